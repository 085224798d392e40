//! Validation 1 of issue [16]: lossless, no contention, the simulated AllReduce time is
//! within 2% of the analytical in-network bound (docs/SIMULATION.md, "The formula"),
//! on the shipped trees and on generated ones; plus the properties the numbers rest on
//! (every element checked, determinism for a seed, faults recovered from).
//!
//! Small sizes here (seconds in CI, release-optimised test profile); the large version
//! (up to 1,024 hosts, 1 MiB) is `cargo test -p inc-sim --release -- --ignored`.

use std::path::PathBuf;

use inc_sim::{Collective, Sim, SimConfig, SimReport};
use inc_topology::generate::{tree_yaml, TreeSpec};
use inc_topology::Topology;

fn shipped(name: &str) -> Topology {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../topologies").join(name);
    Topology::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn generated(fanout: &[u32], hosts_per_leaf: u32, hosts_per_inner: u32) -> Topology {
    let spec = TreeSpec {
        name: format!("gen-{fanout:?}-{hosts_per_leaf}-{hosts_per_inner}"),
        fanout: fanout.to_vec(),
        hosts_per_leaf,
        hosts_per_inner,
        ..TreeSpec::default()
    };
    let yaml = tree_yaml(&spec).expect("valid shape");
    Topology::parse(&spec.name, &yaml).expect("generated YAML validates")
}

/// Runs `cfg` on `topo`; returns the report and the bound's relative error.
fn run(topo: Topology, cfg: SimConfig) -> (SimReport, f64) {
    let name = topo.name.clone();
    let sim = Sim::new(topo, cfg).unwrap_or_else(|e| panic!("{name}: {e}"));
    let bound = sim.analytic().in_network_ns;
    let r = sim.run().unwrap_or_else(|e| panic!("{name}: {e}"));
    let err = r.time_ns as f64 / bound - 1.0;
    (r, err)
}

/// Runs `collective` of `bytes` on `topo` with every link at 1 Gb/s: lossless, and the
/// simulated time off the bound by a relative error in `within`.
fn check_bound_on_slow_links(
    topo: Topology,
    collective: Collective,
    bytes: u64,
    within: std::ops::Range<f64>,
) -> SimReport {
    let name = topo.name.clone();
    let cfg = SimConfig { bytes, link_rate_bps: 1_000_000_000, collective, ..SimConfig::default() };
    let (r, err) = run(topo, cfg);
    assert_eq!(r.retransmissions + r.queue_drops + r.lost, 0, "{name}: lossless");
    assert!(
        within.contains(&err),
        "{name} {collective:?} {bytes} B: simulated {} ns is {:+.2}% off the bound",
        r.time_ns,
        err * 100.0
    );
    r
}

fn check_bound(topo: Topology, bytes: u64) -> f64 {
    let name = topo.name.clone();
    let hosts = topo.hosts.len();
    let cfg = SimConfig { bytes, ..SimConfig::default() };
    let (r, err) = run(topo, cfg);
    assert_eq!(r.verified_ranks, hosts, "{name}: every rank checked");
    assert_eq!(r.retransmissions + r.queue_drops + r.lost, 0, "{name}: lossless");
    println!(
        "{name}: {hosts} hosts, {bytes} B: {} ns, bound error {:+.3}%",
        r.time_ns,
        err * 100.0
    );
    assert!(
        err.abs() < 0.02,
        "{name}: simulated {} ns is {:+.2}% off the bound",
        r.time_ns,
        err * 100.0
    );
    err
}

#[test]
fn allreduce_is_within_two_percent_of_the_in_network_bound() {
    for bytes in [64 << 10, 256 << 10] {
        check_bound(shipped("1-2-4.yaml"), bytes);
        check_bound(shipped("1-4.yaml"), bytes);
        check_bound(shipped("3-level.yaml"), bytes);
        check_bound(generated(&[], 8, 0), bytes);
        check_bound(generated(&[4], 4, 0), bytes);
        check_bound(generated(&[2, 3], 5, 1), bytes);
        check_bound(generated(&[4, 4], 4, 0), bytes);
    }
}

#[test]
fn other_rates_delays_and_payload_sizes_keep_the_bound() {
    let cfg = SimConfig {
        bytes: 256 << 10,
        link_rate_bps: 10_000_000_000,
        link_delay: 5_000,
        mtu: Some(1024),
        ..SimConfig::default()
    };
    let (r, err) = run(shipped("3-level.yaml"), cfg);
    assert_eq!(r.verified_ranks, 9);
    assert!(err.abs() < 0.02, "{:+.2}% off the bound", err * 100.0);
    // Slow links: a window takes longer to serialise than the RC timers' floors; a
    // host whose retransmission is due waits for its link (this once spun forever).
    for rate in [200_000_000, 1_000_000_000] {
        let cfg = SimConfig { bytes: 64 << 10, link_rate_bps: rate, ..SimConfig::default() };
        let (r, err) = run(shipped("1-2-4.yaml"), cfg);
        assert_eq!(r.verified_ranks, 4);
        assert!(err.abs() < 0.02, "{rate} b/s: {:+.2}% off the bound", err * 100.0);
    }
}

/// A Reduce's links between its root rank and the root switch carry data both ways
/// (contributions up, the result down), each direction with the other's ACKs; a
/// Broadcast's data never goes back down a link it came up. The bound counts both: both
/// stay above it (a bound) and within 1 % of it (the Reduce was 1.8-1.9 % off when the
/// bound counted no ACKs for it).
#[test]
fn reduce_and_broadcast_keep_the_bound_on_slow_links() {
    for topo in ["1-2-4.yaml", "3-level.yaml"] {
        for collective in [Collective::Reduce { root: 0 }, Collective::Broadcast { root: 0 }] {
            check_bound_on_slow_links(shipped(topo), collective, 256 << 10, 0.0..0.01);
        }
    }
}

/// A tree whose deepest receiver sits beside the sender: h0 and h1 under leaf, two
/// switches below the root, h2 on the root itself. A Broadcast from h0 reaches h1 at
/// the leaf and h2 after 3 hops up and 1 down; the bound once took 3 up and 3 down and
/// was 8.6 % above the simulated 64 KiB (0.6 % at 1 MiB).
const ASYMMETRIC: &str = r#"
name: asym
controller:
  address: 10.0.0.1:7000
defaults:
  mtu: 4096
  window: 64
root: root
switches:
  - id: 0
    name: root
    ports:
      - { name: d1, ip: 172.16.0.1/30, mac: auto }
      - { name: h2, ip: 10.3.1.1/24, mac: auto }
  - id: 1
    name: mid
    ports:
      - { name: up, ip: 172.16.0.2/30, mac: auto }
      - { name: d1, ip: 172.16.1.1/30, mac: auto }
  - id: 2
    name: leaf
    ports:
      - { name: up, ip: 172.16.1.2/30, mac: auto }
      - { name: h0, ip: 10.1.1.1/24, mac: auto }
      - { name: h1, ip: 10.1.1.2/24, mac: auto }
links:
  - { a: "root:d1", b: "mid:up" }
  - { a: "mid:d1", b: "leaf:up" }
hosts:
  - { name: h0, ip: 10.1.1.21/24, mac: auto, attach: "leaf:h0" }
  - { name: h1, ip: 10.1.1.5/24, mac: auto, attach: "leaf:h1" }
  - { name: h2, ip: 10.3.1.7/24, mac: auto, attach: "root:h2" }"#;

#[test]
fn a_broadcast_turns_at_the_lowest_common_switch() {
    for bytes in [64 << 10, 1 << 20] {
        let topo = Topology::parse("asymmetric", ASYMMETRIC).expect("valid topology");
        let broadcast = Collective::Broadcast { root: 0 };
        let r = check_bound_on_slow_links(topo, broadcast, bytes, 0.0..0.02);
        assert_eq!(r.verified_ranks, 2);
    }
}

#[test]
fn every_collective_and_type_is_checked_exactly() {
    for (collective, dtype, op) in [
        (Collective::AllReduce, "float32", "sum"),
        (Collective::AllReduce, "bfloat16", "sum"),
        (Collective::AllReduce, "int8", "max"),
        (Collective::Reduce { root: 3 }, "float16", "sum"),
        (Collective::Broadcast { root: 5 }, "uint64", "sum"),
    ] {
        let cfg = SimConfig {
            collective,
            dtype: dtype.parse().unwrap(),
            op: op.parse().unwrap(),
            bytes: 96 << 10,
            ..SimConfig::default()
        };
        let (r, _) = run(shipped("3-level.yaml"), cfg);
        let receivers = match collective {
            Collective::Reduce { .. } => 1,
            Collective::Broadcast { .. } => 8,
            _ => 9,
        };
        assert_eq!(
            (r.verified_ranks, r.receiving_ranks),
            (receivers, receivers),
            "{collective:?} {dtype}"
        );
    }
}

/// ReduceScatter (every type x operator row of INCCL's table that applies, one per
/// type) and AllGather (every type) on both shipped trees, with a size that is not a
/// whole number of blocks (rounded down): every rank's block or blocks exact.
#[test]
fn reduce_scatter_and_allgather_are_exact_on_every_rank() {
    let cases = [
        ("int8", "sum"),
        ("uint8", "max"),
        ("int32", "bxor"),
        ("uint32", "min"),
        ("int64", "prod"),
        ("uint64", "band"),
        ("float16", "sum"),
        ("bfloat16", "max"),
        ("float32", "avg"),
        ("float64", "min"),
    ];
    for topo in ["1-2-4.yaml", "3-level.yaml"] {
        let world = shipped(topo).hosts.len();
        for (dtype, op) in cases {
            for collective in [Collective::ReduceScatter, Collective::AllGather] {
                let cfg = SimConfig {
                    collective,
                    dtype: dtype.parse().unwrap(),
                    op: op.parse().unwrap(),
                    bytes: (40 << 10) + 24,
                    ..SimConfig::default()
                };
                let sim = Sim::new(shipped(topo), cfg).unwrap();
                let block = sim.block_bytes();
                assert_eq!(block % elem_size(dtype), 0, "{topo} {dtype}: whole elements");
                assert_eq!(sim.config().bytes, (block * world) as u64, "{topo} {dtype}");
                let r = sim.run().unwrap_or_else(|e| panic!("{topo} {collective:?} {dtype}: {e}"));
                assert_eq!(
                    (r.verified_ranks, r.receiving_ranks),
                    (world, world),
                    "{topo} {collective:?} {dtype} {op}"
                );
            }
        }
    }
}

fn elem_size(dtype: &str) -> usize {
    dtype.parse::<inc_wire::DataType>().unwrap().size()
}

/// Above 1,024 ranks only a sample keeps its own buffers and the others send shared
/// patterns: the expected blocks include theirs (AllGather) or their contributions
/// (ReduceScatter), and every sampled rank is checked.
#[test]
fn reduce_scatter_and_allgather_check_a_sample_above_1024_ranks() {
    for collective in [Collective::ReduceScatter, Collective::AllGather] {
        let topo = generated(&[4, 4], 65, 0);
        let cfg = SimConfig { collective, bytes: 1040 * 16, ..SimConfig::default() };
        let (r, err) = run(topo, cfg);
        assert_eq!((r.verified_ranks, r.receiving_ranks), (520, 1040), "{collective:?}");
        assert!(err >= 0.0, "{collective:?}: {:+.2}% under the bound", err * 100.0);
    }
}

/// ReduceScatter streams every block up every path and block r down toward rank r
/// only, AllGather every block once up and to every other rank, all blocks at once
/// (interleaved on the stream): both within 3 % of the bound.
#[test]
fn reduce_scatter_and_allgather_keep_the_bound() {
    for topo in ["1-2-4.yaml", "3-level.yaml"] {
        for collective in [Collective::ReduceScatter, Collective::AllGather] {
            check_bound_on_slow_links(shipped(topo), collective, 1 << 20, 0.0..0.03);
        }
    }
}

/// `--compare ring` for ReduceScatter and AllGather is their own ring, half a ring
/// AllReduce of the same whole vector.
#[test]
fn the_ring_of_reduce_scatter_and_allgather_is_half_an_allreduce_ring() {
    let ring = |collective| {
        let cfg = SimConfig { collective, bytes: 1 << 20, ..SimConfig::default() };
        Sim::new(shipped("3-level.yaml"), cfg).unwrap().analytic().ring_ns
    };
    // 9 hosts: the blockwise vector is rounded down to 9 whole blocks.
    let allreduce = ring(Collective::AllReduce) * (1_048_572.0 / 1_048_576.0);
    for collective in [Collective::ReduceScatter, Collective::AllGather] {
        let r = ring(collective);
        assert!((r / allreduce - 0.5).abs() < 1e-3, "{collective:?}: {r} vs {allreduce}");
    }
}

/// The YAML's link emulation applies: 1-2-4-lossy loses frames on one link and slows
/// another to 1 Gb/s; the run still completes exactly, with retransmissions, and the
/// same seed replays the same run while another seed does not.
#[test]
fn link_emulation_faults_are_recovered_and_runs_replay_for_a_seed() {
    let cfg = |seed| SimConfig { bytes: 256 << 10, seed, ..SimConfig::default() };
    let (a, _) = run(shipped("1-2-4-lossy.yaml"), cfg(3));
    assert_eq!(a.verified_ranks, 4);
    assert!(a.lost > 0 && a.retransmissions > 0, "lost {} retx {}", a.lost, a.retransmissions);
    let slow = a.busiest.iter().find(|l| l.name == "leaf2:h3 -> h3").expect("the slow link");
    assert_eq!(slow.rate_bps, 1_000_000_000);
    let (b, _) = run(shipped("1-2-4-lossy.yaml"), cfg(3));
    assert_eq!((a.time_ns, a.frames, a.lost, a.events), (b.time_ns, b.frames, b.lost, b.events));
    let (c, _) = run(shipped("1-2-4-lossy.yaml"), cfg(4));
    assert_ne!((a.time_ns, a.lost), (c.time_ns, c.lost));
}

/// A queue smaller than the window drops frames at the tail where a fast link feeds a
/// slow one (hosts at 100 Gb/s, the leaves' uplinks at 10 Gb/s from the YAML's
/// emulation); go-back-N recovers and the result is still exact.
#[test]
fn a_short_output_queue_drops_and_the_collective_still_completes() {
    let spec = TreeSpec {
        name: "slow-uplinks".into(),
        fanout: vec![2],
        hosts_per_leaf: 2,
        switch_link_emulation: vec![Some("rate=10gbit".into())],
        ..TreeSpec::default()
    };
    let topo = Topology::parse("slow-uplinks", &tree_yaml(&spec).unwrap()).unwrap();
    let cfg = SimConfig { bytes: 256 << 10, queue_frames: 8, ..SimConfig::default() };
    let (r, _) = run(topo.clone(), cfg.clone());
    assert!(r.queue_drops > 0, "no drops with an 8-frame queue");
    assert!(r.retransmissions > 0);
    assert_eq!(r.verified_ranks, 4);
    let slow = r.busiest.iter().find(|l| l.name == "s1-0:up -> root:d0").expect("an uplink");
    assert_eq!(slow.rate_bps, 10_000_000_000);
    let (deep, _) = run(topo, SimConfig { queue_frames: 4096, ..cfg });
    assert_eq!(deep.queue_drops, 0);
    assert!(deep.time_ns < r.time_ns);
}

/// `host_tx_ahead`: a host that hands its link every frame at once (the emulator's
/// hosts with `INCCL_NIC_PACING=off`) changes nothing without loss, where the links set the pace; with loss on
/// the host links its go-back-N copies and ACKs queue behind its whole send queue, so
/// the same losses cost more time than behind a NIC's few frames.
#[test]
fn a_host_that_queues_everything_on_its_link_pays_more_for_loss() {
    let tree = |loss: &str| {
        let spec = TreeSpec {
            name: "host-queue".into(),
            fanout: vec![2],
            hosts_per_leaf: 2,
            host_link_emulation: Some(format!("rate=200mbit{loss}")),
            switch_link_emulation: vec![Some("rate=200mbit".into())],
            ..TreeSpec::default()
        };
        Topology::parse("host-queue", &tree_yaml(&spec).unwrap()).unwrap()
    };
    let nic = SimConfig { bytes: 1 << 20, ..SimConfig::default() };
    let link = SimConfig { host_tx_ahead: inc_sim::HOST_TX_ALL, ..nic.clone() };
    let (a, _) = run(tree(""), nic.clone());
    let (b, _) = run(tree(""), link.clone());
    assert_eq!((a.retransmissions, b.retransmissions), (0, 0));
    let lossless = b.time_ns as f64 / a.time_ns as f64;
    assert!((lossless - 1.0).abs() < 0.02, "lossless: link / nic = {lossless:.3}");
    let (mut nic_ns, mut link_ns) = (0, 0);
    for seed in 1..=3 {
        let (a, _) = run(tree(",loss=1%"), SimConfig { seed, ..nic.clone() });
        let (b, _) = run(tree(",loss=1%"), SimConfig { seed, ..link.clone() });
        assert_eq!((a.verified_ranks, b.verified_ranks), (4, 4));
        assert!(a.lost > 0 && b.lost > 0);
        nic_ns += a.time_ns;
        link_ns += b.time_ns;
    }
    assert!(link_ns > nic_ns, "1% loss, 3 seeds: link {link_ns} ns, nic {nic_ns} ns");
}

/// Per-frame costs slow the run down (a switch handling a frame in 1 µs cannot keep
/// up with 4 KiB frames at 100 Gb/s).
#[test]
fn per_frame_costs_slow_the_run() {
    let base = SimConfig { bytes: 128 << 10, ..SimConfig::default() };
    let (fast, _) = run(shipped("1-2-4.yaml"), base.clone());
    let slow_cfg = SimConfig { switch_frame_cost: 1_000, host_frame_cost: 100, ..base };
    let (slow, _) = run(shipped("1-2-4.yaml"), slow_cfg);
    assert_eq!(slow.verified_ranks, 4);
    assert!(slow.time_ns > fast.time_ns * 3, "{} vs {}", slow.time_ns, fast.time_ns);
}

#[test]
fn errors_name_what_is_at_fault() {
    let cfg = SimConfig { bytes: 6, ..SimConfig::default() };
    let e = Sim::new(shipped("1-2-4.yaml"), cfg).unwrap_err().to_string();
    assert!(e.contains("size 6 bytes") && e.contains("int32"), "{e}");
    let cfg = SimConfig { collective: Collective::Reduce { root: 4 }, ..SimConfig::default() };
    let e = Sim::new(shipped("1-2-4.yaml"), cfg).unwrap_err().to_string();
    assert!(e.contains("root rank 4") && e.contains("1-2-4.yaml"), "{e}");
    let cfg = SimConfig { collective: Collective::AllGather, bytes: 32, ..SimConfig::default() };
    let e = Sim::new(shipped("3-level.yaml"), cfg).unwrap_err().to_string();
    assert!(e.contains("size 32 bytes") && e.contains("9 hosts") && e.contains("3-level"), "{e}");
    let missing = PathBuf::from("/nonexistent/t.yaml");
    let e = Sim::load(&missing, SimConfig::default()).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/t.yaml"), "{e}");
}

/// The large version: generated trees up to 1,024 hosts, 1 MiB per rank.
/// `cargo test -p inc-sim --release --test validation -- --ignored --nocapture`
#[test]
#[ignore = "minutes: the full validation 1 up to 1,024 hosts at 1 MiB"]
fn large_allreduce_is_within_two_percent_of_the_bound() {
    check_bound(shipped("1-2-4.yaml"), 1 << 20);
    check_bound(shipped("3-level.yaml"), 1 << 20);
    check_bound(generated(&[4], 16, 0), 1 << 20);
    check_bound(generated(&[4, 4], 16, 0), 1 << 20);
    check_bound(generated(&[8, 8], 16, 0), 1 << 20);
}
