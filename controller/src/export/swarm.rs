//! Docker Swarm stack of a topology (`inc-controller export swarm`), for
//! `docker stack deploy --resolve-image never`.
//!
//! The containers are the compose export's; what differs is what Swarm allows:
//!
//! - Every data link is its own `internal` overlay (VXLAN) network with an explicit
//!   carrier subnet from a pool (`--carrier`, default [`DEFAULT_CARRIER`]) and
//!   `com.docker.network.driver.mtu` of the link MTU plus [`OVERLAY_OVERHEAD`] (the
//!   container gets the option's value minus 50). `internal`, because no container may
//!   reach or be reached from outside; unlike the compose bridges, overlay networks add no
//!   rules that drop frames with addresses outside the carrier subnet.
//! - `docker stack deploy` ignores `ipv4_address`: Docker picks each container's carrier
//!   address (and Swarm takes one per node and network for its load balancer). So
//!   `INC_IFACES` locates each interface by its network's carrier *subnet*;
//!   `inc-entrypoint` renames it and keeps Docker's MAC (an overlay carries frames
//!   between nodes only to the MACs Docker gave its endpoints; switches report them to
//!   the controller, whose rules use them). A data interface gets the topology's address
//!   in place of Docker's (none on switch ports).
//! - The management network keeps Docker's addresses, and containers reach each other
//!   by service name through Docker's DNS: the controller listens on all its addresses
//!   (its only network is the internal management overlay), switches and rank 0 dial
//!   `ctrl:PORT`, the other ranks reach rank 0 at its host's name. An overlay answers
//!   ARP between nodes only for Docker's own addresses, so the topology's management
//!   addresses would not resolve across nodes.
//! - Services are placed by node labels: `--place NAME=NODE` pins an element to the nodes
//!   labelled `inc-node=NODE` (`docker node update --label-add inc-node=NODE`); a host
//!   not placed itself follows its edge switch, so host links stay on one node. An
//!   element without a placement may run on any node.
//! - Credentials are Swarm secrets made from the export's files (each service gets only
//!   its role's, mode 0400); the topology file is a Swarm config, so no node needs a copy.
//! - Host services stay up idle (`sleep infinity`); a collective is run in each host
//!   container with `docker exec CONTAINER inc-collective` (`scripts/swarm-demo`),
//!   because re-creating Swarm tasks for every run would take seconds each.
//! - Every service uses `endpoint_mode: dnsrr` (no virtual IP, no IPVS): the lab's
//!   traffic never goes through Docker's service load balancing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use super::{
    check_carrier, command, compose::with_tag_variable, data_links, ends_of, flow_list, header,
    host_env, iface_entry, q, role_image, role_name, roles, secret, secrets, switch_capabilities,
    ExportError, ExportOptions, HostTransport, MgmtNaming, Role, MGMT_IF, TOPOLOGY_IN_CONTAINER,
};
use crate::topology::Topology;

/// Default carrier pool: 198.19.0.0/22, the upper half of the benchmarking range (RFC
/// 2544) next to the compose export's 198.18.0.0/24, large enough for the bundled
/// topologies.
pub const DEFAULT_CARRIER: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 19, 0, 0), 22);
/// Addresses per link carrier subnet (/28): network, gateway, broadcast, the two ends,
/// one load-balancer endpoint per node that runs an end, and room for replaced tasks
/// (their addresses are freed only after the old task is gone).
const LINK_BLOCK: u32 = 16;
/// What the overlay driver takes off `com.docker.network.driver.mtu` for the VXLAN
/// header before it sets the containers' interfaces' MTU.
pub const OVERLAY_OVERHEAD: u32 = 50;
/// Name of the host's data interface in Swarm containers.
pub const HOST_DATA_IF: &str = "eth0";
/// Node label that placements refer to: `--place leaf1=n2` runs leaf1 on the nodes
/// with `inc-node=n2`.
pub const NODE_LABEL: &str = "inc-node";
/// Name of the Swarm config holding the topology file.
pub const TOPOLOGY_CONFIG: &str = "inc-topology";

/// Which node (label value) each element runs on; elements not named here run anywhere,
/// except hosts, which follow their edge switch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    nodes: BTreeMap<String, String>,
}

impl Placement {
    /// No element pinned.
    pub fn new() -> Self {
        Placement::default()
    }

    /// Add `NAME=NODE` (NAME a switch, a host or `ctrl`). `origin` names where the spec
    /// came from in errors (`--place`, `FILE:LINE`).
    pub fn add(&mut self, t: &Topology, spec: &str, origin: &str) -> Result<(), ExportError> {
        let bad = |reason: String| ExportError::BadPlacement {
            origin: origin.to_string(),
            spec: spec.to_string(),
            reason,
        };
        let (name, node) = spec.split_once('=').ok_or_else(|| {
            bad("expected NAME=NODE (a switch, host or ctrl, and a node label value)".into())
        })?;
        let (name, node) = (name.trim(), node.trim());
        if !roles(t).into_iter().any(|r| role_name(t, r) == name) {
            return Err(bad(format!("topology `{}` has no element `{name}`", t.name)));
        }
        let label_ok = !node.is_empty()
            && node.len() <= 63
            && node.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !label_ok {
            return Err(bad(format!(
                "node `{node}` is not a label value (1-63 letters, digits, `-`, `_`, `.`)"
            )));
        }
        if let Some(prev) = self.nodes.get(name) {
            if prev != node {
                return Err(bad(format!("`{name}` is already placed on `{prev}`")));
            }
        }
        self.nodes.insert(name.to_string(), node.to_string());
        Ok(())
    }

    /// Add every `NAME=NODE` line of a placement file (`#` starts a comment, blank lines
    /// are skipped); errors name `source:LINE`.
    pub fn add_file(&mut self, t: &Topology, text: &str, source: &str) -> Result<(), ExportError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if !line.is_empty() {
                self.add(t, line, &format!("{source}:{}", i + 1))?;
            }
        }
        Ok(())
    }

    /// The node of a role: its own placement, else (hosts) its edge switch's.
    pub fn node_of(&self, t: &Topology, r: Role) -> Option<&str> {
        if let Some(n) = self.nodes.get(role_name(t, r)) {
            return Some(n);
        }
        match r {
            Role::Host(i) => {
                self.nodes.get(&t.switches[t.hosts[i].attach.switch].name).map(String::as_str)
            }
            _ => None,
        }
    }
}

/// Carrier subnets: management first, then one [`LINK_BLOCK`] per link.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Carrier {
    mgmt: (Ipv4Addr, u8),
    links: Vec<(Ipv4Addr, u8)>,
}

fn allocate(t: &Topology, pool: (Ipv4Addr, u8), links: usize) -> Result<Carrier, ExportError> {
    let (base, _) = pool;
    let elements = roles(t).len() as u64;
    // Every element twice (a replaced task's address is freed late), plus network,
    // gateway, broadcast and load-balancer endpoints.
    let mgmt_size = (2 * elements + 8).next_power_of_two().max(u64::from(LINK_BLOCK));
    let mgmt_prefix = check_carrier(t, pool, links, mgmt_size, LINK_BLOCK)?;
    let link_prefix = 32 - LINK_BLOCK.trailing_zeros() as u8;
    let add = |n: u64| Ipv4Addr::from(u32::from(base).wrapping_add(n as u32));
    let links = (0..links as u64)
        .map(|k| (add(mgmt_size + u64::from(LINK_BLOCK) * k), link_prefix))
        .collect();
    Ok(Carrier { mgmt: (base, mgmt_prefix), links })
}

fn cidr((ip, prefix): (Ipv4Addr, u8)) -> String {
    format!("{ip}/{prefix}")
}

/// Render the stack file. `pool` is the carrier pool (network address and prefix).
pub fn render(
    t: &Topology,
    opts: &ExportOptions,
    pool: (Ipv4Addr, u8),
    place: &Placement,
) -> Result<String, ExportError> {
    let caps = switch_capabilities(&opts.backend)?;
    if opts.transport == HostTransport::Verbs {
        return Err(ExportError::Unsupported {
            target: "swarm",
            what: "--transport verbs: Swarm services cannot be given /dev/infiniband or a \
                   device cgroup rule"
                .into(),
        });
    }
    let links = data_links(t, HOST_DATA_IF);
    let carrier = allocate(t, pool, links.len())?;
    let naming = MgmtNaming::ServiceNames;
    let link_mtu = t.defaults.link_mtu;

    let mut o = String::new();
    header(&mut o, t, "Docker Swarm stack file", "inc-controller export swarm TOPOLOGY");
    let _ = writeln!(o, "# Deploy: docker stack deploy --resolve-image never -c FILE STACK");
    let _ = writeln!(
        o,
        "# Every link is an internal overlay network with a carrier subnet from {} (--carrier);",
        cidr(pool)
    );
    let _ = writeln!(
        o,
        "# each entrypoint finds its interfaces by subnet, names them as the topology does"
    );
    let _ = writeln!(
        o,
        "# and keeps Docker's MACs; data links get the topology's addresses, management"
    );
    let _ = writeln!(
        o,
        "# keeps Docker's and uses service names (controller {}).",
        naming.controller(t)
    );
    let _ = writeln!(
        o,
        "# Placement: node label {NODE_LABEL}; hosts idle until `docker exec C inc-collective`."
    );
    let _ = writeln!(o, "version: \"3.8\"");
    let _ = writeln!(o, "services:");
    for role in roles(t) {
        let name = role_name(t, role);
        // Interfaces: management first, then data links in link order.
        let mut ifaces =
            vec![iface_entry(&cidr(carrier.mgmt), MGMT_IF, None, Some(naming.mgmt_addr(t, role)))];
        let mut nets = vec!["mgmt".to_string()];
        for (k, _, end) in ends_of(&links, role) {
            ifaces.push(iface_entry(
                &cidr(carrier.links[k]),
                &end.ifname,
                Some(end.mac.clone()),
                end.addr.clone(),
            ));
            nets.push(links[k].name.clone());
        }
        let (image, what) = role_image(t, role, opts);
        let _ = writeln!(o, "  # {what}");
        let _ = writeln!(o, "  {name}:");
        let _ = writeln!(o, "    image: {}", q(&with_tag_variable(image)));
        let _ = writeln!(o, "    hostname: {}", q(name));
        let _ = writeln!(o, "    init: true");
        let _ = writeln!(o, "    stop_grace_period: 5s");
        let cmd = match role {
            Role::Host(_) => vec!["sleep".to_string(), "infinity".to_string()],
            _ => command(t, role, opts, naming),
        };
        let _ = writeln!(o, "    command: {}", flow_list(&cmd));
        let _ = writeln!(o, "    environment:");
        let _ = writeln!(o, "      - {}", q(&format!("INC_IFACES={}", ifaces.join(" "))));
        if !matches!(role, Role::Controller) {
            let _ = writeln!(o, "      - {}", q(&format!("INC_LINK_MTU={link_mtu}")));
        }
        if let Role::Host(i) = role {
            for e in host_env(t, i, HOST_DATA_IF, opts.transport, naming) {
                let _ = writeln!(o, "      - {}", q(&e));
            }
        }
        let cap_add = match role {
            Role::Switch(_) => caps.to_vec(),
            _ => vec!["NET_ADMIN"],
        };
        let _ = writeln!(o, "    cap_add: {}", flow_list(&cap_add));
        // Its role's credential only, a file readable by root alone.
        let s = secret(role);
        let _ = writeln!(o, "    secrets:");
        let _ = writeln!(o, "      - source: {}", s.name);
        let _ = writeln!(o, "        target: {}", s.name);
        let _ = writeln!(o, "        mode: 0400");
        if !matches!(role, Role::Host(_)) {
            let _ = writeln!(o, "    configs:");
            let _ = writeln!(o, "      - source: {TOPOLOGY_CONFIG}");
            let _ = writeln!(o, "        target: {TOPOLOGY_IN_CONTAINER}");
            let _ = writeln!(o, "        mode: 0444");
        }
        let _ = writeln!(o, "    sysctls:");
        let _ = writeln!(o, "      net.ipv6.conf.all.disable_ipv6: \"1\"");
        let _ = writeln!(o, "      net.ipv6.conf.default.disable_ipv6: \"1\"");
        if matches!(role, Role::Switch(_)) {
            // The switch process is the data plane; the kernel must never route.
            let _ = writeln!(o, "      net.ipv4.ip_forward: \"0\"");
        }
        // No healthcheck on the controller: Swarm's DNS names a task only once it is
        // healthy, and a check that waits for every switch would keep the switches from
        // finding the controller. `inc-ready` is run by whoever waits (scripts/swarm-demo).
        let _ = writeln!(o, "    networks: {}", flow_list(&nets));
        let _ = writeln!(o, "    deploy:");
        let _ = writeln!(o, "      endpoint_mode: dnsrr");
        // A switch that started before the controller listened exits and is restarted.
        let _ = writeln!(o, "      restart_policy:");
        let _ = writeln!(o, "        condition: any");
        let _ = writeln!(o, "        delay: 1s");
        if let Some(node) = place.node_of(t, role) {
            let _ = writeln!(o, "      placement:");
            let c = format!("node.labels.{NODE_LABEL} == {node}");
            let _ = writeln!(o, "        constraints: {}", flow_list(&[c]));
        }
    }

    let _ = writeln!(o, "secrets:");
    let _ = writeln!(o, "  # made by the export (mode 0600); Swarm stores them encrypted and");
    let _ = writeln!(o, "  # mounts each at /run/secrets/NAME in the services that list it");
    for s in secrets() {
        let _ = writeln!(o, "  {}:", s.name);
        let _ = writeln!(o, "    file: {}", q(&s.on_host(opts)));
    }
    let _ = writeln!(o, "configs:");
    let _ = writeln!(o, "  {TOPOLOGY_CONFIG}:");
    let _ = writeln!(o, "    file: {}", q(&opts.topology_path));
    let _ = writeln!(o, "networks:");
    let _ = writeln!(o, "  # management: Docker's addresses, service names through Docker's DNS");
    write_network(&mut o, "mgmt", carrier.mgmt, None);
    for (k, l) in links.iter().enumerate() {
        let _ = writeln!(o, "  # {}", l.describe);
        write_network(&mut o, &l.name, carrier.links[k], Some(link_mtu + OVERLAY_OVERHEAD));
    }
    Ok(o)
}

fn write_network(o: &mut String, name: &str, sub: (Ipv4Addr, u8), mtu: Option<u32>) {
    let _ = writeln!(o, "  {name}:");
    let _ = writeln!(o, "    driver: overlay");
    let _ = writeln!(o, "    internal: true");
    if let Some(mtu) = mtu {
        let _ = writeln!(o, "    driver_opts:");
        let _ = writeln!(o, "      com.docker.network.driver.mtu: \"{mtu}\"");
    }
    let _ = writeln!(o, "    ipam:");
    let _ = writeln!(o, "      config:");
    let _ = writeln!(o, "        - subnet: {}", q(&cidr(sub)));
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use marked_yaml::types::MarkedMappingNode;

    use super::super::testutil::{golden, opts, topology};
    use super::*;

    fn place(t: &Topology, specs: &[&str]) -> Placement {
        let mut p = Placement::new();
        for s in specs {
            p.add(t, s, "--place").unwrap();
        }
        p
    }

    fn parse(y: &str) -> marked_yaml::Node {
        marked_yaml::parse_yaml(0, y).expect("valid YAML")
    }

    fn scalar(m: &MarkedMappingNode, k: &str) -> String {
        m.get_scalar(k).unwrap_or_else(|| panic!("no scalar {k}")).as_str().to_string()
    }

    fn strings(m: &MarkedMappingNode, k: &str) -> Vec<String> {
        m.get_sequence(k)
            .unwrap_or_else(|| panic!("no sequence {k}"))
            .iter()
            .map(|v| v.as_scalar().expect("scalar").as_str().to_string())
            .collect()
    }

    fn parse_cidr(s: &str) -> (u32, u32) {
        let (b, p) = s.split_once('/').unwrap();
        (u32::from(b.parse::<Ipv4Addr>().unwrap()), p.parse().unwrap())
    }

    #[test]
    fn golden_1_2_4() {
        let t = topology("1-2-4");
        let p = place(&t, &["ctrl=n1", "root=n1", "leaf1=n1", "leaf2=n2"]);
        golden("1-2-4.swarm.yaml", &render(&t, &opts(), DEFAULT_CARRIER, &p).unwrap());
    }

    /// The stack file parses, and its structure is what `docker stack deploy` needs,
    /// independent of the golden text.
    #[test]
    fn structure_of_1_2_4() {
        let t = topology("1-2-4");
        let p = place(&t, &["leaf1=n1", "leaf2=n2", "h3=n1"]);
        let y = render(&t, &opts(), DEFAULT_CARRIER, &p).unwrap();
        let doc = parse(&y);
        let root = doc.as_mapping().unwrap();
        assert_eq!(scalar(root, "version"), "3.8");
        let services = root.get_mapping("services").unwrap();
        let networks = root.get_mapping("networks").unwrap();
        assert_eq!(services.len(), 8);
        assert_eq!(networks.len(), 7);
        let svc = |n: &str| services.get_mapping(n).unwrap_or_else(|| panic!("service {n}"));

        // Networks: internal overlays, disjoint subnets inside the pool, data links with
        // the MTU option that gives containers the link MTU.
        let (pool, pool_prefix) = parse_cidr(&cidr(DEFAULT_CARRIER));
        let pool_mask = u32::MAX << (32 - pool_prefix);
        let mut subnets: Vec<(String, u32, u32)> = Vec::new();
        for (name, n) in networks.iter() {
            let n = n.as_mapping().unwrap();
            assert_eq!(scalar(n, "driver"), "overlay", "{}", name.as_str());
            assert_eq!(scalar(n, "internal"), "true", "{}", name.as_str());
            let sub = n
                .get_mapping("ipam")
                .and_then(|i| i.get_sequence("config"))
                .and_then(|c| c.get_mapping(0))
                .map(|c| scalar(c, "subnet"))
                .unwrap();
            let (base, prefix) = parse_cidr(&sub);
            assert_eq!(base & pool_mask, pool, "{sub} outside the pool");
            subnets.push((name.as_str().to_string(), base, prefix));
            let mtu =
                n.get_mapping("driver_opts").map(|d| scalar(d, "com.docker.network.driver.mtu"));
            if name.as_str() == "mgmt" {
                assert_eq!(mtu, None);
            } else {
                assert_eq!(prefix, 28, "{sub}");
                assert_eq!(mtu.as_deref(), Some("9050"), "{}", name.as_str());
                assert_eq!(t.defaults.link_mtu + OVERLAY_OVERHEAD, 9050);
            }
        }
        for (i, (a, ab, ap)) in subnets.iter().enumerate() {
            for (b, bb, bp) in &subnets[i + 1..] {
                let m = u32::MAX << (32 - (*ap).min(*bp));
                assert_ne!(ab & m, bb & m, "{a} and {b} overlap");
            }
        }
        let subnet_of = |net: &str| {
            let (_, b, p) = subnets.iter().find(|(n, _, _)| n == net).unwrap();
            format!("{}/{p}", Ipv4Addr::from(*b))
        };

        // Services: networks as a list; every interface located by its network's subnet.
        assert_eq!(strings(svc("leaf1"), "networks"), ["mgmt", "root-d1", "leaf1-h0", "leaf1-h1"]);
        assert_eq!(strings(svc("h2"), "networks"), ["mgmt", "leaf2-h2"]);
        assert!(!y.contains("ipv4_address"));
        let env = |n: &str| strings(svc(n), "environment");
        let ifaces = |n: &str| {
            env(n)
                .into_iter()
                .find_map(|e| e.strip_prefix("INC_IFACES=").map(str::to_string))
                .unwrap()
        };
        for (name, _) in services.iter() {
            let n = name.as_str();
            let list = ifaces(n);
            let nets = strings(svc(n), "networks");
            assert_eq!(list.split(' ').count(), nets.len(), "{n}: {list}");
            for (entry, net) in list.split(' ').zip(&nets) {
                assert!(
                    entry.starts_with(&format!("{}=", subnet_of(net))),
                    "{n}: {entry} vs {net}"
                );
            }
        }
        assert!(ifaces("leaf1").contains("=h0,02:00:0a:01:01:01,-"), "{}", ifaces("leaf1"));
        assert!(ifaces("h0").contains("=eth0,02:00:0a:01:01:15,10.1.1.21/24"), "{}", ifaces("h0"));
        // Management on Docker's addresses, by service name.
        assert!(ifaces("ctrl").ends_with("=mgmt0,-,docker"), "{}", ifaces("ctrl"));
        assert!(ifaces("h3").starts_with(&format!("{}=mgmt0,-,docker ", subnet_of("mgmt"))));
        assert!(env("h3").contains(&"INC_MASTER=h0".to_string()), "{:?}", env("h3"));
        assert!(env("h3").contains(&"INCCL_CONTROLLER=ctrl:7000".to_string()));
        let cmd = |n: &str| strings(svc(n), "command");
        assert!(
            cmd("leaf2").windows(2).any(|w| w == ["--controller", "ctrl:7000"]),
            "{:?}",
            cmd("leaf2")
        );
        assert!(
            cmd("ctrl").windows(2).any(|w| w == ["--listen", "0.0.0.0:7000"]),
            "{:?}",
            cmd("ctrl")
        );
        assert!(!y.contains("10.0.0."), "a topology management address in the stack file");
        assert!(env("h0").contains(&"INC_RANK=0".to_string()));
        assert!(env("root").contains(&"INC_LINK_MTU=9000".to_string()));
        assert_eq!(strings(svc("h1"), "command"), ["sleep", "infinity"]);

        // Capabilities, never privileged; the switches do not route.
        assert_eq!(strings(svc("root"), "cap_add"), ["NET_ADMIN", "NET_RAW"]);
        assert_eq!(strings(svc("h0"), "cap_add"), ["NET_ADMIN"]);
        assert!(!y.contains("privileged"));
        let sysctl = svc("leaf2").get_mapping("sysctls").unwrap();
        assert_eq!(scalar(sysctl, "net.ipv4.ip_forward"), "0");

        // Each service has its role's credential only; none is in an environment.
        let secrets_of = |n: &str| -> Vec<(String, String)> {
            svc(n)
                .get_sequence("secrets")
                .unwrap()
                .iter()
                .map(|s| {
                    let s = s.as_mapping().unwrap();
                    assert_eq!(scalar(s, "mode"), "0400");
                    (scalar(s, "source"), scalar(s, "target"))
                })
                .collect()
        };
        let one = |s: &str| vec![(s.to_string(), s.to_string())];
        assert_eq!(secrets_of("ctrl"), one("inc-controller-token"));
        for sw in ["root", "leaf1", "leaf2"] {
            assert_eq!(secrets_of(sw), one("inc-switch-token"), "{sw}");
        }
        for h in ["h0", "h1", "h2", "h3"] {
            assert_eq!(secrets_of(h), one("inc-host-token"), "{h}");
        }
        let files = root.get_mapping("secrets").unwrap();
        assert_eq!(files.len(), 3);
        let file = |n: &str| scalar(files.get_mapping(n).unwrap(), "file");
        assert_eq!(file("inc-host-token"), "/srv/inc/secrets/host.token");
        assert!(!y.contains("INC_CONTROLLER_TOKEN") && !y.contains("--insecure"));
        // The topology is a config of the controller and the switches, not the hosts.
        let configs = root.get_mapping("configs").unwrap();
        assert_eq!(
            scalar(configs.get_mapping(TOPOLOGY_CONFIG).unwrap(), "file"),
            "/srv/inc/1-2-4.yaml"
        );
        assert!(svc("leaf1").get_sequence("configs").is_some());
        assert!(svc("h0").get_sequence("configs").is_none());

        // Placement: switches where placed, hosts with their switch unless placed,
        // the unplaced controller and root anywhere.
        let constraint = |n: &str| {
            svc(n)
                .get_mapping("deploy")
                .unwrap()
                .get_mapping("placement")
                .map(|p| strings(p, "constraints"))
        };
        let on = |node: &str| Some(vec![format!("node.labels.inc-node == {node}")]);
        assert_eq!(constraint("leaf2"), on("n2"));
        assert_eq!(constraint("h2"), on("n2"));
        assert_eq!(constraint("h3"), on("n1"));
        assert_eq!(constraint("h0"), on("n1"));
        assert_eq!(constraint("ctrl"), None);
        assert_eq!(constraint("root"), None);
        let deploy = svc("h0").get_mapping("deploy").unwrap();
        assert_eq!(scalar(deploy, "endpoint_mode"), "dnsrr");
    }

    #[test]
    fn placement_errors_name_spec_and_origin() {
        let t = topology("1-2-4");
        let mut p = Placement::new();
        let e = p.add(&t, "leaf9=n1", "--place").unwrap_err().to_string();
        assert!(e.contains("--place") && e.contains("leaf9") && e.contains("1-2-4"), "{e}");
        let e = p.add(&t, "leaf1", "--place").unwrap_err().to_string();
        assert!(e.contains("NAME=NODE"), "{e}");
        let e = p.add(&t, "leaf1=a b", "--place").unwrap_err().to_string();
        assert!(e.contains("`a b`"), "{e}");
        let e = p
            .add_file(&t, "# nodes\nleaf1 = n1\n\nleaf2=n2 # far\nleaf1=n3\n", "place.txt")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("place.txt:5:"), "{e}");
        assert!(e.contains("already placed on `n1`"), "{e}");
        assert_eq!(p.node_of(&t, Role::Host(3)), Some("n2"));
    }

    #[test]
    fn carrier_pool_errors_name_the_pool() {
        let t = topology("1-2-4");
        // 32 (mgmt) + 6 * 16 = 128.
        let e = render(&t, &opts(), (Ipv4Addr::new(198, 19, 0, 0), 26), &Placement::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("198.19.0.0/26") && e.contains("needs 128"), "{e}");
        assert!(e.contains("links of 16"), "{e}");
        assert!(render(&t, &opts(), (Ipv4Addr::new(10, 9, 0, 128), 25), &Placement::new()).is_ok());
        let e =
            render(&t, &opts(), (Ipv4Addr::new(10, 9, 0, 1), 24), &Placement::new()).unwrap_err();
        assert!(matches!(e, ExportError::CarrierNotNetwork(_)), "{e}");
    }

    #[test]
    fn verbs_is_refused() {
        let t = topology("1-2-4");
        let o = ExportOptions { transport: HostTransport::Verbs, ..opts() };
        let e = render(&t, &o, DEFAULT_CARRIER, &Placement::new()).unwrap_err().to_string();
        assert!(e.contains("swarm") && e.contains("verbs"), "{e}");
    }

    #[test]
    fn every_bundled_topology_exports() {
        for name in ["1-4", "1-2-4", "3-level"] {
            let t = topology(name);
            let y = render(&t, &opts(), DEFAULT_CARRIER, &Placement::new())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let doc = parse(&y);
            let nets = doc.as_mapping().unwrap().get_mapping("networks").unwrap().len();
            assert_eq!(nets, 1 + t.links.len() + t.hosts.len(), "{name}");
            let mut seen = HashSet::new();
            for l in y.lines().filter(|l| l.contains("- subnet:")) {
                assert!(seen.insert(l.to_string()), "{name}: {l} twice");
            }
        }
    }
}
