//! UDP (RFC 768). RoCEv2 senders write checksum 0; the ICRC protects the packet.

use crate::error::{need, Error, Result};
use crate::field;

/// UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;
/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;

/// Zero-copy view of a UDP datagram.
#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }
    /// Checks that the buffer holds the header and the length it announces.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = UdpPacket { buffer };
        let len = p.buffer.as_ref().len();
        need("UDP header", UDP_HEADER_LEN, len)?;
        let l = usize::from(p.length());
        if l < UDP_HEADER_LEN {
            return Err(Error::Malformed { what: "UDP header", reason: "length below 8" });
        }
        need("UDP datagram (length field)", l, len)?;
        Ok(p)
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn src_port(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 0)
    }
    pub fn dst_port(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 2)
    }
    /// The length field (header + payload).
    pub fn length(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 4)
    }
    pub fn checksum(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 6)
    }
    /// The payload, bounded by the length field.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[UDP_HEADER_LEN..usize::from(self.length())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    pub fn set_src_port(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 0, v);
    }
    pub fn set_dst_port(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 2, v);
    }
    pub fn set_len(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 4, v);
    }
    pub fn set_checksum(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 6, v);
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let l = usize::from(self.length());
        &mut self.buffer.as_mut()[UDP_HEADER_LEN..l]
    }
}

/// High-level UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload_len: usize,
}

impl UdpRepr {
    pub const HEADER_LEN: usize = UDP_HEADER_LEN;

    /// Parses the header. The checksum is not verified: RoCEv2 sends 0 and the ICRC
    /// covers the datagram.
    pub fn parse<T: AsRef<[u8]>>(packet: &UdpPacket<T>) -> Result<Self> {
        let len = packet.buffer.as_ref().len();
        need("UDP header", UDP_HEADER_LEN, len)?;
        let l = usize::from(packet.length());
        if l < UDP_HEADER_LEN {
            return Err(Error::Malformed { what: "UDP header", reason: "length below 8" });
        }
        need("UDP datagram (length field)", l, len)?;
        Ok(UdpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: l - UDP_HEADER_LEN,
        })
    }

    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN
    }

    /// Writes the header with checksum 0.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut UdpPacket<T>) -> Result<()> {
        need("UDP header (emit)", UDP_HEADER_LEN, packet.buffer.as_ref().len())?;
        let l = u16::try_from(UDP_HEADER_LEN + self.payload_len).map_err(|_| Error::Malformed {
            what: "UDP payload_len",
            reason: "length exceeds 65535",
        })?;
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(l);
        packet.set_checksum(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = UdpRepr { src_port: 49441, dst_port: ROCEV2_PORT, payload_len: 4 };
        let mut buf = [0u8; 12];
        r.emit(&mut UdpPacket::new_unchecked(&mut buf[..])).unwrap();
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(UdpRepr::parse(&p).unwrap(), r);
        assert_eq!(p.checksum(), 0);
        assert!(UdpPacket::new_checked(&buf[..11]).is_err());
    }
}
