//! Golden tests: compiled rules for the shipped topologies must not change silently.
//! Regenerate with `UPDATE_GOLDEN=1 cargo test -p inc-controller --test golden`.

use std::fmt::Write as _;
use std::path::PathBuf;

use inc_controller::compiler::describe_routes;
use inc_controller::{compile, demo_ranks, yaml, Allocator, CommunicatorSpec, Topology};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn golden(topo_file: &str) {
    let t = Topology::load(root().join("topologies").join(topo_file)).expect("valid topology");
    let ips: Vec<_> = t.hosts.iter().map(|h| h.addr.ip).collect();
    let spec = CommunicatorSpec { comm_id: 7, ranks: demo_ranks(&ips), mtu: None, window: None };
    let c = compile(&t, &spec, &mut Allocator::new(), 42).expect("compiles");
    let mut out = String::new();
    writeln!(out, "# golden rules for {topo_file}: all hosts, AllReduce tree").unwrap();
    for r in &c.rules {
        out.push_str("---\n");
        out.push_str(&yaml::to_yaml(r).unwrap());
    }
    out.push_str("--- # endpoints\n");
    out.push_str(&yaml::to_yaml(&c.endpoints).unwrap());
    out.push_str("--- # Reduce/Broadcast routes for every root\n");
    for root_rank in 0..ips.len() as u16 {
        writeln!(out, "# root rank {root_rank}").unwrap();
        out.push_str(&describe_routes(&c, root_rank));
    }
    // A sub-communicator (every other host) shows pruning and LCA roots.
    let sub: Vec<_> = ips.iter().copied().step_by(2).collect();
    let spec =
        CommunicatorSpec { comm_id: 8, ranks: demo_ranks(&sub), mtu: Some(4096), window: Some(8) };
    let c = compile(&t, &spec, &mut Allocator::new(), 42).expect("compiles");
    writeln!(out, "--- # sub-communicator over {:?}, root switch {}", sub, c.root_switch).unwrap();
    for root_rank in 0..sub.len() as u16 {
        writeln!(out, "# root rank {root_rank}").unwrap();
        out.push_str(&describe_routes(&c, root_rank));
    }

    let path = root().join("controller/tests/golden").join(topo_file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &out).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == out,
        "golden mismatch for {topo_file}; rerun with UPDATE_GOLDEN=1 and review the diff\n{out}"
    );
}

#[test]
fn golden_1_2_4() {
    golden("1-2-4.yaml");
}

#[test]
fn golden_1_4() {
    golden("1-4.yaml");
}

#[test]
fn golden_3_level() {
    golden("3-level.yaml");
}
