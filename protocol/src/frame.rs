//! Building the RoCEv2 frames an RC endpoint emits.
//!
//! Every frame carries IPv4 ID 0, DF, TTL 64, TOS 0 and UDP checksum 0: what an
//! unconnected UDP socket with `IP_PMTUDISC_DO` puts on the wire, so a userspace
//! transport can send the UDP payload through a socket and the ICRC still matches.

use std::net::Ipv4Addr;

use inc_wire::{AethRepr, BthRepr, EthAddrs, EthernetAddress, ExtHeaders, Opcode, Psn, RoceRepr};

/// Ethernet + IPv4 + UDP + BTH, the fixed header prefix of every emitted frame.
pub const HEADERS_LEN: usize = 14 + 20 + 8 + inc_wire::BTH_LEN;
/// Offset of the BTH in an emitted frame.
pub const BTH_OFFSET: usize = 14 + 20 + 8;
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
}

impl RcAddressing {
    fn repr(&self, bth: BthRepr, ext: ExtHeaders, payload_len: usize) -> RoceRepr {
        RoceRepr {
            eth: EthAddrs {
                src: self.local_mac,
                dst: self.peer_mac.unwrap_or(EthernetAddress::BROADCAST),
            },
            ip_src: self.local_ip,
            ip_dst: self.peer_ip,
            ip_ident: 0,
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
    /// `payload`, AckReq clear. Returns the frame length, or `None` if `buf` is too small.
    pub fn emit_send(
        &self,
        buf: &mut [u8],
        psn: Psn,
        imm: Option<u32>,
        payload: &[u8],
    ) -> Option<usize> {
        let opcode =
            if imm.is_some() { Opcode::RcSendOnlyWithImmediate } else { Opcode::RcSendOnly };
        let ext = ExtHeaders { imm, ..ExtHeaders::default() };
        let repr = self.repr(BthRepr::new(opcode, self.peer_qpn, psn), ext, payload.len());
        repr.emit(buf, |p| p.copy_from_slice(payload)).ok()
    }

    /// Writes an ACKNOWLEDGE with `aeth`. Returns the frame length.
    pub fn emit_ack(&self, buf: &mut [u8], psn: Psn, aeth: AethRepr) -> Option<usize> {
        let ext = ExtHeaders { aeth: Some(aeth), ..ExtHeaders::default() };
        let repr = self.repr(BthRepr::new(Opcode::RcAcknowledge, self.peer_qpn, psn), ext, 0);
        repr.emit(buf, |_| {}).ok()
    }
}

/// Sets or clears AckReq in a frame this crate emitted and recomputes its ICRC.
pub fn set_ack_req(frame: &mut [u8], ack_req: bool) {
    let a = BTH_OFFSET + 8;
    let cur = frame[a] & 0x80 != 0;
    if cur == ack_req {
        return;
    }
    frame[a] = (frame[a] & 0x7f) | if ack_req { 0x80 } else { 0 };
    reseal(frame);
}

/// Recomputes the ICRC (the last 4 bytes) of an emitted frame.
pub fn reseal(frame: &mut [u8]) {
    let n = frame.len();
    let crc = inc_wire::icrc::compute(&frame[14..n - 4]);
    frame[n - 4..].copy_from_slice(&crc.to_le_bytes());
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
