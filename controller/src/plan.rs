//! Network-namespace plan: a line-oriented description of the namespaces, veths,
//! addresses and management network of a topology, read by `scripts/netns-up` and
//! the end-to-end tests without parsing YAML.
//!
//! Line formats (whitespace-separated, `#` starts a comment line):
//!
//! ```text
//! plan 1 <topology-name> <prefix>
//! controller <ns> <ip:port> <mgmt-prefix>
//! netns <ns> <host|switch|controller> <element>
//! bridge <ns> <ifname> <ip/prefix>
//! mgmt <ns> <ifname> <ip/prefix> <bridge-ns> <bridge-port-ifname> <bridge-ifname>
//! veth <nsA> <ifA> <macA> <ipA/prefix|-> <nsB> <ifB> <macB> <ipB/prefix|-> <mtu>
//! switch <name> <id> <ns> <mgmt-ip>
//! port <switch> <port> <ns> <ifname> <ip> <mac> <prefix>
//! host <name> <ns> <ifname> <ip> <mac> <mgmt-ip> <prefix> <switch> <port>
//! ```
//!
//! Switch data-plane ports get no kernel address (`-`): the switch process answers
//! ARP itself, and a kernel without the address never answers RoCE with ICMP.
//!
//! [`render`] writes a plan; [`ParsedPlan::parse`] reads one back, for the programs that
//! work on a topology brought up in namespaces (the end-to-end harnesses, `inc-bench`).

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use inc_ctrl_proto::EthernetAddress;
use inc_topology::{Topology, CONTROLLER_NAME};

/// Default namespace prefix.
pub const DEFAULT_PREFIX: &str = "inc";
/// Interface name of every element's management veth.
pub const MGMT_IF: &str = "mgmt0";
/// Interface name of a host's data-plane veth.
pub const HOST_DATA_IF: &str = "eth0";
/// Management bridge in the controller namespace.
pub const MGMT_BRIDGE: &str = "br0";

/// Invalid prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid prefix `{0}`: use 1-16 chars of [a-z0-9], `-` inside")]
pub struct PrefixError(pub String);

/// Check a namespace prefix.
pub fn check_prefix(p: &str) -> Result<(), PrefixError> {
    let ok = !p.is_empty()
        && p.len() <= 16
        && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !p.starts_with('-')
        && !p.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(PrefixError(p.to_string()))
    }
}

/// Namespace of an element.
pub fn ns_name(prefix: &str, element: &str) -> String {
    format!("{prefix}-{element}")
}

/// Render the plan.
pub fn render(t: &Topology, prefix: &str) -> Result<String, PrefixError> {
    check_prefix(prefix)?;
    let mut o = String::new();
    let ctrl_ns = ns_name(prefix, CONTROLLER_NAME);
    let mgmt = t.mgmt_subnet();
    let link_mtu = t.defaults.link_mtu;
    let _ = writeln!(o, "# netns plan for topology `{}` ({}), prefix `{prefix}`", t.name, t.file);
    let _ = writeln!(o, "plan 1 {} {prefix}", t.name);
    let _ = writeln!(o, "controller {ctrl_ns} {} {}", t.controller, t.mgmt_prefix);
    let _ = writeln!(o, "netns {ctrl_ns} controller {CONTROLLER_NAME}");
    for s in &t.switches {
        let _ = writeln!(o, "netns {} switch {}", ns_name(prefix, &s.name), s.name);
    }
    for h in &t.hosts {
        let _ = writeln!(o, "netns {} host {}", ns_name(prefix, &h.name), h.name);
    }
    let _ = writeln!(o, "bridge {ctrl_ns} {MGMT_BRIDGE} {}/{}", t.controller.ip(), mgmt.prefix);
    let elements = t
        .switches
        .iter()
        .map(|s| (&s.name, s.mgmt))
        .chain(t.hosts.iter().map(|h| (&h.name, h.mgmt)));
    for (i, (name, ip)) in elements.enumerate() {
        let _ = writeln!(
            o,
            "mgmt {} {MGMT_IF} {ip}/{} {ctrl_ns} m{i} {MGMT_BRIDGE}",
            ns_name(prefix, name),
            mgmt.prefix
        );
    }
    for l in &t.links {
        let (sa, sb) = (&t.switches[l.a.switch], &t.switches[l.b.switch]);
        let (pa, pb) = (&sa.ports[l.a.port], &sb.ports[l.b.port]);
        let _ = writeln!(
            o,
            "veth {} {} {} - {} {} {} - {link_mtu}",
            ns_name(prefix, &sa.name),
            pa.name,
            pa.mac,
            ns_name(prefix, &sb.name),
            pb.name,
            pb.mac
        );
    }
    for h in &t.hosts {
        let s = &t.switches[h.attach.switch];
        let p = &s.ports[h.attach.port];
        let _ = writeln!(
            o,
            "veth {} {HOST_DATA_IF} {} {} {} {} {} - {link_mtu}",
            ns_name(prefix, &h.name),
            h.if_mac,
            h.addr,
            ns_name(prefix, &s.name),
            p.name,
            p.mac
        );
    }
    for s in &t.switches {
        let ns = ns_name(prefix, &s.name);
        let _ = writeln!(o, "switch {} {} {ns} {}", s.name, s.id, s.mgmt);
        for p in &s.ports {
            let _ = writeln!(
                o,
                "port {} {} {ns} {} {} {} {}",
                s.name, p.name, p.name, p.addr.ip, p.mac, p.addr.prefix
            );
        }
    }
    for h in &t.hosts {
        let s = &t.switches[h.attach.switch];
        let _ = writeln!(
            o,
            "host {} {} {HOST_DATA_IF} {} {} {} {} {} {}",
            h.name,
            ns_name(prefix, &h.name),
            h.addr.ip,
            h.if_mac,
            h.mgmt,
            h.addr.prefix,
            s.name,
            s.ports[h.attach.port].name
        );
    }
    Ok(o)
}

/// A switch of a parsed plan (`switch` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSwitch {
    /// Name.
    pub name: String,
    /// Topology id.
    pub id: u32,
    /// Namespace.
    pub ns: String,
}

/// A switch port of a parsed plan (`port` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanPort {
    /// Switch name.
    pub switch: String,
    /// Port name.
    pub port: String,
    /// Namespace of the interface.
    pub ns: String,
    /// Interface name.
    pub ifname: String,
    /// Address the switch serves on the port.
    pub ip: Ipv4Addr,
    /// MAC the switch uses on the port.
    pub mac: EthernetAddress,
    /// Prefix length of the port's subnet.
    pub prefix_len: u8,
}

/// A host of a parsed plan (`host` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanHost {
    /// Name.
    pub name: String,
    /// Namespace.
    pub ns: String,
    /// Data-plane interface.
    pub ifname: String,
    /// Data-plane address.
    pub ip: Ipv4Addr,
    /// Data-plane MAC.
    pub mac: EthernetAddress,
    /// Management address (bootstrap of the ranks).
    pub mgmt: Ipv4Addr,
    /// Prefix length of the data-plane address.
    pub prefix_len: u8,
    /// Switch it attaches to.
    pub switch: String,
    /// Port of that switch.
    pub port: String,
}

/// A namespace of a parsed plan (`netns` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanNetns {
    /// Namespace.
    pub ns: String,
    /// `host`, `switch` or `controller`.
    pub kind: String,
    /// The element's name.
    pub element: String,
}

/// A data-plane veth of a parsed plan (`veth` line): `(namespace, interface)` of each end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanVeth {
    /// One end.
    pub a: (String, String),
    /// The other end.
    pub b: (String, String),
}

/// A line of a plan that [`ParsedPlan::parse`] cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plan line {line} `{text}`: {what}")]
pub struct PlanParseError {
    /// 1-based line number.
    pub line: usize,
    /// The line.
    pub text: String,
    /// What is wrong with it.
    pub what: String,
}

/// A rendered plan read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedPlan {
    /// Controller namespace.
    pub controller_ns: String,
    /// Controller address `ip:port`.
    pub controller_addr: String,
    /// Every namespace with its element.
    pub namespaces: Vec<PlanNetns>,
    /// Switches.
    pub switches: Vec<PlanSwitch>,
    /// Switch ports.
    pub ports: Vec<PlanPort>,
    /// Hosts, by rank.
    pub hosts: Vec<PlanHost>,
    /// Data-plane veths (switch-switch and host-switch).
    pub veths: Vec<PlanVeth>,
}

impl ParsedPlan {
    /// Parse the text [`render`] writes. Lines of kinds it does not need (`plan`,
    /// `bridge`, `mgmt`) and comments are skipped; a known line with missing or bad
    /// fields is an error naming the line.
    pub fn parse(text: &str) -> Result<ParsedPlan, PlanParseError> {
        let mut p = ParsedPlan::default();
        for (i, line) in text.lines().enumerate() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = |what: &str| PlanParseError {
                line: i + 1,
                text: line.to_string(),
                what: what.to_string(),
            };
            let field = |n: usize| f.get(n).copied().ok_or_else(|| bad("too few fields"));
            let ip = |n: usize| field(n)?.parse::<Ipv4Addr>().map_err(|_| bad("bad IPv4 address"));
            let mac = |n: usize| field(n)?.parse::<EthernetAddress>().map_err(|_| bad("bad MAC"));
            let num = |n: usize| field(n)?.parse::<u32>().map_err(|_| bad("bad number"));
            let prefix = |n: usize| field(n)?.parse::<u8>().map_err(|_| bad("bad prefix length"));
            match f.first().copied() {
                Some("controller") => {
                    p.controller_ns = field(1)?.into();
                    p.controller_addr = field(2)?.into();
                }
                Some("netns") => p.namespaces.push(PlanNetns {
                    ns: field(1)?.into(),
                    kind: field(2)?.into(),
                    element: field(3)?.into(),
                }),
                Some("switch") => p.switches.push(PlanSwitch {
                    name: field(1)?.into(),
                    id: num(2)?,
                    ns: field(3)?.into(),
                }),
                Some("port") => p.ports.push(PlanPort {
                    switch: field(1)?.into(),
                    port: field(2)?.into(),
                    ns: field(3)?.into(),
                    ifname: field(4)?.into(),
                    ip: ip(5)?,
                    mac: mac(6)?,
                    prefix_len: prefix(7)?,
                }),
                Some("veth") => p.veths.push(PlanVeth {
                    a: (field(1)?.into(), field(2)?.into()),
                    b: (field(5)?.into(), field(6)?.into()),
                }),
                Some("host") => p.hosts.push(PlanHost {
                    name: field(1)?.into(),
                    ns: field(2)?.into(),
                    ifname: field(3)?.into(),
                    ip: ip(4)?,
                    mac: mac(5)?,
                    mgmt: ip(6)?,
                    prefix_len: prefix(7)?,
                    switch: field(8)?.into(),
                    port: field(9)?.into(),
                }),
                _ => {}
            }
        }
        if p.controller_ns.is_empty() || p.switches.is_empty() || p.hosts.is_empty() {
            return Err(PlanParseError {
                line: 0,
                text: String::new(),
                what: "the plan has no controller, no switch or no host".into(),
            });
        }
        Ok(p)
    }

    /// The switch named `name`.
    pub fn switch(&self, name: &str) -> Option<&PlanSwitch> {
        self.switches.iter().find(|s| s.name == name)
    }

    /// The port `switch:port`.
    pub fn port(&self, switch: &str, port: &str) -> Option<&PlanPort> {
        self.ports.iter().find(|p| p.switch == switch && p.port == port)
    }

    /// The far end `(ns, ifname)` of the veth whose one end is `ifname` in `ns`.
    pub fn peer_of(&self, ns: &str, ifname: &str) -> Option<&(String, String)> {
        self.veths.iter().find_map(|v| {
            if v.a.0 == ns && v.a.1 == ifname {
                Some(&v.b)
            } else if v.b.0 == ns && v.b.1 == ifname {
                Some(&v.a)
            } else {
                None
            }
        })
    }

    /// The switch whose namespace is `ns`.
    pub fn switch_in(&self, ns: &str) -> Option<&str> {
        self.namespaces
            .iter()
            .find(|n| n.ns == ns && n.kind == "switch")
            .map(|n| n.element.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_for_1_2_4() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
        let t = Topology::load(path).unwrap();
        let p = render(&t, "t1").unwrap();
        assert!(p.contains("controller t1-ctrl 10.0.0.1:7000 24\n"), "{p}");
        assert!(p.contains("netns t1-h0 host h0\n"));
        assert!(p.contains("bridge t1-ctrl br0 10.0.0.1/24\n"));
        assert!(p.contains("mgmt t1-root mgmt0 10.0.0.2/24 t1-ctrl m0 br0\n"));
        assert!(p.contains(
            "veth t1-root d1 02:00:ac:10:00:01 - t1-leaf1 up 02:00:ac:10:00:02 - 9000\n"
        ));
        assert!(p.contains(
            "veth t1-h0 eth0 02:00:0a:01:01:15 10.1.1.21/24 t1-leaf1 h0 02:00:0a:01:01:01 - 9000\n"
        ));
        assert!(p.contains("switch leaf1 1 t1-leaf1 10.0.0.3\n"));
        assert!(p.contains("port leaf1 h0 t1-leaf1 h0 10.1.1.1 02:00:0a:01:01:01 24\n"));
        assert!(p.contains("host h0 t1-h0 eth0 10.1.1.21 02:00:0a:01:01:15 10.0.0.5 24 leaf1 h0\n"));
        // Every interface name fits IFNAMSIZ.
        for line in p.lines().filter(|l| l.starts_with("veth") || l.starts_with("mgmt")) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let ifs = if f[0] == "veth" { [f[2], f[6]] } else { [f[2], f[5]] };
            assert!(ifs.iter().all(|i| i.len() <= 15), "{line}");
        }
        assert!(render(&t, "Bad_Prefix").is_err());
    }

    #[test]
    fn a_rendered_plan_parses_back() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
        let t = Topology::load(path).unwrap();
        let p = ParsedPlan::parse(&render(&t, "t1").unwrap()).unwrap();
        assert_eq!(
            (p.controller_ns.as_str(), p.controller_addr.as_str()),
            ("t1-ctrl", "10.0.0.1:7000")
        );
        assert_eq!((p.switches.len(), p.ports.len(), p.hosts.len(), p.veths.len()), (3, 8, 4, 6));
        let h0 = &p.hosts[0];
        assert_eq!(
            (h0.name.as_str(), h0.ip, h0.prefix_len),
            ("h0", Ipv4Addr::new(10, 1, 1, 21), 24)
        );
        assert_eq!((h0.switch.as_str(), h0.port.as_str()), ("leaf1", "h0"));
        let port = p.port("leaf1", "h0").unwrap();
        assert_eq!(port.mac.to_string(), "02:00:0a:01:01:01");
        assert_eq!(p.switch("root").unwrap().id, 0);
        let peer = p.peer_of("t1-root", "d1").unwrap();
        assert_eq!((peer.0.as_str(), peer.1.as_str()), ("t1-leaf1", "up"));
        assert_eq!(p.switch_in("t1-leaf2"), Some("leaf2"));
        assert_eq!(p.switch_in("t1-h0"), None);
    }

    #[test]
    fn a_bad_plan_line_is_named() {
        let e = ParsedPlan::parse("controller c 10.0.0.1:7000 24\nswitch root x ns\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("bad number"), "{e}");
        assert!(ParsedPlan::parse("# nothing\n").is_err());
    }
}
