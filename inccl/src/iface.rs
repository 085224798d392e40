//! Data-plane address selection: which IPv4 address and MAC this rank's QPs use.
//!
//! Order: `INCCL_IFACE` (or [`GroupConfig::iface`]) names the interface; an explicit
//! `INCCL_LOCAL_IP` overrides its address; otherwise the single non-loopback IPv4
//! interface that is not the one used to reach the master is chosen. A host with only
//! the management interface uses that one.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};

use inc_ctrl_proto::EthernetAddress;
use nix::net::if_::InterfaceFlags;

use crate::config::GroupConfig;
use crate::error::{Error, Result};

/// The data-plane identity of a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataPlane {
    /// Interface name, when known.
    pub iface: Option<String>,
    /// IPv4 address the QPs bind to and register with the controller.
    pub ip: Ipv4Addr,
    /// MAC address of the interface (derived from the IP when unknown).
    pub mac: EthernetAddress,
}

/// One interface as seen by `getifaddrs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct IfInfo {
    pub ipv4: Vec<Ipv4Addr>,
    pub mac: Option<EthernetAddress>,
    pub loopback: bool,
    pub up: bool,
}

/// All interfaces of this network namespace by name.
pub(crate) fn interfaces() -> Result<BTreeMap<String, IfInfo>> {
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| Error::io("getifaddrs (listing network interfaces)", e.into()))?;
    let mut out: BTreeMap<String, IfInfo> = BTreeMap::new();
    for a in addrs {
        let info = out.entry(a.interface_name.clone()).or_default();
        info.loopback |= a.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        info.up |= a.flags.contains(InterfaceFlags::IFF_UP);
        let Some(addr) = a.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            info.ipv4.push(sin.ip());
        } else if let Some(mac) = addr.as_link_addr().and_then(|l| l.addr()) {
            info.mac = Some(EthernetAddress(mac));
        }
    }
    Ok(out)
}

/// Local IPv4 address the kernel would use to reach `peer` (the management address).
fn local_ip_towards(peer: &str) -> Option<Ipv4Addr> {
    let addr: SocketAddr = peer.to_socket_addrs().ok()?.find(|a| a.is_ipv4())?;
    let s = UdpSocket::bind(("0.0.0.0", 0)).ok()?;
    s.connect(addr).ok()?;
    match s.local_addr().ok()? {
        SocketAddr::V4(v4) => Some(*v4.ip()),
        SocketAddr::V6(_) => None,
    }
}

/// Resolve this rank's data-plane address from the configuration and the interfaces.
pub fn resolve(cfg: &GroupConfig) -> Result<DataPlane> {
    let ifs = interfaces()?;
    let mgmt = local_ip_towards(&cfg.master_endpoint());
    select(cfg.iface.as_deref(), cfg.local_ip, cfg.local_mac, mgmt, &ifs)
}

pub(crate) fn select(
    iface: Option<&str>,
    local_ip: Option<Ipv4Addr>,
    local_mac: Option<EthernetAddress>,
    mgmt: Option<Ipv4Addr>,
    ifs: &BTreeMap<String, IfInfo>,
) -> Result<DataPlane> {
    if let Some(name) = iface {
        let info = ifs.get(name).ok_or_else(|| {
            let names: Vec<&str> = ifs.keys().map(String::as_str).collect();
            Error::Config(format!(
                "data-plane interface `{name}` (INCCL_IFACE) does not exist here; interfaces: {}",
                names.join(", ")
            ))
        })?;
        let ip = match local_ip.or_else(|| info.ipv4.first().copied()) {
            Some(ip) => ip,
            None => {
                return Err(Error::Config(format!(
                    "data-plane interface `{name}` (INCCL_IFACE) has no IPv4 address"
                )))
            }
        };
        let mac = local_mac.or(info.mac).unwrap_or_else(|| EthernetAddress::from_ipv4(ip));
        return Ok(DataPlane { iface: Some(name.to_string()), ip, mac });
    }
    if let Some(ip) = local_ip {
        // An address inside 127/8 or one the tests bind on `lo` may not be listed.
        let owner = ifs.iter().find(|(_, i)| i.ipv4.contains(&ip));
        let mac = local_mac
            .or_else(|| owner.and_then(|(_, i)| i.mac).filter(|m| m.0 != [0; 6]))
            .unwrap_or_else(|| EthernetAddress::from_ipv4(ip));
        return Ok(DataPlane { iface: owner.map(|(n, _)| n.clone()), ip, mac });
    }
    let usable: Vec<(&String, &IfInfo)> =
        ifs.iter().filter(|(_, i)| !i.loopback && i.up && !i.ipv4.is_empty()).collect();
    let data: Vec<&(&String, &IfInfo)> =
        usable.iter().filter(|(_, i)| mgmt.is_none_or(|m| !i.ipv4.contains(&m))).collect();
    let pick = match (data.as_slice(), usable.as_slice()) {
        ([one], _) => *one,
        // Only the management interface exists: data and management share it.
        ([], [only]) => only,
        _ => {
            let names: Vec<String> =
                usable.iter().map(|(n, i)| format!("{n} ({})", i.ipv4[0])).collect();
            return Err(Error::Config(format!(
                "cannot choose the data-plane interface automatically among [{}]{}; set INCCL_IFACE",
                names.join(", "),
                mgmt.map(|m| format!(" (management address {m})")).unwrap_or_default()
            )));
        }
    };
    let (name, info) = pick;
    let ip = info.ipv4[0];
    Ok(DataPlane {
        iface: Some(name.to_string()),
        ip,
        mac: local_mac.or(info.mac).unwrap_or_else(|| EthernetAddress::from_ipv4(ip)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> BTreeMap<String, IfInfo> {
        let mut t = BTreeMap::new();
        t.insert(
            "lo".to_string(),
            IfInfo { ipv4: vec![Ipv4Addr::LOCALHOST], mac: None, loopback: true, up: true },
        );
        t.insert(
            "mgmt0".to_string(),
            IfInfo {
                ipv4: vec![Ipv4Addr::new(192, 0, 2, 5)],
                mac: Some(EthernetAddress([2, 0, 0, 0, 0, 5])),
                loopback: false,
                up: true,
            },
        );
        t.insert(
            "data0".to_string(),
            IfInfo {
                ipv4: vec![Ipv4Addr::new(10, 1, 0, 2)],
                mac: Some(EthernetAddress([2, 0, 0, 0, 1, 2])),
                loopback: false,
                up: true,
            },
        );
        t
    }

    #[test]
    fn auto_picks_the_non_management_interface() {
        let dp = select(None, None, None, Some(Ipv4Addr::new(192, 0, 2, 5)), &table()).unwrap();
        assert_eq!(dp.iface.as_deref(), Some("data0"));
        assert_eq!(dp.ip, Ipv4Addr::new(10, 1, 0, 2));
        assert_eq!(dp.mac, EthernetAddress([2, 0, 0, 0, 1, 2]));
    }

    #[test]
    fn auto_is_ambiguous_without_management_address() {
        let err = select(None, None, None, None, &table()).unwrap_err().to_string();
        assert!(err.contains("INCCL_IFACE") && err.contains("data0") && err.contains("mgmt0"));
    }

    #[test]
    fn single_interface_is_shared() {
        let mut t = table();
        t.remove("data0");
        let dp = select(None, None, None, Some(Ipv4Addr::new(192, 0, 2, 5)), &t).unwrap();
        assert_eq!(dp.iface.as_deref(), Some("mgmt0"));
    }

    #[test]
    fn explicit_interface_and_ip() {
        let dp = select(Some("mgmt0"), None, None, None, &table()).unwrap();
        assert_eq!(dp.ip, Ipv4Addr::new(192, 0, 2, 5));
        let err = select(Some("eth9"), None, None, None, &table()).unwrap_err().to_string();
        assert!(err.contains("eth9"), "{err}");
        let ip = Ipv4Addr::new(127, 0, 0, 11);
        let dp = select(None, Some(ip), None, None, &table()).unwrap();
        assert_eq!((dp.ip, dp.mac), (ip, EthernetAddress::from_ipv4(ip)));
    }
}
