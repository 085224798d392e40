//! Semantic validation of a parsed file. Every check reports into one list so a person
//! fixes a file in one pass; later steps skip elements an earlier step rejected, so
//! one mistake does not cascade into many.
//!
//! - this file: controller, defaults, names, switches and ports;
//! - [`layout`]: links, hosts, subnets, the tree and management addresses.

mod emulation;
mod layout;

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use inc_ctrl_proto::{EthernetAddress, MAX_WINDOW, VALID_MTUS};
use inc_link_spec::PortLinkEmu;
use marked_yaml::Spanned;

use crate::error::{TopologyError, TopologyIssue};
use crate::model::{pos, Defaults, IfAddr, Port, PortRef, Switch, Topology};
use crate::raw::{RawDefaults, RawSwitch, RawTopology, S};
use crate::{CONTROLLER_NAME, DEFAULT_LINK_MTU, DEFAULT_MAX_SLOTS, DEFAULT_MAX_SLOT_MEMORY};

pub(crate) struct Validator<'a> {
    file: &'a str,
    issues: Vec<TopologyIssue>,
    /// Data-plane IPs and MACs seen so far, with the element that uses them.
    ips: HashMap<Ipv4Addr, String>,
    macs: HashMap<EthernetAddress, String>,
    /// Switch ports taken by a link or a host.
    used: HashMap<PortRef, String>,
    /// Link emulation of the ports of valid links and hosts.
    emu: Vec<(PortRef, PortLinkEmu)>,
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && s.len() <= 32
}

fn parse_ifaddr(s: &str) -> Result<IfAddr, String> {
    let (ip, prefix) = s.split_once('/').ok_or_else(|| format!("`{s}` must be IP/prefix"))?;
    let ip: Ipv4Addr = ip.trim().parse().map_err(|_| format!("`{s}`: invalid IPv4 address"))?;
    let prefix: u8 = prefix.trim().parse().map_err(|_| format!("`{s}`: invalid prefix length"))?;
    if !(8..=31).contains(&prefix) {
        return Err(format!("`{s}`: prefix length must be 8..=31"));
    }
    check_unicast(ip).map_err(|m| format!("`{s}`: {m}"))?;
    let a = IfAddr { ip, prefix };
    if prefix < 31 {
        let host = u32::from(ip) & !a.mask();
        if host == 0 || host == !a.mask() {
            return Err(format!("`{s}` is the network or broadcast address of its subnet"));
        }
    }
    Ok(a)
}

fn check_unicast(ip: Ipv4Addr) -> Result<(), &'static str> {
    if ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_link_local()
        || ip.octets()[0] >= 240
    {
        return Err("not a usable unicast address");
    }
    Ok(())
}

/// Placeholder for an address that failed to parse; later checks skip it.
const NO_ADDR: IfAddr = IfAddr { ip: Ipv4Addr::UNSPECIFIED, prefix: 32 };

impl<'a> Validator<'a> {
    pub(crate) fn new(file: &'a str) -> Self {
        Validator {
            file,
            issues: Vec::new(),
            ips: HashMap::new(),
            macs: HashMap::new(),
            used: HashMap::new(),
            emu: Vec::new(),
        }
    }

    fn issue<T>(
        &mut self,
        at: &Spanned<T>,
        element: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.issue_at(pos(at), element, message);
    }

    fn issue_at(
        &mut self,
        (line, column): (usize, usize),
        element: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.issues.push(TopologyIssue {
            file: self.file.to_string(),
            line,
            column,
            element: element.into(),
            message: message.into(),
        });
    }

    /// `Err` means already reported: callers skip duplicate checks to avoid cascades.
    fn parse_mac(
        &mut self,
        m: &Option<S<String>>,
        ip: Ipv4Addr,
        el: &str,
        allow_learn: bool,
    ) -> Result<Option<EthernetAddress>, ()> {
        match m {
            None => Ok(Some(EthernetAddress::from_ipv4(ip))),
            Some(s) if s.as_str() == "auto" => Ok(Some(EthernetAddress::from_ipv4(ip))),
            Some(s) if allow_learn && s.as_str() == "learn" => Ok(None),
            Some(s) => match s.parse::<EthernetAddress>() {
                Ok(mac) if mac.is_multicast() || mac == EthernetAddress([0; 6]) => {
                    self.issue(s, el, format!("MAC {mac} is not a unicast address"));
                    Err(())
                }
                Ok(mac) => Ok(Some(mac)),
                Err(_) => {
                    let msg = format!(
                        "invalid MAC address `{}` (expected six hex bytes separated by `:`)",
                        s.as_str()
                    );
                    self.issue(s, el, msg);
                    Err(())
                }
            },
        }
    }

    /// Remember a data-plane IP; reports a duplicate.
    fn claim_ip(&mut self, at: &S<String>, el: &str, ip: Ipv4Addr) {
        if !ip.is_unspecified() {
            if let Some(o) = self.ips.insert(ip, el.to_string()) {
                self.issue(at, el, format!("duplicate IP {ip} (also {o})"));
            }
        }
    }

    /// Remember a MAC; reports a duplicate.
    fn claim_mac(&mut self, at: &S<String>, el: &str, mac: EthernetAddress) {
        if let Some(o) = self.macs.insert(mac, el.to_string()) {
            self.issue(at, el, format!("duplicate MAC {mac} (also {o})"));
        }
    }

    pub(crate) fn run(mut self, raw: RawTopology) -> Result<Topology, TopologyError> {
        let (controller, mgmt_prefix) = self.controller(&raw);
        let defaults = self.defaults(raw.defaults.as_ref());
        self.names(&raw);
        let mut switches = self.switches(&raw);
        let links = self.links(&raw, &switches);
        let hosts = self.hosts(&raw, &switches);
        self.overlapping_subnets(&switches, &links, &hosts);
        let (root, tree) = self.tree(&raw, &switches, &links, &hosts);
        let mgmt_net = IfAddr { ip: *controller.ip(), prefix: mgmt_prefix };
        let hosts = self.management(&raw, mgmt_net, &mut switches, hosts);
        for (p, emu) in std::mem::take(&mut self.emu) {
            switches[p.switch].ports[p.port].emu = emu;
        }

        if !self.issues.is_empty() {
            self.issues.sort_by_key(|i| (i.line, i.column));
            return Err(TopologyError::Invalid(self.issues));
        }
        Ok(Topology {
            file: self.file.to_string(),
            name: raw.name.to_string(),
            controller,
            mgmt_prefix,
            defaults,
            root,
            switches,
            links: links.into_iter().map(|(l, _)| l).collect(),
            hosts,
            tree,
        })
    }

    fn controller(&mut self, raw: &RawTopology) -> (SocketAddrV4, u8) {
        let c = &raw.controller;
        let addr = match c.address.parse::<SocketAddrV4>() {
            Ok(a) => {
                if let Err(m) = check_unicast(*a.ip()) {
                    self.issue(&c.address, "controller", format!("address {a}: {m}"));
                }
                a
            }
            Err(_) => {
                let msg = format!("`{}` must be IPv4:port", *c.address);
                self.issue(&c.address, "controller", msg);
                SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 7000)
            }
        };
        let prefix = match &c.mgmt_prefix {
            Some(p) if !(8..=30).contains(&**p) => {
                self.issue(p, "controller", "mgmt_prefix must be 8..=30");
                24
            }
            Some(p) => **p,
            None => 24,
        };
        (addr, prefix)
    }

    fn defaults(&mut self, raw: Option<&RawDefaults>) -> Defaults {
        let mut defaults = Defaults { mtu: 1024, window: 64, link_mtu: DEFAULT_LINK_MTU };
        let Some(d) = raw else { return defaults };
        if let Some(m) = &d.mtu {
            if !VALID_MTUS.contains(&**m) {
                self.issue(m, "defaults", format!("mtu {} must be one of {VALID_MTUS:?}", **m));
            } else {
                defaults.mtu = **m;
            }
        }
        if let Some(w) = &d.window {
            if **w == 0 || **w > MAX_WINDOW {
                self.issue(w, "defaults", format!("window must be 1..={MAX_WINDOW}"));
            } else {
                defaults.window = **w;
            }
        }
        if let Some(l) = &d.link_mtu {
            if **l < 4096 + 100 || **l > 65535 {
                self.issue(l, "defaults", "link_mtu must be 4196..=65535 (path MTU 4096 must fit)");
            } else {
                defaults.link_mtu = **l;
            }
        }
        defaults
    }

    /// Names are shared by switches and hosts: they become namespace names.
    fn names(&mut self, raw: &RawTopology) {
        let mut names: HashMap<String, (usize, usize)> = HashMap::new();
        let all = raw
            .switches
            .iter()
            .map(|s| (&s.name, "switch"))
            .chain(raw.hosts.iter().map(|h| (&h.name, "host")));
        for (n, kind) in all {
            let el = format!("{kind} {}", n.as_str());
            if !valid_name(n) {
                self.issue(
                    n,
                    &el,
                    "name must be 1-32 chars of [A-Za-z0-9_-], starting alphanumeric",
                );
            } else if n.as_str() == CONTROLLER_NAME {
                self.issue(
                    n,
                    &el,
                    format!("name `{CONTROLLER_NAME}` is reserved for the controller"),
                );
            }
            if let Some((l, c)) = names.get(n.as_str()) {
                let msg = format!("duplicate name (first defined at line {l}, column {c})");
                let msg = if kind == "host" { format!("{msg}: host attached twice") } else { msg };
                self.issue(n, &el, msg);
            } else {
                names.insert(n.to_string(), pos(n));
            }
        }
    }

    fn switches(&mut self, raw: &RawTopology) -> Vec<Switch> {
        let mut ids: HashMap<u32, String> = HashMap::new();
        let mut switches = Vec::new();
        for s in &raw.switches {
            let sel = format!("switch {}", s.name.as_str());
            if let Some(other) = ids.get(&*s.id) {
                let msg = format!("duplicate switch id {} (also switch {other})", *s.id);
                self.issue(&s.id, &sel, msg);
            } else {
                ids.insert(*s.id, s.name.to_string());
            }
            if s.ports.is_empty() {
                self.issue(&s.name, &sel, "switch has no ports");
            }
            let mut ports = Vec::new();
            let mut pnames = HashSet::new();
            for p in &s.ports {
                let el = format!("switch {} port {}", s.name.as_str(), p.name.as_str());
                if !valid_name(&p.name)
                    || p.name.len() > 15
                    || p.name.as_str() == "lo"
                    || p.name.as_str() == "mgmt0"
                {
                    self.issue(&p.name, &el, "port name must be a valid interface name (<= 15 chars of [A-Za-z0-9_-], not `lo`/`mgmt0`)");
                }
                if !pnames.insert(p.name.as_str()) {
                    self.issue(&p.name, &el, "duplicate port name on this switch");
                }
                let addr = parse_ifaddr(&p.ip).unwrap_or_else(|m| {
                    self.issue(&p.ip, &el, m);
                    NO_ADDR
                });
                self.claim_ip(&p.ip, &el, addr.ip);
                let parsed = self.parse_mac(&p.mac, addr.ip, &el, false);
                let mac = parsed.ok().flatten().unwrap_or_default();
                if parsed.is_ok() {
                    self.claim_mac(p.mac.as_ref().unwrap_or(&p.ip), &el, mac);
                }
                ports.push(Port { name: p.name.to_string(), addr, mac, emu: Default::default() });
            }
            let (max_slots, max_window, max_mtu, max_slot_memory, max_host_memory) =
                self.switch_limits(s, &sel);
            switches.push(Switch {
                id: *s.id,
                name: s.name.to_string(),
                mgmt: Ipv4Addr::UNSPECIFIED,
                max_slots,
                max_window,
                max_mtu,
                max_slot_memory,
                max_host_memory,
                ports,
            });
        }
        if raw.switches.is_empty() {
            self.issue(&raw.name, "topology", "no switches");
        }
        switches
    }
}

impl Validator<'_> {
    /// `max_slots`, `max_window`, `max_mtu`, `max_slot_memory`, `max_host_memory` of a
    /// switch: what the controller lets hosts ask of it.
    fn switch_limits(&mut self, s: &RawSwitch, el: &str) -> (u32, u32, u16, u64, u64) {
        let mut slots = DEFAULT_MAX_SLOTS;
        if let Some(v) = &s.max_slots {
            if **v < 2 {
                self.issue(v, el, "max_slots must be at least 2 (one window of 1)");
            } else {
                slots = **v;
            }
        }
        let mut window = MAX_WINDOW;
        if let Some(v) = &s.max_window {
            if **v == 0 || **v > MAX_WINDOW {
                self.issue(v, el, format!("max_window must be 1..={MAX_WINDOW}"));
            } else {
                window = **v;
            }
        }
        let mut mtu = *VALID_MTUS.last().expect("not empty");
        if let Some(v) = &s.max_mtu {
            if !VALID_MTUS.contains(&**v) {
                self.issue(v, el, format!("max_mtu {} must be one of {VALID_MTUS:?}", **v));
            } else {
                mtu = **v;
            }
        }
        let mut memory = DEFAULT_MAX_SLOT_MEMORY;
        if let Some(v) = &s.max_slot_memory {
            if **v < 1 << 20 {
                self.issue(v, el, "max_slot_memory must be at least 1048576 bytes");
            } else {
                memory = **v;
            }
        }
        // Half the switch by default: two hosts' jobs always fit side by side.
        let mut host_memory = memory / 2;
        if let Some(v) = &s.max_host_memory {
            if **v < 1 << 20 || **v > memory {
                self.issue(
                    v,
                    el,
                    format!(
                        "max_host_memory must be at least 1048576 bytes and at most max_slot_memory ({memory})"
                    ),
                );
            } else {
                host_memory = **v;
            }
        }
        (slots, window, mtu, memory, host_memory)
    }
}

/// Resolve `switch:port`.
fn resolve(r: &str, switches: &[Switch]) -> Result<PortRef, String> {
    let (sw, port) = r.split_once(':').ok_or_else(|| format!("`{r}` must be switch:port"))?;
    let si = switches
        .iter()
        .position(|s| s.name == sw)
        .ok_or_else(|| format!("dangling reference `{r}`: no switch `{sw}`"))?;
    let pi =
        switches[si].ports.iter().position(|p| p.name == port).ok_or_else(|| {
            format!("dangling reference `{r}`: switch `{sw}` has no port `{port}`")
        })?;
    Ok(PortRef { switch: si, port: pi })
}
