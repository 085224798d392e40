//! BTH extension headers: AETH, RETH, DETH, AtomicETH, AtomicAckETH.
//!
//! These are fixed-size, so their `parse` takes the bytes right after the preceding
//! header and their `emit` writes into a slice of at least `LEN` bytes.

use core::time::Duration;

use crate::error::{need, Error, Result};
use crate::field;

pub const AETH_LEN: usize = 4;
pub const RETH_LEN: usize = 16;
pub const DETH_LEN: usize = 8;
pub const ATOMIC_ETH_LEN: usize = 28;
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

/// NAK codes of an AETH whose syndrome type is NAK (0b11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    /// Codes 5-31 (reserved by IBA).
    Reserved(u8),
}

impl NakCode {
    pub fn from_code(v: u8) -> NakCode {
        match v & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            o => NakCode::Reserved(o),
        }
    }
    pub fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(o) => o & 0x1f,
        }
    }
}

/// The AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive ACK; `credits` is the 5-bit credit count (0x1F = invalid, what RoCE
    /// responders such as rxe send: syndrome 0x1F).
    Ack { credits: u8 },
    /// Receiver-not-ready NAK; `timer` is the 5-bit IBA RNR timer code
    /// (see [`rnr_timer_to_duration`]).
    RnrNak { timer: u8 },
    /// NAK.
    Nak(NakCode),
}

impl AethSyndrome {
    /// The syndrome of an ACK with invalid credits, what RoCE responders send.
    pub const ACK: AethSyndrome = AethSyndrome::Ack { credits: 0x1f };

    /// Decodes a syndrome byte; the reserved type 0b10 is an error. Bit 7 is reserved
    /// and ignored.
    pub fn from_byte(b: u8) -> Result<AethSyndrome> {
        let v = b & 0x1f;
        match (b >> 5) & 0x3 {
            0b00 => Ok(AethSyndrome::Ack { credits: v }),
            0b01 => Ok(AethSyndrome::RnrNak { timer: v }),
            0b11 => Ok(AethSyndrome::Nak(NakCode::from_code(v))),
            _ => Err(Error::Malformed { what: "AETH syndrome", reason: "reserved type 0b10" }),
        }
    }

    /// The syndrome byte (values are masked to 5 bits).
    pub fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Nak(code) => 0x60 | code.code(),
        }
    }
}

/// ACK extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    pub syndrome: AethSyndrome,
    /// 24-bit message sequence number.
    pub msn: u32,
}

impl AethRepr {
    pub const LEN: usize = AETH_LEN;

    pub fn parse(b: &[u8]) -> Result<Self> {
        need("AETH", AETH_LEN, b.len())?;
        Ok(AethRepr { syndrome: AethSyndrome::from_byte(b[0])?, msn: field::u24_at(b, 1) })
    }

    /// Writes the header; fails if `msn` exceeds 24 bits.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        need("AETH (emit)", AETH_LEN, b.len())?;
        if self.msn > 0xff_ffff {
            return Err(Error::Malformed { what: "AETH msn", reason: "exceeds 24 bits" });
        }
        b[0] = self.syndrome.to_byte();
        field::set_u24(b, 1, self.msn);
        Ok(())
    }
}

/// RNR timer code to the delay it asks for (IBA table 45, "RNR NAK timer field").
pub fn rnr_timer_to_duration(timer: u8) -> Duration {
    // Microseconds per code 0..=31; code 0 is the longest, 655.36 ms.
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    Duration::from_micros(u64::from(US[usize::from(timer & 0x1f)]))
}

/// The smallest RNR timer code whose delay is at least `d` (code 0, 655.36 ms, if `d`
/// exceeds 491.52 ms).
pub fn rnr_timer_for_duration(d: Duration) -> u8 {
    (1..32u8).find(|&t| rnr_timer_to_duration(t) >= d).unwrap_or(0)
}

/// RDMA extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    pub virtual_addr: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl RethRepr {
    pub const LEN: usize = RETH_LEN;

    pub fn parse(b: &[u8]) -> Result<Self> {
        need("RETH", RETH_LEN, b.len())?;
        Ok(RethRepr {
            virtual_addr: field::u64_at(b, 0),
            rkey: field::u32_at(b, 8),
            dma_len: field::u32_at(b, 12),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        need("RETH (emit)", RETH_LEN, b.len())?;
        field::set_u64(b, 0, self.virtual_addr);
        field::set_u32(b, 8, self.rkey);
        field::set_u32(b, 12, self.dma_len);
        Ok(())
    }
}

/// Datagram extended transport header (UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    pub qkey: u32,
    /// 24-bit source QP number.
    pub src_qp: u32,
}

impl DethRepr {
    pub const LEN: usize = DETH_LEN;

    pub fn parse(b: &[u8]) -> Result<Self> {
        need("DETH", DETH_LEN, b.len())?;
        Ok(DethRepr { qkey: field::u32_at(b, 0), src_qp: field::u24_at(b, 5) })
    }

    /// Writes the header; fails if `src_qp` exceeds 24 bits.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        need("DETH (emit)", DETH_LEN, b.len())?;
        if self.src_qp > 0xff_ffff {
            return Err(Error::Malformed { what: "DETH src_qp", reason: "exceeds 24 bits" });
        }
        field::set_u32(b, 0, self.qkey);
        b[4] = 0;
        field::set_u24(b, 5, self.src_qp);
        Ok(())
    }
}

/// Atomic extended transport header (CompareSwap, FetchAdd).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    pub virtual_addr: u64,
    pub rkey: u32,
    /// Swap value (CompareSwap) or add value (FetchAdd).
    pub swap_add: u64,
    /// Compare value (CompareSwap only).
    pub compare: u64,
}

impl AtomicEthRepr {
    pub const LEN: usize = ATOMIC_ETH_LEN;

    pub fn parse(b: &[u8]) -> Result<Self> {
        need("AtomicETH", ATOMIC_ETH_LEN, b.len())?;
        Ok(AtomicEthRepr {
            virtual_addr: field::u64_at(b, 0),
            rkey: field::u32_at(b, 8),
            swap_add: field::u64_at(b, 12),
            compare: field::u64_at(b, 20),
        })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        need("AtomicETH (emit)", ATOMIC_ETH_LEN, b.len())?;
        field::set_u64(b, 0, self.virtual_addr);
        field::set_u32(b, 8, self.rkey);
        field::set_u64(b, 12, self.swap_add);
        field::set_u64(b, 20, self.compare);
        Ok(())
    }
}

/// Atomic ACK extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    /// The remote value before the atomic operation.
    pub orig_remote_data: u64,
}

impl AtomicAckEthRepr {
    pub const LEN: usize = ATOMIC_ACK_ETH_LEN;

    pub fn parse(b: &[u8]) -> Result<Self> {
        need("AtomicAckETH", ATOMIC_ACK_ETH_LEN, b.len())?;
        Ok(AtomicAckEthRepr { orig_remote_data: field::u64_at(b, 0) })
    }

    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        need("AtomicAckETH (emit)", ATOMIC_ACK_ETH_LEN, b.len())?;
        field::set_u64(b, 0, self.orig_remote_data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aeth_syndromes() {
        for b in 0..=0x7fu8 {
            match AethSyndrome::from_byte(b) {
                Ok(s) => assert_eq!(s.to_byte(), b),
                Err(_) => assert_eq!(b >> 5, 0b10),
            }
        }
        assert_eq!(AethSyndrome::from_byte(0x1f).unwrap(), AethSyndrome::ACK);
        assert_eq!(
            AethSyndrome::from_byte(0x60).unwrap(),
            AethSyndrome::Nak(NakCode::PsnSequenceError)
        );
        let a = AethRepr { syndrome: AethSyndrome::RnrNak { timer: 14 }, msn: 0xabcdef };
        let mut b = [0u8; 4];
        a.emit(&mut b).unwrap();
        assert_eq!(b, [0x2e, 0xab, 0xcd, 0xef]);
        assert_eq!(AethRepr::parse(&b).unwrap(), a);
        assert!(AethRepr { msn: 1 << 24, ..a }.emit(&mut b).is_err());
        assert!(AethRepr::parse(&b[..3]).is_err());
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_to_duration(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer_to_duration(1), Duration::from_micros(10));
        assert_eq!(rnr_timer_to_duration(14), Duration::from_micros(1_280));
        assert_eq!(rnr_timer_to_duration(31), Duration::from_micros(491_520));
        assert_eq!(rnr_timer_for_duration(Duration::from_millis(1)), 14);
        assert_eq!(rnr_timer_for_duration(Duration::ZERO), 1);
        assert_eq!(rnr_timer_for_duration(Duration::from_secs(1)), 0);
    }

    #[test]
    fn fixed_headers_round_trip() {
        let mut b = [0u8; 28];
        let r = RethRepr { virtual_addr: 0x1122_3344_5566_7788, rkey: 0xdead_beef, dma_len: 4096 };
        r.emit(&mut b).unwrap();
        assert_eq!(RethRepr::parse(&b).unwrap(), r);
        let d = DethRepr { qkey: 0x1111_1111, src_qp: 0x12_3456 };
        d.emit(&mut b).unwrap();
        assert_eq!(&b[..8], &[0x11, 0x11, 0x11, 0x11, 0, 0x12, 0x34, 0x56]);
        assert_eq!(DethRepr::parse(&b).unwrap(), d);
        let a = AtomicEthRepr { virtual_addr: 1, rkey: 2, swap_add: 3, compare: 4 };
        a.emit(&mut b).unwrap();
        assert_eq!(AtomicEthRepr::parse(&b).unwrap(), a);
        let k = AtomicAckEthRepr { orig_remote_data: u64::MAX - 1 };
        k.emit(&mut b).unwrap();
        assert_eq!(AtomicAckEthRepr::parse(&b).unwrap(), k);
        assert!(AtomicEthRepr::parse(&b[..27]).is_err());
    }
}
