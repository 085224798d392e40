//! The INC collective messages and chunk arithmetic shared by switch and host.
//!
//! Control messages are `SEND_ONLY_WITH_IMMEDIATE`: the immediate is the seed's INC
//! immediate ([`IncImm`]) of the collective with `reserved` = the message kind, the
//! payload a [`HEADER_LEN`]-byte big-endian header (see `docs/PROTOCOL.md`). Data
//! chunks are plain `SEND_ONLY` of up to `mtu` bytes and carry no header: their
//! position follows from the per-connection arrival order. A host whose collective is
//! one chunk that fits behind the header sends Start and chunk as one message
//! ([`MsgKind::StartWithData`]): one frame instead of two for every small collective.

use inc_wire::{DataType, ImmError, IncImm, Operator, Primitive};

/// Length of every control header.
pub const HEADER_LEN: usize = 40;
/// First byte of a control header.
pub const MAGIC: u8 = 0xC1;
/// Header version this build speaks.
pub const VERSION: u8 = 1;
/// `rank` value of headers a switch originates.
pub const NO_RANK: u16 = 0xFFFF;

/// Control message kinds (also in the immediate's `reserved` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgKind {
    /// Start of a collective (host -> switch, switch -> parent).
    Start = 0,
    /// Cumulative chunk completion (switch -> child; delivered counts also child
    /// switch -> parent).
    Progress = 1,
    /// The collective failed (switch -> every neighbour).
    Error = 2,
    /// A Start followed by the collective's only chunk (host -> switch), for collectives
    /// of one chunk of at most `mtu - HEADER_LEN` bytes.
    StartWithData = 3,
}

/// What a collective is: the fields of the INC immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CollOp {
    /// AllReduce, Reduce, Broadcast or AllGather (Barrier is AllReduce with operator
    /// Barrier).
    pub primitive: Primitive,
    /// Barrier, Sum, Max or Min.
    pub operator: Operator,
    /// Int32 or Float32.
    pub datatype: DataType,
    /// Root rank of Reduce/Broadcast; [`IncImm::ALL_RANKS`] otherwise.
    pub root: u16,
}

impl CollOp {
    /// The immediate of a message of `kind` for this collective.
    pub fn imm(&self, kind: MsgKind) -> u32 {
        IncImm {
            dest_rank: self.root,
            primitive: self.primitive,
            operator: self.operator,
            datatype: self.datatype,
            reserved: kind as u8,
        }
        .encode()
    }

    /// Decodes an immediate into the collective and the message kind.
    pub fn from_imm(imm: u32) -> Result<(CollOp, MsgKind), CtrlError> {
        let i = IncImm::decode(imm)?;
        let kind = match i.reserved {
            0 => MsgKind::Start,
            1 => MsgKind::Progress,
            2 => MsgKind::Error,
            3 => MsgKind::StartWithData,
            _ => return Err(CtrlError::UnknownKind { imm }),
        };
        let op = CollOp {
            primitive: i.primitive,
            operator: i.operator,
            datatype: i.datatype,
            root: i.dest_rank,
        };
        Ok((op, kind))
    }

    /// A ReduceScatter: a Reduce to every rank, block `r` to rank `r` (root
    /// [`IncImm::ALL_RANKS`]), its blocks interleaved as an AllGather's.
    pub fn is_scatter(&self) -> bool {
        self.primitive == Primitive::Reduce && self.root == IncImm::ALL_RANKS
    }

    /// Whether the root rank matters for this primitive.
    pub fn rooted(&self) -> bool {
        !matches!(self.primitive, Primitive::AllReduce | Primitive::AllGather)
    }
}

/// Error codes carried by [`CtrlMsg::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// Ranks disagree on the collective.
    Mismatch = 1,
    /// An RC connection on the path failed.
    ConnectionFailed = 2,
    /// A neighbour broke the protocol (unexpected message).
    Protocol = 3,
}

/// Bits of the `fields` mask of a mismatch error.
pub mod field {
    /// Primitive differs.
    pub const PRIMITIVE: u16 = 1;
    /// Operator differs.
    pub const OPERATOR: u16 = 2;
    /// Datatype differs.
    pub const DATATYPE: u16 = 4;
    /// Root rank differs.
    pub const ROOT: u16 = 8;
    /// Element count differs.
    pub const COUNT: u16 = 16;
    /// Stream start position differs (the communicator's stream is out of sync).
    pub const START: u16 = 32;
    /// Names of the bits, for messages.
    pub fn names(mask: u16) -> String {
        let all = [
            (PRIMITIVE, "primitive"),
            (OPERATOR, "operator"),
            (DATATYPE, "datatype"),
            (ROOT, "root"),
            (COUNT, "count"),
            (START, "stream position"),
        ];
        let v: Vec<&str> = all.iter().filter(|(b, _)| mask & b != 0).map(|(_, n)| *n).collect();
        if v.is_empty() {
            "nothing".into()
        } else {
            v.join(", ")
        }
    }
}

/// A parsed control message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlMsg {
    /// Start of collective `seq`: `count` elements (a ReduceScatter or AllGather: of
    /// one block), `chunks` chunks starting at stream position `start_pos`; `rank` is
    /// the sender's rank (lowest rank of the subtree for a switch).
    Start { seq: u32, count: u64, start_pos: u64, chunks: u64, rank: u16 },
    /// Chunks `0..completed` of collective `seq` are complete.
    Progress { seq: u32, completed: u64 },
    /// Collective `seq` failed; for a mismatch `fields` tells what differs between
    /// `rank_a` and `rank_b`.
    Error { seq: u32, code: ErrorCode, fields: u16, rank_a: u16, rank_b: u16 },
}

/// Malformed control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CtrlError {
    /// Not an INC immediate: the field at fault and its value.
    #[error(transparent)]
    Immediate(#[from] ImmError),
    /// An INC immediate whose message kind (bits 5:0) is none of the control kinds.
    #[error("immediate {imm:#010x}: message kind {} is not a control kind (0-3)", .imm & 0x3f)]
    UnknownKind {
        /// The immediate.
        imm: u32,
    },
    /// Payload shorter than the header.
    #[error("control payload of {0} bytes, expected {HEADER_LEN}")]
    Truncated(usize),
    /// Wrong magic or version.
    #[error("control header magic/version {0:#04x}/{1} not understood")]
    Version(u8, u8),
    /// Kind in the header differs from the immediate's, or unknown code.
    #[error("control header inconsistent: {0}")]
    Inconsistent(&'static str),
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl CtrlMsg {
    /// The kind.
    pub fn kind(&self) -> MsgKind {
        match self {
            CtrlMsg::Start { .. } => MsgKind::Start,
            CtrlMsg::Progress { .. } => MsgKind::Progress,
            CtrlMsg::Error { .. } => MsgKind::Error,
        }
    }

    /// Collective sequence number.
    pub fn seq(&self) -> u32 {
        match *self {
            CtrlMsg::Start { seq, .. }
            | CtrlMsg::Progress { seq, .. }
            | CtrlMsg::Error { seq, .. } => seq,
        }
    }

    /// Parses a control message: its immediate and payload. A
    /// [`MsgKind::StartWithData`] is refused here: only [`Self::parse_with_data`] knows
    /// that a chunk follows the header.
    pub fn parse(imm: u32, payload: &[u8]) -> Result<(CollOp, CtrlMsg), CtrlError> {
        match Self::parse_with_data(imm, payload)? {
            (op, msg, None) => Ok((op, msg)),
            (_, _, Some(_)) => Err(CtrlError::Inconsistent("a Start with data where none may be")),
        }
    }

    /// Parses any message: its immediate and payload, plus, for a
    /// [`MsgKind::StartWithData`] (returned as a [`CtrlMsg::Start`]), the chunk behind
    /// the header.
    pub fn parse_with_data(
        imm: u32,
        payload: &[u8],
    ) -> Result<(CollOp, CtrlMsg, Option<&[u8]>), CtrlError> {
        let (op, kind) = CollOp::from_imm(imm)?;
        if payload.len() < HEADER_LEN {
            return Err(CtrlError::Truncated(payload.len()));
        }
        let b = payload;
        if b[0] != MAGIC || b[1] != VERSION {
            return Err(CtrlError::Version(b[0], b[1]));
        }
        if b[2] != kind as u8 {
            return Err(CtrlError::Inconsistent("kind in header differs from the immediate"));
        }
        let seq = u32_at(b, 4);
        // Byte 34 said which part of a ReduceScatter or AllGather a Start was, in builds
        // that ran them as one collective per block.
        if matches!(kind, MsgKind::Start | MsgKind::StartWithData) && b[34] != 0 {
            return Err(CtrlError::Inconsistent("a part of a blockwise collective (byte 34)"));
        }
        let msg = match kind {
            MsgKind::Start | MsgKind::StartWithData => CtrlMsg::Start {
                seq,
                count: u64_at(b, 8),
                start_pos: u64_at(b, 16),
                chunks: u64_at(b, 24),
                rank: u16_at(b, 32),
            },
            MsgKind::Progress => CtrlMsg::Progress { seq, completed: u64_at(b, 8) },
            MsgKind::Error => CtrlMsg::Error {
                seq,
                code: match u16_at(b, 8) {
                    1 => ErrorCode::Mismatch,
                    2 => ErrorCode::ConnectionFailed,
                    3 => ErrorCode::Protocol,
                    _ => return Err(CtrlError::Inconsistent("unknown error code")),
                },
                fields: u16_at(b, 10),
                rank_a: u16_at(b, 12),
                rank_b: u16_at(b, 14),
            },
        };
        let data = (kind == MsgKind::StartWithData).then(|| &payload[HEADER_LEN..]);
        Ok((op, msg, data))
    }

    /// Writes the header into `out[..HEADER_LEN]`.
    pub fn emit(&self, out: &mut [u8]) {
        let b = &mut out[..HEADER_LEN];
        b.fill(0);
        b[0] = MAGIC;
        b[1] = VERSION;
        b[2] = self.kind() as u8;
        b[4..8].copy_from_slice(&self.seq().to_be_bytes());
        match *self {
            CtrlMsg::Start { count, start_pos, chunks, rank, .. } => {
                b[8..16].copy_from_slice(&count.to_be_bytes());
                b[16..24].copy_from_slice(&start_pos.to_be_bytes());
                b[24..32].copy_from_slice(&chunks.to_be_bytes());
                b[32..34].copy_from_slice(&rank.to_be_bytes());
            }
            CtrlMsg::Progress { completed, .. } => {
                b[8..16].copy_from_slice(&completed.to_be_bytes());
            }
            CtrlMsg::Error { code, fields, rank_a, rank_b, .. } => {
                b[8..10].copy_from_slice(&(code as u16).to_be_bytes());
                b[10..12].copy_from_slice(&fields.to_be_bytes());
                b[12..14].copy_from_slice(&rank_a.to_be_bytes());
                b[14..16].copy_from_slice(&rank_b.to_be_bytes());
            }
        }
    }

    /// Writes the header of a Start that carries its collective's only chunk, which the
    /// caller writes at `out[HEADER_LEN..]`; returns the immediate.
    pub fn emit_start_with_data(&self, op: &CollOp, out: &mut [u8]) -> u32 {
        debug_assert!(matches!(self, CtrlMsg::Start { .. }), "only a Start carries data");
        self.emit(out);
        out[2] = MsgKind::StartWithData as u8;
        op.imm(MsgKind::StartWithData)
    }

    /// The header as an array.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.emit(&mut b);
        b
    }
}

/// Chunks of a collective of `count` elements of `elem` bytes at `mtu` payload bytes per
/// chunk: at least one (a Barrier or empty vector is one zero-length chunk).
pub fn chunk_count(count: u64, elem: usize, mtu: usize) -> u64 {
    let bytes = count.saturating_mul(elem as u64);
    bytes.div_ceil(mtu as u64).max(1)
}

/// Byte offset and length of chunk `index` in a vector of `bytes` bytes.
pub fn chunk_range(index: u64, bytes: u64, mtu: usize) -> (u64, usize) {
    let off = index.saturating_mul(mtu as u64).min(bytes);
    let len = (bytes - off).min(mtu as u64) as usize;
    (off, len)
}

/// Stream positions of an AllGather of `world` blocks of `count` elements: every block
/// is chunked as a vector of its own ([`chunk_count`]), and chunk `k` of rank `b`'s
/// block sits at position `k * world + b` ([`gather_position`]). Interleaved, every
/// rank's block is on the wire at once within one window, and a switch that passes the
/// positions on in order keeps O(window) of them.
pub fn gather_chunks(count: u64, elem: usize, mtu: usize, world: u16) -> u64 {
    chunk_count(count, elem, mtu).saturating_mul(u64::from(world.max(1)))
}

/// Chunks of `blocks` of the `world` blocks of an interleaved collective (ReduceScatter,
/// AllGather) of `chunks` stream positions.
pub fn chunks_of_blocks(chunks: u64, world: u16, blocks: u64) -> u64 {
    chunks / u64::from(world.max(1)) * blocks
}

/// Position, relative to an AllGather's start, of the `index`-th chunk a peer sends
/// when the blocks it carries are those of `ranks` (ascending): a host its own block,
/// a switch the blocks of the ranks behind it, in stream order.
pub fn gather_position(index: u64, ranks: &[u16], world: u16) -> u64 {
    let m = ranks.len().max(1) as u64;
    (index / m) * u64::from(world) + u64::from(ranks[(index % m) as usize])
}

/// Which block (its rank) and which chunk of it an AllGather position (relative to its
/// start) holds.
pub fn gather_chunk_at(pos: u64, world: u16) -> (u16, u64) {
    let world = u64::from(world.max(1));
    ((pos % world) as u16, pos / world)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A bad immediate is refused naming the field at fault, not only the number.
    #[test]
    fn bad_immediates_name_the_field() {
        let op = CollOp {
            primitive: Primitive::AllReduce,
            operator: Operator::Bxor,
            datatype: DataType::Int64,
            root: 0,
        };
        let good = op.imm(MsgKind::Start);
        assert_eq!(CollOp::from_imm(good).unwrap(), (op, MsgKind::Start));
        let float = CollOp { datatype: DataType::Float32, ..op }.imm(MsgKind::Start);
        let e = CollOp::from_imm(float).unwrap_err();
        assert!(matches!(e, CtrlError::Immediate(ImmError::Unsupported { .. })), "{e}");
        assert!(e.to_string().contains("bxor") && e.to_string().contains("float32"), "{e}");
        let e = CollOp::from_imm(good | 0x3f).unwrap_err();
        assert_eq!(e, CtrlError::UnknownKind { imm: good | 0x3f });
        assert!(e.to_string().contains("message kind 63"), "{e}");
    }

    #[test]
    fn chunking() {
        assert_eq!(chunk_count(0, 4, 1024), 1);
        assert_eq!(chunk_count(256, 4, 1024), 1);
        assert_eq!(chunk_count(257, 4, 1024), 2);
        assert_eq!(chunk_count(1 << 30, 4, 256), 1 << 24);
        assert_eq!(chunk_range(1, 1028, 1024), (1024, 4));
        assert_eq!(chunk_range(0, 0, 1024), (0, 0));
        // 4 GiB + 4 bytes: offsets beyond u32.
        let bytes = (1u64 << 32) + 4;
        let n = chunk_count(bytes / 4, 4, 4096);
        assert_eq!(chunk_range(n - 1, bytes, 4096), (1 << 32, 4));
    }

    /// Rank 2 of 4 sends positions 2, 6, 10, ...; a switch behind which ranks 1 and 3
    /// sit sends 1, 3, 5, 7, ...; and every position names its block and chunk.
    #[test]
    fn gather_positions_interleave_the_blocks() {
        assert_eq!(gather_chunks(1000, 4, 1024, 4), 16);
        assert_eq!(gather_chunks(0, 4, 1024, 3), 3, "an empty block is one empty chunk");
        let own: Vec<u64> = (0..3).map(|i| gather_position(i, &[2], 4)).collect();
        assert_eq!(own, [2, 6, 10]);
        let pair: Vec<u64> = (0..4).map(|i| gather_position(i, &[1, 3], 4)).collect();
        assert_eq!(pair, [1, 3, 5, 7]);
        assert_eq!(gather_chunk_at(7, 4), (3, 1));
        for pos in 0..40 {
            let (rank, k) = gather_chunk_at(pos, 5);
            assert_eq!(gather_position(k, &[rank], 5), pos);
        }
    }

    fn op() -> CollOp {
        CollOp {
            primitive: Primitive::Reduce,
            operator: Operator::Max,
            datatype: DataType::Float32,
            root: 3,
        }
    }

    proptest! {
        #[test]
        fn roundtrip(seq: u32, a: u64, b: u64, c: u64, r: u16, kind in 0u8..3, code in 1u16..4, f: u16) {
            let msg = match kind {
                0 => CtrlMsg::Start { seq, count: a, start_pos: b, chunks: c, rank: r },
                1 => CtrlMsg::Progress { seq, completed: a },
                _ => CtrlMsg::Error { seq, code: match code { 1 => ErrorCode::Mismatch, 2 => ErrorCode::ConnectionFailed, _ => ErrorCode::Protocol }, fields: f, rank_a: r, rank_b: r ^ 1 },
            };
            let imm = op().imm(msg.kind());
            let (o, m) = CtrlMsg::parse(imm, &msg.to_bytes()).unwrap();
            prop_assert_eq!(o, op());
            prop_assert_eq!(m, msg);
        }

        #[test]
        fn parse_never_panics(imm: u32, payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = CtrlMsg::parse(imm, &payload);
            let _ = CtrlMsg::parse_with_data(imm, &payload);
        }
    }

    /// A Start with data parses as the Start plus the bytes behind its header, and only
    /// through `parse_with_data`; its header must say so too.
    #[test]
    fn start_with_data_carries_the_chunk() {
        let msg = CtrlMsg::Start { seq: 7, count: 3, start_pos: 90, chunks: 1, rank: 2 };
        let mut buf = [0u8; HEADER_LEN + 12];
        let imm = msg.emit_start_with_data(&op(), &mut buf);
        buf[HEADER_LEN..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        let (o, m, data) = CtrlMsg::parse_with_data(imm, &buf).unwrap();
        assert_eq!((o, m), (op(), msg));
        assert_eq!(data, Some(&buf[HEADER_LEN..]));
        assert!(matches!(CtrlMsg::parse(imm, &buf), Err(CtrlError::Inconsistent(_))));
        // A zero-length chunk (Barrier) is a bare header.
        let (_, _, data) = CtrlMsg::parse_with_data(imm, &buf[..HEADER_LEN]).unwrap();
        assert_eq!(data, Some(&[][..]));
        // Header and immediate must agree on the kind.
        let plain = op().imm(MsgKind::Start);
        assert!(matches!(CtrlMsg::parse_with_data(plain, &buf), Err(CtrlError::Inconsistent(_))));
        assert_eq!(CtrlMsg::parse_with_data(plain, &msg.to_bytes()).unwrap().2, None);
    }

    /// Byte 34 is 0: builds that ran a ReduceScatter or AllGather as one collective
    /// per block put 1 or 2 there, and such a part is refused, not taken for a Reduce or
    /// Broadcast of its own.
    #[test]
    fn a_part_of_an_older_build_is_refused() {
        let msg = CtrlMsg::Start { seq: 1, count: 2, start_pos: 3, chunks: 1, rank: 4 };
        let mut b = msg.to_bytes();
        assert_eq!(b[34], 0);
        let imm = op().imm(MsgKind::Start);
        assert_eq!(CtrlMsg::parse(imm, &b).unwrap().1, msg);
        for code in [1, 2] {
            b[34] = code;
            assert!(matches!(CtrlMsg::parse(imm, &b), Err(CtrlError::Inconsistent(_))));
        }
    }

    #[test]
    fn kind_mismatch_rejected() {
        let msg = CtrlMsg::Progress { seq: 1, completed: 2 };
        let imm = op().imm(MsgKind::Start);
        assert!(matches!(CtrlMsg::parse(imm, &msg.to_bytes()), Err(CtrlError::Inconsistent(_))));
    }
}
