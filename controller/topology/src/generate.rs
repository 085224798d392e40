//! Regular trees written as topology YAML (`inc-controller gen tree`), so big topologies
//! come from one command instead of a hand-written file.
//!
//! Everything is derived from the shape, deterministically:
//! - switches in breadth-first order: `root` (id 0), then `s<level>-<index>`; a switch's
//!   ports are `up` (towards its parent), `d<j>` (its j-th child switch) and `h<j>` (its
//!   j-th host);
//! - hosts `h<k>` numbered over the whole tree, depth first (so a leaf's hosts are
//!   consecutive ranks);
//! - the j-th switch link (breadth-first) is the /30 `172.16.0.0 + 4j` (parent `.1`,
//!   child `.2`): up to 2^18 links;
//! - host k gets the /24 `10.(1 + k / 256).(k % 256).0`, port `.1`, host `.10`: up to
//!   254 x 256 hosts, none in the management subnet `10.0.0.0/16` (controller
//!   `10.0.0.1:7000`, `mgmt_prefix: 16`, room for 65,533 elements).

use std::fmt::Write as _;
use std::net::Ipv4Addr;

/// The shape of a regular tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSpec {
    /// `name:` of the topology.
    pub name: String,
    /// Child switches per switch, level by level from the root (`[4, 4]`: a root with 4
    /// children, each with 4: 16 leaves). Empty: the root is the only switch.
    pub fanout: Vec<u32>,
    /// Hosts on every leaf switch.
    pub hosts_per_leaf: u32,
    /// Hosts on every inner switch (the root included), 0 by default.
    pub hosts_per_inner: u32,
    /// `defaults.mtu`.
    pub mtu: u16,
    /// `defaults.window`.
    pub window: u32,
    /// Link emulation (an `inc-switch --link-emu` spec) of the links into each switch
    /// level: index 0 for root-to-level-1 links, and so on.
    pub switch_link_emulation: Vec<Option<String>>,
    /// Link emulation of every host link.
    pub host_link_emulation: Option<String>,
    /// Hosts get `mac: learn` (switches resolve them by ARP) instead of `auto`.
    pub learn_host_macs: bool,
}

impl Default for TreeSpec {
    fn default() -> Self {
        TreeSpec {
            name: "tree".into(),
            fanout: vec![2],
            hosts_per_leaf: 2,
            hosts_per_inner: 0,
            mtu: 4096,
            window: 64,
            switch_link_emulation: Vec::new(),
            host_link_emulation: None,
            learn_host_macs: false,
        }
    }
}

/// Most hosts a generated tree addresses (`10.1.0.0` .. `10.254.255.0`, one /24 each).
pub const MAX_HOSTS: u64 = 254 * 256;
/// Most switch links (`172.16.0.0/12` in /30s).
pub const MAX_SWITCH_LINKS: u64 = 1 << 18;

/// A shape that cannot be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    /// A fan-out of 0 (a level with no switches).
    #[error("fan-out of level {level} is 0 (leave the level out instead)")]
    ZeroFanout {
        /// 1-based level.
        level: usize,
    },
    /// No hosts at all.
    #[error("the tree has no hosts (--hosts-per-leaf and --hosts-per-inner are 0)")]
    NoHosts,
    /// More hosts than the address plan holds.
    #[error("{hosts} hosts: the address plan holds at most {MAX_HOSTS}")]
    TooManyHosts {
        /// Hosts the shape asks for.
        hosts: u64,
    },
    /// More switch links than the address plan holds.
    #[error("{links} switch links: the address plan holds at most {MAX_SWITCH_LINKS}")]
    TooManyLinks {
        /// Links the shape asks for.
        links: u64,
    },
    /// Emulation given for a level the tree does not have.
    #[error(
        "link emulation for switch level {level}, but the tree has {levels} levels below the root"
    )]
    NoSuchLevel {
        /// 1-based level given.
        level: usize,
        /// Levels below the root.
        levels: usize,
    },
}

impl TreeSpec {
    /// Switches on each level, the root's level first.
    fn level_sizes(&self) -> Vec<u64> {
        let mut sizes = vec![1u64];
        for f in &self.fanout {
            let last = *sizes.last().expect("root level");
            sizes.push(last.saturating_mul(u64::from(*f)));
        }
        sizes
    }

    /// Switches, switch links and hosts of the shape.
    pub fn counts(&self) -> (u64, u64, u64) {
        let sizes = self.level_sizes();
        let switches: u64 = sizes.iter().sum();
        let leaves = *sizes.last().expect("root level");
        let inner = switches - leaves;
        let hosts = leaves
            .saturating_mul(u64::from(self.hosts_per_leaf))
            .saturating_add(inner.saturating_mul(u64::from(self.hosts_per_inner)));
        (switches, switches - 1, hosts)
    }

    fn check(&self) -> Result<(), GenerateError> {
        if let Some(i) = self.fanout.iter().position(|f| *f == 0) {
            return Err(GenerateError::ZeroFanout { level: i + 1 });
        }
        if self.switch_link_emulation.len() > self.fanout.len() {
            return Err(GenerateError::NoSuchLevel {
                level: self.switch_link_emulation.len(),
                levels: self.fanout.len(),
            });
        }
        let (_, links, hosts) = self.counts();
        if hosts == 0 {
            return Err(GenerateError::NoHosts);
        }
        if hosts > MAX_HOSTS {
            return Err(GenerateError::TooManyHosts { hosts });
        }
        if links > MAX_SWITCH_LINKS {
            return Err(GenerateError::TooManyLinks { links });
        }
        Ok(())
    }
}

/// One switch of the tree while it is written.
struct Node {
    name: String,
    level: usize,
    children: Vec<usize>,
    /// Index of the link to the parent (its /30), if any.
    up_link: Option<u64>,
    /// Global numbers of its hosts.
    hosts: Vec<u64>,
}

fn link_ip(link: u64, side: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + 4 * link as u32 + side)
}

fn host_net(k: u64) -> (u64, u64) {
    (1 + k / 256, k % 256)
}

/// The topology YAML of `spec`; it loads with [`crate::Topology::parse`].
pub fn tree_yaml(spec: &TreeSpec) -> Result<String, GenerateError> {
    spec.check()?;
    // Breadth-first switches with their children.
    let mut nodes = vec![Node {
        name: "root".into(),
        level: 0,
        children: vec![],
        up_link: None,
        hosts: vec![],
    }];
    let mut level_start = 0;
    for (level, f) in spec.fanout.iter().enumerate() {
        let level_end = nodes.len();
        let mut index = 0;
        for parent in level_start..level_end {
            for _ in 0..*f {
                let id = nodes.len();
                nodes.push(Node {
                    name: format!("s{}-{index}", level + 1),
                    level: level + 1,
                    children: vec![],
                    up_link: Some(id as u64 - 1),
                    hosts: vec![],
                });
                nodes[parent].children.push(id);
                index += 1;
            }
        }
        level_start = level_end;
    }
    // Hosts depth first, so a switch's hosts are consecutive ranks.
    let mut next_host = 0u64;
    let mut stack = vec![0usize];
    while let Some(n) = stack.pop() {
        let per =
            if nodes[n].children.is_empty() { spec.hosts_per_leaf } else { spec.hosts_per_inner };
        nodes[n].hosts = (next_host..next_host + u64::from(per)).collect();
        next_host += u64::from(per);
        stack.extend(nodes[n].children.iter().rev());
    }

    let (switches, links, hosts) = spec.counts();
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# Generated by `inc-controller gen tree`: fan-out {:?}, {} hosts per leaf, {} per inner switch;\n# {switches} switches, {links} switch links, {hosts} hosts.",
        spec.fanout, spec.hosts_per_leaf, spec.hosts_per_inner
    );
    let _ = writeln!(y, "name: {}", spec.name);
    y.push_str("controller:\n  address: 10.0.0.1:7000\n  mgmt_prefix: 16\n");
    let _ = writeln!(y, "defaults:\n  mtu: {}\n  window: {}", spec.mtu, spec.window);
    y.push_str("root: root\nswitches:\n");
    for (id, n) in nodes.iter().enumerate() {
        let _ = writeln!(y, "  - id: {id}\n    name: {}\n    ports:", n.name);
        if let Some(l) = n.up_link {
            let _ = writeln!(y, "      - {{ name: up, ip: {}/30 }}", link_ip(l, 2));
        }
        for (j, c) in n.children.iter().enumerate() {
            let l = nodes[*c].up_link.expect("a child has an up link");
            let _ = writeln!(y, "      - {{ name: d{j}, ip: {}/30 }}", link_ip(l, 1));
        }
        for (j, k) in n.hosts.iter().enumerate() {
            let (a, b) = host_net(*k);
            let _ = writeln!(y, "      - {{ name: h{j}, ip: 10.{a}.{b}.1/24 }}");
        }
    }
    if nodes.len() > 1 {
        y.push_str("links:\n");
        for n in &nodes {
            for (j, c) in n.children.iter().enumerate() {
                let _ = write!(y, "  - {{ a: \"{}:d{j}\", b: \"{}:up\"", n.name, nodes[*c].name);
                if let Some(Some(e)) = spec.switch_link_emulation.get(nodes[*c].level - 1) {
                    let _ = write!(y, ", emulate: \"{e}\"");
                }
                y.push_str(" }\n");
            }
        }
    }
    y.push_str("hosts:\n");
    let mut by_rank: Vec<(u64, &Node, usize)> = Vec::new();
    for n in &nodes {
        by_rank.extend(n.hosts.iter().enumerate().map(|(j, k)| (*k, n, j)));
    }
    by_rank.sort_by_key(|(k, _, _)| *k);
    for (k, n, j) in by_rank {
        let (a, b) = host_net(k);
        let _ = write!(y, "  - {{ name: h{k}, ip: 10.{a}.{b}.10/24, attach: \"{}:h{j}\"", n.name);
        if spec.learn_host_macs {
            y.push_str(", mac: learn");
        }
        if let Some(e) = &spec.host_link_emulation {
            let _ = write!(y, ", emulate: \"{e}\"");
        }
        y.push_str(" }\n");
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Topology;

    fn load(spec: &TreeSpec) -> Topology {
        let y = tree_yaml(spec).unwrap();
        Topology::parse("gen.yaml", &y).unwrap_or_else(|e| panic!("{e}\n{y}"))
    }

    /// Trees of every depth load and validate with the counts the shape implies, the
    /// spanning tree is the generated one, and leaf hosts are consecutive ranks.
    #[test]
    fn generated_trees_are_valid_topologies() {
        for (fanout, leaf, inner) in [
            (vec![], 4, 0),
            (vec![2], 2, 0),
            (vec![2, 2], 2, 1),
            (vec![4, 4], 16, 0),
            (vec![16], 16, 0),
            (vec![8, 8, 4], 4, 0),
        ] {
            let spec = TreeSpec {
                fanout: fanout.clone(),
                hosts_per_leaf: leaf,
                hosts_per_inner: inner,
                ..TreeSpec::default()
            };
            let t = load(&spec);
            let (switches, links, hosts) = spec.counts();
            assert_eq!(
                (t.switches.len() as u64, t.links.len() as u64, t.hosts.len() as u64),
                (switches, links, hosts),
                "{fanout:?}"
            );
            assert_eq!(t.switches[t.root].name, "root");
        }
        let t = load(&TreeSpec { fanout: vec![4, 4], hosts_per_leaf: 16, ..TreeSpec::default() });
        assert_eq!(t.hosts.len(), 256);
        assert_eq!(t.hosts[17].name, "h17");
        assert_eq!(t.switches[t.hosts[17].attach.switch].name, "s2-1");
        assert_eq!(t.hosts[17].addr.ip, Ipv4Addr::new(10, 1, 17, 10));
        assert_eq!(t.hosts[255].addr.ip, Ipv4Addr::new(10, 1, 255, 10));
    }

    /// The address plan reaches its limits without overlap: 1,024 and 8,192 hosts load.
    #[test]
    fn thousands_of_hosts() {
        let t = load(&TreeSpec { fanout: vec![32, 16], hosts_per_leaf: 16, ..TreeSpec::default() });
        assert_eq!(t.hosts.len(), 8192);
        assert_eq!(t.hosts[8191].addr.ip, Ipv4Addr::new(10, 32, 255, 10));
        let big = TreeSpec { fanout: vec![255, 256], hosts_per_leaf: 1, ..TreeSpec::default() };
        assert!(matches!(tree_yaml(&big), Err(GenerateError::TooManyHosts { hosts: 65280 })));
    }

    #[test]
    fn emulation_per_level_and_bad_shapes() {
        let spec = TreeSpec {
            fanout: vec![2, 2],
            switch_link_emulation: vec![None, Some("delay=1us".into())],
            host_link_emulation: Some("rate=100gbit".into()),
            learn_host_macs: true,
            ..TreeSpec::default()
        };
        let y = tree_yaml(&spec).unwrap();
        assert!(y.contains("{ a: \"root:d0\", b: \"s1-0:up\" }"), "{y}");
        assert!(y.contains("{ a: \"s1-1:d1\", b: \"s2-3:up\", emulate: \"delay=1us\" }"), "{y}");
        assert!(y.contains("attach: \"s2-0:h0\", mac: learn, emulate: \"rate=100gbit\" }"), "{y}");
        assert!(load(&spec).hosts.iter().all(|h| h.mac.is_none()));
        let zero = TreeSpec { fanout: vec![2, 0], ..TreeSpec::default() };
        assert_eq!(tree_yaml(&zero), Err(GenerateError::ZeroFanout { level: 2 }));
        let none = TreeSpec { hosts_per_leaf: 0, ..TreeSpec::default() };
        assert_eq!(tree_yaml(&none), Err(GenerateError::NoHosts));
        let deep = TreeSpec {
            switch_link_emulation: vec![None, Some("loss=1%".into())],
            ..TreeSpec::default()
        };
        assert_eq!(tree_yaml(&deep), Err(GenerateError::NoSuchLevel { level: 2, levels: 1 }));
    }
}
