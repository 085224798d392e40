//! Whole RoCEv2 frames: Ethernet / IPv4 / UDP / BTH / extension headers / payload /
//! pad / ICRC, parsed into one [`RoceRepr`] and emitted from one.

use std::net::Ipv4Addr;

use crate::bth::{BthPacket, BthRepr, BTH_LEN};
use crate::error::{need, Error, Result};
use crate::ethernet::{
    EtherType, EthernetAddress, EthernetFrame, EthernetRepr, ETHERNET_HEADER_LEN,
};
use crate::ext::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, RethRepr, AETH_LEN, ATOMIC_ACK_ETH_LEN,
    ATOMIC_ETH_LEN, DETH_LEN, RETH_LEN,
};
use crate::icrc::{self, ICRC_LEN};
use crate::ipv4::{Ipv4Packet, Ipv4Repr, IPV4_HEADER_LEN, PROTOCOL_UDP};
use crate::udp::{UdpPacket, UdpRepr, ROCEV2_PORT, UDP_HEADER_LEN};

/// Bytes before the extension headers: Ethernet + IPv4 + UDP + BTH.
pub const BASE_HEADERS_LEN: usize =
    ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;
/// Length of the ImmDt and IETH headers.
const IMM_LEN: usize = 4;

/// Source and destination MAC addresses of a RoCEv2 frame (the EtherType is IPv4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthAddrs {
    pub src: EthernetAddress,
    pub dst: EthernetAddress,
}

/// The extension headers after the BTH; which ones are present follows from the
/// opcode (see the `Opcode::has_*` helpers), and [`RoceRepr::emit`] checks that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    pub reth: Option<RethRepr>,
    pub aeth: Option<AethRepr>,
    pub deth: Option<DethRepr>,
    /// ImmDt, host order.
    pub imm: Option<u32>,
    /// IETH (the R_Key to invalidate, SEND with invalidate), host order.
    pub ieth: Option<u32>,
    pub atomic: Option<AtomicEthRepr>,
    pub atomic_ack: Option<AtomicAckEthRepr>,
}

impl ExtHeaders {
    /// Total length of the headers present.
    pub fn len(&self) -> usize {
        self.deth.map_or(0, |_| DETH_LEN)
            + self.reth.map_or(0, |_| RETH_LEN)
            + self.atomic.map_or(0, |_| ATOMIC_ETH_LEN)
            + self.aeth.map_or(0, |_| AETH_LEN)
            + self.atomic_ack.map_or(0, |_| ATOMIC_ACK_ETH_LEN)
            + self.imm.map_or(0, |_| IMM_LEN)
            + self.ieth.map_or(0, |_| IMM_LEN)
    }

    /// True if no extension header is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A parsed or to-be-emitted RoCEv2 frame, all headers but no payload bytes.
///
/// ```
/// use std::net::Ipv4Addr;
/// use inc_wire::{AethRepr, AethSyndrome, BthRepr, EthAddrs, EthernetAddress, Opcode, Psn, RoceRepr};
///
/// // An ACK for PSN 41 with MSN 3 from 10.0.0.2 to 10.0.0.1, QP 0x11.
/// let mut ack = RoceRepr::new(
///     EthAddrs { src: "02:00:00:00:00:02".parse().unwrap(), dst: EthernetAddress([2, 0, 0, 0, 0, 1]) },
///     Ipv4Addr::new(10, 0, 0, 2),
///     Ipv4Addr::new(10, 0, 0, 1),
///     49152,
///     BthRepr::new(Opcode::RcAcknowledge, 0x11, Psn::new(41)),
/// );
/// ack.ext.aeth = Some(AethRepr { syndrome: AethSyndrome::ACK, msn: 3 });
/// let mut buf = [0u8; 128];
/// let len = ack.emit(&mut buf, |_| {}).unwrap();
/// assert_eq!(len, 62);
///
/// let frame = RoceRepr::parse(&buf[..len]).unwrap();
/// assert!(frame.icrc_ok);
/// assert_eq!(frame.repr.ext.aeth.unwrap().msn, 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoceRepr {
    pub eth: EthAddrs,
    pub ip_src: Ipv4Addr,
    pub ip_dst: Ipv4Addr,
    pub ip_ident: u16,
    pub ttl: u8,
    pub tos: u8,
    pub dont_frag: bool,
    pub udp_src_port: u16,
    pub udp_dst_port: u16,
    /// `bth.pad_count` is what the frame carried when parsed; `emit` recomputes it.
    pub bth: BthRepr,
    pub ext: ExtHeaders,
    /// Payload bytes, without pad.
    pub payload_len: usize,
}

/// Result of [`RoceRepr::parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    pub repr: RoceRepr,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
    /// The ICRC stored in the frame.
    pub icrc: u32,
    /// True if the stored ICRC matches the recomputed one. A bad ICRC is not a parse
    /// error: receivers count and drop such frames, tools report them.
    pub icrc_ok: bool,
}

fn malformed(what: &'static str, reason: &'static str) -> Error {
    Error::Malformed { what, reason }
}

impl RoceRepr {
    /// Defaults for frames the project emits: IPv4 ID 0, DF, TTL 64, TOS 0, UDP
    /// destination port 4791; no extension headers, no payload.
    pub fn new(
        eth: EthAddrs,
        ip_src: Ipv4Addr,
        ip_dst: Ipv4Addr,
        udp_src_port: u16,
        bth: BthRepr,
    ) -> RoceRepr {
        RoceRepr {
            eth,
            ip_src,
            ip_dst,
            ip_ident: 0,
            ttl: 64,
            tos: 0,
            dont_frag: true,
            udp_src_port,
            udp_dst_port: ROCEV2_PORT,
            bth,
            ext: ExtHeaders::default(),
            payload_len: 0,
        }
    }

    /// Number of pad bytes that make the payload a multiple of 4.
    pub const fn pad_len(&self) -> usize {
        (4 - self.payload_len % 4) % 4
    }

    /// Offset of the payload from the start of the frame.
    pub fn payload_offset(&self) -> usize {
        BASE_HEADERS_LEN + self.ext.len()
    }

    /// Length of the UDP payload (BTH through ICRC).
    pub fn udp_payload_len(&self) -> usize {
        BTH_LEN + self.ext.len() + self.payload_len + self.pad_len() + ICRC_LEN
    }

    /// Length of the whole frame, Ethernet header through ICRC.
    pub fn frame_len(&self) -> usize {
        ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN + self.udp_payload_len()
    }

    /// Parses a complete Ethernet frame (bytes after the IPv4 total length, such as
    /// Ethernet padding, are ignored).
    ///
    /// Returns [`Error::NotRoce`] for frames that are not IPv4/UDP to port 4791, and
    /// other errors for RoCEv2 frames that are malformed (bad IPv4 checksum, truncated
    /// headers, pad count beyond the payload, payload on an opcode without one). A bad
    /// ICRC is reported in [`RoceFrame::icrc_ok`].
    pub fn parse(frame: &[u8]) -> Result<RoceFrame<'_>> {
        Self::parse_inner(frame, true, true)
    }

    /// Like [`RoceRepr::parse`] for a frame whose bytes are known intact, without the
    /// pass over the whole frame that checking its ICRC takes: one this process built
    /// and handed over in memory (a switch-to-switch link inside one process). Every
    /// header check still runs; `icrc_ok` is reported `true` unchecked.
    pub fn parse_intact(frame: &[u8]) -> Result<RoceFrame<'_>> {
        Self::parse_inner(frame, true, false)
    }

    /// Like [`RoceRepr::parse`], but accepts any UDP destination port (userspace hosts
    /// sharing an IP listen on their own ports). The ICRC covers the ports either way;
    /// the port received is reported in [`RoceRepr::udp_dst_port`].
    pub fn parse_any_port(frame: &[u8]) -> Result<RoceFrame<'_>> {
        Self::parse_inner(frame, false, true)
    }

    fn parse_inner(
        frame: &[u8],
        require_rocev2_port: bool,
        check_icrc: bool,
    ) -> Result<RoceFrame<'_>> {
        let eth = EthernetFrame::new_checked(frame)?;
        let eth_repr = EthernetRepr::parse(&eth)?;
        if eth_repr.ethertype != EtherType::Ipv4 {
            return Err(Error::NotRoce { reason: "EtherType is not IPv4" });
        }
        let ip_bytes = &frame[ETHERNET_HEADER_LEN..];
        // Decide whether this is RoCEv2 before judging it, so that tools can skip
        // unrelated traffic and still flag broken RoCEv2 frames.
        if ip_bytes.len() < IPV4_HEADER_LEN || ip_bytes[9] != PROTOCOL_UDP {
            return Err(Error::NotRoce { reason: "not UDP over IPv4" });
        }
        let ihl = usize::from(ip_bytes[0] & 0x0f) * 4;
        let dport_at = ihl + 2;
        match ip_bytes.get(dport_at..dport_at + 2) {
            Some(p) if !require_rocev2_port || u16::from_be_bytes([p[0], p[1]]) == ROCEV2_PORT => {}
            _ => return Err(Error::NotRoce { reason: "UDP destination port is not 4791" }),
        }

        let ip = Ipv4Packet::new_checked(ip_bytes)?;
        let ip_repr = Ipv4Repr::parse(&ip)?;
        let ip_total = IPV4_HEADER_LEN + ip_repr.payload_len;
        let udp = UdpPacket::new_checked(ip.payload())?;
        let udp_repr = UdpRepr::parse(&udp)?;
        if udp_repr.payload_len + UDP_HEADER_LEN != ip_repr.payload_len {
            return Err(malformed("UDP length", "differs from the IPv4 payload length"));
        }
        // Re-slice from the input so the payload borrows the frame, not the views.
        let l4 = &ip_bytes[IPV4_HEADER_LEN + UDP_HEADER_LEN..ip_total];
        let bth_pkt = BthPacket::new_checked(l4)?;
        let bth = BthRepr::parse(&bth_pkt)?;
        let op = bth.opcode;

        let ext_len = op.ext_headers_len();
        need("RoCEv2 extension headers and ICRC", BTH_LEN + ext_len + ICRC_LEN, l4.len())?;
        let mut at = BTH_LEN;
        let mut next = |n: usize| {
            let s = &l4[at..at + n];
            at += n;
            s
        };
        let mut ext = ExtHeaders::default();
        // IBA header order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
        if op.has_deth() {
            ext.deth = Some(DethRepr::parse(next(DETH_LEN))?);
        }
        if op.has_reth() {
            ext.reth = Some(RethRepr::parse(next(RETH_LEN))?);
        }
        if op.has_atomic_eth() {
            ext.atomic = Some(AtomicEthRepr::parse(next(ATOMIC_ETH_LEN))?);
        }
        if op.has_aeth() {
            ext.aeth = Some(AethRepr::parse(next(AETH_LEN))?);
        }
        if op.has_atomic_ack_eth() {
            ext.atomic_ack = Some(AtomicAckEthRepr::parse(next(ATOMIC_ACK_ETH_LEN))?);
        }
        if op.has_immediate() {
            let b = next(IMM_LEN);
            ext.imm = Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        }
        if op.has_ieth() {
            let b = next(IMM_LEN);
            ext.ieth = Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        }

        let padded = &l4[at..l4.len() - ICRC_LEN];
        let pad = usize::from(bth.pad_count);
        if pad > padded.len() {
            return Err(malformed("BTH pad_count", "larger than the payload"));
        }
        if !op.has_payload() && !padded.is_empty() {
            return Err(malformed("RoCEv2 payload", "present on an opcode that carries none"));
        }
        let payload = &padded[..padded.len() - pad];

        let ip_all = &ip_bytes[..ip_total];
        let icrc = icrc::stored(ip_all).unwrap_or(0);
        let icrc_ok = !check_icrc || icrc::compute(&ip_all[..ip_total - ICRC_LEN]) == icrc;

        Ok(RoceFrame {
            repr: RoceRepr {
                eth: EthAddrs { src: eth_repr.src_addr, dst: eth_repr.dst_addr },
                ip_src: ip_repr.src_addr,
                ip_dst: ip_repr.dst_addr,
                ip_ident: ip_repr.ident,
                ttl: ip_repr.ttl,
                tos: ip_repr.tos,
                dont_frag: ip_repr.dont_frag,
                udp_src_port: udp_repr.src_port,
                udp_dst_port: udp_repr.dst_port,
                bth,
                ext,
                payload_len: payload.len(),
            },
            payload,
            icrc,
            icrc_ok,
        })
    }

    /// Checks that the extension headers present are exactly the ones the opcode calls
    /// for, and that only opcodes with payload have one.
    fn check_consistent(&self) -> Result<()> {
        let op = self.bth.opcode;
        let e = &self.ext;
        let checks = [
            (e.deth.is_some(), op.has_deth(), "RoceRepr ext.deth"),
            (e.reth.is_some(), op.has_reth(), "RoceRepr ext.reth"),
            (e.atomic.is_some(), op.has_atomic_eth(), "RoceRepr ext.atomic"),
            (e.aeth.is_some(), op.has_aeth(), "RoceRepr ext.aeth"),
            (e.atomic_ack.is_some(), op.has_atomic_ack_eth(), "RoceRepr ext.atomic_ack"),
            (e.imm.is_some(), op.has_immediate(), "RoceRepr ext.imm"),
            (e.ieth.is_some(), op.has_ieth(), "RoceRepr ext.ieth"),
        ];
        for (present, wanted, what) in checks {
            if present && !wanted {
                return Err(malformed(what, "present but the opcode has no such header"));
            }
            if wanted && !present {
                return Err(malformed(what, "missing but the opcode requires it"));
            }
        }
        if self.payload_len > 0 && !op.has_payload() {
            return Err(malformed("RoceRepr payload_len", "nonzero on an opcode without payload"));
        }
        Ok(())
    }

    /// Emits the whole frame into `buf` and returns its length ([`Self::frame_len`]).
    ///
    /// Writes the headers, calls `fill_payload` with the `payload_len` payload bytes
    /// (in place, so the caller can write or reduce straight into the frame), zeroes
    /// the pad, and fills in the pad count, the IPv4 header checksum, UDP checksum 0
    /// and the ICRC. Fails without calling `fill_payload` if `buf` is too small, the
    /// extension headers do not match the opcode, or a field is out of range.
    pub fn emit(&self, buf: &mut [u8], fill_payload: impl FnOnce(&mut [u8])) -> Result<usize> {
        self.emit_with(buf, fill_payload, None)
    }

    /// Like [`Self::emit`] with `payload` copied in and the ICRC derived from
    /// `payload_crc` (its CRC with the pad, [`icrc::PayloadCrc`]) instead of a pass over
    /// the payload: for one payload sent in several frames. Fails if `payload_crc` was
    /// computed over another length than `payload_len`.
    pub fn emit_with_payload_crc(
        &self,
        buf: &mut [u8],
        payload: &[u8],
        payload_crc: &icrc::PayloadCrc,
    ) -> Result<usize> {
        if payload.len() != self.payload_len || payload_crc.payload_len() != self.payload_len {
            return Err(malformed("RoceRepr payload_len", "payload or its CRC has another length"));
        }
        self.emit_with(buf, |p| p.copy_from_slice(payload), Some(payload_crc))
    }

    /// Like [`Self::emit`] for a payload already in `buf` at [`Self::payload_offset`];
    /// with `payload_crc` (its [`icrc::PayloadCrc`]) the ICRC is derived from it instead
    /// of a pass over the payload. Fails if `payload_crc` covers another length.
    pub fn emit_around_payload(
        &self,
        buf: &mut [u8],
        payload_crc: Option<&icrc::PayloadCrc>,
    ) -> Result<usize> {
        if payload_crc.is_some_and(|c| c.payload_len() != self.payload_len) {
            return Err(malformed("RoceRepr payload_len", "the payload's CRC has another length"));
        }
        self.emit_with(buf, |_| {}, payload_crc)
    }

    fn emit_with(
        &self,
        buf: &mut [u8],
        fill_payload: impl FnOnce(&mut [u8]),
        payload_crc: Option<&icrc::PayloadCrc>,
    ) -> Result<usize> {
        self.check_consistent()?;
        let len = self.frame_len();
        if buf.len() < len {
            return Err(Error::BufferTooSmall { what: "RoCEv2 frame", need: len, have: buf.len() });
        }
        let buf = &mut buf[..len];
        let pad = self.pad_len();
        let udp_len = UDP_HEADER_LEN + self.udp_payload_len();

        let ip_repr = Ipv4Repr {
            src_addr: self.ip_src,
            dst_addr: self.ip_dst,
            protocol: PROTOCOL_UDP,
            payload_len: udp_len,
            ttl: self.ttl,
            tos: self.tos,
            ident: self.ip_ident,
            dont_frag: self.dont_frag,
        };
        // Validate every fallible header before writing anything.
        if IPV4_HEADER_LEN + udp_len > usize::from(u16::MAX) {
            return Err(malformed("RoceRepr payload_len", "frame exceeds the IPv4 maximum"));
        }
        let bth = BthRepr { pad_count: pad as u8, ..self.bth };

        EthernetRepr { src_addr: self.eth.src, dst_addr: self.eth.dst, ethertype: EtherType::Ipv4 }
            .emit(&mut EthernetFrame::new_unchecked(&mut buf[..ETHERNET_HEADER_LEN]));
        let ip_at = ETHERNET_HEADER_LEN;
        ip_repr.emit(&mut Ipv4Packet::new_unchecked(&mut buf[ip_at..ip_at + IPV4_HEADER_LEN]))?;
        let udp_at = ip_at + IPV4_HEADER_LEN;
        UdpRepr {
            src_port: self.udp_src_port,
            dst_port: self.udp_dst_port,
            payload_len: udp_len - UDP_HEADER_LEN,
        }
        .emit(&mut UdpPacket::new_unchecked(&mut buf[udp_at..udp_at + UDP_HEADER_LEN]))?;
        let bth_at = udp_at + UDP_HEADER_LEN;
        bth.emit(&mut BthPacket::new_unchecked(&mut buf[bth_at..bth_at + BTH_LEN]))?;

        let mut at = bth_at + BTH_LEN;
        let e = &self.ext;
        if let Some(d) = e.deth {
            d.emit(&mut buf[at..at + DETH_LEN])?;
            at += DETH_LEN;
        }
        if let Some(r) = e.reth {
            r.emit(&mut buf[at..at + RETH_LEN])?;
            at += RETH_LEN;
        }
        if let Some(a) = e.atomic {
            a.emit(&mut buf[at..at + ATOMIC_ETH_LEN])?;
            at += ATOMIC_ETH_LEN;
        }
        if let Some(a) = e.aeth {
            a.emit(&mut buf[at..at + AETH_LEN])?;
            at += AETH_LEN;
        }
        if let Some(a) = e.atomic_ack {
            a.emit(&mut buf[at..at + ATOMIC_ACK_ETH_LEN])?;
            at += ATOMIC_ACK_ETH_LEN;
        }
        if let Some(i) = e.imm {
            buf[at..at + IMM_LEN].copy_from_slice(&i.to_be_bytes());
            at += IMM_LEN;
        }
        if let Some(i) = e.ieth {
            buf[at..at + IMM_LEN].copy_from_slice(&i.to_be_bytes());
            at += IMM_LEN;
        }
        let headers_end = at;
        fill_payload(&mut buf[at..at + self.payload_len]);
        at += self.payload_len;
        buf[at..at + pad].fill(0);
        at += pad;
        let icrc = match payload_crc {
            Some(pc) => icrc::with_payload_crc(&buf[ip_at..headers_end], pc),
            None => icrc::compute(&buf[ip_at..at]),
        };
        buf[at..at + ICRC_LEN].copy_from_slice(&icrc.to_le_bytes());
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AethSyndrome, Opcode, Psn};

    fn base(op: Opcode) -> RoceRepr {
        RoceRepr::new(
            EthAddrs {
                src: EthernetAddress([2, 0, 0, 0, 0, 1]),
                dst: EthernetAddress([2, 0, 0, 0, 0, 2]),
            },
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            49152,
            BthRepr::new(op, 0x11, Psn::new(0xff_ffff)),
        )
    }

    /// `parse_intact` decodes what `parse` decodes, skips only the ICRC, and still
    /// rejects a broken header.
    #[test]
    fn parse_intact_skips_only_the_icrc() {
        let mut r = base(Opcode::RcSendOnly);
        r.payload_len = 6;
        let mut buf = [0u8; 256];
        let n = r.emit(&mut buf, |p| p.copy_from_slice(b"abcdef")).unwrap();
        let (checked, intact) =
            (RoceRepr::parse(&buf[..n]).unwrap(), RoceRepr::parse_intact(&buf[..n]).unwrap());
        assert_eq!((checked.repr, checked.payload), (intact.repr, intact.payload));
        buf[n - 5] ^= 1; // payload byte: only the ICRC notices
        assert!(!RoceRepr::parse(&buf[..n]).unwrap().icrc_ok);
        assert!(RoceRepr::parse_intact(&buf[..n]).unwrap().icrc_ok);
        buf[14 + 10] ^= 1; // IPv4 header checksum
        assert!(RoceRepr::parse_intact(&buf[..n]).is_err());
    }

    #[test]
    fn send_with_imm_round_trip() {
        let mut r = base(Opcode::RcSendOnlyWithImmediate);
        r.ext.imm = Some(0xffff_1100);
        r.payload_len = 5;
        let mut buf = [0u8; 256];
        let n = r.emit(&mut buf, |p| p.copy_from_slice(b"hello")).unwrap();
        assert_eq!(n, 14 + 20 + 8 + 12 + 4 + 5 + 3 + 4);
        let f = RoceRepr::parse(&buf[..n]).unwrap();
        assert!(f.icrc_ok);
        assert_eq!(f.payload, b"hello");
        assert_eq!(f.repr.bth.pad_count, 3);
        assert_eq!(f.repr, RoceRepr { bth: BthRepr { pad_count: 3, ..r.bth }, ..r });
        // A flipped payload bit breaks only the ICRC.
        buf[n - 6] ^= 1;
        assert!(!RoceRepr::parse(&buf[..n]).unwrap().icrc_ok);
    }

    #[test]
    fn payload_crc_gives_the_same_frame_for_every_pad() {
        for len in [0usize, 1, 2, 3, 4, 4095, 4096] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut r = base(Opcode::RcSendOnlyWithImmediate);
            r.ext.imm = Some(7);
            r.payload_len = len;
            let pc = icrc::PayloadCrc::new(&payload);
            let (mut a, mut b) = (vec![0u8; 4200], vec![0u8; 4200]);
            let n = r.emit(&mut a, |p| p.copy_from_slice(&payload)).unwrap();
            assert_eq!(r.emit_with_payload_crc(&mut b, &payload, &pc).unwrap(), n);
            assert_eq!(a[..n], b[..n], "payload of {len} bytes");
            let short = icrc::PayloadCrc::new(&payload[..len.saturating_sub(1)]);
            if len > 0 {
                assert!(r.emit_with_payload_crc(&mut b, &payload, &short).is_err());
            }
        }
    }

    /// A payload written in place gives the frame `emit` builds, with and without its
    /// CRC computed beforehand; a CRC of another length is refused.
    #[test]
    fn emit_around_payload_matches_emit() {
        for len in [0usize, 3, 4, 4096] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut r = base(Opcode::RcSendOnly);
            r.payload_len = len;
            let mut want = vec![0u8; 4200];
            let n = r.emit(&mut want, |p| p.copy_from_slice(&payload)).unwrap();
            let crc = icrc::PayloadCrc::new(&payload);
            for pc in [None, Some(&crc)] {
                let mut got = vec![0xFFu8; 4200];
                let at = r.payload_offset();
                got[at..at + len].copy_from_slice(&payload);
                assert_eq!(r.emit_around_payload(&mut got, pc).unwrap(), n);
                assert_eq!(got[..n], want[..n], "{len} bytes, crc given: {}", pc.is_some());
            }
            let other = icrc::PayloadCrc::new(&[0u8; 5]);
            assert!(r.emit_around_payload(&mut vec![0u8; 4200], Some(&other)).is_err());
        }
    }

    #[test]
    fn parse_any_port_accepts_other_ports_and_checks_icrc() {
        let mut r = base(Opcode::RcSendOnly);
        r.udp_dst_port = 50000;
        r.payload_len = 8;
        let mut buf = [0u8; 256];
        let n = r.emit(&mut buf, |p| p.copy_from_slice(b"12345678")).unwrap();
        assert!(matches!(RoceRepr::parse(&buf[..n]), Err(Error::NotRoce { .. })));
        let f = RoceRepr::parse_any_port(&buf[..n]).unwrap();
        assert!(f.icrc_ok);
        assert_eq!(f.payload, b"12345678");
        assert_eq!(f.repr, r);
        // The ICRC covers the ports: a flipped destination port bit is detected.
        let dport_at = 14 + 20 + 2;
        buf[dport_at + 1] ^= 1;
        assert!(!RoceRepr::parse_any_port(&buf[..n]).unwrap().icrc_ok);
        buf[dport_at + 1] ^= 1;
        // So is a flipped payload bit.
        buf[n - 5] ^= 0x80;
        assert!(!RoceRepr::parse_any_port(&buf[..n]).unwrap().icrc_ok);
    }

    #[test]
    fn ack_and_errors() {
        let mut r = base(Opcode::RcAcknowledge);
        r.ext.aeth = Some(AethRepr { syndrome: AethSyndrome::ACK, msn: 7 });
        let mut buf = [0u8; 62];
        assert_eq!(r.emit(&mut buf, |_| {}).unwrap(), 62);
        assert!(RoceRepr::parse(&buf).unwrap().icrc_ok);
        assert!(matches!(RoceRepr::parse(&buf[..50]), Err(Error::Truncated { .. })));
        assert!(matches!(r.emit(&mut buf[..61], |_| {}), Err(Error::BufferTooSmall { .. })));
        let missing = RoceRepr { ext: ExtHeaders::default(), ..r };
        assert!(matches!(missing.emit(&mut buf, |_| {}), Err(Error::Malformed { .. })));
        let with_payload = RoceRepr { payload_len: 4, ..r };
        assert!(with_payload.emit(&mut [0u8; 128], |_| {}).is_err());
        let mut other = buf;
        other[14 + 20 + 2] = 0x13; // UDP destination port 4883
        assert!(matches!(RoceRepr::parse(&other), Err(Error::NotRoce { .. })));
    }
}
