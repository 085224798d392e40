//! containerlab topology of a topology (`inc-controller export containerlab`).
//!
//! containerlab creates each link as a veth pair with the interface names given in
//! `endpoints`, so switch ports get their port names directly; hosts use `eth1` for
//! their data link because containerlab reserves `eth0` for its management network,
//! which carries the topology's management addresses (`mgmt-ipv4`). Links appear after
//! a container has started: `inc-entrypoint` waits for the named interfaces, then sets
//! the topology's MACs, addresses and MTU. Host containers stay up idle; collectives are
//! started with `docker exec` (docker/README.md), because containerlab starts every node
//! at once and a host must not start before the switches have registered.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use super::{
    command, data_links, ends_of, flow_list, header, host_env, iface_entry, mgmt_ip, q, role_name,
    roles, secret, switch_capabilities, ExportError, ExportOptions, MgmtNaming, Role,
    TOPOLOGY_IN_CONTAINER,
};
use crate::topology::Topology;

/// Name of the host's data interface in containerlab nodes.
pub const HOST_DATA_IF: &str = "eth1";

/// Render the containerlab topology. The lab is named after the topology; containerlab
/// names the containers `clab-LAB-NODE`.
pub fn render(t: &Topology, opts: &ExportOptions) -> Result<String, ExportError> {
    // containerlab starts linux nodes privileged; the backend is checked all the same so
    // both exports accept the same backends.
    switch_capabilities(&opts.backend)?;
    let links = data_links(t, HOST_DATA_IF);
    let all = roles(t);
    let mgmt = t.mgmt_subnet();
    let gateway = mgmt_gateway(t, &all);

    let mut o = String::new();
    header(&mut o, t, "containerlab topology", "inc-controller export containerlab TOPOLOGY");
    let _ = writeln!(o, "# Deploy: containerlab deploy -t FILE; hosts idle until a collective is");
    let _ = writeln!(o, "# started in each of them: docker exec clab-LAB-HOST inc-collective.");
    let _ = writeln!(o, "name: {}", q(&t.name));
    let _ = writeln!(o, "mgmt:");
    let _ = writeln!(o, "  network: {}", q(&format!("inc-{}-mgmt", t.name)));
    let _ = writeln!(o, "  ipv4-subnet: {}", q(&format!("{}/{}", mgmt.network(), mgmt.prefix)));
    let _ = writeln!(o, "  ipv4-gw: {}", q(&gateway.to_string()));
    let _ = writeln!(o, "topology:");
    let _ = writeln!(o, "  nodes:");
    for &role in &all {
        let name = role_name(t, role);
        let ifaces: Vec<String> = ends_of(&links, role)
            .map(|(_, _, e)| iface_entry(&e.ifname, &e.ifname, Some(e.mac.clone()), e.addr.clone()))
            .collect();
        let image = match role {
            Role::Controller => &opts.images.controller,
            Role::Switch(_) => &opts.images.switch,
            Role::Host(_) => &opts.images.host,
        };
        let _ = writeln!(o, "    {name}:");
        let _ = writeln!(o, "      kind: linux");
        let _ = writeln!(o, "      image: {}", q(image));
        let _ = writeln!(o, "      mgmt-ipv4: {}", q(&mgmt_ip(t, role).to_string()));
        // Its role's credential only, as a read-only file (the export made it mode 0600).
        let s = secret(role);
        let mut binds = vec![format!("{}:{}:ro", s.on_host(opts), s.in_container())];
        if !matches!(role, Role::Host(_)) {
            binds.push(format!("{}:{TOPOLOGY_IN_CONTAINER}:ro", opts.topology_path));
        }
        let _ = writeln!(o, "      binds: {}", flow_list(&binds));
        let _ = writeln!(o, "      env:");
        let _ = writeln!(o, "        INC_IFACES: {}", q(&ifaces.join(" ")));
        let _ = writeln!(o, "        INC_LINK_MTU: {}", q(&t.defaults.link_mtu.to_string()));
        if let Role::Host(i) = role {
            for e in host_env(t, i, HOST_DATA_IF, opts.transport, MgmtNaming::TopologyAddresses) {
                let (k, v) = e.split_once('=').expect("KEY=VALUE");
                let _ = writeln!(o, "        {k}: {}", q(v));
            }
        }
        let cmd = match role {
            Role::Host(_) => "sleep infinity".to_string(),
            _ => command(t, role, opts, MgmtNaming::TopologyAddresses).join(" "),
        };
        let _ = writeln!(o, "      cmd: {}", q(&cmd));
    }
    let _ = writeln!(o, "  links:");
    for l in &links {
        let ends: Vec<String> =
            l.ends.iter().map(|e| format!("{}:{}", role_name(t, e.role), e.ifname)).collect();
        let _ = writeln!(o, "    - endpoints: {}", flow_list(&ends));
    }
    Ok(o)
}

/// The highest address of the management subnet that no element uses: containerlab's
/// bridge takes it (by default it would take the first, often the controller's).
fn mgmt_gateway(t: &Topology, all: &[Role]) -> Ipv4Addr {
    let m = t.mgmt_subnet();
    let used: Vec<Ipv4Addr> = all.iter().map(|&r| mgmt_ip(t, r)).collect();
    let broadcast = u32::from(m.network()) | !m.mask();
    (u32::from(m.network()) + 1..broadcast)
        .rev()
        .map(Ipv4Addr::from)
        .find(|ip| !used.contains(ip))
        .expect("topology validation leaves room in the management subnet")
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{golden, opts, topology};
    use super::*;

    #[test]
    fn golden_1_2_4() {
        let t = topology("1-2-4");
        golden("1-2-4.clab.yaml", &render(&t, &opts()).unwrap());
    }

    #[test]
    fn structure_of_1_2_4() {
        let t = topology("1-2-4");
        let y = render(&t, &opts()).unwrap();
        let doc = marked_yaml::parse_yaml(0, &y).expect("valid YAML");
        let root = doc.as_mapping().unwrap();
        let topo = root.get_mapping("topology").unwrap();
        assert_eq!(topo.get_mapping("nodes").unwrap().len(), 8);
        let links = topo.get_sequence("links").unwrap();
        assert_eq!(links.len(), 6);
        let ends: Vec<Vec<String>> = links
            .iter()
            .map(|l| {
                l.as_mapping()
                    .unwrap()
                    .get_sequence("endpoints")
                    .unwrap()
                    .iter()
                    .map(|e| e.as_scalar().unwrap().as_str().to_string())
                    .collect()
            })
            .collect();
        assert_eq!(ends[0], ["root:d1", "leaf1:up"]);
        assert_eq!(ends[2], ["leaf1:h0", "h0:eth1"]);
        // Every node interface appears once.
        let mut all: Vec<&String> = ends.iter().flatten().collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 12);
        let gw = root.get_mapping("mgmt").unwrap().get_scalar("ipv4-gw").unwrap().as_str();
        assert_eq!(gw, "10.0.0.254");
    }

    #[test]
    fn every_bundled_topology_exports() {
        for name in ["1-4", "1-2-4", "3-level"] {
            let y = render(&topology(name), &opts()).unwrap();
            marked_yaml::parse_yaml(0, &y).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
