//! The message-level collective state machine: no PSNs, no ACKs.
//!
//! Used directly by the ibverbs transport (the NIC provides RC) and wrapped by
//! [`HostEngine`](crate::HostEngine) for the userspace RoCEv2 transport.

use std::collections::VecDeque;

use inc_protocol::coll::{self, CollOp, CtrlMsg, ErrorCode, MsgKind};
use inc_wire::{reduce, IncImm, Primitive};

use crate::{CollectiveKind, CollectiveSpec, HostError, OpBuffers};

/// One message to send: the immediate (control messages) and the payload length written
/// into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutMessage {
    /// Immediate data: `Some` for control messages (SEND_ONLY_WITH_IMM), `None` for data.
    pub imm: Option<u32>,
    /// Payload bytes written.
    pub len: usize,
}

/// Whether an incoming message was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Consumed (possibly discarded as stale, see counters).
    Accepted,
    /// Consumed, and it completed this rank's part of a result whose senders wait for
    /// its delivery (a Reduce's root, a Broadcast's receivers, and so every part of a
    /// ReduceScatter): the RC layer ACKs at once, as the senders' completion waits for
    /// that ACK.
    AcceptedAwaited,
    /// Data arrived while no collective that expects it is running: the RC layer
    /// answers with an RNR NAK and the switch resends later.
    NotReady,
}

/// Message-level counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CollectiveCounters {
    /// Collectives started.
    pub started: u64,
    /// Collectives completed successfully.
    pub completed: u64,
    /// Collectives failed.
    pub failed: u64,
    /// Control messages sent.
    pub tx_control: u64,
    /// Data chunks sent.
    pub tx_chunks: u64,
    /// Result/broadcast chunks received.
    pub rx_chunks: u64,
    /// Progress messages received.
    pub rx_progress: u64,
    /// Messages refused because nothing expected them yet.
    pub not_ready: u64,
    /// Messages for another or no collective, or malformed control messages (dropped).
    pub rx_unexpected: u64,
}

/// Configuration of [`HostCollective`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveConfig {
    /// This rank.
    pub rank: u16,
    /// Ranks in the communicator.
    pub world_size: u16,
    /// Payload bytes per chunk (256..=4096, a multiple of 4).
    pub mtu: usize,
    /// W: chunks this host keeps outstanding.
    pub window: u32,
}

/// Collectives (calls) a host keeps on the wire at once on one communicator. Half of the 8 a switch tracks per communicator: a switch
/// retires a collective only once every connection below it confirmed it, so ranks run
/// ahead of it, and a Start beyond its table is RNR-NAKed (the seeded simulation sees
/// such RNRs in lossless runs at 8, none at 4).
pub const MAX_IN_FLIGHT: usize = 4;

/// The buffers of the calls a [`HostCollective`] holds: `call(i)` belongs to the `i`-th
/// oldest call not yet reported by [`HostCollective::poll_completion`]. One
/// [`OpBuffers`] serves a single call; a slice or deque serves several.
pub trait CallBuffers<'a> {
    /// The buffers of the `i`-th oldest call.
    fn call(&self, i: usize) -> Option<&OpBuffers<'a>>;
    /// The same, writable.
    fn call_mut(&mut self, i: usize) -> Option<&mut OpBuffers<'a>>;
}

impl<'a> CallBuffers<'a> for OpBuffers<'a> {
    fn call(&self, i: usize) -> Option<&OpBuffers<'a>> {
        (i == 0).then_some(self)
    }
    fn call_mut(&mut self, i: usize) -> Option<&mut OpBuffers<'a>> {
        (i == 0).then_some(self)
    }
}

impl<'a> CallBuffers<'a> for [OpBuffers<'a>] {
    fn call(&self, i: usize) -> Option<&OpBuffers<'a>> {
        self.get(i)
    }
    fn call_mut(&mut self, i: usize) -> Option<&mut OpBuffers<'a>> {
        self.get_mut(i)
    }
}

impl<'a> CallBuffers<'a> for VecDeque<OpBuffers<'a>> {
    fn call(&self, i: usize) -> Option<&OpBuffers<'a>> {
        self.get(i)
    }
    fn call_mut(&mut self, i: usize) -> Option<&mut OpBuffers<'a>> {
        self.get_mut(i)
    }
}

/// Stands in for the buffers of a call the caller did not pass.
static NO_BUFFERS: OpBuffers<'static> = OpBuffers::None;

/// One collective on the wire (one call).
#[derive(Debug)]
struct Active {
    /// The call it belongs to.
    call: u64,
    spec: CollectiveSpec,
    op: CollOp,
    seq: u32,
    start_pos: u64,
    chunks: u64,
    /// Bytes of the vector (a ReduceScatter or AllGather: of one block).
    bytes: u64,
    /// A ReduceScatter or AllGather: its blocks interleaved on the stream.
    blocks: Option<Interleaved>,
    start_sent: bool,
    sends_data: bool,
    /// Completion comes from result chunks (else from progress messages).
    gets_data: bool,
    /// A Broadcast root or an AllGather rank sends nothing until every earlier
    /// collective completed here: its chunks are not aggregated, so sent earlier they
    /// could reach another rank ahead of an earlier collective's results, and data
    /// messages carry no sequence number. (Contributions may go early: their results
    /// complete in stream order.)
    waits_for_head: bool,
    /// Chunks sent (an AllGather: of this rank's block).
    next_send: u64,
    /// Chunks complete end to end (results received or progress reported; a
    /// ReduceScatter or AllGather: [`Interleaved::completed`]).
    completed: u64,
    /// The network failed this collective before it started here: send the Start (so
    /// the switch's bookkeeping closes) and fail.
    doomed: Option<HostError>,
}

impl Active {
    /// Chunks this rank sends.
    fn chunks_to_send(&self) -> u64 {
        self.blocks.map_or(self.chunks, |b| b.chunks_to_send())
    }

    /// Position, relative to the start, of this rank's `k`-th chunk.
    fn send_position(&self, k: u64) -> u64 {
        self.blocks.map_or(k, |b| b.send_position(k))
    }

    /// Whether data for this rank is still to come.
    fn expects_data(&self) -> bool {
        self.gets_data
            && match self.blocks {
                Some(b) => b.received < b.chunks_to_receive(),
                None => self.completed < self.chunks,
            }
    }

    /// Bytes the send buffer must hold.
    fn send_len(&self, bufs: &OpBuffers<'_>) -> u64 {
        self.blocks.map_or(self.bytes, |b| b.send_len(bufs))
    }
}

/// One call of the caller.
#[derive(Debug)]
struct Call {
    id: u64,
    spec: CollectiveSpec,
    /// On the wire (or failed before), as collective `seq`.
    begun: bool,
    seq: u32,
    outcome: Option<Result<(), HostError>>,
}

/// Where a ReduceScatter or an AllGather stands on this rank. Both put their `world`
/// blocks on the stream interleaved (`coll::gather_position`: chunk `k` of block `b` at
/// position `k * world + b`), so that every block flows at once. An AllGather rank
/// sends its block's chunks and receives every other position; a ReduceScatter rank
/// sends every position (the whole vector, which the switches sum) and receives its
/// own block's.
#[derive(Debug, Clone, Copy)]
struct Interleaved {
    /// A ReduceScatter (else an AllGather).
    scatter: bool,
    world: u16,
    rank: u16,
    /// Bytes of one block.
    block_bytes: u64,
    /// Chunks of one block.
    per_block: u64,
    /// Chunks received.
    received: u64,
    /// A ReduceScatter: positions the switches reported complete (Progress).
    reported: u64,
}

impl Interleaved {
    fn positions(&self) -> u64 {
        self.per_block * u64::from(self.world)
    }

    fn chunks_to_send(&self) -> u64 {
        if self.scatter {
            self.positions()
        } else {
            self.per_block
        }
    }

    fn chunks_to_receive(&self) -> u64 {
        if self.scatter {
            self.per_block
        } else {
            self.per_block * u64::from(self.world - 1)
        }
    }

    /// Position of the `k`-th chunk sent.
    fn send_position(&self, k: u64) -> u64 {
        if self.scatter {
            k
        } else {
            k * u64::from(self.world) + u64::from(self.rank)
        }
    }

    /// Block (its rank) and chunk of the `k`-th chunk sent.
    fn sent_chunk(&self, k: u64) -> (u16, u64) {
        if self.scatter {
            coll::gather_chunk_at(k, self.world)
        } else {
            (self.rank, k)
        }
    }

    /// Block and chunk of the `i`-th chunk received.
    fn received_chunk(&self, i: u64) -> (u16, u64) {
        if self.scatter {
            return (self.rank, i);
        }
        let others = u64::from(self.world - 1);
        let j = (i % others) as u16;
        (j + u16::from(j >= self.rank), i / others)
    }

    /// Whether the send buffer is the whole vector (else this rank's block).
    fn sends_from_whole(&self, bufs: &OpBuffers<'_>) -> bool {
        self.scatter || matches!(bufs, OpBuffers::InPlace(_))
    }

    /// Whether the receive buffer is the whole vector (else this rank's block).
    fn receives_into_whole(&self, bufs: &OpBuffers<'_>) -> bool {
        !self.scatter || matches!(bufs, OpBuffers::InPlace(_))
    }

    /// Byte offset of `block` in the send buffer.
    fn send_offset(&self, block: u16, bufs: &OpBuffers<'_>) -> u64 {
        u64::from(block) * self.block_bytes * u64::from(self.sends_from_whole(bufs))
    }

    /// Byte offset of `block` in the receive buffer.
    fn recv_offset(&self, block: u16, bufs: &OpBuffers<'_>) -> u64 {
        u64::from(block) * self.block_bytes * u64::from(self.receives_into_whole(bufs))
    }

    fn send_len(&self, bufs: &OpBuffers<'_>) -> u64 {
        let blocks = if self.sends_from_whole(bufs) { u64::from(self.world) } else { 1 };
        blocks * self.block_bytes
    }

    fn recv_len(&self, bufs: &OpBuffers<'_>) -> u64 {
        let blocks = if self.receives_into_whole(bufs) { u64::from(self.world) } else { 1 };
        blocks * self.block_bytes
    }

    /// Positions complete end to end. An AllGather: those before the first that is
    /// neither this rank's and sent (`sent` of its chunks are) nor another's and
    /// received. A ReduceScatter: what the switches reported, and at least up to this
    /// rank's last result (results complete in stream order).
    fn completed(&self, sent: u64) -> u64 {
        let world = u64::from(self.world);
        let rank = u64::from(self.rank);
        if self.scatter {
            let own = if self.received > 0 { (self.received - 1) * world + rank + 1 } else { 0 };
            return own.max(self.reported).min(self.positions());
        }
        let own = if sent < self.per_block { sent * world + rank } else { u64::MAX };
        let other = if self.received < self.chunks_to_receive() {
            let (block, k) = self.received_chunk(self.received);
            k * world + u64::from(block)
        } else {
            u64::MAX
        };
        own.min(other).min(self.positions())
    }
}

/// What a collective puts on the wire, checked.
struct WirePlan {
    op: CollOp,
    count: u64,
    bytes: u64,
    chunks: u64,
    sends_data: bool,
    gets_data: bool,
}

/// The bytes a rank sends from.
fn send_source<'a>(bufs: &'a OpBuffers<'_>) -> &'a [u8] {
    match bufs {
        OpBuffers::Separate { src, .. } | OpBuffers::SendOnly(src) => src,
        OpBuffers::InPlace(b) => b,
        _ => &[],
    }
}

/// The collective state machine of one rank in one communicator.
///
/// Calls run in start order. Up to [`MAX_IN_FLIGHT`] collectives are on the wire at
/// once: the next one's Start and chunks follow the previous one's last chunk instead
/// of its last result, within one window W counted over the communicator's stream
/// positions, so the switches' slots stay O(W).
#[derive(Debug)]
pub struct HostCollective {
    cfg: CollectiveConfig,
    /// Sequence number of the next collective to begin.
    seq: u32,
    /// Stream position of the next collective to begin.
    next_pos: u64,
    /// Calls not yet reported, oldest first.
    calls: VecDeque<Call>,
    /// Id of the next call.
    next_call: u64,
    /// Collectives on the wire, in stream order.
    active: VecDeque<Active>,
    /// An Error for a collective we have not begun yet.
    early_error: Option<(u32, HostError)>,
    counters: CollectiveCounters,
}

impl HostCollective {
    /// A state machine at the start of the communicator's stream.
    pub fn new(cfg: CollectiveConfig) -> Self {
        HostCollective {
            cfg,
            seq: 0,
            next_pos: 0,
            calls: VecDeque::new(),
            next_call: 0,
            active: VecDeque::new(),
            early_error: None,
            counters: CollectiveCounters::default(),
        }
    }

    /// Configuration.
    pub fn config(&self) -> &CollectiveConfig {
        &self.cfg
    }

    /// Counters.
    pub fn counters(&self) -> &CollectiveCounters {
        &self.counters
    }

    /// Sequence number of the oldest collective on the wire (or of the next one).
    pub fn seq(&self) -> u32 {
        self.active.front().map_or(self.seq, |a| a.seq)
    }

    /// True while a call runs (started and without an outcome).
    pub fn is_active(&self) -> bool {
        self.calls.iter().any(|c| c.outcome.is_none())
    }

    /// Whether [`Self::enqueue`] takes another call.
    pub fn has_room(&self) -> bool {
        self.calls.len() < MAX_IN_FLIGHT
    }

    /// Chunks complete / total of the oldest collective on the wire.
    pub fn progress(&self) -> Option<(u64, u64)> {
        self.active.front().map(|a| (a.completed, a.chunks))
    }

    /// Receive buffers (of `mtu` bytes, or [`coll::HEADER_LEN`] if larger) a verbs host
    /// must keep posted so the switch never meets an RNR in steady state, when it runs
    /// one call at a time ([`Self::start`]).
    pub fn recv_depth(&self) -> u32 {
        2 * self.cfg.window + 8
    }

    /// Starts a collective, the only call: fails while another one runs. An outcome
    /// nobody collected is dropped.
    pub fn start(&mut self, spec: CollectiveSpec) -> Result<(), HostError> {
        while self.calls.front().is_some_and(|c| c.outcome.is_some()) {
            self.calls.pop_front();
        }
        if !self.calls.is_empty() {
            return Err(HostError::Busy { seq: self.seq() });
        }
        self.enqueue(spec)
    }

    /// Starts a collective behind the calls already held (at most [`MAX_IN_FLIGHT`]);
    /// outcomes come out of [`Self::poll_completion`] in call order, and the buffers
    /// passed to the other methods are the calls' in that order ([`CallBuffers`]).
    pub fn enqueue(&mut self, spec: CollectiveSpec) -> Result<(), HostError> {
        if !self.has_room() {
            return Err(HostError::Busy { seq: self.seq() });
        }
        let block_bytes = spec
            .count
            .checked_mul(spec.dtype.size() as u64)
            .ok_or_else(|| HostError::InvalidSpec(format!("count {} overflows", spec.count)))?;
        if spec.kind.is_blockwise()
            && block_bytes.checked_mul(u64::from(self.cfg.world_size)).is_none()
        {
            return Err(HostError::InvalidSpec(format!(
                "{} blocks of {block_bytes} bytes overflow",
                self.cfg.world_size
            )));
        }
        self.wire_plan(spec)?;
        let id = self.next_call;
        self.next_call += 1;
        self.calls.push_back(Call { id, spec, begun: false, seq: self.seq, outcome: None });
        self.counters.started += 1;
        self.pump();
        Ok(())
    }

    /// Checks a collective and works out what it puts on the wire.
    fn wire_plan(&self, spec: CollectiveSpec) -> Result<WirePlan, HostError> {
        let (primitive, root) = match spec.kind {
            CollectiveKind::AllReduce | CollectiveKind::Barrier => {
                (Primitive::AllReduce, IncImm::ALL_RANKS)
            }
            CollectiveKind::Reduce { root } => (Primitive::Reduce, root),
            CollectiveKind::Broadcast { root } => (Primitive::Broadcast, root),
            CollectiveKind::AllGather => (Primitive::AllGather, IncImm::ALL_RANKS),
            // A Reduce to every rank: block r to rank r.
            CollectiveKind::ReduceScatter => (Primitive::Reduce, IncImm::ALL_RANKS),
        };
        if root != IncImm::ALL_RANKS && root >= self.cfg.world_size {
            return Err(HostError::InvalidSpec(format!(
                "root rank {root} is not in the communicator (world size {})",
                self.cfg.world_size
            )));
        }
        let barrier = matches!(spec.kind, CollectiveKind::Barrier);
        let operator = if barrier { inc_wire::Operator::Barrier } else { spec.op };
        if !barrier && operator == inc_wire::Operator::Barrier {
            return Err(HostError::InvalidSpec(
                "operator Barrier is only valid for a barrier".into(),
            ));
        }
        // A pair the tables refuse (a bitwise operator on a float type) would go out in
        // an immediate every switch refuses, and every rank would wait for its timeout.
        operator.check(spec.dtype).map_err(|e| HostError::InvalidSpec(e.to_string()))?;
        let count = if barrier { 0 } else { spec.count };
        let elem = spec.dtype.size() as u64;
        let bytes = count
            .checked_mul(elem)
            .ok_or_else(|| HostError::InvalidSpec(format!("count {count} overflows")))?;
        let world = self.cfg.world_size;
        let chunks = match spec.kind.is_blockwise() {
            true => coll::gather_chunks(count, elem as usize, self.cfg.mtu, world),
            false => coll::chunk_count(count, elem as usize, self.cfg.mtu),
        };
        let me = self.cfg.rank;
        let (sends_data, gets_data) = match spec.kind {
            CollectiveKind::Reduce { root } => (true, root == me),
            CollectiveKind::Broadcast { root } => (root == me, root != me),
            CollectiveKind::AllGather => (true, world > 1),
            _ => (true, true),
        };
        let op = CollOp { primitive, operator, datatype: spec.dtype, root };
        Ok(WirePlan { op, count, bytes, chunks, sends_data, gets_data })
    }

    /// Puts the next calls on the wire, in call order (the same order on every rank),
    /// while fewer than [`MAX_IN_FLIGHT`] are.
    fn pump(&mut self) {
        while self.active.len() < MAX_IN_FLIGHT {
            let Some(call) = self.calls.iter_mut().find(|c| c.outcome.is_none() && !c.begun) else {
                return;
            };
            call.begun = true;
            call.seq = self.seq;
            let (id, spec) = (call.id, call.spec);
            let wire = match self.wire_plan(spec) {
                Ok(w) => w,
                Err(e) => {
                    self.fail_call(id, e);
                    continue;
                }
            };
            let seq = self.seq;
            self.seq = seq.wrapping_add(1);
            let start_pos = self.next_pos;
            // The stream advances by this collective's chunks whatever its outcome, so
            // later collectives stay aligned when only the operation disagreed.
            self.next_pos += wire.chunks;
            let doomed = match self.early_error.take() {
                Some((s, e)) if s == seq => Some(e),
                other => {
                    self.early_error = other;
                    None
                }
            };
            let waits_for_head = match spec.kind {
                CollectiveKind::Broadcast { root } => root == self.cfg.rank,
                CollectiveKind::AllGather => true,
                _ => false,
            };
            let blocks = spec.kind.is_blockwise().then(|| Interleaved {
                scatter: spec.kind == CollectiveKind::ReduceScatter,
                world: self.cfg.world_size,
                rank: self.cfg.rank,
                block_bytes: wire.bytes,
                per_block: coll::chunks_of_blocks(wire.chunks, self.cfg.world_size, 1),
                received: 0,
                reported: 0,
            });
            self.active.push_back(Active {
                call: id,
                spec: CollectiveSpec { count: wire.count, ..spec },
                op: wire.op,
                seq,
                start_pos,
                chunks: wire.chunks,
                bytes: wire.bytes,
                blocks,
                start_sent: false,
                sends_data: wire.sends_data,
                gets_data: wire.gets_data,
                waits_for_head,
                next_send: 0,
                completed: 0,
                doomed,
            });
        }
    }

    /// Index into the caller's buffers of the call `id`.
    fn call_index(&self, id: u64) -> usize {
        self.calls.iter().position(|c| c.id == id).expect("an active collective's call is held")
    }

    /// The collective that sends next, if the window allows: the first one on the wire
    /// with something left to send (a collective's messages follow the previous one's).
    fn sender(&self) -> Option<usize> {
        let front = self.active.front()?;
        let limit = front.start_pos + front.completed + u64::from(self.cfg.window);
        for (i, a) in self.active.iter().enumerate() {
            if a.waits_for_head && i > 0 {
                return None;
            }
            if !a.start_sent {
                // A Start may carry the collective's one chunk: window it like one.
                return (!a.sends_data || a.start_pos < limit).then_some(i);
            }
            if a.sends_data && a.next_send < a.chunks_to_send() {
                return (a.start_pos + a.send_position(a.next_send) < limit).then_some(i);
            }
        }
        None
    }

    /// Whether [`Self::poll_send`] has a message now (a Start, or data the window
    /// allows), so a caller can skip fetching a buffer for nothing.
    pub fn has_send(&self) -> bool {
        self.sender().is_some()
    }

    /// Writes the next message to send into `out` (at least `mtu` bytes), if the window
    /// allows one.
    pub fn poll_send<'a, B: CallBuffers<'a> + ?Sized>(
        &mut self,
        bufs: &B,
        out: &mut [u8],
    ) -> Option<OutMessage> {
        let i = self.sender()?;
        let bufs = bufs.call(self.call_index(self.active[i].call)).unwrap_or(&NO_BUFFERS);
        let a = &mut self.active[i];
        if !a.start_sent {
            let msg = CtrlMsg::Start {
                seq: a.seq,
                count: a.spec.count,
                start_pos: a.start_pos,
                chunks: a.chunks,
                rank: self.cfg.rank,
            };
            a.start_sent = true;
            let (call, doomed) = (a.call, a.doomed.take());
            self.counters.tx_control += 1;
            // A collective of one chunk that fits behind the header goes as one message
            // (a send buffer too short fails the collective after a plain Start, as for
            // longer collectives).
            let with_data = a.sends_data
                && a.chunks == 1
                && coll::HEADER_LEN as u64 + a.bytes <= self.cfg.mtu as u64
                && send_source(bufs).len() as u64 >= a.send_len(bufs);
            let sent = if with_data {
                let imm = msg.emit_start_with_data(&a.op, out);
                self.write_chunk(i, bufs, &mut out[coll::HEADER_LEN..])
                    .map(|len| OutMessage { imm: Some(imm), len: coll::HEADER_LEN + len })
            } else {
                msg.emit(out);
                Some(OutMessage { imm: Some(a.op.imm(MsgKind::Start)), len: coll::HEADER_LEN })
            };
            if let Some(e) = doomed {
                self.fail_call(call, e);
            } else if self.active[i].blocks.is_some() {
                // An AllGather of one rank and one chunk completes by sending it.
                self.check_done(i);
            }
            return sent;
        }
        let sent = self.write_chunk(i, bufs, out).map(|len| OutMessage { imm: None, len });
        // An AllGather rank whose block comes last completes by sending it.
        if self.active.get(i).is_some_and(|a| a.blocks.is_some()) {
            self.check_done(i);
        }
        sent
    }

    /// Writes the next data chunk of collective `i`, in network byte order, to the
    /// front of `out`; returns its length (`None`, and the call failed, if the user's
    /// buffer is too short).
    fn write_chunk(&mut self, i: usize, bufs: &OpBuffers<'_>, out: &mut [u8]) -> Option<usize> {
        let a = &mut self.active[i];
        let (block, chunk) = a.blocks.map_or((0, a.next_send), |b| b.sent_chunk(a.next_send));
        let (off, len) = coll::chunk_range(chunk, a.bytes, self.cfg.mtu);
        if len > 0 {
            let src = send_source(bufs);
            let off = a.blocks.map_or(0, |b| b.send_offset(block, bufs)) + off;
            let Some(chunk) = usize::try_from(off).ok().and_then(|o| src.get(o..o + len)) else {
                let need = a.send_len(bufs);
                let call = a.call;
                let e = HostError::Buffer { what: "send buffer", need, have: src.len() as u64 };
                self.fail_call(call, e);
                return None;
            };
            reduce::to_network(a.spec.dtype, chunk, &mut out[..len]);
        }
        a.next_send += 1;
        if let Some(b) = a.blocks {
            a.completed = b.completed(a.next_send);
        }
        self.counters.tx_chunks += 1;
        Some(len)
    }

    /// Handles one received message (immediate and payload).
    pub fn handle_message<'a, B: CallBuffers<'a> + ?Sized>(
        &mut self,
        imm: Option<u32>,
        payload: &[u8],
        bufs: &mut B,
    ) -> Delivery {
        match imm {
            Some(imm) => {
                self.handle_control(imm, payload);
                Delivery::Accepted
            }
            None => self.handle_data(payload, bufs),
        }
    }

    fn handle_control(&mut self, imm: u32, payload: &[u8]) {
        let Ok((_, msg)) = CtrlMsg::parse(imm, payload) else {
            self.counters.rx_unexpected += 1;
            return;
        };
        if let CtrlMsg::Error { seq, .. } = msg {
            // An Error for a collective we have not begun (it can overtake the last
            // message of a running one): keep it for when that collective begins.
            if seq.wrapping_sub(self.seq) < 1 << 30 {
                if self.early_error.as_ref().is_none_or(|(s, _)| seq.wrapping_sub(*s) >= 1 << 30) {
                    self.early_error = Some((seq, error_of(msg)));
                }
                return;
            }
        }
        let Some(i) = self.active.iter().position(|a| a.seq == msg.seq()) else {
            self.counters.rx_unexpected += 1;
            return;
        };
        let a = &mut self.active[i];
        let scatter = a.blocks.is_some_and(|b| b.scatter);
        match msg {
            CtrlMsg::Progress { completed, .. } if !a.gets_data || scatter => {
                self.counters.rx_progress += 1;
                match &mut a.blocks {
                    Some(b) => {
                        b.reported = b.reported.max(completed);
                        a.completed = b.completed(a.next_send);
                    }
                    None => a.completed = a.completed.max(completed.min(a.chunks)),
                }
                self.check_done(i);
            }
            CtrlMsg::Error { .. } => {
                let call = a.call;
                self.fail_call(call, error_of(msg));
            }
            _ => self.counters.rx_unexpected += 1,
        }
    }

    fn handle_data<'a, B: CallBuffers<'a> + ?Sized>(
        &mut self,
        payload: &[u8],
        bufs: &mut B,
    ) -> Delivery {
        // Data for this rank arrives in stream order (see `Active::waits_for_head`):
        // it belongs to the oldest collective still expecting some.
        let Some(i) = self.active.iter().position(Active::expects_data) else {
            // Nothing running expects data: it belongs to a collective not started yet.
            self.counters.not_ready += 1;
            return Delivery::NotReady;
        };
        let call_index = self.call_index(self.active[i].call);
        let a = &mut self.active[i];
        // Which chunk of which block: a result is the next chunk of the vector, a
        // ReduceScatter's the next of this rank's block, an AllGather's the next
        // position of another rank's block.
        let (block, chunk) = match a.blocks {
            Some(b) => b.received_chunk(b.received),
            None => (0, a.completed),
        };
        let (off, len) = coll::chunk_range(chunk, a.bytes, self.cfg.mtu);
        if payload.len() != len {
            let e = HostError::Protocol(format!(
                "chunk {chunk} (block {block}) of collective {} has {} bytes, expected {len}",
                a.seq,
                payload.len()
            ));
            let call = a.call;
            self.fail_call(call, e);
            return Delivery::Accepted;
        }
        if len > 0 {
            let mut none = OpBuffers::None;
            let bufs = bufs.call_mut(call_index).unwrap_or(&mut none);
            let off = a.blocks.map_or(0, |b| b.recv_offset(block, bufs)) + off;
            let dst: &mut [u8] = match bufs {
                OpBuffers::Separate { dst, .. } | OpBuffers::RecvOnly(dst) => dst,
                OpBuffers::InPlace(b) => b,
                _ => &mut [],
            };
            let have = dst.len() as u64;
            let Some(out) = usize::try_from(off).ok().and_then(|o| dst.get_mut(o..o + len)) else {
                let need = a.blocks.map_or(a.bytes, |b| b.recv_len(bufs));
                let call = a.call;
                self.fail_call(call, HostError::Buffer { what: "receive buffer", need, have });
                return Delivery::Accepted;
            };
            reduce::from_network(a.spec.dtype, payload, out);
        }
        match &mut a.blocks {
            Some(b) => {
                b.received += 1;
                a.completed = b.completed(a.next_send);
            }
            None => a.completed += 1,
        }
        self.counters.rx_chunks += 1;
        let awaited = a.completed == a.chunks
            && matches!(
                a.spec.kind,
                CollectiveKind::Reduce { .. } | CollectiveKind::Broadcast { .. }
            );
        self.check_done(i);
        if awaited {
            Delivery::AcceptedAwaited
        } else {
            Delivery::Accepted
        }
    }

    /// Finishes collective `i` if everything of it happened.
    fn check_done(&mut self, i: usize) {
        let a = &self.active[i];
        // A ReduceScatter also waits for the switches' last Progress, which every rank
        // is sent (so none arrives after its collective is gone).
        if !(a.start_sent
            && a.completed >= a.chunks
            && (!a.sends_data || a.next_send >= a.chunks_to_send())
            && a.blocks.is_none_or(|b| !b.scatter || b.reported >= b.positions()))
        {
            return;
        }
        let Some(a) = self.active.remove(i) else { return };
        if let Some(call) = self.calls.iter_mut().find(|c| c.id == a.call) {
            if call.outcome.is_none() {
                call.outcome = Some(Ok(()));
                self.counters.completed += 1;
            }
        }
        self.pump();
    }

    /// Fails call `id`: its collective leaves the wire (the stream keeps its positions)
    /// or never goes on it.
    fn fail_call(&mut self, id: u64, e: HostError) {
        self.active.retain(|a| a.call != id);
        if let Some(call) = self.calls.iter_mut().find(|c| c.id == id) {
            if call.outcome.is_none() {
                tracing::warn!(rank = self.cfg.rank, seq = call.seq, "collective failed: {e}");
                call.outcome = Some(Err(e));
                self.counters.failed += 1;
            }
        }
        self.pump();
    }

    /// Fails every running call with `e` (used by the RC layer for timeouts and
    /// connection failures: the QP's state is unknown).
    pub fn fail(&mut self, e: HostError) {
        let running: Vec<u64> =
            self.calls.iter().filter(|c| c.outcome.is_none()).map(|c| c.id).collect();
        for id in running {
            self.fail_call(id, e.clone());
        }
    }

    /// The outcome of the oldest call, once it has one (outcomes come in call order).
    pub fn poll_completion(&mut self) -> Option<Result<(), HostError>> {
        if self.calls.front()?.outcome.is_some() {
            return self.calls.pop_front().and_then(|c| c.outcome);
        }
        None
    }
}

fn error_of(msg: CtrlMsg) -> HostError {
    let CtrlMsg::Error { seq, code, fields, rank_a, rank_b } = msg else {
        return HostError::Protocol("not an error message".into());
    };
    match code {
        ErrorCode::Mismatch => {
            HostError::Mismatch { seq, fields: coll::field::names(fields), rank_a, rank_b }
        }
        ErrorCode::ConnectionFailed => HostError::Remote {
            seq,
            reason: format!("an RC connection towards rank {rank_a} failed"),
        },
        ErrorCode::Protocol => HostError::Remote {
            seq,
            reason: format!("protocol violation reported near rank {rank_a}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inc_wire::{DataType, Operator};

    fn spec(kind: CollectiveKind, count: u64) -> CollectiveSpec {
        CollectiveSpec { kind, op: Operator::Sum, dtype: DataType::Int32, count }
    }

    #[test]
    fn window_chunking_and_completion() {
        let mut c =
            HostCollective::new(CollectiveConfig { rank: 0, world_size: 2, mtu: 256, window: 2 });
        let count = 130u64; // 520 bytes: chunks of 256, 256, 8
        let src: Vec<u8> = (0..count as u32).flat_map(|x| x.to_ne_bytes()).collect();
        let mut dst = vec![0u8; src.len()];
        c.start(spec(CollectiveKind::AllReduce, count)).unwrap();
        assert!(matches!(
            c.start(spec(CollectiveKind::Barrier, 0)),
            Err(HostError::Busy { seq: 0 })
        ));
        let mut out = vec![0u8; 256];
        let mut bufs = OpBuffers::Separate { src: &src, dst: &mut dst };
        let m = c.poll_send(&bufs, &mut out).unwrap();
        assert_eq!(m.len, coll::HEADER_LEN);
        let (_, start) = CtrlMsg::parse(m.imm.unwrap(), &out).unwrap();
        assert_eq!(start, CtrlMsg::Start { seq: 0, count, start_pos: 0, chunks: 3, rank: 0 });
        let mut chunks = Vec::new();
        while let Some(m) = c.poll_send(&bufs, &mut out) {
            chunks.push(out[..m.len].to_vec());
        }
        assert_eq!(chunks.len(), 2, "window of 2");
        assert_eq!(&chunks[0][..4], &0u32.to_be_bytes(), "network byte order");
        assert_eq!(c.handle_message(None, &chunks[0], &mut bufs), Delivery::Accepted);
        let m = c.poll_send(&bufs, &mut out).unwrap();
        assert_eq!(m.len, 8);
        let last = out[..8].to_vec();
        c.handle_message(None, &chunks[1], &mut bufs);
        c.handle_message(None, &last, &mut bufs);
        assert_eq!(c.poll_completion(), Some(Ok(())));
        assert_eq!(dst, src);
        // Data with nothing running is refused (RNR), the stream moved on by 3 chunks.
        assert_eq!(c.handle_message(None, &last, &mut OpBuffers::None), Delivery::NotReady);
        // A Barrier is one empty chunk: its Start carries it.
        c.start(spec(CollectiveKind::Barrier, 5)).unwrap();
        let m = c.poll_send(&OpBuffers::None, &mut out).unwrap();
        assert_eq!(m.len, coll::HEADER_LEN);
        let (_, start, data) = CtrlMsg::parse_with_data(m.imm.unwrap(), &out[..m.len]).unwrap();
        assert_eq!(start, CtrlMsg::Start { seq: 1, count: 0, start_pos: 3, chunks: 1, rank: 0 });
        assert_eq!(data, Some(&[][..]));
        assert_eq!(c.poll_send(&OpBuffers::None, &mut out), None);
    }

    /// A one-chunk collective whose chunk fits behind the header goes as one message; one
    /// element more and Start and chunk go apart.
    #[test]
    fn small_collective_sends_start_and_chunk_together() {
        let mtu = 256;
        let fits = ((mtu - coll::HEADER_LEN) / 4) as u64;
        for (count, together) in [(1, true), (fits, true), (fits + 1, false)] {
            let mut c =
                HostCollective::new(CollectiveConfig { rank: 1, world_size: 2, mtu, window: 2 });
            let src: Vec<u8> = (0..count as u32).flat_map(|x| x.to_ne_bytes()).collect();
            let mut dst = vec![0u8; src.len()];
            let bufs = OpBuffers::Separate { src: &src, dst: &mut dst };
            c.start(spec(CollectiveKind::AllReduce, count)).unwrap();
            let mut out = vec![0u8; mtu];
            let m = c.poll_send(&bufs, &mut out).unwrap();
            let (_, start, data) = CtrlMsg::parse_with_data(m.imm.unwrap(), &out[..m.len]).unwrap();
            assert_eq!(start, CtrlMsg::Start { seq: 0, count, start_pos: 0, chunks: 1, rank: 1 });
            let data = data.map(<[u8]>::to_vec);
            let chunk = if together {
                assert_eq!(c.poll_send(&bufs, &mut out), None, "{count}: one message");
                data.expect("chunk behind the header")
            } else {
                assert_eq!(data, None, "{count}");
                let m = c.poll_send(&bufs, &mut out).unwrap();
                assert_eq!(m.imm, None);
                out[..m.len].to_vec()
            };
            assert_eq!(chunk.len(), src.len());
            assert_eq!(&chunk[chunk.len() - 4..], &(count as u32 - 1).to_be_bytes());
            assert_eq!(c.counters().tx_chunks, 1);
        }
    }

    #[test]
    fn early_error_fails_the_next_collective() {
        let mut c =
            HostCollective::new(CollectiveConfig { rank: 1, world_size: 2, mtu: 256, window: 2 });
        let op = CollOp {
            primitive: Primitive::AllReduce,
            operator: Operator::Sum,
            datatype: DataType::Int32,
            root: IncImm::ALL_RANKS,
        };
        let err = CtrlMsg::Error {
            seq: 0,
            code: ErrorCode::Mismatch,
            fields: coll::field::COUNT,
            rank_a: 0,
            rank_b: 1,
        };
        c.handle_message(Some(op.imm(MsgKind::Error)), &err.to_bytes(), &mut OpBuffers::None);
        c.start(spec(CollectiveKind::AllReduce, 4)).unwrap();
        let mut out = vec![0u8; 256];
        assert!(c.poll_send(&OpBuffers::None, &mut out).is_some(), "Start still goes out");
        match c.poll_completion() {
            Some(Err(HostError::Mismatch { fields, .. })) => assert_eq!(fields, "count"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn error_overtaking_the_running_collective_is_kept() {
        let mut c =
            HostCollective::new(CollectiveConfig { rank: 0, world_size: 2, mtu: 256, window: 2 });
        let src = vec![0u8; 16];
        c.start(spec(CollectiveKind::Broadcast { root: 0 }, 4)).unwrap();
        let mut out = vec![0u8; 256];
        while c.poll_send(&OpBuffers::SendOnly(&src), &mut out).is_some() {}
        let op = CollOp {
            primitive: Primitive::AllReduce,
            operator: Operator::Max,
            datatype: DataType::Int32,
            root: IncImm::ALL_RANKS,
        };
        let err = CtrlMsg::Error {
            seq: 1,
            code: ErrorCode::Mismatch,
            fields: coll::field::OPERATOR,
            rank_a: 0,
            rank_b: 3,
        };
        c.handle_message(Some(op.imm(MsgKind::Error)), &err.to_bytes(), &mut OpBuffers::None);
        let bop = CollOp {
            primitive: Primitive::Broadcast,
            operator: Operator::Sum,
            datatype: DataType::Int32,
            root: 0,
        };
        let p = CtrlMsg::Progress { seq: 0, completed: 1 };
        c.handle_message(Some(bop.imm(MsgKind::Progress)), &p.to_bytes(), &mut OpBuffers::None);
        assert_eq!(c.poll_completion(), Some(Ok(())));
        c.start(spec(CollectiveKind::AllReduce, 4)).unwrap();
        assert!(c.poll_send(&OpBuffers::SendOnly(&src), &mut out).is_some());
        assert!(matches!(c.poll_completion(), Some(Err(HostError::Mismatch { seq: 1, .. }))));
    }

    /// Calls in flight: the second call's Start and chunks follow the first's last chunk
    /// before the first completes, within one window over the stream; a Broadcast root
    /// waits until it is the oldest; outcomes come in call order with each call's
    /// buffers.
    #[test]
    fn calls_pipeline_within_one_window() {
        let mut c =
            HostCollective::new(CollectiveConfig { rank: 0, world_size: 2, mtu: 256, window: 3 });
        let a: Vec<u8> = (0..128u32).flat_map(|x| x.to_ne_bytes()).collect(); // 2 chunks
        let b: Vec<u8> = (0..192u32).flat_map(|x| (x + 7).to_ne_bytes()).collect(); // 3
        let (mut out_a, mut out_b) = (vec![0u8; a.len()], vec![0u8; b.len()]);
        c.enqueue(spec(CollectiveKind::AllReduce, 128)).unwrap();
        c.enqueue(spec(CollectiveKind::AllReduce, 192)).unwrap();
        c.enqueue(spec(CollectiveKind::Broadcast { root: 0 }, 64)).unwrap();
        assert!(matches!(c.start(spec(CollectiveKind::Barrier, 0)), Err(HostError::Busy { .. })));
        let mut bufs = vec![
            OpBuffers::Separate { src: &a, dst: &mut out_a },
            OpBuffers::Separate { src: &b, dst: &mut out_b },
            OpBuffers::SendOnly(&a[..256]),
        ];
        let mut out = vec![0u8; 256];
        let mut sent = Vec::new();
        while let Some(m) = c.poll_send(&bufs[..], &mut out) {
            sent.push((m.imm, out[..m.len].to_vec()));
        }
        // Start 0, chunks 0-1, Start 1, chunk 2 (position 2): the window of 3 is full.
        assert_eq!(sent.len(), 5, "{sent:?}");
        let (_, second) = CtrlMsg::parse(sent[3].0.unwrap(), &sent[3].1).unwrap();
        assert!(matches!(second, CtrlMsg::Start { seq: 1, start_pos: 2, chunks: 3, .. }));
        // The first call's results: its two chunks complete, the window moves by two.
        c.handle_message(None, &sent[1].1, &mut bufs[..]);
        c.handle_message(None, &sent[2].1, &mut bufs[..]);
        while let Some(m) = c.poll_send(&bufs[..], &mut out) {
            sent.push((m.imm, out[..m.len].to_vec()));
        }
        assert_eq!(sent.len(), 7, "the rest of call 1; the Broadcast root waits");
        for k in [4, 5, 6] {
            c.handle_message(None, &sent[k].1, &mut bufs[..]);
        }
        assert_eq!(c.poll_completion(), Some(Ok(())));
        assert_eq!(c.poll_completion(), Some(Ok(())));
        bufs.drain(..2);
        let m = c.poll_send(&bufs[..], &mut out).expect("the Broadcast goes once it is oldest");
        assert!(m.imm.is_some(), "its Start");
        assert_eq!(c.poll_completion(), None);
        assert_eq!((out_a, out_b), (a.clone(), b));
    }

    /// The chunk that completes a rank's part of a Reduce (at its root) or a Broadcast
    /// (at a receiver) asks for an ACK at once: the senders complete on it. An
    /// AllReduce's never does: no other rank waits for this one's delivery.
    #[test]
    fn only_results_that_senders_wait_for_are_awaited() {
        let cfg = |rank| CollectiveConfig { rank, world_size: 2, mtu: 256, window: 8 };
        let count = 130u64; // chunks of 256, 256 and 8 bytes
        let src = vec![0u8; 4 * count as usize];
        let results: Vec<Vec<u8>> = vec![vec![0; 256], vec![0; 256], vec![0; 8]];
        let mut out = vec![0u8; 256];
        let cases = [
            (CollectiveKind::Reduce { root: 0 }, 0, true),
            (CollectiveKind::Broadcast { root: 0 }, 1, true),
            (CollectiveKind::AllReduce, 0, false),
        ];
        for (kind, rank, awaited) in cases {
            let mut c = HostCollective::new(cfg(rank));
            c.start(spec(kind, count)).unwrap();
            let mut dst = vec![0u8; src.len()];
            let mut bufs = OpBuffers::Separate { src: &src, dst: &mut dst };
            while c.poll_send(&bufs, &mut out).is_some() {}
            let got: Vec<Delivery> =
                results.iter().map(|r| c.handle_message(None, r, &mut bufs)).collect();
            let last = if awaited { Delivery::AcceptedAwaited } else { Delivery::Accepted };
            assert_eq!(got, [Delivery::Accepted, Delivery::Accepted, last], "{kind:?}");
        }
    }

    fn ints(v: impl IntoIterator<Item = u32>) -> Vec<u8> {
        v.into_iter().flat_map(u32::to_ne_bytes).collect()
    }

    fn wire(v: impl IntoIterator<Item = u32>) -> Vec<u8> {
        v.into_iter().flat_map(u32::to_be_bytes).collect()
    }

    /// Starts `kind` of `count` on `c` and sends all it may: the Start (checked to
    /// announce `chunks` positions) and then the data messages.
    fn start_and_send(
        c: &mut HostCollective,
        kind: CollectiveKind,
        count: u64,
        chunks: u64,
        bufs: &OpBuffers<'_>,
    ) -> (CollOp, Vec<Vec<u8>>) {
        c.start(spec(kind, count)).unwrap();
        let mut out = vec![0u8; 256];
        let m = c.poll_send(bufs, &mut out).unwrap();
        let (op, start) = CtrlMsg::parse(m.imm.unwrap(), &out[..m.len]).unwrap();
        assert!(
            matches!(start, CtrlMsg::Start { count: n, chunks: k, .. } if n == count && k == chunks)
        );
        let mut sent = Vec::new();
        while let Some(m) = c.poll_send(bufs, &mut out) {
            sent.push(out[..m.len].to_vec());
        }
        (op, sent)
    }

    /// A ReduceScatter sends the whole vector with its blocks interleaved (chunk k of
    /// block b at position 2k + b), takes its own block's results, and completes on the
    /// switches' last Progress.
    #[test]
    fn reduce_scatter_interleaves_the_blocks_and_completes_on_the_last_progress() {
        let mut c =
            HostCollective::new(CollectiveConfig { rank: 1, world_size: 2, mtu: 256, window: 8 });
        // Blocks of 100 elements: chunks of 256 and 144 bytes, 4 positions.
        let src = ints(0..200);
        let mut dst = vec![0u8; 400];
        let mut bufs = OpBuffers::Separate { src: &src, dst: &mut dst };
        let (op, sent) = start_and_send(&mut c, CollectiveKind::ReduceScatter, 100, 4, &bufs);
        assert!(op.is_scatter());
        assert_eq!(sent.iter().map(Vec::len).collect::<Vec<_>>(), [256, 256, 144, 144]);
        assert_eq!(sent, [wire(0..64), wire(100..164), wire(64..100), wire(164..200)]);
        assert_eq!(c.handle_message(None, &wire(1000..1064), &mut bufs), Delivery::Accepted);
        c.handle_message(None, &wire(1064..1100), &mut bufs);
        assert_eq!(c.poll_completion(), None, "not before the last Progress");
        let p = CtrlMsg::Progress { seq: 0, completed: 4 };
        c.handle_message(Some(op.imm(MsgKind::Progress)), &p.to_bytes(), &mut bufs);
        assert_eq!(c.poll_completion(), Some(Ok(())));
        assert_eq!(dst, ints(1000..1100));
    }

    /// An AllGather rank sends its block at positions 3k + rank and receives the other
    /// blocks' positions in stream order, each into its block of the result.
    #[test]
    fn allgather_sends_its_block_and_receives_the_others_in_stream_order() {
        let mut c =
            HostCollective::new(CollectiveConfig { rank: 1, world_size: 3, mtu: 256, window: 8 });
        // Blocks of 70 elements: chunks of 256 and 24 bytes, 6 positions.
        let mine = ints(70..140);
        let mut all = vec![0u8; 840];
        let mut bufs = OpBuffers::Separate { src: &mine, dst: &mut all };
        let (op, sent) = start_and_send(&mut c, CollectiveKind::AllGather, 70, 6, &bufs);
        assert_eq!(op.primitive, Primitive::AllGather);
        assert_eq!(sent, [wire(70..134), wire(134..140)]);
        // Positions 0, 2, 3, 5: block 0 and block 2, chunk by chunk.
        for chunk in [wire(0..64), wire(140..204), wire(64..70), wire(204..210)] {
            assert_eq!(c.poll_completion(), None);
            assert_eq!(c.handle_message(None, &chunk, &mut bufs), Delivery::Accepted);
        }
        assert_eq!(c.poll_completion(), Some(Ok(())));
        let mut want = ints(0..210);
        want[280..560].fill(0); // its own block is the caller's to copy
        assert_eq!(all, want);
    }

    #[test]
    fn reduce_non_root_completes_on_progress() {
        let mut c =
            HostCollective::new(CollectiveConfig { rank: 1, world_size: 2, mtu: 256, window: 8 });
        let src = vec![0u8; 4 * 200];
        c.start(spec(CollectiveKind::Reduce { root: 0 }, 200)).unwrap();
        let mut out = vec![0u8; 256];
        let bufs = OpBuffers::SendOnly(&src);
        let mut n = 0;
        while c.poll_send(&bufs, &mut out).is_some() {
            n += 1;
        }
        assert_eq!(n, 5);
        let op = CollOp {
            primitive: Primitive::Reduce,
            operator: Operator::Sum,
            datatype: DataType::Int32,
            root: 0,
        };
        let p = CtrlMsg::Progress { seq: 0, completed: 4 };
        c.handle_message(Some(op.imm(MsgKind::Progress)), &p.to_bytes(), &mut OpBuffers::None);
        assert_eq!(c.poll_completion(), Some(Ok(())));
    }
}
