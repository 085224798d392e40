//! ARP for Ethernet/IPv4 (RFC 826), enough for a switch port to answer who-has.

use std::net::Ipv4Addr;

use crate::error::{need, Error, Result};
use crate::ethernet::EthernetAddress;
use crate::field;

/// Length of an Ethernet/IPv4 ARP packet.
pub const ARP_LEN: usize = 28;

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArpOperation {
    Request,
    Reply,
    Unknown(u16),
}

impl From<u16> for ArpOperation {
    fn from(v: u16) -> Self {
        match v {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            o => ArpOperation::Unknown(o),
        }
    }
}

impl From<ArpOperation> for u16 {
    fn from(v: ArpOperation) -> u16 {
        match v {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
            ArpOperation::Unknown(o) => o,
        }
    }
}

/// Zero-copy view of an ARP packet (fields at the Ethernet/IPv4 offsets).
#[derive(Debug, Clone, Copy)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }
    /// Checks the buffer holds the 28 bytes of an Ethernet/IPv4 ARP packet.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need("ARP packet", ARP_LEN, buffer.as_ref().len())?;
        Ok(ArpPacket { buffer })
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn hardware_type(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 0)
    }
    pub fn protocol_type(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 2)
    }
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[4]
    }
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[5]
    }
    pub fn operation(&self) -> ArpOperation {
        field::u16_at(self.buffer.as_ref(), 6).into()
    }
    pub fn source_hardware_addr(&self) -> EthernetAddress {
        let b = &self.buffer.as_ref()[8..14];
        EthernetAddress([b[0], b[1], b[2], b[3], b[4], b[5]])
    }
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(field::u32_at(self.buffer.as_ref(), 14))
    }
    pub fn target_hardware_addr(&self) -> EthernetAddress {
        let b = &self.buffer.as_ref()[18..24];
        EthernetAddress([b[0], b[1], b[2], b[3], b[4], b[5]])
    }
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(field::u32_at(self.buffer.as_ref(), 24))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    pub fn set_hardware_type(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 0, v);
    }
    pub fn set_protocol_type(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 2, v);
    }
    pub fn set_hardware_len(&mut self, v: u8) {
        self.buffer.as_mut()[4] = v;
    }
    pub fn set_protocol_len(&mut self, v: u8) {
        self.buffer.as_mut()[5] = v;
    }
    pub fn set_operation(&mut self, v: ArpOperation) {
        field::set_u16(self.buffer.as_mut(), 6, v.into());
    }
    pub fn set_source_hardware_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[8..14].copy_from_slice(&a.0);
    }
    pub fn set_source_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[14..18].copy_from_slice(&a.octets());
    }
    pub fn set_target_hardware_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[18..24].copy_from_slice(&a.0);
    }
    pub fn set_target_protocol_addr(&mut self, a: Ipv4Addr) {
        self.buffer.as_mut()[24..28].copy_from_slice(&a.octets());
    }
}

/// High-level Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    pub operation: ArpOperation,
    pub source_hardware_addr: EthernetAddress,
    pub source_protocol_addr: Ipv4Addr,
    pub target_hardware_addr: EthernetAddress,
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    pub fn parse<T: AsRef<[u8]>>(packet: &ArpPacket<T>) -> Result<Self> {
        need("ARP packet", ARP_LEN, packet.buffer.as_ref().len())?;
        if packet.hardware_type() != 1 || packet.hardware_len() != 6 {
            return Err(Error::Unsupported {
                what: "ARP",
                reason: "hardware type is not Ethernet",
            });
        }
        if packet.protocol_type() != 0x0800 || packet.protocol_len() != 4 {
            return Err(Error::Unsupported { what: "ARP", reason: "protocol type is not IPv4" });
        }
        Ok(ArpRepr {
            operation: packet.operation(),
            source_hardware_addr: packet.source_hardware_addr(),
            source_protocol_addr: packet.source_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        ARP_LEN
    }

    /// Writes the packet; the view must hold 28 bytes (use `new_checked`).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ArpPacket<T>) {
        packet.set_hardware_type(1);
        packet.set_protocol_type(0x0800);
        packet.set_hardware_len(6);
        packet.set_protocol_len(4);
        packet.set_operation(self.operation);
        packet.set_source_hardware_addr(self.source_hardware_addr);
        packet.set_source_protocol_addr(self.source_protocol_addr);
        packet.set_target_hardware_addr(self.target_hardware_addr);
        packet.set_target_protocol_addr(self.target_protocol_addr);
    }

    /// The reply a host owning `target_protocol_addr` with MAC `our_mac` sends to this
    /// request.
    pub fn reply(&self, our_mac: EthernetAddress) -> ArpRepr {
        ArpRepr {
            operation: ArpOperation::Reply,
            source_hardware_addr: our_mac,
            source_protocol_addr: self.target_protocol_addr,
            target_hardware_addr: self.source_hardware_addr,
            target_protocol_addr: self.source_protocol_addr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_reply() {
        let req = ArpRepr {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            source_protocol_addr: Ipv4Addr::new(10, 0, 0, 1),
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: Ipv4Addr::new(10, 0, 0, 2),
        };
        let mut buf = [0u8; ARP_LEN];
        req.emit(&mut ArpPacket::new_checked(&mut buf[..]).unwrap());
        assert_eq!(&buf[..8], &[0, 1, 8, 0, 6, 4, 0, 1]);
        let back = ArpRepr::parse(&ArpPacket::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(back, req);
        let rep = req.reply(EthernetAddress([2, 0, 0, 0, 0, 2]));
        assert_eq!(rep.operation, ArpOperation::Reply);
        assert_eq!(rep.source_protocol_addr, Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(rep.target_hardware_addr, req.source_hardware_addr);
        buf[1] = 6; // hardware type 6 (IEEE 802) is not supported
        assert!(ArpRepr::parse(&ArpPacket::new_checked(&buf[..]).unwrap()).is_err());
        assert!(ArpPacket::new_checked(&buf[..27]).is_err());
    }
}
