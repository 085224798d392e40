//! Topologies and communicators for a simulation, produced by the real control plane:
//! the YAML files under `topologies/` and `inc_controller::compile`.

use std::collections::HashSet;
use std::path::PathBuf;

use inc_controller::{compile, Allocator, CommunicatorSpec, Compiled, Topology};
use inc_ctrl_proto::{EthernetAddress, RankEndpoint, MAX_24BIT, ROCE_UDP_PORT};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Path of a topology file shipped in the repository (`"1-2-4"` → `topologies/1-2-4.yaml`).
pub fn topology_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("topologies")
        .join(format!("{name}.yaml"))
}

/// Loads and validates a shipped topology, or a generated one: `star-N` (one switch,
/// N hosts) or `tree-K-M` (a root, K leaf switches, M hosts per leaf); a `-learn` suffix
/// gives the hosts `mac: learn` (switches resolve them by ARP).
pub fn load_topology(name: &str) -> Result<Topology, String> {
    if let Some(yaml) = generated_topology(name) {
        return Topology::parse(name, &yaml).map_err(|e| format!("generated topology {name}: {e}"));
    }
    Topology::load(topology_path(name)).map_err(|e| format!("topology {name}: {e}"))
}

/// YAML of a generated topology (see [`load_topology`]), written by `inc-controller gen
/// tree`'s generator; `None` for other names.
pub fn generated_topology(name: &str) -> Option<String> {
    use inc_controller::topology::generate::{tree_yaml, TreeSpec};
    let (base, learn_host_macs) = match name.strip_suffix("-learn") {
        Some(b) => (b, true),
        None => (name, false),
    };
    let nums: Vec<u32> = base.split('-').skip(1).map(|n| n.parse().ok()).collect::<Option<_>>()?;
    let (fanout, hosts_per_leaf) = match (base.split('-').next()?, nums.as_slice()) {
        ("star", &[n]) => (vec![], n),
        ("tree", &[k, m]) => (vec![k], m),
        _ => return None,
    };
    let spec = TreeSpec {
        name: name.to_string(),
        fanout,
        hosts_per_leaf,
        learn_host_macs,
        ..TreeSpec::default()
    };
    tree_yaml(&spec).ok()
}

/// A communicator to create: which topology hosts take part, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommPlan {
    /// Communicator id.
    pub comm_id: u32,
    /// Host index (into `Topology::hosts`) of every rank.
    pub hosts: Vec<usize>,
    /// Payload size override.
    pub mtu: Option<u16>,
    /// Window override.
    pub window: Option<u32>,
    /// Created only after communicator `after` (an index into the plans) was destroyed:
    /// its resources are released before this one is compiled.
    pub after: Option<usize>,
}

/// A compiled communicator: what each rank registered and what the controller produced.
#[derive(Debug, Clone)]
pub struct CompiledComm {
    /// The request.
    pub plan: CommPlan,
    /// What each rank registered, by rank.
    pub ranks: Vec<RankEndpoint>,
    /// Rules per switch and endpoints per rank.
    pub compiled: Compiled,
}

/// MAC of a host's data-plane interface.
pub fn host_mac(topo: &Topology, host: usize) -> EthernetAddress {
    let h = &topo.hosts[host];
    h.mac.unwrap_or(h.if_mac)
}

/// A random subset of at least `min` hosts of the topology, in random rank order.
pub fn random_hosts(rng: &mut ChaCha8Rng, topo: &Topology, min: usize) -> Vec<usize> {
    let n = topo.hosts.len();
    let k = rng.gen_range(min.min(n)..=n);
    let mut all: Vec<usize> = (0..n).collect();
    all.shuffle(rng);
    all.truncate(k);
    all
}

/// Draws each rank's registration (QPN unique per host, start PSN often just below the
/// 24-bit wrap, kernel or userspace UDP port) and compiles every communicator with one
/// allocator, as the controller service would for communicators that live together.
pub fn compile_comms(
    rng: &mut ChaCha8Rng,
    topo: &Topology,
    plans: &[CommPlan],
) -> Result<Vec<CompiledComm>, String> {
    let mut alloc = Allocator::new();
    let mut used_qpns: HashSet<(usize, u32)> = HashSet::new();
    let mut out = Vec::new();
    for plan in plans {
        if let Some(j) = plan.after {
            alloc.release(plans[j].comm_id);
        }
        let ranks: Vec<RankEndpoint> = plan
            .hosts
            .iter()
            .enumerate()
            .map(|(rank, &h)| {
                let qpn = loop {
                    let q = rng.gen_range(2..=MAX_24BIT);
                    if used_qpns.insert((h, q)) {
                        break q;
                    }
                };
                let start_psn = if rng.gen_bool(0.3) {
                    MAX_24BIT - rng.gen_range(0..256)
                } else {
                    rng.gen_range(0..=MAX_24BIT)
                };
                let udp_port =
                    if rng.gen_bool(0.5) { ROCE_UDP_PORT } else { rng.gen_range(49152..=65535) };
                RankEndpoint {
                    rank: rank as u16,
                    ip: topo.hosts[h].addr.ip,
                    mac: None,
                    qpn,
                    start_psn,
                    udp_port,
                }
            })
            .collect();
        let spec = CommunicatorSpec {
            comm_id: plan.comm_id,
            ranks: ranks.clone(),
            mtu: plan.mtu,
            window: plan.window,
        };
        let compiled = compile(topo, &spec, &mut alloc, rng.gen()).map_err(|e| {
            format!("compiling communicator {} on {}: {e}", plan.comm_id, topo.file)
        })?;
        out.push(CompiledComm { plan: plan.clone(), ranks, compiled });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn shipped_topologies_compile_for_all_hosts_and_subsets() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for name in ["1-2-4", "1-4", "3-level", "star-3", "tree-3-5", "tree-2-2-learn"] {
            let topo = load_topology(name).unwrap();
            let all: Vec<usize> = (0..topo.hosts.len()).collect();
            let sub = random_hosts(&mut rng, &topo, 2);
            let plans = [
                CommPlan { comm_id: 1, hosts: all.clone(), mtu: None, window: None, after: None },
                CommPlan {
                    comm_id: 2,
                    hosts: sub.clone(),
                    mtu: Some(256),
                    window: Some(8),
                    after: None,
                },
                CommPlan {
                    comm_id: 3,
                    hosts: sub.clone(),
                    mtu: None,
                    window: None,
                    after: Some(0),
                },
            ];
            let comms = compile_comms(&mut rng, &topo, &plans).unwrap();
            assert_eq!(comms[0].compiled.endpoints.len(), all.len());
            assert_eq!(comms[1].compiled.endpoints.len(), sub.len());
            assert!(comms[1].compiled.rules.iter().all(|r| r.mtu == 256 && r.window == 8));
        }
    }
}
