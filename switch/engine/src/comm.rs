//! One communicator on one switch: its connections, slot pool and collectives.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use inc_ctrl_proto::{Peer, SwitchRules};
use inc_protocol::coll::{self, field, CollOp, CtrlMsg, ErrorCode, NO_RANK};
use inc_protocol::{earliest, Inbound, RcAddressing, RcConfig, RcConnection, Time};
use inc_wire::{reduce, DataType, EthernetAddress, Primitive, Psn, RoceRepr};

use crate::{CommCounters, ConnCounters, SwitchEngineConfig, SwitchEvent, Transmit};

/// Send-queue entries kept for control messages beyond the data allowance.
const CTRL_RESERVE: usize = 16;
/// Collectives tracked at once per communicator (more means a peer runs ahead wildly).
const MAX_COLLS: usize = 8;
/// Retired collective numbers remembered.
const RETIRED_MEMORY: usize = 16;

#[derive(Debug)]
struct Conn {
    rc: RcConnection,
    port: usize,
    peer: Peer,
    peer_ip: Ipv4Addr,
    ranks: Vec<u16>,
    /// Child ordinal (bit in masks); `None` for the parent.
    ord: Option<usize>,
    /// Data messages still expected, per collective, in arrival order.
    rx: VecDeque<Expect>,
    rx_data: u64,
    tx_data: u64,
    rx_control: u64,
    tx_control: u64,
    failed: bool,
}

#[derive(Debug, Clone, Copy)]
struct Expect {
    seq: u32,
    start_pos: u64,
    bytes: u64,
    next: u64,
    total: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Filling,
    Complete,
}

#[derive(Debug, Clone, Copy)]
struct SlotMeta {
    state: SlotState,
    seq: u32,
    pos: u64,
    arrived: Mask,
    len: usize,
}

const FREE: SlotMeta =
    SlotMeta { state: SlotState::Free, seq: 0, pos: 0, arrived: Mask::EMPTY, len: 0 };

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StartRef {
    op: CollOp,
    count: u64,
    start_pos: u64,
    chunks: u64,
    rank: u16,
}

/// What this switch does for one collective, fixed when every child's Start arrived.
#[derive(Debug, Clone, Copy, Default)]
struct Roles {
    /// Children whose contribution completes a chunk (bits by ordinal).
    contributors: Mask,
    /// A completed chunk goes to the parent.
    up_to_parent: bool,
    /// ... and as data to these children.
    up_data: Mask,
    /// Data chunks expected from the parent.
    down_expected: u64,
    /// A chunk from the parent goes as data to these children.
    down_data: Mask,
    /// Delivery is the minimum of what these children report (host: chunks it ACKed;
    /// switch: its Progress up) ...
    dl_children: Mask,
    /// ... and of the parent's Progress (a Broadcast going up and down elsewhere).
    dl_parent: bool,
    /// Children told the delivered count (Reduce non-root branches, the Broadcast
    /// root's branch).
    deliver_progress: Mask,
    /// The delivered count also goes to the parent.
    progress_up: bool,
    /// Progress messages from the parent are forwarded to these children.
    fwd_progress: Mask,
}

#[derive(Debug)]
struct Coll {
    seq: u32,
    /// The Error sent when the collective failed.
    error: Option<(CollOp, CtrlMsg)>,
    reference: Option<StartRef>,
    started: Mask,
    errored: Mask,
    ready: bool,
    failed: bool,
    roles: Roles,
    up_done: u64,
    down_done: u64,
    prog_done: Vec<u64>,
    prog_sent: Vec<u64>,
    /// Chunks delivered to every receiver beyond this switch (Reduce: the root rank;
    /// Broadcast: all other ranks): the minimum over the delivery sources.
    delivered: u64,
    up_prog_sent: u64,
    /// Per connection (rules index): chunks it reported delivered.
    dcount: Vec<u64>,
    /// Per connection: PSNs of data sent to a receiving host, not yet ACKed.
    unacked_data: Vec<VecDeque<Psn>>,
}

impl Coll {
    fn chunks(&self) -> u64 {
        self.reference.map_or(0, |r| r.chunks)
    }
}

/// How a new in-order request was disposed of.
enum Disposition {
    Accept,
    Rnr,
}

#[derive(Debug)]
pub(crate) struct Comm {
    rules: SwitchRules,
    mtu: usize,
    slots: usize,
    progress_every: u64,
    det: bool,
    conns: Vec<Conn>,
    parent: Option<usize>,
    /// Rules index of each child ordinal.
    children: Vec<usize>,
    all_children: Mask,
    min_rank: u16,
    meta: Vec<SlotMeta>,
    /// Slot buffers: `slots x stride`; in deterministic mode each slot holds one
    /// `mtu` sub-buffer per child.
    buf: Vec<u8>,
    stride: usize,
    colls: VecDeque<Coll>,
    /// Recently retired collectives, so late messages for them create nothing.
    retired: VecDeque<u32>,
    emit: VecDeque<usize>,
    counters: CommCounters,
}

fn bits(mask: Mask) -> impl Iterator<Item = usize> {
    mask.iter()
}

/// Children as bits, by ordinal; fixed size so slot metadata stays `Copy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mask([u64; MAX_FAN_IN / 64]);

/// Most children one switch serves in one communicator.
pub(crate) const MAX_FAN_IN: usize = 256;

impl Mask {
    const EMPTY: Mask = Mask([0; MAX_FAN_IN / 64]);

    fn bit(i: usize) -> Mask {
        let mut m = Mask::EMPTY;
        m.0[i / 64] = 1 << (i % 64);
        m
    }

    fn all(n: usize) -> Mask {
        let mut m = Mask::EMPTY;
        for i in 0..n {
            m.0[i / 64] |= 1 << (i % 64);
        }
        m
    }

    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    fn iter(self) -> impl Iterator<Item = usize> {
        self.0.into_iter().enumerate().flat_map(|(w, mut word)| {
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let b = word.trailing_zeros() as usize;
                    word &= word - 1;
                    w * 64 + b
                })
            })
        })
    }
}

impl std::ops::BitAnd for Mask {
    type Output = Mask;
    fn bitand(mut self, o: Mask) -> Mask {
        self.0.iter_mut().zip(o.0).for_each(|(a, b)| *a &= b);
        self
    }
}

impl std::ops::BitOr for Mask {
    type Output = Mask;
    fn bitor(mut self, o: Mask) -> Mask {
        self.0.iter_mut().zip(o.0).for_each(|(a, b)| *a |= b);
        self
    }
}

impl std::ops::BitOrAssign for Mask {
    fn bitor_assign(&mut self, o: Mask) {
        *self = *self | o;
    }
}

impl std::ops::Not for Mask {
    type Output = Mask;
    fn not(mut self) -> Mask {
        self.0.iter_mut().for_each(|a| *a = !*a);
        self
    }
}

impl Comm {
    pub(crate) fn new(rules: &SwitchRules, ports: &[usize], cfg: &SwitchEngineConfig) -> Comm {
        let mtu = usize::from(rules.mtu);
        let window = rules.window as usize;
        let children: Vec<usize> = rules.children().collect();
        let n_children = children.len();
        let data_cap = 2 * window;
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
                    },
                    send_start_psn: Psn::new(c.local_start_psn),
                    recv_start_psn: Psn::new(c.peer_start_psn),
                    max_payload: mtu.max(coll::HEADER_LEN),
                    send_queue: data_cap + CTRL_RESERVE,
                    timers: cfg.timers,
                }),
                port: ports[i],
                peer: c.peer,
                peer_ip: c.peer_ip,
                ranks: c.ranks.clone(),
                ord: children.iter().position(|&ch| ch == i),
                rx: VecDeque::new(),
                rx_data: 0,
                tx_data: 0,
                rx_control: 0,
                tx_control: 0,
                failed: false,
            })
            .collect();
        let slots = rules.slots as usize;
        let stride = if cfg.deterministic_float { mtu * n_children.max(1) } else { mtu };
        let min_rank = children
            .iter()
            .flat_map(|&c| rules.connections[c].ranks.iter().copied())
            .min()
            .unwrap_or(NO_RANK);
        let progress_every =
            u64::from(cfg.progress_every.unwrap_or((rules.window / 4).max(1)).max(1));
        Comm {
            rules: rules.clone(),
            mtu,
            slots,
            progress_every,
            det: cfg.deterministic_float,
            conns,
            parent: rules.parent,
            all_children: Mask::all(n_children),
            children,
            min_rank,
            meta: vec![FREE; slots],
            buf: vec![0; slots * stride],
            stride,
            colls: VecDeque::with_capacity(MAX_COLLS),
            retired: VecDeque::with_capacity(RETIRED_MEMORY),
            emit: VecDeque::with_capacity(slots),
            counters: CommCounters { comm_id: rules.comm_id, ..CommCounters::default() },
        }
    }

    pub(crate) fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.rules.connections.iter().map(|c| c.local_qpn)
    }

    pub(crate) fn conn_count(&self) -> usize {
        self.conns.len()
    }

    pub(crate) fn accepts(&self, idx: usize, port: usize, src: Ipv4Addr) -> bool {
        let c = &self.conns[idx];
        c.port == port && c.peer_ip == src
    }

    pub(crate) fn learn_mac(&mut self, idx: usize, mac: EthernetAddress) {
        let c = &mut self.conns[idx];
        if c.rc.addressing().peer_mac.is_none() && !mac.is_broadcast() && mac.0[0] & 1 == 0 {
            tracing::debug!(comm = self.rules.comm_id, connection = idx, %mac, "learned peer MAC");
            c.rc.set_peer_mac(mac);
        }
    }

    pub(crate) fn learn_mac_by_ip(&mut self, port: usize, ip: Ipv4Addr, mac: EthernetAddress) {
        for i in 0..self.conns.len() {
            if self.conns[i].port == port && self.conns[i].peer_ip == ip {
                self.learn_mac(i, mac);
            }
        }
    }

    pub(crate) fn poll_transmit(
        &mut self,
        now: Time,
        idx: usize,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let c = &mut self.conns[idx];
        c.rc.poll_transmit(now, buf).map(|len| Transmit { port: c.port, len })
    }

    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        self.conns.iter().fold(None, |acc, c| earliest(acc, c.rc.poll_timeout()))
    }

    pub(crate) fn handle_timeout(&mut self, now: Time, events: &mut VecDeque<SwitchEvent>) {
        for i in 0..self.conns.len() {
            if let Some(f) = self.conns[i].rc.handle_timeout(now) {
                self.connection_failed(i, f, events);
            }
        }
    }

    fn connection_failed(
        &mut self,
        i: usize,
        f: inc_protocol::RcFailure,
        events: &mut VecDeque<SwitchEvent>,
    ) {
        let c = &mut self.conns[i];
        if c.failed {
            return;
        }
        c.failed = true;
        let rule = &self.rules.connections[i];
        tracing::warn!(comm = self.rules.comm_id, connection = i, port = %rule.port, peer = ?rule.peer, "connection failed: {f}");
        events.push_back(SwitchEvent::ConnectionFailed {
            comm_id: self.rules.comm_id,
            connection: i,
            port: rule.port.clone(),
            peer: rule.peer,
            local_qpn: rule.local_qpn,
            psn: f.psn().value(),
            reason: f.to_string(),
        });
        let rank = rule.ranks.first().copied().unwrap_or(NO_RANK);
        let seqs: Vec<u32> = self.colls.iter().filter(|c| !c.failed).map(|c| c.seq).collect();
        for seq in seqs {
            self.fail_coll(seq, ErrorCode::ConnectionFailed, 0, rank, rank, events);
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
        self.buf.len()
            + self.meta.len() * std::mem::size_of::<SlotMeta>()
            + self.conns.iter().map(|c| c.rc.memory_bytes()).sum::<usize>()
    }

    pub(crate) fn handle_packet(
        &mut self,
        now: Time,
        idx: usize,
        r: &RoceRepr,
        payload: &[u8],
        events: &mut VecDeque<SwitchEvent>,
    ) {
        match self.conns[idx].rc.on_packet(now, &r.bth, r.ext.aeth.as_ref()) {
            Inbound::Request => {
                let d = match r.ext.imm {
                    Some(imm) => {
                        self.conns[idx].rx_control += 1;
                        self.on_control(idx, imm, payload, events)
                    }
                    None => {
                        self.conns[idx].rx_data += 1;
                        self.on_data(idx, payload, events)
                    }
                };
                match d {
                    Disposition::Accept => self.conns[idx].rc.accept(now),
                    Disposition::Rnr => self.conns[idx].rc.reject_rnr(),
                }
            }
            Inbound::Failed(f) => self.connection_failed(idx, f, events),
            Inbound::Handled | Inbound::Dropped => {}
        }
        if r.ext.aeth.is_some() {
            self.acked_results(idx);
            // Send-queue room may have opened.
            self.try_emit();
            self.flush_all_progress();
        }
    }

    fn coll_index(&self, seq: u32) -> Option<usize> {
        self.colls.iter().position(|c| c.seq == seq)
    }

    fn send_ctrl(&mut self, idx: usize, op: &CollOp, msg: CtrlMsg) -> bool {
        let c = &mut self.conns[idx];
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
                    connection = idx,
                    "control message not sent: {e}"
                );
                false
            }
        }
    }

    fn data_room(&self, idx: usize) -> bool {
        let c = &self.conns[idx];
        c.failed || c.rc.send_room() > CTRL_RESERVE
    }

    fn send_data(conn: &mut Conn, data: &[u8]) -> Option<Psn> {
        if conn.failed {
            return None;
        }
        let psn = conn.rc.send(None, data).ok()?;
        conn.tx_data += 1;
        Some(psn)
    }

    // ---- control messages -------------------------------------------------------

    fn on_control(
        &mut self,
        idx: usize,
        imm: u32,
        payload: &[u8],
        events: &mut VecDeque<SwitchEvent>,
    ) -> Disposition {
        let Ok((op, msg)) = CtrlMsg::parse(imm, payload) else {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        };
        // A control message ends whatever data of failed collectives was still expected.
        while let Some(e) = self.conns[idx].rx.front() {
            match self.coll_index(e.seq) {
                Some(ci) if !self.colls[ci].failed => break,
                _ => {
                    self.conns[idx].rx.pop_front();
                }
            }
        }
        let from_parent = Some(idx) == self.parent;
        match msg {
            CtrlMsg::Start { seq, count, start_pos, chunks, rank } if !from_parent => {
                self.on_start(idx, StartRef { op, count, start_pos, chunks, rank }, seq, events)
            }
            CtrlMsg::Progress { seq, completed } if from_parent => {
                self.on_parent_progress(seq, completed);
                Disposition::Accept
            }
            CtrlMsg::Progress { seq, completed } => {
                self.on_child_progress(idx, seq, completed);
                Disposition::Accept
            }
            CtrlMsg::Error { seq, code, fields, rank_a, rank_b } => {
                // The Error is the last message of `seq` on this connection.
                self.conns[idx].rx.retain(|e| e.seq != seq);
                let existing =
                    if from_parent { self.coll_index(seq) } else { self.get_or_create(seq) };
                let Some(ci) = existing else {
                    if from_parent {
                        // Still tell the hosts: they may not have started `seq` yet.
                        for ch in self.children.clone() {
                            self.send_ctrl(ch, &op, msg);
                        }
                    }
                    return Disposition::Accept;
                };
                if let Some(o) = self.conns[idx].ord {
                    self.colls[ci].errored |= Mask::bit(o);
                }
                if !self.colls[ci].failed {
                    self.fail_coll(seq, code, fields, rank_a, rank_b, events);
                } else {
                    self.maybe_retire(seq);
                }
                Disposition::Accept
            }
            _ => {
                self.counters.protocol_errors += 1;
                Disposition::Accept
            }
        }
    }

    fn on_start(
        &mut self,
        idx: usize,
        s: StartRef,
        seq: u32,
        events: &mut VecDeque<SwitchEvent>,
    ) -> Disposition {
        let ord = self.conns[idx].ord.expect("children have an ordinal");
        if self.retired.contains(&seq) {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        }
        let Some(ci) = self.get_or_create(seq) else {
            // Too far ahead of the slowest child: let it come back later.
            return Disposition::Rnr;
        };
        if self.colls[ci].started.has(ord) {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        }
        self.colls[ci].started |= Mask::bit(ord);
        // The data this child will send, by its own account: parseable even on mismatch.
        let sends = match s.op.primitive {
            Primitive::Broadcast => self.conns[idx].ranks.binary_search(&s.op.root).is_ok(),
            _ => true,
        };
        let bytes = s.count.saturating_mul(s.op.datatype.size() as u64);
        if sends {
            self.conns[idx].rx.push_back(Expect {
                seq,
                start_pos: s.start_pos,
                bytes,
                next: 0,
                total: s.chunks,
            });
        }
        if self.colls[ci].failed {
            // Repeat the verdict to a child that starts late: its host may have missed it.
            if let Some((op, msg)) = self.colls[ci].error {
                if self.send_ctrl(idx, &op, msg) {
                    self.counters.errors_sent += 1;
                }
            }
            self.maybe_retire(seq);
            return Disposition::Accept;
        }
        // Validate the claim itself.
        let world = self.rules.world_size;
        let bad = if s.chunks != coll::chunk_count(s.count, s.op.datatype.size(), self.mtu) {
            Some(format!("rank {} announced {} chunks for {} elements", s.rank, s.chunks, s.count))
        } else if s.op.rooted() && s.op.root >= world {
            Some(format!("rank {} named root {} outside world size {world}", s.rank, s.op.root))
        } else if s.op.operator == inc_wire::Operator::Barrier
            && (s.count != 0 || s.op.primitive != Primitive::AllReduce)
        {
            Some(format!("rank {} sent a barrier with data", s.rank))
        } else {
            None
        };
        if let Some(reason) = bad {
            tracing::warn!(comm = self.rules.comm_id, seq, "{reason}");
            self.counters.protocol_errors += 1;
            self.fail_coll(seq, ErrorCode::Protocol, 0, s.rank, s.rank, events);
            return Disposition::Accept;
        }
        match self.colls[ci].reference {
            None => self.colls[ci].reference = Some(s),
            Some(r) => {
                let mut f = 0;
                if r.op.primitive != s.op.primitive {
                    f |= field::PRIMITIVE;
                }
                if r.op.operator != s.op.operator {
                    f |= field::OPERATOR;
                }
                if r.op.datatype != s.op.datatype {
                    f |= field::DATATYPE;
                }
                if r.op.rooted() && r.op.root != s.op.root {
                    f |= field::ROOT;
                }
                if r.count != s.count {
                    f |= field::COUNT;
                }
                if r.start_pos != s.start_pos {
                    f |= field::START;
                }
                if f != 0 {
                    self.counters.mismatches += 1;
                    tracing::warn!(
                        comm = self.rules.comm_id,
                        seq,
                        rank_a = r.rank,
                        rank_b = s.rank,
                        "operation mismatch: {}",
                        field::names(f)
                    );
                    self.fail_coll(seq, ErrorCode::Mismatch, f, r.rank, s.rank, events);
                    return Disposition::Accept;
                }
            }
        }
        if self.colls[ci].started == self.all_children {
            self.make_ready(seq, events);
        }
        Disposition::Accept
    }

    fn get_or_create(&mut self, seq: u32) -> Option<usize> {
        if let Some(ci) = self.coll_index(seq) {
            return Some(ci);
        }
        if self.colls.len() >= MAX_COLLS || self.retired.contains(&seq) {
            return None;
        }
        self.counters.collectives_started += 1;
        self.colls.push_back(Coll {
            seq,
            error: None,
            reference: None,
            started: Mask::EMPTY,
            errored: Mask::EMPTY,
            ready: false,
            failed: false,
            roles: Roles::default(),
            up_done: 0,
            down_done: 0,
            prog_done: vec![0; self.children.len()],
            prog_sent: vec![0; self.children.len()],
            delivered: 0,
            up_prog_sent: 0,
            dcount: vec![0; self.conns.len()],
            unacked_data: vec![VecDeque::new(); self.conns.len()],
        });
        Some(self.colls.len() - 1)
    }

    fn make_ready(&mut self, seq: u32, events: &mut VecDeque<SwitchEvent>) {
        let ci = self.coll_index(seq).expect("exists");
        let r = self.colls[ci].reference.expect("every child started");
        let all = self.all_children;
        let bit_of =
            |rules_idx: usize, conns: &[Conn]| Mask::bit(conns[rules_idx].ord.expect("child"));
        let kr = if r.op.rooted() {
            self.children
                .iter()
                .copied()
                .find(|&c| self.conns[c].ranks.binary_search(&r.op.root).is_ok())
        } else {
            None
        };
        let parent_has_ranks = self.parent.is_some_and(|p| !self.conns[p].ranks.is_empty());
        let mut roles = Roles::default();
        let mut error = None;
        match r.op.primitive {
            Primitive::AllReduce => {
                roles.contributors = all;
                if self.parent.is_some() {
                    roles.up_to_parent = true;
                    roles.down_expected = r.chunks;
                    roles.down_data = all;
                } else {
                    roles.up_data = all;
                }
            }
            Primitive::Reduce => {
                roles.contributors = all;
                match (self.parent.is_some(), kr) {
                    (true, Some(k)) => {
                        roles.up_to_parent = true;
                        roles.down_expected = r.chunks;
                        roles.down_data = bit_of(k, &self.conns);
                        roles.dl_children = bit_of(k, &self.conns);
                        roles.deliver_progress = all & !bit_of(k, &self.conns);
                        roles.progress_up = true;
                    }
                    (true, None) => {
                        roles.up_to_parent = true;
                        roles.fwd_progress = all;
                    }
                    (false, Some(k)) => {
                        roles.up_data = bit_of(k, &self.conns);
                        roles.dl_children = bit_of(k, &self.conns);
                        roles.deliver_progress = all & !bit_of(k, &self.conns);
                    }
                    (false, None) => error = Some("Reduce root is not below the tree root"),
                }
            }
            Primitive::Broadcast => match kr {
                Some(k) => {
                    let kb = bit_of(k, &self.conns);
                    let others_have_ranks = !(all & !kb).is_empty() || parent_has_ranks;
                    let k_sends =
                        matches!(self.conns[k].peer, Peer::Host { .. }) || others_have_ranks;
                    if k_sends {
                        roles.contributors = kb;
                        roles.up_data = all & !kb;
                        roles.dl_children = all & !kb;
                        roles.up_to_parent = parent_has_ranks;
                        roles.dl_parent = parent_has_ranks;
                        roles.deliver_progress = kb;
                    }
                }
                None if self.parent.is_some() => {
                    roles.down_expected = r.chunks;
                    roles.down_data = all;
                    roles.dl_children = all;
                    roles.progress_up = true;
                }
                None => error = Some("Broadcast root is not below the tree root"),
            },
        }
        if let Some(e) = error {
            self.counters.protocol_errors += 1;
            tracing::warn!(comm = self.rules.comm_id, seq, root = r.op.root, "{e}");
            self.fail_coll(seq, ErrorCode::Protocol, 0, r.rank, r.op.root, events);
            return;
        }
        let coll = &mut self.colls[ci];
        coll.roles = roles;
        coll.ready = true;
        if let Some(p) = self.parent {
            let msg = CtrlMsg::Start {
                seq,
                count: r.count,
                start_pos: r.start_pos,
                chunks: r.chunks,
                rank: self.min_rank,
            };
            self.send_ctrl(p, &r.op, msg);
            if roles.down_expected > 0 {
                let bytes = r.count.saturating_mul(r.op.datatype.size() as u64);
                self.conns[p].rx.push_back(Expect {
                    seq,
                    start_pos: r.start_pos,
                    bytes,
                    next: 0,
                    total: roles.down_expected,
                });
            }
        }
        // Contributions that arrived before every Start did.
        let mut done: Vec<(u64, usize)> = (0..self.slots)
            .filter(|&s| {
                let m = &self.meta[s];
                m.state == SlotState::Filling && m.seq == seq && m.arrived == roles.contributors
            })
            .map(|s| (self.meta[s].pos, s))
            .collect();
        done.sort_unstable();
        for (_, s) in done {
            self.meta[s].state = SlotState::Complete;
            self.emit.push_back(s);
        }
        self.try_emit();
        self.flush_all_progress();
        self.maybe_retire(seq);
    }

    // ---- data -------------------------------------------------------------------

    fn on_data(
        &mut self,
        idx: usize,
        payload: &[u8],
        events: &mut VecDeque<SwitchEvent>,
    ) -> Disposition {
        let Some(&e) = self.conns[idx].rx.front() else {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        };
        let Some(ci) = self.coll_index(e.seq).filter(|&ci| !self.colls[ci].failed) else {
            self.advance(idx);
            return Disposition::Accept;
        };
        let (_, len) = coll::chunk_range(e.next, e.bytes, self.mtu);
        if payload.len() != len {
            self.counters.protocol_errors += 1;
            self.advance(idx);
            let rank = self.conns[idx].ranks.first().copied().unwrap_or(NO_RANK);
            tracing::warn!(
                comm = self.rules.comm_id,
                connection = idx,
                seq = e.seq,
                chunk = e.next,
                "chunk of {} bytes, expected {len}",
                payload.len()
            );
            self.fail_coll(e.seq, ErrorCode::Protocol, 0, rank, rank, events);
            return Disposition::Accept;
        }
        if Some(idx) == self.parent {
            self.on_parent_data(idx, ci, payload)
        } else {
            self.on_child_data(idx, ci, e, payload)
        }
    }

    fn advance(&mut self, idx: usize) {
        let rx = &mut self.conns[idx].rx;
        if let Some(e) = rx.front_mut() {
            e.next += 1;
            if e.next >= e.total {
                rx.pop_front();
            }
        }
    }

    fn on_child_data(&mut self, idx: usize, ci: usize, e: Expect, payload: &[u8]) -> Disposition {
        let ord = self.conns[idx].ord.expect("child");
        let pos = e.start_pos.wrapping_add(e.next);
        let s = (pos % self.slots as u64) as usize;
        let m = self.meta[s];
        match m.state {
            SlotState::Free => {
                self.meta[s] = SlotMeta {
                    state: SlotState::Filling,
                    seq: e.seq,
                    pos,
                    arrived: Mask::EMPTY,
                    len: payload.len(),
                };
            }
            _ if m.pos == pos && m.seq == e.seq => {}
            _ if m.pos < pos => {
                // The slot still holds an older chunk: back-pressure, never drop.
                self.counters.slot_conflicts += 1;
                return Disposition::Rnr;
            }
            _ => {
                self.counters.protocol_errors += 1;
                self.advance(idx);
                return Disposition::Accept;
            }
        }
        if self.meta[s].arrived.has(ord) || self.meta[s].state == SlotState::Complete {
            self.counters.protocol_errors += 1;
            self.advance(idx);
            return Disposition::Accept;
        }
        let op = self.colls[ci].reference.expect("started").op;
        let base = s * self.stride;
        if self.det {
            let at = base + ord * self.mtu;
            self.buf[at..at + payload.len()].copy_from_slice(payload);
        } else if self.meta[s].arrived.is_empty() {
            self.buf[base..base + payload.len()].copy_from_slice(payload);
        } else {
            reduce::combine_be(
                op.operator,
                op.datatype,
                &mut self.buf[base..base + payload.len()],
                payload,
            );
        }
        self.meta[s].arrived |= Mask::bit(ord);
        self.advance(idx);
        let coll = &self.colls[ci];
        if coll.ready {
            if !coll.roles.contributors.has(ord) {
                self.counters.protocol_errors += 1;
            } else if self.meta[s].arrived == coll.roles.contributors {
                self.meta[s].state = SlotState::Complete;
                self.emit.push_back(s);
                self.try_emit();
            }
        }
        Disposition::Accept
    }

    fn on_parent_data(&mut self, idx: usize, ci: usize, payload: &[u8]) -> Disposition {
        let roles = self.colls[ci].roles;
        if bits(roles.down_data).any(|o| !self.data_room(self.children[o])) {
            self.counters.backpressure_rnr += 1;
            return Disposition::Rnr;
        }
        for o in bits(roles.down_data) {
            let c = self.children[o];
            let psn = Self::send_data(&mut self.conns[c], payload);
            self.note_sent(ci, o, c, psn);
        }
        self.counters.chunks_down += 1;
        let coll = &mut self.colls[ci];
        coll.down_done += 1;
        let seq = coll.seq;
        self.advance(idx);
        self.flush_progress(ci, false);
        self.maybe_retire(seq);
        Disposition::Accept
    }

    fn on_parent_progress(&mut self, seq: u32, completed: u64) {
        let Some(ci) = self.coll_index(seq) else {
            self.counters.protocol_errors += 1;
            return;
        };
        if self.colls[ci].failed {
            return;
        }
        let coll = &mut self.colls[ci];
        let completed = completed.min(coll.chunks());
        if coll.roles.dl_parent {
            let p = self.parent.expect("dl_parent only below the root");
            coll.dcount[p] = coll.dcount[p].max(completed);
            self.update_delivered(ci);
        }
        let coll = &mut self.colls[ci];
        for o in bits(coll.roles.fwd_progress) {
            coll.prog_done[o] = coll.prog_done[o].max(completed);
        }
        self.flush_progress(ci, true);
        self.maybe_retire(seq);
    }

    /// A child switch reports chunks delivered below it.
    fn on_child_progress(&mut self, idx: usize, seq: u32, completed: u64) {
        let Some(ci) = self.coll_index(seq) else {
            self.counters.protocol_errors += 1;
            return;
        };
        let ord = self.conns[idx].ord.expect("child");
        let roles = self.colls[ci].roles;
        if self.colls[ci].failed || !roles.dl_children.has(ord) || self.is_host(idx) {
            self.counters.protocol_errors += 1;
            return;
        }
        let coll = &mut self.colls[ci];
        coll.dcount[idx] = coll.dcount[idx].max(completed.min(coll.chunks()));
        self.update_delivered(ci);
        self.flush_progress(ci, true);
        self.maybe_retire(seq);
    }

    fn is_host(&self, idx: usize) -> bool {
        matches!(self.conns[idx].peer, Peer::Host { .. })
    }

    /// Remembers data sent to a receiving host whose ACKs measure delivery.
    fn note_sent(&mut self, ci: usize, ord: usize, idx: usize, psn: Option<Psn>) {
        if self.colls[ci].roles.dl_children.has(ord) && self.is_host(idx) {
            self.colls[ci].unacked_data[idx].extend(psn);
        }
    }

    /// Recomputes the delivered count: the minimum over the delivery sources, or the
    /// chunks sent on when nobody beyond this switch needs them.
    fn update_delivered(&mut self, ci: usize) {
        let parent = self.parent;
        let coll = &mut self.colls[ci];
        let r = coll.roles;
        if r.deliver_progress.is_empty() && !r.progress_up {
            return;
        }
        let mut d = u64::MAX;
        for o in bits(r.dl_children) {
            d = d.min(coll.dcount[self.children[o]]);
        }
        if r.dl_parent {
            d = d.min(coll.dcount[parent.expect("dl_parent only below the root")]);
        }
        if d == u64::MAX {
            d = coll.up_done;
        }
        coll.delivered = coll.delivered.max(d.min(coll.chunks()));
        for o in bits(r.deliver_progress) {
            coll.prog_done[o] = coll.prog_done[o].max(coll.delivered);
        }
    }

    /// Counts data a receiving host has ACKed (called after an ACK on `idx`).
    fn acked_results(&mut self, idx: usize) {
        let oldest = self.conns[idx].rc.oldest_unacked();
        for ci in 0..self.colls.len() {
            let coll = &mut self.colls[ci];
            if coll.failed || coll.unacked_data[idx].is_empty() {
                continue;
            }
            let q = &mut coll.unacked_data[idx];
            let before = q.len();
            while q.front().is_some_and(|p| oldest.is_none_or(|o| p.is_before(o))) {
                q.pop_front();
            }
            let n = (before - q.len()) as u64;
            if n > 0 {
                coll.dcount[idx] += n;
                self.update_delivered(ci);
            }
        }
    }

    /// Sends completed chunks on, in completion order, while the send queues have room.
    fn try_emit(&mut self) {
        while let Some(&s) = self.emit.front() {
            let m = self.meta[s];
            let Some(ci) = self.coll_index(m.seq).filter(|&ci| !self.colls[ci].failed) else {
                self.meta[s] = FREE;
                self.emit.pop_front();
                continue;
            };
            let roles = self.colls[ci].roles;
            let parent_room = !roles.up_to_parent || self.parent.is_none_or(|p| self.data_room(p));
            if !parent_room || bits(roles.up_data).any(|o| !self.data_room(self.children[o])) {
                break;
            }
            let op = self.colls[ci].reference.expect("ready").op;
            let base = s * self.stride;
            if self.det {
                // Combine in child order for run-to-run identical floats.
                let mut first = None;
                for o in bits(roles.contributors) {
                    match first {
                        None => first = Some(o),
                        Some(f) => {
                            let (a, b) =
                                self.buf[base..base + self.stride].split_at_mut(o * self.mtu);
                            reduce::combine_be(
                                op.operator,
                                op.datatype,
                                &mut a[f * self.mtu..f * self.mtu + m.len],
                                &b[..m.len],
                            );
                        }
                    }
                }
                let f = first.unwrap_or(0);
                if f != 0 {
                    self.buf.copy_within(base + f * self.mtu..base + f * self.mtu + m.len, base);
                }
            }
            let data = &self.buf[base..base + m.len];
            if roles.up_to_parent {
                if let Some(p) = self.parent {
                    Self::send_data(&mut self.conns[p], data);
                }
            }
            for o in bits(roles.up_data) {
                let c = self.children[o];
                let psn = Self::send_data(&mut self.conns[c], data);
                // Inline `note_sent`: `data` borrows the slot buffer.
                if roles.dl_children.has(o) && matches!(self.conns[c].peer, Peer::Host { .. }) {
                    self.colls[ci].unacked_data[c].extend(psn);
                }
            }
            self.meta[s] = FREE;
            self.emit.pop_front();
            self.counters.chunks_aggregated += 1;
            self.colls[ci].up_done += 1;
            self.update_delivered(ci);
            let seq = self.colls[ci].seq;
            self.flush_progress(ci, false);
            self.maybe_retire(seq);
        }
    }

    fn flush_all_progress(&mut self) {
        for ci in 0..self.colls.len() {
            let force = !self.colls[ci].roles.fwd_progress.is_empty();
            self.flush_progress(ci, force);
        }
        // ACKs can finish a collective (Reduce delivery, progress finally sent).
        let mut ci = 0;
        while ci < self.colls.len() {
            let (seq, before) = (self.colls[ci].seq, self.colls.len());
            self.maybe_retire(seq);
            if self.colls.len() == before {
                ci += 1;
            }
        }
    }

    /// Sends progress messages that are due: every `progress_every` chunks, at the end,
    /// or at once for forwarded progress (already coalesced upstream).
    fn flush_progress(&mut self, ci: usize, force: bool) {
        let coll = &self.colls[ci];
        if !coll.ready || coll.failed {
            return;
        }
        let roles = coll.roles;
        let targets = roles.deliver_progress | roles.fwd_progress;
        let chunks = coll.chunks();
        let seq = coll.seq;
        let op = coll.reference.expect("ready").op;
        if roles.progress_up {
            let (done, sent) = (self.colls[ci].delivered, self.colls[ci].up_prog_sent);
            if done > sent && (force || done - sent >= self.progress_every || done == chunks) {
                let p = self.parent.expect("progress_up only below the root");
                if self.send_ctrl(p, &op, CtrlMsg::Progress { seq, completed: done }) {
                    self.counters.progress_sent += 1;
                    self.colls[ci].up_prog_sent = done;
                }
            }
        }
        for o in bits(targets) {
            let (done, sent) = (self.colls[ci].prog_done[o], self.colls[ci].prog_sent[o]);
            if done > sent && (force || done - sent >= self.progress_every || done == chunks) {
                let c = self.children[o];
                if self.send_ctrl(c, &op, CtrlMsg::Progress { seq, completed: done }) {
                    self.counters.progress_sent += 1;
                    self.colls[ci].prog_sent[o] = done;
                }
            }
        }
    }

    /// Drops a collective's state once nothing more will arrive for it.
    fn maybe_retire(&mut self, seq: u32) {
        let Some(ci) = self.coll_index(seq) else { return };
        let c = &self.colls[ci];
        let done = if c.failed {
            (c.started | c.errored) == self.all_children
        } else if c.ready {
            let r = &c.roles;
            let chunks = c.chunks();
            let up_total = if r.contributors.is_empty() { 0 } else { chunks };
            let prog = r.deliver_progress | r.fwd_progress;
            c.up_done >= up_total
                && c.down_done >= r.down_expected
                && bits(prog).all(|o| c.prog_sent[o] >= chunks)
                && (!r.progress_up || c.up_prog_sent >= chunks)
        } else {
            false
        };
        if done {
            if !c.failed {
                self.counters.collectives_completed += 1;
            }
            self.colls.remove(ci);
            if self.retired.len() == RETIRED_MEMORY {
                self.retired.pop_front();
            }
            self.retired.push_back(seq);
        }
    }

    fn fail_coll(
        &mut self,
        seq: u32,
        code: ErrorCode,
        fields: u16,
        rank_a: u16,
        rank_b: u16,
        events: &mut VecDeque<SwitchEvent>,
    ) {
        let Some(ci) = self.coll_index(seq) else { return };
        if self.colls[ci].failed {
            return;
        }
        self.colls[ci].failed = true;
        self.counters.collectives_failed += 1;
        let op = self.colls[ci].reference.map_or(
            CollOp {
                primitive: Primitive::AllReduce,
                operator: inc_wire::Operator::Barrier,
                datatype: DataType::Int32,
                root: inc_wire::IncImm::ALL_RANKS,
            },
            |r| r.op,
        );
        for s in 0..self.slots {
            if self.meta[s].state != SlotState::Free && self.meta[s].seq == seq {
                self.meta[s] = FREE;
            }
        }
        let reason = match code {
            ErrorCode::Mismatch => {
                format!("ranks {rank_a} and {rank_b} disagree on {}", field::names(fields))
            }
            ErrorCode::ConnectionFailed => format!("connection towards rank {rank_a} failed"),
            ErrorCode::Protocol => format!("protocol error near rank {rank_a}"),
        };
        events.push_back(SwitchEvent::CollectiveFailed {
            comm_id: self.rules.comm_id,
            seq,
            reason,
        });
        let msg = CtrlMsg::Error { seq, code, fields, rank_a, rank_b };
        self.colls[ci].error = Some((op, msg));
        for i in 0..self.conns.len() {
            // Also back to where the error came from: on each connection the Error is
            // the delimiter after which no data of `seq` follows.
            if self.send_ctrl(i, &op, msg) {
                self.counters.errors_sent += 1;
            }
        }
        self.maybe_retire(seq);
    }
}
