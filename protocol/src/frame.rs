//! Building the RoCEv2 frames an RC endpoint emits.
//!
//! Every frame carries DF, TTL 64, TOS 0 and UDP checksum 0, and IPv4 ID 0: what an
//! unconnected UDP socket with `IP_PMTUDISC_DO` puts on the wire, so a userspace
//! transport can send the UDP payload through a socket and the ICRC still matches.
//! A switch's frames carry their PSN's low 16 bits as IPv4 ID instead
//! ([`RcAddressing::psn_ident`]): consecutive requests then have the consecutive IDs
//! that UDP GSO gives the segments of one send, so a run of them goes out as one GSO
//! frame just as it sits in the send queue, and a receiver behind a UDP socket (which
//! never sees the IP header) knows each one's ID from its BTH.

use std::net::Ipv4Addr;
use std::ops::Deref;
use std::sync::Arc;

use inc_wire::icrc::PayloadCrc;
use inc_wire::{AethRepr, BthRepr, EthAddrs, EthernetAddress, ExtHeaders, Opcode, Psn, RoceRepr};

/// Ethernet + IPv4 + UDP + BTH, the fixed header prefix of every emitted frame.
pub const HEADERS_LEN: usize = 14 + 20 + 8 + inc_wire::BTH_LEN;
/// Offset of the BTH in an emitted frame.
pub const BTH_OFFSET: usize = 14 + 20 + 8;
/// Offset of a SEND request's payload: behind the 4-byte ImmDt header when it has one.
pub const fn send_payload_offset(imm: Option<u32>) -> usize {
    match imm {
        Some(_) => HEADERS_LEN + 4,
        None => HEADERS_LEN,
    }
}

/// Largest frame for a given payload: headers, ImmDt or AETH (4), payload, pad (<= 3), ICRC.
pub const fn max_frame_len(payload: usize) -> usize {
    HEADERS_LEN + 4 + payload + 3 + 4
}

/// The addresses of one RC connection, seen from the local end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcAddressing {
    /// Our MAC (Ethernet source).
    pub local_mac: EthernetAddress,
    /// Our IP.
    pub local_ip: Ipv4Addr,
    /// UDP source port of our frames.
    pub local_udp_port: u16,
    /// Our QPN (destination QP of what the peer sends us).
    pub local_qpn: u32,
    /// Peer MAC; `None` until learned (frames then go to the broadcast address).
    pub peer_mac: Option<EthernetAddress>,
    /// Peer IP.
    pub peer_ip: Ipv4Addr,
    /// UDP destination port of our frames.
    pub peer_udp_port: u16,
    /// Peer QPN (destination QP of our frames).
    pub peer_qpn: u32,
    /// IPv4 ID of every frame = PSN mod 2^16 (a switch, which writes its own IP
    /// headers) instead of 0 (a host whose kernel writes them). See the module docs.
    pub psn_ident: bool,
}

/// The IPv4 ID a frame with `psn` carries when its sender stamps PSNs as IDs
/// ([`RcAddressing::psn_ident`]).
pub fn psn_ident(psn: Psn) -> u16 {
    psn.value() as u16
}

impl RcAddressing {
    fn repr(&self, bth: BthRepr, ext: ExtHeaders, payload_len: usize) -> RoceRepr {
        let ip_ident = if self.psn_ident { psn_ident(bth.psn) } else { 0 };
        RoceRepr {
            eth: EthAddrs {
                src: self.local_mac,
                dst: self.peer_mac.unwrap_or(EthernetAddress::BROADCAST),
            },
            ip_src: self.local_ip,
            ip_dst: self.peer_ip,
            ip_ident,
            ttl: 64,
            tos: 0,
            dont_frag: true,
            udp_src_port: self.local_udp_port,
            udp_dst_port: self.peer_udp_port,
            bth,
            ext,
            payload_len,
        }
    }

    /// Writes a SEND_ONLY (or SEND_ONLY_WITH_IMMEDIATE when `imm` is set) request with
    /// `payload`, AckReq clear. With `payload_crc` (the CRC of `payload` and its pad, for
    /// a payload sent in several frames) the ICRC is derived from it instead of a pass
    /// over the payload. Returns the frame length, or `None` if `buf` is too small or
    /// `payload_crc` covers another length.
    pub fn emit_send(
        &self,
        buf: &mut [u8],
        psn: Psn,
        imm: Option<u32>,
        payload: &[u8],
        payload_crc: Option<&PayloadCrc>,
    ) -> Option<usize> {
        let repr = self.send_repr(psn, imm, payload.len());
        match payload_crc {
            Some(crc) => repr.emit_with_payload_crc(buf, payload, crc).ok(),
            None => repr.emit(buf, |p| p.copy_from_slice(payload)).ok(),
        }
    }

    /// Writes the headers and ICRC of a SEND_ONLY (with immediate when `imm` is set)
    /// request whose `payload_len` payload bytes are already in `buf` at
    /// [`send_payload_offset`]`(imm)`; the ICRC derived from `payload_crc` when given.
    /// Returns the frame length, or `None` if `buf` is too small or `payload_crc`
    /// covers another length.
    pub fn emit_send_in_place(
        &self,
        buf: &mut [u8],
        psn: Psn,
        imm: Option<u32>,
        payload_len: usize,
        payload_crc: Option<&PayloadCrc>,
    ) -> Option<usize> {
        self.send_repr(psn, imm, payload_len).emit_around_payload(buf, payload_crc).ok()
    }

    /// A SEND_ONLY request, with immediate when `imm` is set.
    fn send_repr(&self, psn: Psn, imm: Option<u32>, payload_len: usize) -> RoceRepr {
        let opcode =
            if imm.is_some() { Opcode::RcSendOnlyWithImmediate } else { Opcode::RcSendOnly };
        let ext = ExtHeaders { imm, ..ExtHeaders::default() };
        self.repr(BthRepr::new(opcode, self.peer_qpn, psn), ext, payload_len)
    }

    /// Writes an ACKNOWLEDGE with `aeth`. Returns the frame length.
    pub fn emit_ack(&self, buf: &mut [u8], psn: Psn, aeth: AethRepr) -> Option<usize> {
        let ext = ExtHeaders { aeth: Some(aeth), ..ExtHeaders::default() };
        let repr = self.repr(BthRepr::new(Opcode::RcAcknowledge, self.peer_qpn, psn), ext, 0);
        repr.emit(buf, |_| {}).ok()
    }
}

/// A frame of a send queue, shared with whoever transmits it: the queue keeps it for
/// retransmission while a backend hands the same bytes to the kernel, without a copy
/// into a transmit buffer. Read-only; the queue changes a frame only while nobody else
/// holds it (copying it otherwise).
#[derive(Debug, Clone)]
pub struct QueuedFrame {
    buf: Arc<Vec<u8>>,
    len: usize,
}

impl QueuedFrame {
    pub(crate) fn new(buf: Arc<Vec<u8>>, len: usize) -> Self {
        QueuedFrame { buf, len }
    }
}

/// A frame held by nobody else (tests, tools).
impl From<Vec<u8>> for QueuedFrame {
    fn from(frame: Vec<u8>) -> Self {
        let len = frame.len();
        QueuedFrame { buf: Arc::new(frame), len }
    }
}

impl Deref for QueuedFrame {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl AsRef<[u8]> for QueuedFrame {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// Whether a frame this crate emitted has AckReq set.
pub fn ack_req(frame: &[u8]) -> bool {
    frame[BTH_OFFSET + 8] & 0x80 != 0
}

/// Sets or clears AckReq in a frame this crate emitted and recomputes its ICRC.
pub fn set_ack_req(frame: &mut [u8], ack_req: bool) {
    let a = BTH_OFFSET + 8;
    if self::ack_req(frame) == ack_req {
        return;
    }
    frame[a] ^= 0x80;
    // The ICRC covers the IPv4 header onward; patch it for the one flipped bit instead
    // of a pass over the payload.
    const IP_OFFSET: usize = 14;
    let n = frame.len();
    let icrc = u32::from_le_bytes(frame[n - 4..].try_into().expect("4-byte ICRC"));
    let icrc = inc_wire::icrc::with_xor(icrc, a - IP_OFFSET, &[0x80], n - 4 - IP_OFFSET);
    frame[n - 4..].copy_from_slice(&icrc.to_le_bytes());
}

/// Writes the destination MAC (not covered by the ICRC).
pub fn set_dst_mac(frame: &mut [u8], mac: EthernetAddress) {
    frame[..6].copy_from_slice(&mac.0);
}

/// Parses a RoCEv2 frame whose UDP destination port may differ from 4791 (userspace
/// hosts sharing an IP listen on their own ports). Zero-copy; the ICRC covers the ports.
pub fn parse_any_port(frame: &[u8]) -> inc_wire::Result<inc_wire::RoceFrame<'_>> {
    RoceRepr::parse_any_port(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addressing() -> RcAddressing {
        RcAddressing {
            local_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            local_ip: Ipv4Addr::new(10, 0, 0, 1),
            local_udp_port: 49152,
            local_qpn: 0x11,
            peer_mac: Some(EthernetAddress([2, 0, 0, 0, 0, 2])),
            peer_ip: Ipv4Addr::new(10, 0, 0, 2),
            peer_udp_port: inc_wire::ROCEV2_PORT,
            peer_qpn: 0x22,
            psn_ident: false,
        }
    }

    #[test]
    fn set_ack_req_keeps_the_icrc_valid_both_ways() {
        for len in [0usize, 1, 3, 4, 1023, 4096] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut buf = vec![0u8; max_frame_len(len)];
            let n = addressing().emit_send(&mut buf, Psn::new(5), Some(9), &payload, None).unwrap();
            let frame = &mut buf[..n];
            for ack_req in [true, false, true] {
                set_ack_req(frame, ack_req);
                let parsed = parse_any_port(frame).expect("ICRC must still match");
                assert_eq!(parsed.repr.bth.ack_req, ack_req, "len {len}");
                assert_eq!(parsed.payload, &payload[..], "len {len}");
            }
        }
    }
}
