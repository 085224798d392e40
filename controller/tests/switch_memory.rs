//! Switch memory admission (issue [19] item 6): everything a communicator allocates in
//! a switch (slot pool and every connection's send queue, `CommMemory`) is counted
//! against the switch's `max_slot_memory` and against the share `max_host_memory` of
//! the host that asks (rank 0's) before anything is allocated; refusals name the
//! switch and the limit, and released communicators give everything back.

use inc_controller::compiler::{compile, Allocator, CommunicatorSpec, CompileError};
use inc_controller::demo_ranks;
use inc_topology::{CommMemory, Topology};

fn topology() -> Topology {
    Topology::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml")).unwrap()
}

/// A communicator of all four hosts of 1-2-4 with rank 0 on host `first` (the others
/// in topology order after it).
fn spec(topo: &Topology, comm_id: u32, first: usize, window: u32) -> CommunicatorSpec {
    let n = topo.hosts.len();
    let ips: Vec<_> = (0..n).map(|i| topo.hosts[(first + i) % n].addr.ip).collect();
    CommunicatorSpec { comm_id, ranks: demo_ranks(&ips), mtu: Some(4096), window: Some(window) }
}

fn switch_id(topo: &Topology, name: &str) -> u32 {
    topo.switches.iter().find(|s| s.name == name).unwrap().id
}

/// The case of the issue: window 16384 at mtu 4096 was accepted (256 MiB of slot
/// buffers counted, the limit) and took 1 GiB in a real switch process; now its send
/// queues are counted and it is refused, naming the switch and the limit.
#[test]
fn a_communicator_beyond_max_slot_memory_is_refused() {
    let topo = topology();
    let mut alloc = Allocator::new();
    let err = compile(&topo, &spec(&topo, 1, 0, 16384), &mut alloc, 7).unwrap_err();
    let CompileError::Limit { switch, limit, .. } = &err else { panic!("{err}") };
    assert_eq!(switch, "root", "the first switch compiled");
    assert!(limit.contains("max_slot_memory 268435456"), "{err}");
    let text = err.to_string();
    assert!(text.starts_with("switch root: ") && text.contains("send queues"), "{text}");
    for s in &topo.switches {
        assert_eq!(alloc.live_memory(s.id), 0, "nothing taken on {}", s.name);
        assert_eq!(alloc.live_slots(s.id), 0);
    }
}

/// One host's communicators together stay within its share of each switch
/// (`max_host_memory`, half of `max_slot_memory` by default); another host still gets
/// the rest of the switch, up to `max_slot_memory`; releasing gives all of it back.
#[test]
fn one_host_cannot_take_a_whole_switch() {
    let topo = topology();
    let leaf1 = switch_id(&topo, "leaf1");
    let sw = &topo.switches[topo.switch_by_id(leaf1).unwrap()];
    assert_eq!(sw.max_host_memory, sw.max_slot_memory / 2);
    // Window 2048: about 87 MB on a leaf (slot pool 34 MB, three send queues of 18 MB).
    let window = 2048;
    let per_leaf = CommMemory::new(4096, window, 2 * u64::from(window), 3).total();
    assert!(per_leaf < sw.max_host_memory && 2 * per_leaf > sw.max_host_memory);
    assert!(3 * per_leaf <= sw.max_slot_memory && 4 * per_leaf > sw.max_slot_memory);

    let mut alloc = Allocator::new();
    // h0 (under leaf1) asks once: accepted, charged to h0 on every switch.
    compile(&topo, &spec(&topo, 1, 0, window), &mut alloc, 7).unwrap();
    assert_eq!(alloc.live_memory(leaf1), per_leaf);
    assert_eq!(alloc.host_memory(leaf1, 0), per_leaf);
    // h0 again: beyond its share of the root (compiled first; two connections there).
    let per_root = CommMemory::new(4096, window, 2 * u64::from(window), 2).total();
    assert!(2 * per_root > sw.max_host_memory);
    let err = compile(&topo, &spec(&topo, 2, 0, window), &mut alloc, 7).unwrap_err();
    let text = err.to_string();
    let CompileError::Limit { switch, limit, .. } = &err else { panic!("{text}") };
    assert_eq!(switch, "root", "{text}");
    let free = sw.max_host_memory - per_root;
    assert_eq!(limit, &format!("{free} of host h0's share max_host_memory 134217728 free"));
    // As quoted in topologies/README.md.
    assert_eq!(
        text,
        "switch root: 69623808 bytes of switch memory (slot pool 33824768 + send queues \
         35799040) for window 2048, mtu 4096 and 2 connection(s) exceeds its limit: 64593920 \
         of host h0's share max_host_memory 134217728 free"
    );
    assert_eq!(alloc.live_memory(leaf1), per_leaf, "the refused one took nothing");

    // Other hosts ask: accepted until the switch itself is full.
    compile(&topo, &spec(&topo, 3, 1, window), &mut alloc, 7).unwrap();
    compile(&topo, &spec(&topo, 4, 2, window), &mut alloc, 7).unwrap();
    assert_eq!(alloc.live_memory(leaf1), 3 * per_leaf);
    // A fourth host: the root is full (4 x per_root > 256 MiB).
    assert!(4 * per_root > sw.max_slot_memory);
    let err = compile(&topo, &spec(&topo, 5, 3, window), &mut alloc, 7).unwrap_err();
    let text = err.to_string();
    let free = sw.max_slot_memory - 3 * per_root;
    assert!(text.starts_with("switch root: "), "{text}");
    assert!(text.ends_with(&format!("{free} of max_slot_memory 268435456 free")), "{text}");

    for comm in [1, 3, 4] {
        alloc.release(comm);
    }
    for s in &topo.switches {
        assert_eq!(alloc.live_memory(s.id), 0, "{} given back", s.name);
        for h in 0..topo.hosts.len() {
            assert_eq!(alloc.host_memory(s.id, h), 0);
        }
    }
    // And h0 may ask again.
    compile(&topo, &spec(&topo, 6, 0, window), &mut alloc, 7).unwrap();
}

/// A topology's `max_host_memory` is checked when it is loaded.
#[test]
fn max_host_memory_is_validated() {
    let yaml =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml"))
            .unwrap();
    let bad = yaml.replace(
        "    name: leaf1\n",
        "    name: leaf1\n    max_slot_memory: 4194304\n    max_host_memory: 8388608\n",
    );
    let err = Topology::parse("bad.yaml", &bad).unwrap_err().to_string();
    assert!(err.contains("max_host_memory must be at least 1048576 bytes and at most"), "{err}");
    let good = yaml.replace(
        "    name: leaf1\n",
        "    name: leaf1\n    max_slot_memory: 4194304\n    max_host_memory: 2097152\n",
    );
    let topo = Topology::parse("good.yaml", &good).unwrap();
    let leaf1 = &topo.switches[topo.switch_by_id(1).unwrap()];
    assert_eq!((leaf1.max_slot_memory, leaf1.max_host_memory), (4194304, 2097152));
    assert_ne!(topo.fingerprint(), topology().fingerprint(), "limits are in the fingerprint");
}
