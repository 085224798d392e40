//! IPv4 (RFC 791) without options or fragmentation, which RoCEv2 never uses.

use std::net::Ipv4Addr;

use crate::error::{need, Error, Result};
use crate::field;

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const PROTOCOL_UDP: u8 = 17;

/// The Internet checksum (RFC 1071) of `data`, folded and complemented.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Zero-copy view of an IPv4 packet.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }
    /// Checks that the buffer holds the header (IHL) and the total length it announces;
    /// bytes beyond the total length (Ethernet padding) are allowed and ignored.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Ipv4Packet { buffer };
        let len = p.buffer.as_ref().len();
        need("IPv4 header", IPV4_HEADER_LEN, len)?;
        let hl = usize::from(p.header_len());
        if hl < IPV4_HEADER_LEN {
            return Err(Error::Malformed { what: "IPv4 header", reason: "IHL below 5" });
        }
        need("IPv4 header with options", hl, len)?;
        let tl = usize::from(p.total_len());
        if tl < hl {
            return Err(Error::Malformed {
                what: "IPv4 header",
                reason: "total length below header length",
            });
        }
        need("IPv4 packet (total length)", tl, len)?;
        Ok(p)
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }
    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> u8 {
        (self.buffer.as_ref()[0] & 0x0f) * 4
    }
    /// The whole TOS byte (DSCP and ECN).
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    pub fn total_len(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 2)
    }
    pub fn ident(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 4)
    }
    pub fn dont_frag(&self) -> bool {
        self.buffer.as_ref()[6] & 0x40 != 0
    }
    pub fn more_frags(&self) -> bool {
        self.buffer.as_ref()[6] & 0x20 != 0
    }
    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (field::u16_at(self.buffer.as_ref(), 6) & 0x1fff) << 3
    }
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[8]
    }
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[9]
    }
    pub fn checksum(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 10)
    }
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(field::u32_at(self.buffer.as_ref(), 12))
    }
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(field::u32_at(self.buffer.as_ref(), 16))
    }
    /// True if the header checksum is valid.
    pub fn verify_checksum(&self) -> bool {
        let hl = usize::from(self.header_len());
        internet_checksum(&self.buffer.as_ref()[..hl]) == 0
    }
    /// The payload, bounded by the total length (excludes Ethernet padding).
    pub fn payload(&self) -> &[u8] {
        let hl = usize::from(self.header_len());
        let tl = usize::from(self.total_len());
        &self.buffer.as_ref()[hl..tl]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    pub fn set_version_and_header_len(&mut self, version: u8, header_len: u8) {
        self.buffer.as_mut()[0] = (version << 4) | ((header_len / 4) & 0x0f);
    }
    pub fn set_tos(&mut self, v: u8) {
        self.buffer.as_mut()[1] = v;
    }
    pub fn set_total_len(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 2, v);
    }
    pub fn set_ident(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 4, v);
    }
    /// Sets flags (DF only, MF clear) and a zero fragment offset.
    pub fn set_dont_frag_unfragmented(&mut self, df: bool) {
        field::set_u16(self.buffer.as_mut(), 6, if df { 0x4000 } else { 0 });
    }
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[8] = v;
    }
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[9] = v;
    }
    pub fn set_checksum(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 10, v);
    }
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[12..16].copy_from_slice(&a.octets());
    }
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[16..20].copy_from_slice(&a.octets());
    }
    /// Recomputes the header checksum over the current header.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = usize::from(self.header_len());
        let c = internet_checksum(&self.buffer.as_ref()[..hl]);
        self.set_checksum(c);
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = usize::from(self.header_len());
        let tl = usize::from(self.total_len());
        &mut self.buffer.as_mut()[hl..tl]
    }
}

/// High-level IPv4 header (no options, not fragmented).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub protocol: u8,
    pub payload_len: usize,
    pub ttl: u8,
    pub tos: u8,
    pub ident: u16,
    pub dont_frag: bool,
}

impl Ipv4Repr {
    pub const HEADER_LEN: usize = IPV4_HEADER_LEN;

    /// Parses and validates the header: version 4, no options, not a fragment, valid
    /// header checksum.
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>) -> Result<Self> {
        let len = packet.buffer.as_ref().len();
        need("IPv4 header", IPV4_HEADER_LEN, len)?;
        if packet.version() != 4 {
            return Err(Error::Malformed { what: "IPv4 header", reason: "version is not 4" });
        }
        if usize::from(packet.header_len()) != IPV4_HEADER_LEN {
            return Err(Error::Unsupported { what: "IPv4 header", reason: "options present" });
        }
        let tl = usize::from(packet.total_len());
        if tl < IPV4_HEADER_LEN {
            return Err(Error::Malformed {
                what: "IPv4 header",
                reason: "total length below header length",
            });
        }
        need("IPv4 packet (total length)", tl, len)?;
        if packet.more_frags() || packet.frag_offset() != 0 {
            return Err(Error::Unsupported { what: "IPv4 packet", reason: "fragmented" });
        }
        if !packet.verify_checksum() {
            return Err(Error::BadChecksum { what: "IPv4 header" });
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: tl - IPV4_HEADER_LEN,
            ttl: packet.ttl(),
            tos: packet.tos(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Writes the 20-byte header including its checksum. The view must hold 20 bytes;
    /// fails if the total length does not fit 16 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Ipv4Packet<T>) -> Result<()> {
        need("IPv4 header (emit)", IPV4_HEADER_LEN, packet.buffer.as_ref().len())?;
        let total = u16::try_from(IPV4_HEADER_LEN + self.payload_len).map_err(|_| {
            Error::Malformed { what: "IPv4 payload_len", reason: "total length exceeds 65535" }
        })?;
        packet.set_version_and_header_len(4, IPV4_HEADER_LEN as u8);
        packet.set_tos(self.tos);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_dont_frag_unfragmented(self.dont_frag);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 77, 0, 2),
            dst_addr: Ipv4Addr::new(10, 77, 0, 1),
            protocol: PROTOCOL_UDP,
            payload_len: 8,
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_frag: true,
        }
    }

    #[test]
    fn round_trip_and_checksum() {
        let mut buf = [0u8; 28];
        repr().emit(&mut Ipv4Packet::new_unchecked(&mut buf[..])).unwrap();
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(Ipv4Repr::parse(&p).unwrap(), repr());
        buf[8] = 63;
        let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p), Err(Error::BadChecksum { what: "IPv4 header" }));
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut buf = [0u8; 28];
        repr().emit(&mut Ipv4Packet::new_unchecked(&mut buf[..])).unwrap();
        assert!(Ipv4Packet::new_checked(&buf[..27]).is_err());
        buf[0] = 0x44;
        assert!(Ipv4Packet::new_checked(&buf[..]).is_err());
        let big = Ipv4Repr { payload_len: 70_000, ..repr() };
        assert!(big.emit(&mut Ipv4Packet::new_unchecked(&mut [0u8; 20][..])).is_err());
    }

    #[test]
    fn checksum_known_value() {
        // Example header from RFC 1071 style calculations (wikipedia IPv4 checksum).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(internet_checksum(&h), 0xb861);
    }
}
