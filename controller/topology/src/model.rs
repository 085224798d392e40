//! The validated topology: switches, ports, links, hosts, the spanning tree and
//! management addresses.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;

use inc_ctrl_proto::EthernetAddress;
use inc_link_spec::PortLinkEmu;
use marked_yaml::{LoaderOptions, Spanned};

use crate::error::{TopologyError, TopologyIssue};
use crate::raw::RawTopology;
use crate::validate::Validator;

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
///
/// Not `Eq`: link emulation settings hold probabilities (`f64`).
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// Port name; also the interface name in the switch's namespace.
    pub name: String,
    /// Address served by the switch on this port (never configured in the kernel).
    pub addr: IfAddr,
    /// MAC (resolved: `auto` becomes [`EthernetAddress::from_ipv4`]).
    pub mac: EthernetAddress,
    /// Link emulation the switch applies on this port, from the `emulate:` settings of
    /// the port's link or host: `tx` to the frames it sends, `rx` (host ports only) to
    /// the frames the host sends it.
    pub emu: PortLinkEmu,
}

/// A switch.
#[derive(Debug, Clone, PartialEq)]
pub struct Switch {
    /// Topology id.
    pub id: u32,
    /// Name.
    pub name: String,
    /// Management address.
    pub mgmt: Ipv4Addr,
    /// Slot capacity across communicators.
    pub max_slots: u32,
    /// Largest window a communicator may use on this switch.
    pub max_window: u32,
    /// Largest payload size a communicator may use on this switch.
    pub max_mtu: u16,
    /// Bytes of switch memory all communicators together may take on this switch:
    /// everything a communicator allocates there (slot pool, send queues, staging),
    /// counted by [`crate::comm_memory`] at its most.
    pub max_slot_memory: u64,
    /// Bytes of switch memory the communicators one host asks for (the host of their
    /// rank 0) may take together on this switch: its share, so that one host cannot
    /// take the whole switch. At most `max_slot_memory`.
    pub max_host_memory: u64,
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
    pub mac: Option<EthernetAddress>,
    /// MAC the netns scripts assign (auto MAC when `learn`).
    pub if_mac: EthernetAddress,
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
#[derive(Debug, Clone, PartialEq)]
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
        Validator::new(file).run(raw)
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

    /// What identifies this topology between a controller and its switches:
    /// `NAME/HASH`, HASH a 64-bit FNV-1a of a canonical text of the model (name,
    /// controller address, defaults, every switch with its limits and ports, links and
    /// hosts; not the file's path, layout or comments, nor link emulation settings,
    /// which the switches apply themselves). A switch started with another topology
    /// file than its controller's is refused when it registers.
    pub fn fingerprint(&self) -> String {
        use std::fmt::Write as _;
        let mut t = String::new();
        let d = &self.defaults;
        let _ = write!(
            t,
            "{}|{}|{}|{}:{}:{}|{}|",
            self.name, self.controller, self.mgmt_prefix, d.mtu, d.window, d.link_mtu, self.root
        );
        for s in &self.switches {
            let _ = write!(
                t,
                "s{}:{}:{}:{}:{}:{}:{}:{}|",
                s.id,
                s.name,
                s.mgmt,
                s.max_slots,
                s.max_window,
                s.max_mtu,
                s.max_slot_memory,
                s.max_host_memory
            );
            for p in &s.ports {
                let _ = write!(t, "p{}:{}:{}|", p.name, p.addr, p.mac);
            }
        }
        for l in &self.links {
            let _ = write!(t, "l{}.{}:{}.{}|", l.a.switch, l.a.port, l.b.switch, l.b.port);
        }
        for h in &self.hosts {
            let mac = h.mac.map_or_else(|| "learn".to_string(), |m| m.to_string());
            let (sw, port) = (h.attach.switch, h.attach.port);
            let _ = write!(t, "h{}:{}:{mac}:{}:{sw}.{port}|", h.name, h.addr, h.mgmt);
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in t.bytes() {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{}/{hash:016x}", self.name)
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

pub(crate) fn pos<T>(s: &Spanned<T>) -> (usize, usize) {
    s.span().start().map(|m| (m.line(), m.column())).unwrap_or((0, 0))
}
