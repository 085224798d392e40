//! RoCEv2 wire format for the INC emulator.
//!
//! smoltcp-style zero-copy packet views (`XxxPacket<T: AsRef<[u8]>>`) with
//! `new_checked`, getters and setters, plus `XxxRepr` types with `parse`/`emit`, for
//! Ethernet II, ARP, IPv4, UDP, the InfiniBand BTH and its extension headers (AETH,
//! RETH, DETH, ImmDt, AtomicETH, AtomicAckETH, IETH), the ICRC, 24-bit [`Psn`]
//! arithmetic, the INC immediate-data encoding ([`IncImm`]), element reduce kernels
//! ([`reduce`]) and a full-frame parser/builder ([`RoceRepr`]).
//!
//! No I/O, no allocation; malformed input yields an [`Error`], never a panic. The only
//! `unsafe` is the run-time CPU dispatch of the reduce kernels (`reduce::simd_dispatch`).
#![deny(unsafe_code)]

pub mod arp;
pub mod bth;
pub mod dtype;
mod error;
pub mod ethernet;
pub mod ext;
pub mod gso;
pub mod icrc;
pub mod imm;
pub mod ipv4;
pub mod opcode;
pub mod psn;
pub mod reduce;
pub mod roce;
pub mod udp;

pub use arp::{ArpOperation, ArpPacket, ArpRepr};
pub use bth::{BthPacket, BthRepr, BTH_LEN};
pub use dtype::{AppliesTo, Class, DataType, Operator, TypeVisitor, UnknownName, Unsupported};
pub use error::{Error, Result};
pub use ethernet::{
    EtherType, EthernetAddress, EthernetFrame, EthernetRepr, ParseEthernetAddressError,
};
pub use ext::{
    rnr_timer_for_duration, rnr_timer_to_duration, AethRepr, AethSyndrome, AtomicAckEthRepr,
    AtomicEthRepr, DethRepr, NakCode, RethRepr,
};
pub use icrc::DatagramHeaders;
pub use imm::{ImmError, IncImm, Primitive};
pub use ipv4::{Ipv4Packet, Ipv4Repr};
pub use opcode::{Opcode, Transport};
pub use psn::Psn;
pub use roce::{EthAddrs, ExtHeaders, RoceFrame, RoceRepr};
pub use udp::{UdpPacket, UdpRepr, ROCEV2_PORT};

/// Big-endian field accessors shared by the packet views.
pub(crate) mod field {
    pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    pub(crate) fn u24_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
    }
    pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(x)
    }
    pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn set_u24(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    pub(crate) fn set_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
}
