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

use std::fmt::Write as _;

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
}
