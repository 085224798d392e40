//! One communicator on one switch: its connections, slot pool and collectives.
//!
//! - [`mask`]: sets of children by ordinal.
//! - [`slots`]: the slot pool where chunks are combined.
//! - [`roles`]: what this switch does for a collective, from the tree's shape.
//! - [`collective`]: per-collective state, Start checks, delivery and completion rules.
//! - `control`: Start, Progress and Error messages.
//! - `data`: data chunks from children and parent, and sending completed chunks on.
//! - `delivery`: delivery confirmations and the Progress messages they cause.
//! - `gather`: AllGather positions, each on to every other neighbour in stream order.
//! - `failure`: failed connections and failed collectives.

mod collective;
mod control;
mod data;
mod delivery;
mod failure;
mod gather;
pub(crate) mod mask;
mod roles;
mod slots;

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use inc_ctrl_proto::{Peer, SwitchRules};
use inc_protocol::coll::{self, CollOp, CtrlMsg, NO_RANK};
use inc_protocol::{earliest, Inbound, RcAddressing, RcConfig, RcConnection, Time};
use inc_wire::icrc::PayloadCrc;
use inc_wire::{EthernetAddress, Psn, RoceRepr};

use crate::{CommCounters, ConnCounters, SwitchEngineConfig, SwitchEvent, TransmitFrame};
use collective::{Collective, ExpectedData};
use mask::ChildMask;
use slots::SlotPool;

pub(crate) use mask::MAX_FAN_IN;

/// Send-queue entries kept for control messages beyond the data allowance, so that
/// Progress and Error still go out when data fills the queue.
const CONTROL_RESERVE: usize = 16;
/// Collectives tracked at once per communicator (more means a peer runs ahead wildly).
const MAX_COLLECTIVES: usize = 8;
/// Retired collective numbers remembered, so late messages for them create nothing.
const RETIRED_MEMORY: usize = 16;

#[derive(Debug)]
struct Conn {
    rc: RcConnection,
    port: usize,
    peer: Peer,
    peer_ip: Ipv4Addr,
    ranks: Vec<u16>,
    /// Position among the children (bit in masks); `None` for the parent.
    child_ordinal: Option<usize>,
    /// Data still expected, per collective, in arrival order.
    expected: VecDeque<ExpectedData>,
    rx_data: u64,
    tx_data: u64,
    rx_control: u64,
    tx_control: u64,
    failed: bool,
}

/// The CRC of `data` for the frames it goes out in, so that their ICRCs need no pass
/// over it: read off the ICRC of the frame it arrived in when `data` is that frame's
/// whole payload (a few nanoseconds, worth it for one destination too); hashed once
/// when it goes to several `destinations`; `None` for one destination and no frame
/// (its ICRC is then computed with the frame).
fn shared_crc(
    data: &[u8],
    destinations: usize,
    arrived_in: Option<FrameCrc<'_>>,
) -> Option<PayloadCrc> {
    match arrived_in {
        Some(f) => Some(PayloadCrc::from_icrc(f.icrc, f.headers, data.len())),
        None => (destinations > 1).then(|| PayloadCrc::new(data)),
    }
}

/// What a received frame's ICRC says about its payload ([`shared_crc`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameCrc<'a> {
    /// IPv4 header through the last extension header.
    pub(crate) headers: &'a [u8],
    /// The frame's ICRC, checked (or the frame known intact).
    pub(crate) icrc: u32,
}

impl Conn {
    fn is_host(&self) -> bool {
        matches!(self.peer, Peer::Host { .. })
    }

    fn first_rank(&self) -> u16 {
        self.ranks.first().copied().unwrap_or(NO_RANK)
    }

    /// Queues one data chunk; `None` when the connection failed (its collectives fail
    /// separately) or, which room checks rule out, the queue is full. `shared_crc` is
    /// the chunk's CRC when it goes to several connections ([`shared_crc`]).
    fn send_data(&mut self, data: &[u8], shared_crc: Option<&PayloadCrc>) -> Option<Psn> {
        if self.failed {
            return None;
        }
        let sent = match shared_crc {
            Some(crc) => self.rc.send_shared(None, data, crc),
            None => self.rc.send(None, data),
        };
        let psn = sent.ok()?;
        self.tx_data += 1;
        Some(psn)
    }

    /// Room for one more data chunk without eating the control reserve. A failed
    /// connection has room: what would go to it is dropped, not waited for.
    fn data_room(&self) -> bool {
        self.failed || self.rc.send_room() > CONTROL_RESERVE
    }
}

/// How a new in-order request was disposed of.
enum Disposition {
    Accept,
    /// Refuse with an RNR NAK: the peer sends it again later.
    Rnr,
}

#[derive(Debug)]
pub(crate) struct Comm {
    rules: SwitchRules,
    mtu: usize,
    progress_every: u64,
    conns: Vec<Conn>,
    parent: Option<usize>,
    /// Rules index of each child ordinal.
    child_conn: Vec<usize>,
    all_children: ChildMask,
    /// Names this switch in the Start it sends up.
    lowest_rank_below: u16,
    /// Per rank: the connection it is reached through.
    rank_conn: Vec<usize>,
    /// The ranks behind the children, ascending.
    ranks_below: Vec<u16>,
    slots: SlotPool,
    /// Per slot: the CRC of an AllGather chunk held there, read off its frame.
    held_crc: Vec<Option<PayloadCrc>>,
    collectives: VecDeque<Collective>,
    retired: VecDeque<u32>,
    /// Complete slots, in completion order, waiting for send-queue room.
    completed_slots: VecDeque<usize>,
    counters: CommCounters,
}

impl Comm {
    pub(crate) fn new(rules: &SwitchRules, ports: &[usize], cfg: &SwitchEngineConfig) -> Comm {
        let mtu = usize::from(rules.mtu);
        let window = rules.window as usize;
        let child_conn: Vec<usize> = rules.children().collect();
        let conns = rules
            .connections
            .iter()
            .enumerate()
            .map(|(i, c)| Conn {
                rc: RcConnection::new(RcConfig {
                    addr: RcAddressing {
                        local_mac: EthernetAddress(c.local_mac.0),
                        local_ip: c.local_ip,
                        local_udp_port: c.local_udp_port,
                        local_qpn: c.local_qpn,
                        peer_mac: c.peer_mac.map(|m| EthernetAddress(m.0)),
                        peer_ip: c.peer_ip,
                        peer_udp_port: c.peer_udp_port,
                        peer_qpn: c.peer_qpn,
                        psn_ident: true,
                    },
                    send_start_psn: Psn::new(c.local_start_psn),
                    recv_start_psn: Psn::new(c.peer_start_psn),
                    max_payload: mtu.max(coll::HEADER_LEN),
                    // Two windows of data: one being acknowledged, one being filled.
                    send_queue: 2 * window + CONTROL_RESERVE,
                    timers: inc_protocol::timers_for_window(cfg.timers, window),
                }),
                port: ports[i],
                peer: c.peer,
                peer_ip: c.peer_ip,
                ranks: c.ranks.clone(),
                child_ordinal: child_conn.iter().position(|&ch| ch == i),
                expected: VecDeque::new(),
                rx_data: 0,
                tx_data: 0,
                rx_control: 0,
                tx_control: 0,
                failed: false,
            })
            .collect();
        let lowest_rank_below = child_conn
            .iter()
            .flat_map(|&c| rules.connections[c].ranks.iter().copied())
            .min()
            .unwrap_or(NO_RANK);
        let mut rank_conn = vec![0; usize::from(rules.world_size)];
        for (i, c) in rules.connections.iter().enumerate() {
            for &rank in &c.ranks {
                rank_conn[usize::from(rank)] = i;
            }
        }
        let mut ranks_below: Vec<u16> =
            child_conn.iter().flat_map(|&c| rules.connections[c].ranks.iter().copied()).collect();
        ranks_below.sort_unstable();
        let progress_every =
            u64::from(cfg.progress_every.unwrap_or((rules.window / 4).max(1)).max(1));
        let slot_count = rules.slots as usize;
        Comm {
            rules: rules.clone(),
            mtu,
            progress_every,
            conns,
            parent: rules.parent,
            all_children: ChildMask::first(child_conn.len()),
            slots: SlotPool::new(slot_count, mtu, child_conn.len(), cfg.deterministic_float),
            held_crc: vec![None; slot_count],
            child_conn,
            lowest_rank_below,
            rank_conn,
            ranks_below,
            collectives: VecDeque::with_capacity(MAX_COLLECTIVES),
            retired: VecDeque::with_capacity(RETIRED_MEMORY),
            completed_slots: VecDeque::with_capacity(slot_count),
            counters: CommCounters { comm_id: rules.comm_id, ..CommCounters::default() },
        }
    }

    pub(crate) fn id(&self) -> u32 {
        self.rules.comm_id
    }

    /// Switch-side QPNs, by connection index.
    pub(crate) fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.rules.connections.iter().map(|c| c.local_qpn)
    }

    /// Whether a frame for connection `conn` came from where its peer is.
    pub(crate) fn accepts(&self, conn: usize, port: usize, src: Ipv4Addr) -> bool {
        let c = &self.conns[conn];
        c.port == port && c.peer_ip == src
    }

    pub(crate) fn learn_mac(&mut self, conn: usize, mac: EthernetAddress) {
        let c = &mut self.conns[conn];
        if c.rc.addressing().peer_mac.is_none() && !mac.is_broadcast() && mac.0[0] & 1 == 0 {
            tracing::debug!(comm = self.rules.comm_id, connection = conn, %mac, "learned peer MAC");
            c.rc.set_peer_mac(mac);
        }
    }

    pub(crate) fn learn_mac_by_ip(&mut self, port: usize, ip: Ipv4Addr, mac: EthernetAddress) {
        for conn in 0..self.conns.len() {
            if self.conns[conn].port == port && self.conns[conn].peer_ip == ip {
                self.learn_mac(conn, mac);
            }
        }
    }

    pub(crate) fn poll_transmit(
        &mut self,
        now: Time,
        conn: usize,
        buf: &mut [u8],
    ) -> Option<TransmitFrame> {
        let c = &mut self.conns[conn];
        c.rc.poll_transmit_frame(now, buf).map(|frame| TransmitFrame { port: c.port, frame })
    }

    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        self.conns.iter().fold(None, |acc, c| earliest(acc, c.rc.poll_timeout()))
    }

    pub(crate) fn handle_timeout(&mut self, now: Time, events: &mut VecDeque<SwitchEvent>) {
        for conn in 0..self.conns.len() {
            if let Some(failure) = self.conns[conn].rc.handle_timeout(now) {
                self.connection_failed(conn, failure, events);
            }
        }
    }

    pub(crate) fn counters(&self) -> CommCounters {
        let connections = self
            .conns
            .iter()
            .enumerate()
            .map(|(i, c)| ConnCounters {
                index: i,
                port: self.rules.connections[i].port.clone(),
                peer: c.peer,
                local_qpn: self.rules.connections[i].local_qpn,
                failed: c.failed,
                rc: *c.rc.counters(),
                rx_data: c.rx_data,
                tx_data: c.tx_data,
                rx_control: c.rx_control,
                tx_control: c.tx_control,
            })
            .collect();
        CommCounters {
            memory_bytes: self.memory_bytes() as u64,
            connections,
            ..self.counters.clone()
        }
    }

    /// Slot pool plus send-queue buffers plus bookkeeping.
    fn memory_bytes(&self) -> usize {
        self.slots.memory_bytes() + self.conns.iter().map(|c| c.rc.memory_bytes()).sum::<usize>()
    }

    /// One RoCE packet for connection `conn` (addresses and ICRC already checked).
    pub(crate) fn handle_packet(
        &mut self,
        now: Time,
        conn: usize,
        packet: &RoceRepr,
        payload: &[u8],
        crc_source: FrameCrc<'_>,
        events: &mut VecDeque<SwitchEvent>,
    ) {
        match self.conns[conn].rc.on_packet(now, &packet.bth, packet.ext.aeth.as_ref()) {
            Inbound::Request => {
                let disposition = match packet.ext.imm {
                    Some(imm) => {
                        self.conns[conn].rx_control += 1;
                        self.on_control(conn, imm, payload, events)
                    }
                    None => {
                        self.conns[conn].rx_data += 1;
                        self.on_data(conn, payload, Some(crc_source), events)
                    }
                };
                match disposition {
                    Disposition::Accept => self.conns[conn].rc.accept(now),
                    Disposition::Rnr => self.conns[conn].rc.reject_rnr(),
                }
            }
            Inbound::Failed(failure) => self.connection_failed(conn, failure, events),
            Inbound::Handled | Inbound::Dropped => {}
        }
        if packet.ext.aeth.is_some() {
            self.count_acked_results(conn);
            // Send-queue room may have opened.
            self.send_completed();
            self.flush_all_progress();
        }
    }

    fn find_collective(&self, seq: u32) -> Option<usize> {
        self.collectives.iter().position(|c| c.seq == seq)
    }

    /// The collective `seq`, created if there is room and it was not retired.
    fn find_or_create(&mut self, seq: u32) -> Option<usize> {
        if let Some(coll_idx) = self.find_collective(seq) {
            return Some(coll_idx);
        }
        if self.collectives.len() >= MAX_COLLECTIVES || self.retired.contains(&seq) {
            return None;
        }
        self.counters.collectives_started += 1;
        self.collectives.push_back(Collective::new(seq, self.child_conn.len(), self.conns.len()));
        Some(self.collectives.len() - 1)
    }

    /// Drops a collective's state once nothing more will arrive for it.
    fn maybe_retire(&mut self, seq: u32) {
        let Some(coll_idx) = self.find_collective(seq) else { return };
        let coll = &self.collectives[coll_idx];
        if !coll.is_finished(self.all_children) {
            return;
        }
        if !coll.failed {
            self.counters.collectives_completed += 1;
        }
        self.collectives.remove(coll_idx);
        if self.retired.len() == RETIRED_MEMORY {
            self.retired.pop_front();
        }
        self.retired.push_back(seq);
    }

    /// Queues a control message; false if the connection failed or its queue is full.
    fn send_control(&mut self, conn: usize, op: &CollOp, msg: CtrlMsg) -> bool {
        let c = &mut self.conns[conn];
        if c.failed {
            return false;
        }
        match c.rc.send(Some(op.imm(msg.kind())), &msg.to_bytes()) {
            Ok(_) => {
                c.tx_control += 1;
                true
            }
            Err(e) => {
                self.counters.control_send_failures += 1;
                tracing::warn!(
                    comm = self.rules.comm_id,
                    connection = conn,
                    "control message not sent: {e}"
                );
                false
            }
        }
    }
}
