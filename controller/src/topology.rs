//! Topology model: YAML schema (see `topologies/README.md`), loading and validation.
//!
//! Loading collects every semantic error it can find, each naming the file, the
//! line/column and the element, so a person fixes a file in one pass.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;

use inc_ctrl_proto::{Mac, VALID_MTUS};
use marked_yaml::{LoaderOptions, Spanned};
use serde::Deserialize;

/// Default L2 MTU of data links: room for a 4096-byte payload plus all headers.
pub const DEFAULT_LINK_MTU: u32 = 9000;
/// Default slot capacity of a switch (across all communicators).
pub const DEFAULT_MAX_SLOTS: u32 = 1 << 20;
/// Name of the controller element (namespace `P-ctrl`).
pub const CONTROLLER_NAME: &str = "ctrl";
const MAX_WINDOW: u32 = 1 << 16;

// ---------------------------------------------------------------- errors

/// One problem in a topology file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyIssue {
    /// File name as given.
    pub file: String,
    /// 1-based line (0 if unknown).
    pub line: usize,
    /// 1-based column (0 if unknown).
    pub column: usize,
    /// Offending element, e.g. `switch leaf1 port up`.
    pub element: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for TopologyIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}: {}", self.file, self.line, self.column, self.element, self.message)
    }
}

/// Errors loading a topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// File could not be read.
    #[error("{file}: {source}")]
    Io {
        /// File name.
        file: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is invalid; every issue found is listed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<TopologyIssue>),
}

impl TopologyError {
    /// Issues, if the error is a validation error.
    pub fn issues(&self) -> &[TopologyIssue] {
        match self {
            TopologyError::Invalid(v) => v,
            TopologyError::Io { .. } => &[],
        }
    }
}

// ---------------------------------------------------------------- raw schema

type S<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    name: S<String>,
    controller: RawController,
    #[serde(default)]
    defaults: Option<RawDefaults>,
    #[serde(default)]
    root: Option<S<String>>,
    switches: Vec<RawSwitch>,
    #[serde(default)]
    links: Vec<RawLink>,
    #[serde(default)]
    hosts: Vec<RawHost>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawController {
    address: S<String>,
    #[serde(default)]
    mgmt_prefix: Option<S<u8>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    #[serde(default)]
    mtu: Option<S<u16>>,
    #[serde(default)]
    window: Option<S<u32>>,
    #[serde(default)]
    link_mtu: Option<S<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSwitch {
    id: S<u32>,
    name: S<String>,
    #[serde(default)]
    mgmt: Option<S<String>>,
    #[serde(default)]
    max_slots: Option<S<u32>>,
    ports: Vec<RawPort>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    name: S<String>,
    ip: S<String>,
    #[serde(default)]
    mac: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLink {
    a: S<String>,
    b: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: S<String>,
    ip: S<String>,
    #[serde(default)]
    mac: Option<S<String>>,
    attach: S<String>,
    #[serde(default)]
    mgmt: Option<S<String>>,
}

// ---------------------------------------------------------------- model

/// An IPv4 interface address with prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfAddr {
    /// Address.
    pub ip: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
}

impl IfAddr {
    /// Network mask.
    pub fn mask(self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        }
    }

    /// Network address.
    pub fn network(self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.ip) & self.mask())
    }

    /// Whether `ip` is inside this subnet.
    pub fn contains(self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.ip) & self.mask()
    }

    /// Whether two subnets overlap.
    pub fn overlaps(self, other: IfAddr) -> bool {
        let m = self.mask() & other.mask();
        u32::from(self.ip) & m == u32::from(other.ip) & m
    }

    /// Same network and prefix.
    pub fn same_subnet(self, other: IfAddr) -> bool {
        self.prefix == other.prefix && self.network() == other.network()
    }
}

impl fmt::Display for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix)
    }
}

/// A switch data-plane port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Port name; also the interface name in the switch's namespace.
    pub name: String,
    /// Address served by the switch on this port (never configured in the kernel).
    pub addr: IfAddr,
    /// MAC (resolved: `auto` becomes [`Mac::from_ipv4`]).
    pub mac: Mac,
}

/// A switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// Topology id.
    pub id: u32,
    /// Name.
    pub name: String,
    /// Management address.
    pub mgmt: Ipv4Addr,
    /// Slot capacity across communicators.
    pub max_slots: u32,
    /// Data-plane ports.
    pub ports: Vec<Port>,
}

/// A switch port, by indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRef {
    /// Index into [`Topology::switches`].
    pub switch: usize,
    /// Index into that switch's ports.
    pub port: usize,
}

/// A switch-to-switch link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// One end.
    pub a: PortRef,
    /// Other end.
    pub b: PortRef,
}

/// A host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Name.
    pub name: String,
    /// Data-plane address.
    pub addr: IfAddr,
    /// MAC; `None` for `mac: learn` (switches resolve it by ARP).
    pub mac: Option<Mac>,
    /// MAC the netns scripts assign (auto MAC when `learn`).
    pub if_mac: Mac,
    /// Management address.
    pub mgmt: Ipv4Addr,
    /// Switch port the host is attached to.
    pub attach: PortRef,
}

/// Defaults for communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// Payload bytes per packet.
    pub mtu: u16,
    /// Window in chunks.
    pub window: u32,
    /// L2 MTU of data links.
    pub link_mtu: u32,
}

/// Where a switch sits in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeNode {
    /// Parent switch index and (local port, parent's port).
    pub parent: Option<(usize, usize, usize)>,
    /// Child switches: (child index, local port, child's port).
    pub children: Vec<(usize, usize, usize)>,
    /// Hosts attached directly (host indices).
    pub hosts: Vec<usize>,
    /// Depth (root = 0).
    pub depth: usize,
}

/// A validated topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// File it was loaded from.
    pub file: String,
    /// Topology name.
    pub name: String,
    /// Controller management address and port.
    pub controller: SocketAddrV4,
    /// Management subnet prefix length.
    pub mgmt_prefix: u8,
    /// Communicator defaults.
    pub defaults: Defaults,
    /// Index of the root switch.
    pub root: usize,
    /// Switches in file order.
    pub switches: Vec<Switch>,
    /// Switch-to-switch links.
    pub links: Vec<Link>,
    /// Hosts in file order.
    pub hosts: Vec<Host>,
    /// Tree structure, indexed like `switches`.
    pub tree: Vec<TreeNode>,
}

impl Topology {
    /// Load and validate a file.
    pub fn load(path: impl AsRef<Path>) -> Result<Topology, TopologyError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| TopologyError::Io { file: file.clone(), source })?;
        Topology::parse(&file, &text)
    }

    /// Parse and validate YAML text; `file` is used in error messages.
    pub fn parse(file: &str, text: &str) -> Result<Topology, TopologyError> {
        let opts = LoaderOptions::default().error_on_duplicate_keys(true).toplevel_mapping();
        let node = marked_yaml::parse_yaml_with_options(0, text, opts).map_err(|e| {
            let (line, column) = load_error_pos(&e);
            TopologyError::Invalid(vec![TopologyIssue {
                file: file.to_string(),
                line,
                column,
                element: "yaml".into(),
                message: e.to_string(),
            }])
        })?;
        let raw: RawTopology = marked_yaml::from_node(&node).map_err(|e| {
            let (line, column) = e.start_mark().map(|m| (m.line(), m.column())).unwrap_or((0, 0));
            TopologyError::Invalid(vec![TopologyIssue {
                file: file.to_string(),
                line,
                column,
                element: e.path().filter(|p| !p.is_empty()).unwrap_or("topology").to_string(),
                message: e.into_inner().to_string(),
            }])
        })?;
        Validator { file, issues: Vec::new() }.run(raw)
    }

    /// Find a host by data-plane IP.
    pub fn host_by_ip(&self, ip: Ipv4Addr) -> Option<usize> {
        self.hosts.iter().position(|h| h.addr.ip == ip)
    }

    /// Find a switch by topology id.
    pub fn switch_by_id(&self, id: u32) -> Option<usize> {
        self.switches.iter().position(|s| s.id == id)
    }

    /// Find a switch by name.
    pub fn switch_by_name(&self, name: &str) -> Option<usize> {
        self.switches.iter().position(|s| s.name == name)
    }

    /// Management subnet.
    pub fn mgmt_subnet(&self) -> IfAddr {
        IfAddr { ip: *self.controller.ip(), prefix: self.mgmt_prefix }
    }

    /// The peer of a switch port: another switch's port or a host.
    pub fn port_peer(&self, p: PortRef) -> Option<PortPeer> {
        for l in &self.links {
            if l.a == p {
                return Some(PortPeer::Switch(l.b));
            }
            if l.b == p {
                return Some(PortPeer::Switch(l.a));
            }
        }
        self.hosts.iter().position(|h| h.attach == p).map(PortPeer::Host)
    }
}

/// What is at the other end of a switch port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortPeer {
    /// A switch port.
    Switch(PortRef),
    /// A host index.
    Host(usize),
}

fn load_error_pos(e: &marked_yaml::LoadError) -> (usize, usize) {
    use marked_yaml::LoadError::*;
    let m = match e {
        TopLevelMustBeMapping(m)
        | TopLevelMustBeSequence(m)
        | UnexpectedAnchor(m)
        | MappingKeyMustBeScalar(m)
        | UnexpectedTag(m)
        | ScanError(m, _) => Some(*m),
        DuplicateKey(inner) => inner.key.span().start().copied(),
    };
    m.map(|m| (m.line(), m.column())).unwrap_or((0, 0))
}

fn pos<T>(s: &Spanned<T>) -> (usize, usize) {
    s.span().start().map(|m| (m.line(), m.column())).unwrap_or((0, 0))
}

// ---------------------------------------------------------------- validation

struct Validator<'a> {
    file: &'a str,
    issues: Vec<TopologyIssue>,
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

impl Validator<'_> {
    fn issue<T>(
        &mut self,
        at: &Spanned<T>,
        element: impl Into<String>,
        message: impl Into<String>,
    ) {
        let (line, column) = pos(at);
        self.issues.push(TopologyIssue {
            file: self.file.to_string(),
            line,
            column,
            element: element.into(),
            message: message.into(),
        });
    }

    fn parse_mac(
        &mut self,
        m: &Option<S<String>>,
        ip: Ipv4Addr,
        el: &str,
        allow_learn: bool,
    ) -> Result<Option<Mac>, ()> {
        // Err: already reported; callers skip duplicate checks to avoid cascades.
        match m {
            None => Ok(Some(Mac::from_ipv4(ip))),
            Some(s) if s.as_str() == "auto" => Ok(Some(Mac::from_ipv4(ip))),
            Some(s) if allow_learn && s.as_str() == "learn" => Ok(None),
            Some(s) => match s.parse::<Mac>() {
                Ok(mac) if mac.is_multicast() || mac == Mac([0; 6]) => {
                    self.issue(s, el, format!("MAC {mac} is not a unicast address"));
                    Err(())
                }
                Ok(mac) => Ok(Some(mac)),
                Err(e) => {
                    self.issue(s, el, e.to_string());
                    Err(())
                }
            },
        }
    }

    fn run(mut self, raw: RawTopology) -> Result<Topology, TopologyError> {
        // ---- controller / defaults
        let (controller, mgmt_prefix) = {
            let c = &raw.controller;
            let addr = match c.address.parse::<SocketAddrV4>() {
                Ok(a) => {
                    if let Err(m) = check_unicast(*a.ip()) {
                        self.issue(&c.address, "controller", format!("address {a}: {m}"));
                    }
                    a
                }
                Err(_) => {
                    self.issue(
                        &c.address,
                        "controller",
                        format!("`{}` must be IPv4:port", *c.address),
                    );
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
        };
        let mut defaults = Defaults { mtu: 1024, window: 64, link_mtu: DEFAULT_LINK_MTU };
        if let Some(d) = &raw.defaults {
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
                    self.issue(
                        l,
                        "defaults",
                        "link_mtu must be 4196..=65535 (path MTU 4096 must fit)",
                    );
                } else {
                    defaults.link_mtu = **l;
                }
            }
        }

        // ---- names (shared by switches and hosts: they become namespace names)
        let mut names: HashMap<String, (usize, usize)> = HashMap::new();
        let mut check_name = |v: &mut Self, n: &S<String>, kind: &str| {
            let el = format!("{kind} {}", n.as_str());
            if !valid_name(n) {
                v.issue(n, &el, "name must be 1-32 chars of [A-Za-z0-9_-], starting alphanumeric");
            } else if n.as_str() == CONTROLLER_NAME {
                v.issue(n, &el, format!("name `{CONTROLLER_NAME}` is reserved for the controller"));
            }
            if let Some((l, c)) = names.get(n.as_str()) {
                let msg = format!("duplicate name (first defined at line {l}, column {c})");
                v.issue(
                    n,
                    &el,
                    if kind == "host" { format!("{msg}: host attached twice") } else { msg },
                );
            } else {
                names.insert(n.to_string(), pos(n));
            }
        };
        for s in &raw.switches {
            check_name(&mut self, &s.name, "switch");
        }
        for h in &raw.hosts {
            check_name(&mut self, &h.name, "host");
        }

        // ---- switches and ports
        let mut ids: HashMap<u32, String> = HashMap::new();
        let mut ips: HashMap<Ipv4Addr, String> = HashMap::new();
        let mut macs: HashMap<Mac, String> = HashMap::new();
        let mut switches = Vec::new();
        // Spans for later errors about ports.
        let mut port_spans: Vec<Vec<(usize, usize)>> = Vec::new();
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
            let mut spans = Vec::new();
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
                let addr = match parse_ifaddr(&p.ip) {
                    Ok(a) => a,
                    Err(m) => {
                        self.issue(&p.ip, &el, m);
                        IfAddr { ip: Ipv4Addr::UNSPECIFIED, prefix: 32 }
                    }
                };
                if !addr.ip.is_unspecified() {
                    if let Some(o) = ips.insert(addr.ip, el.clone()) {
                        self.issue(&p.ip, &el, format!("duplicate IP {} (also {o})", addr.ip));
                    }
                }
                let parsed = self.parse_mac(&p.mac, addr.ip, &el, false);
                let mac = parsed.ok().flatten().unwrap_or_default();
                if parsed.is_ok() {
                    if let Some(o) = macs.insert(mac, el.clone()) {
                        let at = p.mac.as_ref().unwrap_or(&p.ip);
                        self.issue(at, &el, format!("duplicate MAC {mac} (also {o})"));
                    }
                }
                spans.push(pos(&p.name));
                ports.push(Port { name: p.name.to_string(), addr, mac });
            }
            port_spans.push(spans);
            switches.push(Switch {
                id: *s.id,
                name: s.name.to_string(),
                mgmt: Ipv4Addr::UNSPECIFIED,
                max_slots: s.max_slots.as_ref().map(|m| **m).unwrap_or(DEFAULT_MAX_SLOTS),
                ports,
            });
        }
        if raw.switches.is_empty() {
            self.issue(&raw.name, "topology", "no switches");
        }

        let resolve = |r: &str, switches: &[Switch]| -> Result<PortRef, String> {
            let (sw, port) =
                r.split_once(':').ok_or_else(|| format!("`{r}` must be switch:port"))?;
            let si = switches
                .iter()
                .position(|s| s.name == sw)
                .ok_or_else(|| format!("dangling reference `{r}`: no switch `{sw}`"))?;
            let pi = switches[si].ports.iter().position(|p| p.name == port).ok_or_else(|| {
                format!("dangling reference `{r}`: switch `{sw}` has no port `{port}`")
            })?;
            Ok(PortRef { switch: si, port: pi })
        };

        // ---- links: resolution, port reuse, subnets, cycles (union-find)
        let mut used: HashMap<PortRef, String> = HashMap::new();
        let mut links = Vec::new();
        let mut link_spans = Vec::new();
        let mut uf: Vec<usize> = (0..switches.len()).collect();
        fn find(uf: &mut [usize], mut x: usize) -> usize {
            while uf[x] != x {
                uf[x] = uf[uf[x]];
                x = uf[x];
            }
            x
        }
        for l in &raw.links {
            let el = format!("link {} -- {}", l.a.as_str(), l.b.as_str());
            let a = resolve(&l.a, &switches).map_err(|m| self.issue(&l.a, &el, m)).ok();
            let b = resolve(&l.b, &switches).map_err(|m| self.issue(&l.b, &el, m)).ok();
            let (Some(a), Some(b)) = (a, b) else { continue };
            if a.switch == b.switch {
                self.issue(&l.a, &el, "link connects a switch to itself");
                continue;
            }
            let mut port_ok = true;
            for (r, at) in [(a, &l.a), (b, &l.b)] {
                if let Some(o) = used.get(&r) {
                    self.issue(at, &el, format!("port already used by {o}"));
                    port_ok = false;
                } else {
                    used.insert(r, el.clone());
                }
            }
            if !port_ok {
                continue;
            }
            let (aa, ba) =
                (switches[a.switch].ports[a.port].addr, switches[b.switch].ports[b.port].addr);
            if !aa.same_subnet(ba) && !aa.ip.is_unspecified() && !ba.ip.is_unspecified() {
                self.issue(
                    &l.a,
                    &el,
                    format!("endpoints {aa} and {ba} are not in the same subnet"),
                );
            }
            let (ra, rb) = (find(&mut uf, a.switch), find(&mut uf, b.switch));
            if ra == rb {
                self.issue(&l.a, &el, "link creates a cycle (the switches must form a tree)");
                continue;
            }
            uf[ra] = rb;
            links.push(Link { a, b });
            link_spans.push(pos(&l.a));
        }

        // ---- hosts
        let mut hosts = Vec::new();
        let mut host_spans = Vec::new();
        for h in &raw.hosts {
            let el = format!("host {}", h.name.as_str());
            let addr = match parse_ifaddr(&h.ip) {
                Ok(a) => a,
                Err(m) => {
                    self.issue(&h.ip, &el, m);
                    IfAddr { ip: Ipv4Addr::UNSPECIFIED, prefix: 32 }
                }
            };
            if !addr.ip.is_unspecified() {
                if let Some(o) = ips.insert(addr.ip, el.clone()) {
                    self.issue(&h.ip, &el, format!("duplicate IP {} (also {o})", addr.ip));
                }
            }
            let parsed = self.parse_mac(&h.mac, addr.ip, &el, true);
            let mac = parsed.unwrap_or(None);
            let if_mac = mac.unwrap_or(Mac::from_ipv4(addr.ip));
            if parsed.is_ok() {
                if let Some(o) = macs.insert(if_mac, el.clone()) {
                    let at = h.mac.as_ref().unwrap_or(&h.ip);
                    self.issue(at, &el, format!("duplicate MAC {if_mac} (also {o})"));
                }
            }
            let Ok(attach) =
                resolve(&h.attach, &switches).map_err(|m| self.issue(&h.attach, &el, m))
            else {
                continue;
            };
            if let Some(o) = used.get(&attach) {
                self.issue(
                    &h.attach,
                    &el,
                    format!("port `{}` already used by {o}", h.attach.as_str()),
                );
                continue;
            }
            used.insert(attach, el.clone());
            let paddr = switches[attach.switch].ports[attach.port].addr;
            if !addr.ip.is_unspecified() && !paddr.ip.is_unspecified() && !addr.same_subnet(paddr) {
                self.issue(
                    &h.ip,
                    &el,
                    format!(
                        "{addr} is not in the subnet of port `{}` ({paddr})",
                        h.attach.as_str()
                    ),
                );
            }
            host_spans.push(pos(&h.name));
            hosts.push((
                h,
                Host {
                    name: h.name.to_string(),
                    addr,
                    mac,
                    if_mac,
                    mgmt: Ipv4Addr::UNSPECIFIED,
                    attach,
                },
            ));
        }

        // ---- overlapping subnets: every port's subnet belongs to one link, except that
        // host ports of one switch may share a subnet (a LAN behind that switch).
        {
            #[derive(Clone, Copy)]
            struct Seg {
                addr: IfAddr,
                switch: usize,
                host_port: bool,
                at: (usize, usize),
            }
            let mut segs: Vec<(String, Seg)> = Vec::new();
            for (l, at) in links.iter().zip(&link_spans) {
                let addr = switches[l.a.switch].ports[l.a.port].addr;
                let el = format!(
                    "link {}:{} -- {}:{}",
                    switches[l.a.switch].name,
                    switches[l.a.switch].ports[l.a.port].name,
                    switches[l.b.switch].name,
                    switches[l.b.switch].ports[l.b.port].name
                );
                segs.push((el, Seg { addr, switch: l.a.switch, host_port: false, at: *at }));
            }
            for ((_, h), at) in hosts.iter().zip(&host_spans) {
                let el = format!("host {} link", h.name);
                segs.push((
                    el,
                    Seg { addr: h.addr, switch: h.attach.switch, host_port: true, at: *at },
                ));
            }
            for i in 0..segs.len() {
                for j in 0..i {
                    let (a, b) = (segs[i].1, segs[j].1);
                    if a.addr.ip.is_unspecified()
                        || b.addr.ip.is_unspecified()
                        || !a.addr.overlaps(b.addr)
                    {
                        continue;
                    }
                    if a.host_port
                        && b.host_port
                        && a.switch == b.switch
                        && a.addr.same_subnet(b.addr)
                    {
                        continue;
                    }
                    self.issues.push(TopologyIssue {
                        file: self.file.to_string(),
                        line: a.at.0,
                        column: a.at.1,
                        element: segs[i].0.clone(),
                        message: format!(
                            "subnet {}/{} overlaps {} ({}/{})",
                            a.addr.network(),
                            a.addr.prefix,
                            segs[j].0,
                            b.addr.network(),
                            b.addr.prefix
                        ),
                    });
                }
            }
        }

        // ---- root and reachability
        let root = match &raw.root {
            Some(r) => switches.iter().position(|s| s.name == r.as_str()).unwrap_or_else(|| {
                self.issue(r, "root", format!("no switch named `{}`", r.as_str()));
                0
            }),
            None => 0,
        };
        let mut tree: Vec<TreeNode> = (0..switches.len())
            .map(|_| TreeNode { parent: None, children: Vec::new(), hosts: Vec::new(), depth: 0 })
            .collect();
        if !switches.is_empty() {
            let mut adj: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); switches.len()];
            for l in &links {
                adj[l.a.switch].push((l.b.switch, l.a.port, l.b.port));
                adj[l.b.switch].push((l.a.switch, l.b.port, l.a.port));
            }
            let mut seen = vec![false; switches.len()];
            seen[root] = true;
            let mut q = VecDeque::from([root]);
            while let Some(s) = q.pop_front() {
                let mut next = adj[s].clone();
                next.sort();
                for (c, lp, cp) in next {
                    if seen[c] {
                        continue;
                    }
                    seen[c] = true;
                    tree[c].parent = Some((s, cp, lp));
                    tree[c].depth = tree[s].depth + 1;
                    tree[s].children.push((c, lp, cp));
                    q.push_back(c);
                }
            }
            for (i, s) in raw.switches.iter().enumerate() {
                if !seen[i] {
                    let msg =
                        format!("switch is unreachable from the root `{}`", switches[root].name);
                    self.issue(&s.name, format!("switch {}", s.name.as_str()), msg);
                }
            }
        }
        for (i, (_, h)) in hosts.iter().enumerate() {
            tree[h.attach.switch].hosts.push(i);
        }

        // ---- management addresses
        let mgmt_net = IfAddr { ip: *controller.ip(), prefix: mgmt_prefix };
        let mut mgmt_used: HashMap<Ipv4Addr, String> =
            HashMap::from([(*controller.ip(), "controller".to_string())]);
        let mut explicit = |v: &mut Self, m: &Option<S<String>>, el: &str| -> Option<Ipv4Addr> {
            let m = m.as_ref()?;
            let ip = match m.parse::<Ipv4Addr>() {
                Ok(ip) => ip,
                Err(_) => {
                    v.issue(m, el, format!("mgmt `{}` is not an IPv4 address", m.as_str()));
                    return None;
                }
            };
            let host = u32::from(ip) & !mgmt_net.mask();
            if !mgmt_net.contains(ip) || host == 0 || host == !mgmt_net.mask() {
                v.issue(
                    m,
                    el,
                    format!(
                        "mgmt {ip} is not a host address of the management subnet {}/{}",
                        mgmt_net.network(),
                        mgmt_prefix
                    ),
                );
                return None;
            }
            if let Some(o) = mgmt_used.insert(ip, el.to_string()) {
                v.issue(m, el, format!("duplicate management address {ip} (also {o})"));
            }
            Some(ip)
        };
        let sw_mgmt: Vec<Option<Ipv4Addr>> = raw
            .switches
            .iter()
            .map(|s| explicit(&mut self, &s.mgmt, &format!("switch {}", s.name.as_str())))
            .collect();
        let host_mgmt: Vec<Option<Ipv4Addr>> = hosts
            .iter()
            .map(|(r, _)| explicit(&mut self, &r.mgmt, &format!("host {}", r.name.as_str())))
            .collect();
        // Auto addresses: next free host addresses after the controller's.
        let mut next = u32::from(*controller.ip());
        let mut alloc = |v: &mut Self, at: &S<String>, el: &str| -> Ipv4Addr {
            loop {
                next = next.wrapping_add(1);
                let ip = Ipv4Addr::from(next);
                let host = next & !mgmt_net.mask();
                if !mgmt_net.contains(ip) || host == !mgmt_net.mask() {
                    v.issue(at, el, "management subnet exhausted");
                    return Ipv4Addr::UNSPECIFIED;
                }
                if host != 0 && !mgmt_used.contains_key(&ip) {
                    mgmt_used.insert(ip, el.to_string());
                    return ip;
                }
            }
        };
        for (i, s) in raw.switches.iter().enumerate() {
            switches[i].mgmt = sw_mgmt[i].unwrap_or_else(|| {
                alloc(&mut self, &s.name, &format!("switch {}", s.name.as_str()))
            });
        }
        let mut hosts_final = Vec::new();
        for (i, (r, mut h)) in hosts.into_iter().enumerate() {
            h.mgmt = host_mgmt[i]
                .unwrap_or_else(|| alloc(&mut self, &r.name, &format!("host {}", r.name.as_str())));
            hosts_final.push(h);
        }
        // The management subnet must not overlap data subnets: hosts route both.
        for h in &hosts_final {
            if !h.addr.ip.is_unspecified() && h.addr.overlaps(mgmt_net) {
                self.issue(
                    &raw.controller.address,
                    "controller",
                    format!(
                        "management subnet {}/{} overlaps the data subnet of host {} ({})",
                        mgmt_net.network(),
                        mgmt_prefix,
                        h.name,
                        h.addr
                    ),
                );
            }
        }
        let _ = port_spans;

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
            links,
            hosts: hosts_final,
            tree,
        })
    }
}
