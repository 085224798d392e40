//! Ethernet MAC address newtype, serialized as `aa:bb:cc:dd:ee:ff`.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// The deterministic MAC used for `mac: auto`: `02:00:a:b:c:d` for IPv4 `a.b.c.d`.
    ///
    /// Locally administered, unicast; the netns scripts assign exactly these MACs, so
    /// rules computed offline match the interfaces that get created.
    pub fn from_ipv4(ip: Ipv4Addr) -> Mac {
        let o = ip.octets();
        Mac([0x02, 0x00, o[0], o[1], o[2], o[3]])
    }

    /// Raw bytes.
    pub fn octets(self) -> [u8; 6] {
        self.0
    }

    /// True for group (multicast/broadcast) addresses.
    pub fn is_multicast(self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Error parsing a MAC address string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address `{0}` (expected six hex bytes separated by `:`)")]
pub struct ParseMacError(pub String);

impl FromStr for Mac {
    type Err = ParseMacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseMacError(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let p = parts.next().ok_or_else(err)?;
            if p.is_empty() || p.len() > 2 {
                return Err(err());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(Mac(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_mac_from_ip() {
        let m = Mac::from_ipv4(Ipv4Addr::new(10, 1, 1, 21));
        assert_eq!(m.to_string(), "02:00:0a:01:01:15");
        assert_eq!("02:00:0a:01:01:15".parse::<Mac>().unwrap(), m);
        assert_eq!("2:0:a:1:1:15".parse::<Mac>().unwrap(), m);
    }

    #[test]
    fn bad_macs() {
        for s in ["", "02:00", "02:00:0a:01:01:15:00", "zz:00:0a:01:01:15", "123:0:0:0:0:0"] {
            assert!(s.parse::<Mac>().is_err(), "{s}");
        }
    }

    #[test]
    fn serde_roundtrip() {
        let m = Mac([0xde, 0xad, 0xbe, 0xef, 0, 1]);
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, "\"de:ad:be:ef:00:01\"");
        assert_eq!(serde_json::from_str::<Mac>(&j).unwrap(), m);
    }
}
