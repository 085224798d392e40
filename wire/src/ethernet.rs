//! Ethernet II (no VLAN tags).

use core::fmt;
use core::str::FromStr;

use crate::error::{need, Error, Result};
use crate::field;

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// ff:ff:ff:ff:ff:ff
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Builds an address from a slice of exactly 6 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let a: [u8; 6] = b
            .try_into()
            .map_err(|_| Error::Malformed { what: "Ethernet address", reason: "not 6 bytes" })?;
        Ok(EthernetAddress(a))
    }
    pub const fn as_bytes(&self) -> &[u8; 6] {
        &self.0
    }
    pub const fn is_broadcast(&self) -> bool {
        matches!(self.0, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
    }
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }
    /// A unicast, not all-zero address.
    pub const fn is_unicast(&self) -> bool {
        !self.is_multicast() && !matches!(self.0, [0, 0, 0, 0, 0, 0])
    }
    /// The deterministic address of `mac: auto` in topologies: `02:00:a:b:c:d` for
    /// IPv4 `a.b.c.d`. Locally administered and unicast; the netns scripts assign
    /// exactly these, so rules computed offline match the interfaces they create.
    pub const fn from_ipv4(ip: core::net::Ipv4Addr) -> Self {
        let o = ip.octets();
        EthernetAddress([0x02, 0x00, o[0], o[1], o[2], o[3]])
    }
    /// The six bytes.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }
}

/// Text form (`aa:bb:cc:dd:ee:ff`) in serde formats: the control plane's JSON and YAML.
#[cfg(feature = "serde")]
mod serde_text {
    use core::fmt;

    use serde::de::Visitor;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::EthernetAddress;

    impl Serialize for EthernetAddress {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(self)
        }
    }

    struct Text;

    impl Visitor<'_> for Text {
        type Value = EthernetAddress;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a MAC address like 02:00:00:00:00:01")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<EthernetAddress, E> {
            v.parse().map_err(|_| E::custom(format_args!("invalid MAC address `{v}`")))
        }
    }

    impl<'de> Deserialize<'de> for EthernetAddress {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(Text)
        }
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

/// Error parsing an [`EthernetAddress`] from text; carries nothing because the caller
/// knows the string it passed and should name it in its own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address (expected six hex bytes like 02:00:00:00:00:01)")]
pub struct ParseEthernetAddressError;

impl FromStr for EthernetAddress {
    type Err = ParseEthernetAddressError;
    fn from_str(s: &str) -> core::result::Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in &mut out {
            let p = parts.next().ok_or(ParseEthernetAddressError)?;
            if p.is_empty() || p.len() > 2 {
                return Err(ParseEthernetAddressError);
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| ParseEthernetAddressError)?;
        }
        if parts.next().is_some() {
            return Err(ParseEthernetAddressError);
        }
        Ok(EthernetAddress(out))
    }
}

/// EtherType of an Ethernet II frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EtherType {
    Ipv4,
    Arp,
    Ipv6,
    Unknown(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            0x0806 => EtherType::Arp,
            0x86dd => EtherType::Ipv6,
            other => EtherType::Unknown(other),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Arp => 0x0806,
            EtherType::Ipv6 => 0x86dd,
            EtherType::Unknown(other) => other,
        }
    }
}

/// Length of the Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// Zero-copy view of an Ethernet II frame.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }
    /// Checks that the buffer holds at least the 14-byte header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need("Ethernet header", ETHERNET_HEADER_LEN, buffer.as_ref().len())?;
        Ok(EthernetFrame { buffer })
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn dst_addr(&self) -> EthernetAddress {
        let b = self.buffer.as_ref();
        EthernetAddress([b[0], b[1], b[2], b[3], b[4], b[5]])
    }
    pub fn src_addr(&self) -> EthernetAddress {
        let b = self.buffer.as_ref();
        EthernetAddress([b[6], b[7], b[8], b[9], b[10], b[11]])
    }
    pub fn ethertype(&self) -> EtherType {
        field::u16_at(self.buffer.as_ref(), 12).into()
    }
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[ETHERNET_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a.0);
    }
    pub fn set_src_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a.0);
    }
    pub fn set_ethertype(&mut self, t: EtherType) {
        field::set_u16(self.buffer.as_mut(), 12, t.into());
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[ETHERNET_HEADER_LEN..]
    }
}

/// High-level Ethernet II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    pub src_addr: EthernetAddress,
    pub dst_addr: EthernetAddress,
    pub ethertype: EtherType,
}

impl EthernetRepr {
    pub const HEADER_LEN: usize = ETHERNET_HEADER_LEN;

    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<Self> {
        need("Ethernet header", ETHERNET_HEADER_LEN, frame.buffer.as_ref().len())?;
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }
    pub const fn buffer_len(&self) -> usize {
        ETHERNET_HEADER_LEN
    }
    /// Writes the header; the frame must hold at least 14 bytes (use `new_checked`).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut EthernetFrame<T>) {
        frame.set_src_addr(self.src_addr);
        frame.set_dst_addr(self.dst_addr);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_mac_from_ipv4() {
        let m = EthernetAddress::from_ipv4(core::net::Ipv4Addr::new(10, 1, 1, 21));
        assert_eq!(m.to_string(), "02:00:0a:01:01:15");
        assert!(m.is_unicast());
        assert_eq!("2:0:a:1:1:15".parse::<EthernetAddress>(), Ok(m));
    }

    #[test]
    fn mac_text_round_trip() {
        let a: EthernetAddress = "02:00:0a:4d:00:01".parse().unwrap();
        assert_eq!(a.0, [2, 0, 0x0a, 0x4d, 0, 1]);
        assert_eq!(a.to_string(), "02:00:0a:4d:00:01");
        assert!("02:00:0a:4d:00".parse::<EthernetAddress>().is_err());
        assert!("02:00:0a:4d:00:01:02".parse::<EthernetAddress>().is_err());
        assert!("zz:00:0a:4d:00:01".parse::<EthernetAddress>().is_err());
        assert!(EthernetAddress::BROADCAST.is_broadcast());
    }

    #[test]
    fn header_round_trip() {
        let repr = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress::BROADCAST,
            ethertype: EtherType::Arp,
        };
        let mut buf = [0u8; 14];
        let mut f = EthernetFrame::new_checked(&mut buf[..]).unwrap();
        repr.emit(&mut f);
        let f = EthernetFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f).unwrap(), repr);
        assert!(EthernetFrame::new_checked(&buf[..13]).is_err());
    }
}
