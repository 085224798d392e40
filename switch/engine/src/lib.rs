//! The sans-IO INC switch engine.
//!
//! Terminates one RoCEv2 Reliable Connection per link and communicator (configured by
//! [`SwitchRules`](inc_ctrl_proto::SwitchRules)), aggregates the chunks of AllReduce,
//! Reduce, Broadcast and Barrier in a per-communicator slot pool keyed by stream
//! position, and answers ARP for its port addresses. Frames in, frames out, `now` in,
//! the next deadline out; see `docs/PROTOCOL.md`.

mod comm;

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::Ipv4Addr;

use inc_ctrl_proto::{Peer, SwitchRules, VALID_MTUS};
use inc_protocol::{earliest, Outgoing, RcCounters, RcTimers, Time};
use inc_wire::ethernet::ETHERNET_HEADER_LEN;
use inc_wire::{
    ArpOperation, ArpPacket, ArpRepr, EtherType, EthernetAddress, EthernetFrame, EthernetRepr,
    Opcode, RoceRepr,
};
use serde::Serialize;

use comm::Comm;

/// One data-plane port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// Port name, as in the topology and the rules.
    pub name: String,
    /// The port's IP (RC endpoint address, answered in ARP).
    pub ip: Ipv4Addr,
    /// The port's MAC.
    pub mac: EthernetAddress,
}

/// Engine configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SwitchEngineConfig {
    /// Topology id; rules for another switch are refused.
    pub switch_id: u32,
    /// Ports, indexed by position (the `port` of frames in and out).
    pub ports: Vec<PortConfig>,
    /// RC timers of every connection.
    pub timers: RcTimers,
    /// Combine FLOAT32 contributions in a fixed child order, so results are bit-identical
    /// run to run (costs `fan-in x` slot memory).
    pub deterministic_float: bool,
    /// Send a progress message every this many chunks (`None`: `max(1, W/4)`).
    pub progress_every: Option<u32>,
}

/// A frame to send: `buf[..len]` out of port `port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Port index.
    pub port: usize,
    /// Frame length.
    pub len: usize,
}

/// A frame to send out of port `port`: in the caller's buffer, or a connection's
/// queued request as it is ([`SwitchEngine::poll_transmit_frame`]).
#[derive(Debug, Clone)]
pub struct TransmitFrame {
    /// Port index.
    pub port: usize,
    /// The frame.
    pub frame: Outgoing,
}

/// Something the driver should know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchEvent {
    /// An RC connection exhausted its retries; its communicator's running collectives
    /// were failed and the hosts told.
    ConnectionFailed {
        /// Communicator.
        comm_id: u32,
        /// Index of the connection in the rules.
        connection: usize,
        /// Port name.
        port: String,
        /// Who is at the other end.
        peer: Peer,
        /// Switch-side QPN.
        local_qpn: u32,
        /// The stalled PSN.
        psn: u32,
        /// Why.
        reason: String,
    },
    /// A collective failed (operation mismatch, protocol error, connection failure).
    CollectiveFailed {
        /// Communicator.
        comm_id: u32,
        /// Collective sequence number.
        seq: u32,
        /// Why.
        reason: String,
    },
}

/// Rules the engine refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Rules for another switch.
    #[error("rules of communicator {comm_id} are for switch {got}, this is switch {expected}")]
    WrongSwitch {
        /// Communicator.
        comm_id: u32,
        /// This switch.
        expected: u32,
        /// The rules' switch.
        got: u32,
    },
    /// Communicator already installed.
    #[error("communicator {0} is already installed")]
    CommExists(u32),
    /// Communicator not installed.
    #[error("communicator {0} is not installed")]
    UnknownComm(u32),
    /// A connection names a port this switch does not have.
    #[error("communicator {comm_id} connection {connection}: unknown port `{port}`")]
    UnknownPort {
        /// Communicator.
        comm_id: u32,
        /// Connection index.
        connection: usize,
        /// The port name.
        port: String,
    },
    /// A switch-side QPN is already in use (or repeated in the rules).
    #[error("communicator {comm_id} connection {connection}: QPN {qpn:#x} is already in use")]
    QpnInUse {
        /// Communicator.
        comm_id: u32,
        /// Connection index.
        connection: usize,
        /// The QPN.
        qpn: u32,
    },
    /// Rules that cannot work.
    #[error("communicator {comm_id}: invalid rules: {reason}")]
    InvalidRules {
        /// Communicator.
        comm_id: u32,
        /// What is wrong.
        reason: String,
    },
}

/// Frames dropped before reaching a connection, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DropCounters {
    /// Not IPv4/UDP:4791 and not ARP.
    pub not_roce: u64,
    /// Malformed headers.
    pub malformed: u64,
    /// Bad ICRC.
    pub bad_icrc: u64,
    /// Destination QP unknown.
    pub unknown_qpn: u64,
    /// Known QP, but from another address, port or IP destination.
    pub wrong_peer: u64,
    /// RC opcode other than SEND_ONLY[_WITH_IMM] and ACK, or not RC.
    pub unsupported_opcode: u64,
    /// Frame on a port index the engine does not have.
    pub bad_port: u64,
}

/// Counters of one connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConnCounters {
    /// Index in the rules.
    pub index: usize,
    /// Port name.
    pub port: String,
    /// Peer.
    pub peer: Peer,
    /// Switch-side QPN.
    pub local_qpn: u32,
    /// True once the connection failed.
    pub failed: bool,
    /// RC level.
    pub rc: RcCounters,
    /// Data chunks received.
    pub rx_data: u64,
    /// Data chunks sent.
    pub tx_data: u64,
    /// Control messages received.
    pub rx_control: u64,
    /// Control messages sent.
    pub tx_control: u64,
}

/// Counters of one communicator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CommCounters {
    /// Communicator.
    pub comm_id: u32,
    /// Collectives seen.
    pub collectives_started: u64,
    /// Collectives finished here.
    pub collectives_completed: u64,
    /// Collectives failed.
    pub collectives_failed: u64,
    /// Chunks completed (every contributor's part arrived) and sent on.
    pub chunks_aggregated: u64,
    /// Of those, chunks whose last contribution was combined straight into the frame
    /// that carries the result on (no combine into the slot and copy out).
    pub chunks_combined_into_frame: u64,
    /// Of those, chunks of a single contributor (a Broadcast's owner, an AllGather
    /// position every destination was owed next) sent on straight from the frame they
    /// arrived in: no slot, no hash.
    pub chunks_passed_through: u64,
    /// Chunks received from the parent and sent down.
    pub chunks_down: u64,
    /// AllGather chunks that arrived before some destination's cursor reached them and
    /// waited in a slot for it (each link carries its positions in stream order).
    pub gather_chunks_held: u64,
    /// Progress messages sent.
    pub progress_sent: u64,
    /// Error messages sent.
    pub errors_sent: u64,
    /// Contributions refused (RNR) because their slot still held an older chunk.
    pub slot_conflicts: u64,
    /// Packets refused (RNR) because an outgoing send queue was full.
    pub backpressure_rnr: u64,
    /// Operation mismatches detected here.
    pub mismatches: u64,
    /// Messages that break the protocol (wrong length, unexpected data/control).
    pub protocol_errors: u64,
    /// Control messages that found a full send queue and were not sent.
    pub control_send_failures: u64,
    /// Bytes held: slot pool plus send queues.
    pub memory_bytes: u64,
    /// Per connection.
    pub connections: Vec<ConnCounters>,
}

/// All counters of a switch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SwitchCounters {
    /// Frames handed in.
    pub rx_frames: u64,
    /// Of those, frames handed in as intact (ICRC not checked; see
    /// [`SwitchEngine::handle_intact_frame`]).
    pub rx_intact_frames: u64,
    /// Frames handed out.
    pub tx_frames: u64,
    /// ARP requests for our addresses answered.
    pub arp_replies: u64,
    /// Drops before a connection.
    pub drops: DropCounters,
    /// Per communicator.
    pub comms: Vec<CommCounters>,
}

impl SwitchCounters {
    /// Total bytes held by all communicators.
    pub fn memory_bytes(&self) -> u64 {
        self.comms.iter().map(|c| c.memory_bytes).sum()
    }

    /// Slot conflicts over all communicators.
    pub fn slot_conflicts(&self) -> u64 {
        self.comms.iter().map(|c| c.slot_conflicts).sum()
    }

    /// Retransmitted packets over all connections.
    pub fn retransmits(&self) -> u64 {
        self.comms.iter().flat_map(|c| &c.connections).map(|c| c.rc.retransmits).sum()
    }
}

const MAX_ARP_BACKLOG: usize = 64;
const ARP_FRAME_LEN: usize = 60;

/// The sans-IO switch.
#[derive(Debug)]
pub struct SwitchEngine {
    cfg: SwitchEngineConfig,
    /// Sorted by communicator id; indices change only on install and remove.
    comms: Vec<Comm>,
    /// Switch-side QPN -> (index in `comms`, connection index); looked up per frame.
    by_qpn: HashMap<u32, (usize, usize), BuildHasherDefault<QpnHasher>>,
    /// Every (index in `comms`, connection), polled round-robin so no connection starves.
    tx_order: Vec<(usize, usize)>,
    next_tx_turn: usize,
    arp_out: VecDeque<(usize, [u8; ARP_FRAME_LEN])>,
    events: VecDeque<SwitchEvent>,
    counters: SwitchCounters,
}

impl SwitchEngine {
    /// A switch with no communicators.
    pub fn new(config: SwitchEngineConfig) -> Self {
        SwitchEngine {
            cfg: config,
            comms: Vec::new(),
            by_qpn: HashMap::default(),
            tx_order: Vec::new(),
            next_tx_turn: 0,
            arp_out: VecDeque::new(),
            events: VecDeque::new(),
            counters: SwitchCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SwitchEngineConfig {
        &self.cfg
    }

    /// Installs the rules of one communicator.
    pub fn install(&mut self, rules: &SwitchRules, _now: Time) -> Result<(), EngineError> {
        let comm_id = rules.comm_id;
        let invalid = |reason: String| EngineError::InvalidRules { comm_id, reason };
        if rules.switch_id != self.cfg.switch_id {
            return Err(EngineError::WrongSwitch {
                comm_id,
                expected: self.cfg.switch_id,
                got: rules.switch_id,
            });
        }
        if self.comm_index(comm_id).is_some() {
            return Err(EngineError::CommExists(comm_id));
        }
        if !VALID_MTUS.contains(&rules.mtu) {
            return Err(invalid(format!("mtu {} is not one of {VALID_MTUS:?}", rules.mtu)));
        }
        if rules.window == 0 || rules.window > 1 << 16 {
            return Err(invalid(format!("window {} outside 1..=65536", rules.window)));
        }
        if u64::from(rules.slots) < 2 * u64::from(rules.window) || rules.slots > 1 << 18 {
            return Err(invalid(format!(
                "slots {} must be at least 2 x window ({}) and at most 262144",
                rules.slots,
                2 * u64::from(rules.window)
            )));
        }
        if let Some(p) = rules.parent {
            if p >= rules.connections.len() {
                return Err(invalid(format!(
                    "parent index {p} but only {} connections",
                    rules.connections.len()
                )));
            }
        }
        // Every rank is reached through exactly one connection (AllGather routes each
        // block by its rank).
        let mut reached = vec![false; usize::from(rules.world_size)];
        for (i, c) in rules.connections.iter().enumerate() {
            for (k, &rank) in c.ranks.iter().enumerate() {
                let sorted = k == 0 || c.ranks[k - 1] < rank;
                match reached.get_mut(usize::from(rank)) {
                    Some(seen) if !*seen && sorted => *seen = true,
                    _ => {
                        return Err(invalid(format!(
                            "connection {i}: rank {rank} is outside world size {}, repeated or out of order",
                            rules.world_size
                        )))
                    }
                }
            }
        }
        if let Some(rank) = reached.iter().position(|seen| !seen) {
            return Err(invalid(format!("rank {rank} is reached through no connection")));
        }
        if rules.fan_in() > comm::MAX_FAN_IN {
            return Err(invalid(format!("fan-in {} exceeds {}", rules.fan_in(), comm::MAX_FAN_IN)));
        }
        let mut ports = Vec::with_capacity(rules.connections.len());
        for (i, c) in rules.connections.iter().enumerate() {
            let port = self.cfg.ports.iter().position(|p| p.name == c.port).ok_or_else(|| {
                EngineError::UnknownPort { comm_id, connection: i, port: c.port.clone() }
            })?;
            let dup = rules.connections[..i].iter().any(|earlier| earlier.local_qpn == c.local_qpn);
            if dup
                || self.by_qpn.contains_key(&c.local_qpn)
                || c.local_qpn < 2
                || c.local_qpn > inc_ctrl_proto::MAX_24BIT
            {
                return Err(EngineError::QpnInUse { comm_id, connection: i, qpn: c.local_qpn });
            }
            if c.peer_qpn > inc_ctrl_proto::MAX_24BIT
                || c.local_start_psn > inc_ctrl_proto::MAX_24BIT
                || c.peer_start_psn > inc_ctrl_proto::MAX_24BIT
            {
                return Err(invalid(format!("connection {i}: QPN or PSN exceeds 24 bits")));
            }
            if Some(i) != rules.parent && c.ranks.is_empty() {
                return Err(invalid(format!(
                    "connection {i} (child on port `{}`) reaches no rank",
                    c.port
                )));
            }
            ports.push(port);
        }
        let comm = Comm::new(rules, &ports, &self.cfg);
        tracing::info!(
            comm_id,
            switch_id = self.cfg.switch_id,
            connections = rules.connections.len(),
            "communicator installed"
        );
        let at = self.comms.partition_point(|c| c.id() < comm_id);
        self.comms.insert(at, comm);
        self.rebuild_indices();
        Ok(())
    }

    /// Removes a communicator and everything it holds.
    pub fn remove(&mut self, comm_id: u32) -> Result<(), EngineError> {
        let at = self.comm_index(comm_id).ok_or(EngineError::UnknownComm(comm_id))?;
        self.comms.remove(at);
        self.rebuild_indices();
        Ok(())
    }

    fn comm_index(&self, comm_id: u32) -> Option<usize> {
        self.comms.binary_search_by_key(&comm_id, Comm::id).ok()
    }

    /// Positions in `comms` moved: redo the QPN map and the transmit order.
    fn rebuild_indices(&mut self) {
        self.by_qpn.clear();
        self.tx_order.clear();
        for (at, comm) in self.comms.iter().enumerate() {
            for (conn, qpn) in comm.qpns().enumerate() {
                self.by_qpn.insert(qpn, (at, conn));
                self.tx_order.push((at, conn));
            }
        }
        self.next_tx_turn = 0;
    }

    /// Handles one received frame from port `port`.
    pub fn handle_frame(&mut self, now: Time, port: usize, frame: &[u8]) {
        self.receive(now, port, frame, true);
    }

    /// Like [`Self::handle_frame`] for a frame known intact because it never left this
    /// process's memory (an in-process link with no corruption emulated): its ICRC is
    /// not checked, a pass over the whole frame saved ([`RoceRepr::parse_intact`]).
    pub fn handle_intact_frame(&mut self, now: Time, port: usize, frame: &[u8]) {
        self.counters.rx_intact_frames += 1;
        self.receive(now, port, frame, false);
    }

    fn receive(&mut self, now: Time, port: usize, frame: &[u8], check_icrc: bool) {
        self.counters.rx_frames += 1;
        if port >= self.cfg.ports.len() {
            self.counters.drops.bad_port += 1;
            return;
        }
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            self.counters.drops.malformed += 1;
            return;
        };
        if eth.ethertype() == EtherType::Arp {
            self.handle_arp(port, eth.src_addr(), eth.payload());
            return;
        }
        let parsed =
            if check_icrc { RoceRepr::parse(frame) } else { RoceRepr::parse_intact(frame) };
        let parsed = match parsed {
            Ok(p) => p,
            Err(inc_wire::Error::NotRoce { .. }) => {
                self.counters.drops.not_roce += 1;
                return;
            }
            Err(_) => {
                self.counters.drops.malformed += 1;
                return;
            }
        };
        if !parsed.icrc_ok {
            self.counters.drops.bad_icrc += 1;
            return;
        }
        let packet = &parsed.repr;
        let Some(&(at, conn)) = self.by_qpn.get(&packet.bth.dest_qp) else {
            self.counters.drops.unknown_qpn += 1;
            return;
        };
        let comm = &mut self.comms[at];
        if !comm.accepts(conn, port, packet.ip_src) || packet.ip_dst != self.cfg.ports[port].ip {
            self.counters.drops.wrong_peer += 1;
            return;
        }
        match packet.bth.opcode {
            Opcode::RcAcknowledge | Opcode::RcSendOnly | Opcode::RcSendOnlyWithImmediate => {}
            _ => {
                self.counters.drops.unsupported_opcode += 1;
                return;
            }
        }
        comm.learn_mac(conn, packet.eth.src);
        let crc_source = comm::FrameCrc {
            headers: &frame[ETHERNET_HEADER_LEN..packet.payload_offset()],
            icrc: parsed.icrc,
        };
        comm.handle_packet(now, conn, packet, parsed.payload, crc_source, &mut self.events);
    }

    fn handle_arp(&mut self, port: usize, src_mac: EthernetAddress, payload: &[u8]) {
        let Ok(pkt) = ArpPacket::new_checked(payload) else {
            self.counters.drops.malformed += 1;
            return;
        };
        let Ok(arp) = ArpRepr::parse(&pkt) else {
            self.counters.drops.malformed += 1;
            return;
        };
        for comm in &mut self.comms {
            comm.learn_mac_by_ip(port, arp.source_protocol_addr, arp.source_hardware_addr);
        }
        let me = &self.cfg.ports[port];
        if arp.operation != ArpOperation::Request || arp.target_protocol_addr != me.ip {
            return;
        }
        if self.arp_out.len() >= MAX_ARP_BACKLOG {
            return;
        }
        let mut out = [0u8; ARP_FRAME_LEN];
        let mut eth = EthernetFrame::new_unchecked(&mut out[..]);
        EthernetRepr { src_addr: me.mac, dst_addr: src_mac, ethertype: EtherType::Arp }
            .emit(&mut eth);
        let mut ap = ArpPacket::new_unchecked(&mut out[14..42]);
        arp.reply(me.mac).emit(&mut ap);
        self.counters.arp_replies += 1;
        self.arp_out.push_back((port, out));
    }

    /// Writes the next frame to send into `buf` (at least `mtu + 70` bytes).
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.poll_transmit_frame(now, buf)?;
        let len = match t.frame {
            Outgoing::Written(len) => len,
            Outgoing::Queued(frame) => {
                buf[..frame.len()].copy_from_slice(&frame);
                frame.len()
            }
        };
        Some(Transmit { port: t.port, len })
    }

    /// The next frame to send. Requests come as their connection's queued frame,
    /// which a backend may send without copying it; everything else (ACK/NAKs, ARP
    /// replies) is written into `buf` (at least 128 bytes).
    pub fn poll_transmit_frame(&mut self, now: Time, buf: &mut [u8]) -> Option<TransmitFrame> {
        if let Some((port, frame)) = self.arp_out.pop_front() {
            buf[..ARP_FRAME_LEN].copy_from_slice(&frame);
            self.counters.tx_frames += 1;
            return Some(TransmitFrame { port, frame: Outgoing::Written(ARP_FRAME_LEN) });
        }
        let n = self.tx_order.len();
        for k in 0..n {
            let i = (self.next_tx_turn + k) % n;
            let (at, conn) = self.tx_order[i];
            if let Some(t) = self.comms[at].poll_transmit(now, conn, buf) {
                self.next_tx_turn = i + 1;
                self.counters.tx_frames += 1;
                return Some(t);
            }
        }
        None
    }

    /// When [`handle_timeout`](Self::handle_timeout) must run next.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.comms.iter().fold(None, |acc, c| earliest(acc, c.poll_timeout()))
    }

    /// Runs expired timers.
    pub fn handle_timeout(&mut self, now: Time) {
        for comm in &mut self.comms {
            comm.handle_timeout(now, &mut self.events);
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<SwitchEvent> {
        self.events.pop_front()
    }

    /// Counters.
    pub fn counters(&self) -> SwitchCounters {
        SwitchCounters {
            comms: self.comms.iter().map(Comm::counters).collect(),
            ..self.counters.clone()
        }
    }
}

/// Hashes switch-side QPNs (small integers the controller allocates, not chosen by
/// the peer) with one multiplication instead of SipHash: the lookup runs per frame.
#[derive(Default)]
struct QpnHasher(u64);

impl Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, qpn: u32) {
        self.0 = u64::from(qpn).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests;
