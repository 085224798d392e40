//! The message-level collective state machine: no PSNs, no ACKs.
//!
//! Used directly by the ibverbs transport (the NIC provides RC) and wrapped by
//! [`HostEngine`](crate::HostEngine) for the userspace RoCEv2 transport.

use inc_protocol::coll::{self, CollOp, CtrlMsg, ErrorCode, MsgKind, PartOf};
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

#[derive(Debug)]
struct Active {
    spec: CollectiveSpec,
    op: CollOp,
    seq: u32,
    start_pos: u64,
    chunks: u64,
    bytes: u64,
    /// The part of a blockwise collective this is.
    blocks: Option<Blocks>,
    start_sent: bool,
    sends_data: bool,
    /// Completion comes from result chunks (else from progress messages).
    gets_data: bool,
    next_send: u64,
    /// Chunks complete end to end (results received or progress reported).
    completed: u64,
    /// The network failed this collective before it started here: send the Start (so
    /// the switch's bookkeeping closes) and fail.
    doomed: Option<HostError>,
}

/// Where a part of a `ReduceScatter` or `AllGather` stands: part `i` is a collective
/// rooted at rank `i` over block `i` of the user's buffers.
#[derive(Debug, Clone, Copy)]
struct Blocks {
    /// The caller's collective.
    whole: CollectiveSpec,
    /// The running part (= its root rank).
    part: u16,
    /// Bytes of one block.
    block_bytes: u64,
    /// Sequence number of part 0.
    first_seq: u32,
}

impl Blocks {
    /// The collective part `self.part` runs.
    fn part_spec(&self) -> CollectiveSpec {
        let root = self.part;
        let kind = match self.whole.kind {
            CollectiveKind::ReduceScatter => CollectiveKind::Reduce { root },
            _ => CollectiveKind::Broadcast { root },
        };
        CollectiveSpec { kind, ..self.whole }
    }

    /// What the Start of a part says it belongs to.
    fn part_of(&self) -> PartOf {
        match self.whole.kind {
            CollectiveKind::ReduceScatter => PartOf::ReduceScatter,
            _ => PartOf::AllGather,
        }
    }

    /// Byte offset of the running part's block in the send buffer.
    fn send_offset(&self, bufs: &OpBuffers<'_>) -> u64 {
        match (self.whole.kind, bufs) {
            // AllGather's out-of-place source is the rank's one block.
            (CollectiveKind::AllGather, OpBuffers::Separate { .. }) => 0,
            _ => u64::from(self.part) * self.block_bytes,
        }
    }

    /// Byte offset of the running part's block in the receive buffer.
    fn recv_offset(&self, bufs: &OpBuffers<'_>) -> u64 {
        match (self.whole.kind, bufs) {
            // ReduceScatter's out-of-place result is the rank's one block.
            (CollectiveKind::ReduceScatter, OpBuffers::Separate { .. }) => 0,
            _ => u64::from(self.part) * self.block_bytes,
        }
    }
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
#[derive(Debug)]
pub struct HostCollective {
    cfg: CollectiveConfig,
    seq: u32,
    next_pos: u64,
    active: Option<Active>,
    /// An Error for the collective we have not started yet.
    early_error: Option<(u32, HostError)>,
    done: Option<Result<(), HostError>>,
    counters: CollectiveCounters,
}

impl HostCollective {
    /// A state machine at the start of the communicator's stream.
    pub fn new(cfg: CollectiveConfig) -> Self {
        HostCollective {
            cfg,
            seq: 0,
            next_pos: 0,
            active: None,
            early_error: None,
            done: None,
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

    /// Sequence number of the running (or next) collective.
    pub fn seq(&self) -> u32 {
        self.active.as_ref().map_or(self.seq, |a| a.seq)
    }

    /// True while a collective runs.
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Chunks complete / total of the running collective.
    pub fn progress(&self) -> Option<(u64, u64)> {
        self.active.as_ref().map(|a| (a.completed, a.chunks))
    }

    /// Receive buffers (of `mtu` bytes, or [`coll::HEADER_LEN`] if larger) a verbs host
    /// must keep posted so the switch never meets an RNR in steady state.
    pub fn recv_depth(&self) -> u32 {
        2 * self.cfg.window + 8
    }

    /// Starts a collective. Fails if one is running or the spec is invalid.
    pub fn start(&mut self, spec: CollectiveSpec) -> Result<(), HostError> {
        if let Some(a) = &self.active {
            return Err(HostError::Busy { seq: a.seq });
        }
        self.done = None;
        let (first, blocks) = if spec.kind.is_blockwise() {
            let block_bytes = spec
                .count
                .checked_mul(spec.dtype.size() as u64)
                .ok_or_else(|| HostError::InvalidSpec(format!("count {} overflows", spec.count)))?;
            if block_bytes.checked_mul(u64::from(self.cfg.world_size)).is_none() {
                return Err(HostError::InvalidSpec(format!(
                    "{} blocks of {block_bytes} bytes overflow",
                    self.cfg.world_size
                )));
            }
            let blocks = Blocks { whole: spec, part: 0, block_bytes, first_seq: self.seq };
            (blocks.part_spec(), Some(blocks))
        } else {
            (spec, None)
        };
        self.begin(first, blocks)?;
        self.counters.started += 1;
        Ok(())
    }

    /// Starts one collective on the wire: a whole collective or one part of a blockwise
    /// one.
    fn begin(&mut self, spec: CollectiveSpec, blocks: Option<Blocks>) -> Result<(), HostError> {
        let (primitive, root) = match spec.kind {
            CollectiveKind::AllReduce | CollectiveKind::Barrier => {
                (Primitive::AllReduce, IncImm::ALL_RANKS)
            }
            CollectiveKind::Reduce { root } => (Primitive::Reduce, root),
            CollectiveKind::Broadcast { root } => (Primitive::Broadcast, root),
            CollectiveKind::ReduceScatter | CollectiveKind::AllGather => {
                unreachable!("blockwise collectives begin part by part")
            }
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
        let chunks = coll::chunk_count(count, elem as usize, self.cfg.mtu);
        let op = CollOp { primitive, operator, datatype: spec.dtype, root };
        let me = self.cfg.rank;
        let (sends_data, gets_data) = match spec.kind {
            CollectiveKind::Reduce { root } => (true, root == me),
            CollectiveKind::Broadcast { root } => (root == me, root != me),
            _ => (true, true),
        };
        self.active = Some(Active {
            spec: CollectiveSpec { count, ..spec },
            op,
            seq: self.seq,
            start_pos: self.next_pos,
            chunks,
            bytes,
            blocks,
            start_sent: false,
            sends_data,
            gets_data,
            next_send: 0,
            completed: 0,
            doomed: match self.early_error.take() {
                Some((s, e)) if s == self.seq => Some(e),
                other => {
                    self.early_error = other;
                    None
                }
            },
        });
        Ok(())
    }

    /// Whether [`Self::poll_send`] has a message now (the Start, or data the window
    /// allows), so a caller can skip fetching a buffer for nothing.
    pub fn has_send(&self) -> bool {
        self.active.as_ref().is_some_and(|a| {
            !a.start_sent
                || (a.sends_data
                    && a.next_send < a.chunks
                    && a.next_send < a.completed + u64::from(self.cfg.window))
        })
    }

    /// Writes the next message to send into `out` (at least `mtu` bytes), if the window
    /// allows one.
    pub fn poll_send(&mut self, bufs: &OpBuffers<'_>, out: &mut [u8]) -> Option<OutMessage> {
        if !self.has_send() {
            return None;
        }
        let a = self.active.as_mut()?;
        if !a.start_sent {
            let msg = CtrlMsg::Start {
                seq: a.seq,
                count: a.spec.count,
                start_pos: a.start_pos,
                chunks: a.chunks,
                rank: self.cfg.rank,
                part_of: a.blocks.map_or(PartOf::Whole, |b| b.part_of()),
            };
            a.start_sent = true;
            self.counters.tx_control += 1;
            // A collective of one chunk that fits behind the header goes as one message
            // (a send buffer too short fails the collective after a plain Start, as for
            // longer collectives).
            let with_data = a.sends_data
                && a.chunks == 1
                && coll::HEADER_LEN as u64 + a.bytes <= self.cfg.mtu as u64
                && send_source(bufs).len() as u64
                    >= a.blocks.map_or(0, |b| b.send_offset(bufs)) + a.bytes;
            let sent = if with_data {
                let imm = msg.emit_start_with_data(&a.op, out);
                self.write_chunk(bufs, &mut out[coll::HEADER_LEN..])
                    .map(|len| OutMessage { imm: Some(imm), len: coll::HEADER_LEN + len })
            } else {
                msg.emit(out);
                Some(OutMessage { imm: Some(a.op.imm(MsgKind::Start)), len: coll::HEADER_LEN })
            };
            if let Some(e) = self.active.as_mut().and_then(|a| a.doomed.take()) {
                self.fail(e);
            }
            return sent;
        }
        self.write_chunk(bufs, out).map(|len| OutMessage { imm: None, len })
    }

    /// Writes the next data chunk, in network byte order, to the front of `out`;
    /// returns its length (`None`, and the collective failed, if the user's buffer is
    /// too short).
    fn write_chunk(&mut self, bufs: &OpBuffers<'_>, out: &mut [u8]) -> Option<usize> {
        let a = self.active.as_mut()?;
        let (off, len) = coll::chunk_range(a.next_send, a.bytes, self.cfg.mtu);
        if len > 0 {
            let src = send_source(bufs);
            let base = a.blocks.map_or(0, |b| b.send_offset(bufs));
            let off = base + off;
            let Some(chunk) = usize::try_from(off).ok().and_then(|o| src.get(o..o + len)) else {
                let need = base + a.bytes;
                self.fail(HostError::Buffer { what: "send buffer", need, have: src.len() as u64 });
                return None;
            };
            reduce::to_network(a.spec.dtype, chunk, &mut out[..len]);
        }
        a.next_send += 1;
        self.counters.tx_chunks += 1;
        Some(len)
    }

    /// Handles one received message (immediate and payload).
    pub fn handle_message(
        &mut self,
        imm: Option<u32>,
        payload: &[u8],
        bufs: &mut OpBuffers<'_>,
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
            // An Error for a collective we have not started (it can overtake the last
            // message of the running one): keep it for when that collective starts.
            let next = self.active.as_ref().map_or(self.seq, |a| a.seq.wrapping_add(1));
            if seq.wrapping_sub(next) < 1 << 30 {
                if self.early_error.as_ref().is_none_or(|(s, _)| seq.wrapping_sub(*s) >= 1 << 30) {
                    self.early_error = Some((seq, error_of(msg)));
                }
                return;
            }
        }
        let Some(a) = self.active.as_mut() else {
            self.counters.rx_unexpected += 1;
            return;
        };
        if msg.seq() != a.seq {
            // An Error for an earlier part of the running ReduceScatter or AllGather
            // (this rank finished that part before the Error reached it) fails
            // the whole call.
            if let (CtrlMsg::Error { seq, .. }, Some(b)) = (msg, a.blocks) {
                if seq.wrapping_sub(b.first_seq) < a.seq.wrapping_sub(b.first_seq) {
                    self.fail(error_of(msg));
                    return;
                }
            }
            self.counters.rx_unexpected += 1;
            return;
        }
        match msg {
            CtrlMsg::Progress { completed, .. } if !a.gets_data => {
                self.counters.rx_progress += 1;
                a.completed = a.completed.max(completed.min(a.chunks));
                self.check_done();
            }
            CtrlMsg::Error { .. } => self.fail(error_of(msg)),
            _ => self.counters.rx_unexpected += 1,
        }
    }

    fn handle_data(&mut self, payload: &[u8], bufs: &mut OpBuffers<'_>) -> Delivery {
        let Some(a) = self.active.as_mut() else {
            self.counters.not_ready += 1;
            return Delivery::NotReady;
        };
        if !a.gets_data || a.completed >= a.chunks {
            // Nothing of this collective is data for us: it belongs to the next one.
            self.counters.not_ready += 1;
            return Delivery::NotReady;
        }
        let (off, len) = coll::chunk_range(a.completed, a.bytes, self.cfg.mtu);
        let base = a.blocks.map_or(0, |b| b.recv_offset(bufs));
        let off = base + off;
        if payload.len() != len {
            let e = HostError::Protocol(format!(
                "chunk {} of collective {} has {} bytes, expected {len}",
                a.completed,
                a.seq,
                payload.len()
            ));
            self.fail(e);
            return Delivery::Accepted;
        }
        if len > 0 {
            let dst: &mut [u8] = match bufs {
                OpBuffers::Separate { dst, .. } | OpBuffers::RecvOnly(dst) => dst,
                OpBuffers::InPlace(b) => b,
                _ => &mut [],
            };
            let have = dst.len() as u64;
            let Some(out) = usize::try_from(off).ok().and_then(|o| dst.get_mut(o..o + len)) else {
                let need = base + a.bytes;
                self.fail(HostError::Buffer { what: "receive buffer", need, have });
                return Delivery::Accepted;
            };
            reduce::from_network(a.spec.dtype, payload, out);
        }
        a.completed += 1;
        self.counters.rx_chunks += 1;
        self.check_done();
        Delivery::Accepted
    }

    fn check_done(&mut self) {
        if let Some(a) = &self.active {
            if a.start_sent && a.completed >= a.chunks && (!a.sends_data || a.next_send >= a.chunks)
            {
                self.finish(Ok(()));
            }
        }
    }

    fn finish(&mut self, r: Result<(), HostError>) {
        if let Some(a) = self.active.take() {
            // The stream advances by this collective's chunks whatever the outcome, so
            // later collectives stay aligned when only the operation disagreed.
            self.seq = a.seq.wrapping_add(1);
            self.next_pos = a.start_pos + a.chunks;
            if let (Ok(()), Some(blocks)) = (&r, a.blocks) {
                if blocks.part + 1 < self.cfg.world_size {
                    let next = Blocks { part: blocks.part + 1, ..blocks };
                    // Valid: the first part passed the same checks.
                    if let Err(e) = self.begin(next.part_spec(), Some(next)) {
                        self.done = Some(Err(e));
                        self.counters.failed += 1;
                    }
                    return;
                }
            }
            match &r {
                Ok(()) => self.counters.completed += 1,
                Err(e) => {
                    tracing::warn!(rank = self.cfg.rank, seq = a.seq, "collective failed: {e}");
                    self.counters.failed += 1;
                }
            }
            self.done = Some(r);
        }
    }

    /// Fails the running collective with `e` (used by the RC layer for timeouts and
    /// connection failures).
    pub fn fail(&mut self, e: HostError) {
        self.finish(Err(e));
    }

    /// The outcome of the last collective, once.
    pub fn poll_completion(&mut self) -> Option<Result<(), HostError>> {
        self.done.take()
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
        assert_eq!(
            start,
            CtrlMsg::Start {
                seq: 0,
                count,
                start_pos: 0,
                chunks: 3,
                rank: 0,
                part_of: PartOf::Whole
            }
        );
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
        assert_eq!(
            start,
            CtrlMsg::Start {
                seq: 1,
                count: 0,
                start_pos: 3,
                chunks: 1,
                rank: 0,
                part_of: PartOf::Whole
            }
        );
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
            assert_eq!(
                start,
                CtrlMsg::Start {
                    seq: 0,
                    count,
                    start_pos: 0,
                    chunks: 1,
                    rank: 1,
                    part_of: PartOf::Whole
                }
            );
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
