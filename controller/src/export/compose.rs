//! Docker Compose file of a topology (`inc-controller export compose`).
//!
//! One bridge network per data link and one management network. Docker only knows
//! "carrier" subnets taken from a pool (`--carrier`, default [`DEFAULT_CARRIER`]): it
//! refuses overlapping subnets across networks (1-2-4 has two links in 10.1.1.0/24),
//! and its bridge would own the gateway address of a subnet in the host's namespace.
//! Each container finds its interfaces by their carrier address and `inc-entrypoint`
//! replaces it with the topology's names, MACs and addresses. Masquerading is off, so
//! nothing leaves the lab; no network is `internal`, because Docker's isolation rules
//! for internal networks drop bridged frames whose addresses are outside the carrier
//! subnet, i.e. all of the topology's traffic.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use super::{
    check_carrier, command, data_links, ends_of, flow_list, header, host_env, iface_entry, q,
    role_image, role_name, roles, secret, secrets, switch_capabilities, ExportError, ExportOptions,
    HostTransport, MgmtNaming, Role, MGMT_IF, SECRETS_IN_CONTAINER, TOPOLOGY_IN_CONTAINER,
};
use crate::topology::Topology;

/// Default carrier pool: the first /24 of the benchmarking range (RFC 2544).
pub const DEFAULT_CARRIER: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 24);
/// Addresses per link carrier subnet (/29: network, gateway, two ends, spare).
const LINK_BLOCK: u32 = 8;
/// Name of the host's data interface in compose containers.
pub const HOST_DATA_IF: &str = "eth0";

/// Variables passed through from the environment of `docker-compose` to every host
/// container when set there (run parameters read by `inc-collective`, INCCL tuning).
pub const HOST_PASSTHROUGH: &[&str] = &[
    "INC_COLLECTIVE",
    "INC_COUNT",
    "INC_DTYPE",
    "INC_OP",
    "INC_ROOT",
    "INC_ITERS",
    "INC_WARMUP",
    "INCCL_OP_TIMEOUT_MS",
    "INCCL_TIMEOUT_MS",
    "INCCL_MTU",
    "INCCL_WINDOW",
    "INCCL_LOG",
];

/// Carrier addresses of every container and network.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Carrier {
    /// Management subnet, its gateway and one address per role (in [`roles`] order).
    mgmt: (Ipv4Addr, u8, Ipv4Addr, Vec<Ipv4Addr>),
    /// Per data link: subnet base (/29); gateway +1, ends +2 and +3.
    links: Vec<Ipv4Addr>,
}

fn add(ip: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(ip).wrapping_add(n))
}

fn allocate(t: &Topology, pool: (Ipv4Addr, u8), links: usize) -> Result<Carrier, ExportError> {
    let (base, _) = pool;
    let elements = roles(t).len() as u64;
    // Network, broadcast and the bridge's gateway besides the containers.
    let mgmt_size = (elements + 3).next_power_of_two().max(u64::from(LINK_BLOCK));
    let mgmt_prefix = check_carrier(t, pool, links, mgmt_size, LINK_BLOCK)?;
    let hosts = (1..=elements as u32).map(|i| add(base, i)).collect();
    let gateway = add(base, mgmt_size as u32 - 2);
    let links = (0..links as u32).map(|k| add(base, mgmt_size as u32 + LINK_BLOCK * k)).collect();
    Ok(Carrier { mgmt: (base, mgmt_prefix, gateway, hosts), links })
}

/// Render the compose file. `pool` is the carrier pool (network address and prefix).
pub fn render(
    t: &Topology,
    opts: &ExportOptions,
    pool: (Ipv4Addr, u8),
) -> Result<String, ExportError> {
    let caps = switch_capabilities(&opts.backend)?;
    let links = data_links(t, HOST_DATA_IF);
    let carrier = allocate(t, pool, links.len())?;
    let all = roles(t);

    let mut o = String::new();
    header(&mut o, t, "Docker Compose file", "inc-controller export compose TOPOLOGY");
    let _ = writeln!(
        o,
        "# Networks use carrier subnets from {}/{} (--carrier); every container's entrypoint",
        pool.0, pool.1
    );
    let _ =
        writeln!(o, "# puts the topology's interface names, MACs and addresses in their place.");
    let _ = writeln!(o, "# Images: docker/build-images (tag: INC_IMAGE_TAG, default latest).");
    let _ =
        writeln!(o, "# Hosts run one collective and exit; INC_COLLECTIVE, INC_COUNT, INC_DTYPE,");
    let _ =
        writeln!(o, "# INC_OP, INC_ROOT, INC_ITERS are taken from docker-compose's environment.");
    let _ = writeln!(o, "version: \"2.4\"");
    let _ = writeln!(o, "services:");
    for (idx, &role) in all.iter().enumerate() {
        let name = role_name(t, role);
        // Interfaces: management first, then data links in link order.
        let mut ifaces = vec![iface_entry(
            &carrier.mgmt.3[idx].to_string(),
            MGMT_IF,
            None,
            Some(MgmtNaming::TopologyAddresses.mgmt_addr(t, role)),
        )];
        let mut nets = vec![("mgmt".to_string(), carrier.mgmt.3[idx])];
        for (k, e, end) in ends_of(&links, role) {
            let ip = add(carrier.links[k], 2 + e as u32);
            ifaces.push(iface_entry(
                &ip.to_string(),
                &end.ifname,
                Some(end.mac.clone()),
                end.addr.clone(),
            ));
            nets.push((links[k].name.clone(), ip));
        }
        let (image, what) = role_image(t, role, opts);
        let _ = writeln!(o, "  # {what}");
        let _ = writeln!(o, "  {name}:");
        let _ = writeln!(o, "    image: {}", q(&with_tag_variable(image)));
        let _ = writeln!(o, "    hostname: {}", q(name));
        // docker-init as PID 1 forwards SIGTERM, so `docker stop` ends programs at once.
        let _ = writeln!(o, "    init: true");
        let _ = writeln!(o, "    stop_grace_period: 5s");
        let _ = writeln!(
            o,
            "    command: {}",
            flow_list(&command(t, role, opts, MgmtNaming::TopologyAddresses))
        );
        let _ = writeln!(o, "    environment:");
        let _ = writeln!(o, "      - {}", q(&format!("INC_IFACES={}", ifaces.join(" "))));
        let mut passthrough: Vec<&str> = vec!["RUST_LOG"];
        if let Role::Host(i) = role {
            for e in host_env(t, i, HOST_DATA_IF, opts.transport, MgmtNaming::TopologyAddresses) {
                let _ = writeln!(o, "      - {}", q(&e));
            }
            passthrough.extend_from_slice(HOST_PASSTHROUGH);
        }
        for v in passthrough {
            let _ = writeln!(o, "      - {}", q(v));
        }
        let mut cap_add = vec!["NET_ADMIN"];
        match role {
            Role::Switch(_) => cap_add = caps.to_vec(),
            Role::Host(_) if opts.transport == HostTransport::Verbs => cap_add.push("IPC_LOCK"),
            _ => {}
        }
        let _ = writeln!(o, "    cap_add: {}", flow_list(&cap_add));
        // Its role's credential only, as a file (not in `docker inspect`'s environment).
        let _ = writeln!(o, "    secrets: {}", flow_list(&[secret(role).name]));
        let _ = writeln!(o, "    sysctls:");
        let _ = writeln!(o, "      net.ipv6.conf.all.disable_ipv6: \"1\"");
        let _ = writeln!(o, "      net.ipv6.conf.default.disable_ipv6: \"1\"");
        if matches!(role, Role::Switch(_)) {
            // The switch process is the data plane; the kernel must never route.
            let _ = writeln!(o, "      net.ipv4.ip_forward: \"0\"");
        }
        match role {
            Role::Controller | Role::Switch(_) => {
                let _ = writeln!(o, "    volumes:");
                let bind = format!("{}:{TOPOLOGY_IN_CONTAINER}:ro", opts.topology_path);
                let _ = writeln!(o, "      - {}", q(&bind));
            }
            Role::Host(_) if opts.transport == HostTransport::Verbs => {
                // The uverbs character devices appear when the entrypoint adds rxe0.
                let _ = writeln!(o, "    volumes:");
                let _ = writeln!(o, "      - \"/dev/infiniband:/dev/infiniband\"");
                let _ = writeln!(o, "    device_cgroup_rules: [\"c 231:* rmw\"]");
                let _ = writeln!(o, "    ulimits:");
                let _ = writeln!(o, "      memlock: -1");
            }
            Role::Host(_) => {}
        }
        match role {
            Role::Controller => {
                // Healthy once every switch of the topology has registered.
                let _ = writeln!(o, "    healthcheck:");
                let test = ["CMD", "inc-ready", &t.controller.to_string()];
                let _ = writeln!(o, "      test: {}", flow_list(&test));
                let _ = writeln!(o, "      interval: 1s");
                let _ = writeln!(o, "      timeout: 5s");
                let _ = writeln!(o, "      retries: 120");
            }
            Role::Switch(_) => {
                let _ = writeln!(o, "    depends_on:");
                let _ = writeln!(o, "      ctrl:");
                let _ = writeln!(o, "        condition: service_started");
            }
            Role::Host(_) => {
                let _ = writeln!(o, "    depends_on:");
                let _ = writeln!(o, "      ctrl:");
                let _ = writeln!(o, "        condition: service_healthy");
            }
        }
        let _ = writeln!(o, "    networks:");
        for (net, ip) in nets {
            let _ = writeln!(o, "      {net}:");
            let _ = writeln!(o, "        ipv4_address: {}", q(&ip.to_string()));
        }
    }

    let _ = writeln!(o, "secrets:");
    let _ =
        writeln!(o, "  # made by the export (mode 0600); compose bind-mounts each read-only at");
    let _ = writeln!(o, "  # {SECRETS_IN_CONTAINER}/NAME in the containers that list it");
    for s in secrets() {
        let _ = writeln!(o, "  {}:", s.name);
        let _ = writeln!(o, "    file: {}", q(&s.on_host(opts)));
    }
    let _ = writeln!(o, "networks:");
    let (mbase, mprefix, mgw, _) = &carrier.mgmt;
    let m = t.mgmt_subnet();
    let _ = writeln!(o, "  # management {}/{}: controller {}", m.network(), m.prefix, t.controller);
    write_network(&mut o, "mgmt", (*mbase, *mprefix), *mgw, None);
    for (k, l) in links.iter().enumerate() {
        let _ = writeln!(o, "  # {}", l.describe);
        let sub = carrier.links[k];
        write_network(&mut o, &l.name, (sub, 29), add(sub, 1), Some(t.defaults.link_mtu));
    }
    Ok(o)
}

/// `repo/role:TAG` becomes `repo/role:${INC_IMAGE_TAG:-TAG}`, so a run picks its images.
pub(crate) fn with_tag_variable(image: &str) -> String {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => format!("{repo}:${{INC_IMAGE_TAG:-{tag}}}"),
        _ => image.to_string(),
    }
}

fn write_network(o: &mut String, name: &str, sub: (Ipv4Addr, u8), gw: Ipv4Addr, mtu: Option<u32>) {
    let _ = writeln!(o, "  {name}:");
    let _ = writeln!(o, "    driver: bridge");
    let _ = writeln!(o, "    driver_opts:");
    let _ = writeln!(o, "      com.docker.network.bridge.enable_ip_masquerade: \"false\"");
    if let Some(mtu) = mtu {
        let _ = writeln!(o, "      com.docker.network.driver.mtu: \"{mtu}\"");
    }
    let _ = writeln!(o, "    ipam:");
    let _ = writeln!(o, "      config:");
    let _ = writeln!(o, "        - subnet: {}", q(&format!("{}/{}", sub.0, sub.1)));
    let _ = writeln!(o, "          gateway: {}", q(&gw.to_string()));
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{golden, opts, topology};
    use super::*;

    #[test]
    fn golden_1_2_4() {
        let t = topology("1-2-4");
        let y = render(&t, &opts(), DEFAULT_CARRIER).unwrap();
        golden("1-2-4.compose.yaml", &y);
    }

    /// The generated file is YAML with the structure compose needs; checked by parsing
    /// it, independent of the golden text.
    #[test]
    fn structure_of_1_2_4() {
        use marked_yaml::Node;
        let t = topology("1-2-4");
        let y = render(&t, &opts(), DEFAULT_CARRIER).unwrap();
        let doc = marked_yaml::parse_yaml(0, &y).expect("valid YAML");
        let root = doc.as_mapping().unwrap();
        let services = root.get_mapping("services").unwrap();
        let networks = root.get_mapping("networks").unwrap();
        // ctrl + 3 switches + 4 hosts; mgmt + 2 switch links + 4 host links.
        assert_eq!(services.len(), 8);
        assert_eq!(networks.len(), 7);
        let svc = |n: &str| services.get_mapping(n).unwrap_or_else(|| panic!("service {n}"));
        let nets_of = |n: &str| -> Vec<String> {
            svc(n).get_mapping("networks").unwrap().keys().map(|k| k.as_str().to_string()).collect()
        };
        assert_eq!(nets_of("leaf1"), ["mgmt", "root-d1", "leaf1-h0", "leaf1-h1"]);
        assert_eq!(nets_of("h2"), ["mgmt", "leaf2-h2"]);
        // Every carrier address is unique and inside its network's subnet.
        let mut seen = std::collections::HashSet::new();
        for (name, s) in services.iter() {
            for (net, cfg) in s.as_mapping().unwrap().get_mapping("networks").unwrap().iter() {
                let ip: Ipv4Addr = cfg
                    .as_mapping()
                    .unwrap()
                    .get_scalar("ipv4_address")
                    .unwrap()
                    .as_str()
                    .parse()
                    .unwrap();
                assert!(seen.insert(ip), "{ip} used twice ({})", name.as_str());
                let subnet = networks
                    .get_mapping(net.as_str())
                    .and_then(|n| n.get_mapping("ipam"))
                    .and_then(|i| i.get_sequence("config"))
                    .and_then(|c| c.get_mapping(0))
                    .and_then(|c| c.get_scalar("subnet"))
                    .unwrap()
                    .as_str()
                    .to_string();
                let (b, p) = subnet.split_once('/').unwrap();
                let (b, p): (Ipv4Addr, u32) = (b.parse().unwrap(), p.parse().unwrap());
                let mask = u32::MAX << (32 - p);
                assert_eq!(u32::from(ip) & mask, u32::from(b), "{ip} outside {subnet}");
            }
        }
        // Switch ports carry the topology MAC and no kernel address; hosts their address.
        let env = |n: &str| -> Vec<String> {
            svc(n)
                .get_sequence("environment")
                .unwrap()
                .iter()
                .map(|v| match v {
                    Node::Scalar(s) => s.as_str().to_string(),
                    _ => panic!("environment entries are strings"),
                })
                .collect()
        };
        let leaf1 = env("leaf1").into_iter().find(|e| e.starts_with("INC_IFACES=")).unwrap();
        assert!(leaf1.contains("=h0,02:00:0a:01:01:01,-"), "{leaf1}");
        assert!(leaf1.contains("=mgmt0,-,10.0.0.3/24"), "{leaf1}");
        let h0 = env("h0");
        assert!(h0.iter().any(|e| e.contains("=eth0,02:00:0a:01:01:15,10.1.1.21/24")), "{h0:?}");
        assert!(h0.contains(&"INC_RANK=0".to_string()));
        let caps = svc("root").get_sequence("cap_add").unwrap();
        assert_eq!(caps.len(), 2);
        // Each container has its role's credential file only; none is in an environment.
        let secrets_of = |n: &str| -> Vec<String> {
            let s = svc(n).get_sequence("secrets").unwrap();
            s.iter().map(|v| v.as_scalar().unwrap().as_str().to_string()).collect()
        };
        assert_eq!(secrets_of("ctrl"), ["inc-controller-token"]);
        assert_eq!(secrets_of("leaf2"), ["inc-switch-token"]);
        assert_eq!(secrets_of("h3"), ["inc-host-token"]);
        let files = root.get_mapping("secrets").unwrap();
        let file = |n: &str| {
            files.get_mapping(n).unwrap().get_scalar("file").unwrap().as_str().to_string()
        };
        assert_eq!(file("inc-switch-token"), "/srv/inc/secrets/switch.token");
        assert_eq!(files.len(), 3);
        assert!(!y.contains("INC_CONTROLLER_TOKEN") && !y.contains("--insecure"));
    }

    #[test]
    fn carrier_pool_errors_name_the_pool() {
        let t = topology("1-2-4");
        let e = render(&t, &opts(), (Ipv4Addr::new(198, 18, 0, 0), 27)).unwrap_err();
        assert!(e.to_string().contains("198.18.0.0/27"), "{e}");
        assert!(e.to_string().contains("needs 64"), "{e}");
        let e = render(&t, &opts(), (Ipv4Addr::new(198, 18, 0, 1), 24)).unwrap_err();
        assert!(matches!(e, ExportError::CarrierNotNetwork(_)), "{e}");
        // Exactly enough: 16 (mgmt) + 6 * 8.
        assert!(render(&t, &opts(), (Ipv4Addr::new(10, 9, 0, 64), 26)).is_ok());
    }

    #[test]
    fn every_bundled_topology_exports() {
        for name in ["1-4", "1-2-4", "3-level"] {
            let t = topology(name);
            let y = render(&t, &opts(), DEFAULT_CARRIER).unwrap();
            marked_yaml::parse_yaml(0, &y).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn verbs_hosts_get_devices_and_transport() {
        let t = topology("1-2-4");
        let o = ExportOptions { transport: HostTransport::Verbs, ..opts() };
        let y = render(&t, &o, DEFAULT_CARRIER).unwrap();
        assert!(y.contains("\"INCCL_TRANSPORT=verbs\""));
        assert!(y.contains("device_cgroup_rules"));
        assert!(y.contains("\"IPC_LOCK\""));
    }

    #[test]
    fn image_tag_variable() {
        assert_eq!(with_tag_variable("inc-emu/host:abc"), "inc-emu/host:${INC_IMAGE_TAG:-abc}");
        assert_eq!(with_tag_variable("reg:5000/host"), "reg:5000/host");
    }
}
