//! CPU cost of the protocol engines per frame, free of the kernel and of the machine's
//! load: INT32 SUM AllReduces on `1-2-4` through the real controller, switch and host
//! engines over the lossless in-memory fabric of the simulation suite.
//!
//! `cargo bench -p inc-tests --bench engine_cost [-- SIZE [JOBS]]` runs JOBS AllReduces
//! (default 1) of SIZE bytes (`4`, `64K`, `16M`; a bare number is MiB; default 16M) and
//! prints frames and wall time. Wall time moves with load; instruction counts do not.
//! For those, run the bench binary under callgrind, counting only inside the engines:
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='inc_switch_engine::SwitchEngine::receive' \
//!   --toggle-collect='inc_switch_engine::SwitchEngine::poll_transmit' \
//!   target/release/deps/engine_cost-HASH 8
//! ```
//!
//! (`HostEngine::handle_frame` and `HostEngine::poll_transmit` for the hosts.)

use std::time::Instant;

use inc_tests::sim::cases::{CollectiveCase, FloatInputs};
use inc_tests::sim::reference::Kind;
use inc_tests::sim::scenario::{run, CommWorkload, Scenario};
use inc_tests::sim::{LinkConfig, RunLimits, MICROS};
use inc_wire::{DataType, Operator};

const USAGE: &str = "usage: engine_cost [SIZE [JOBS]] (SIZE: bytes with B/K/M suffix, or MiB)";

/// `4`, `4B`, `64K`, `16M`; a bare number is MiB.
fn parse_size(s: &str) -> usize {
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => s.split_at(at),
        None => (s, "M"),
    };
    let n: usize = num.parse().expect(USAGE);
    n * match unit {
        "B" | "b" => 1,
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        _ => panic!("{USAGE}"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let bytes = args.next().map_or(16 << 20, |a| parse_size(&a));
    let jobs: usize = args.next().map_or(1, |a| a.parse().expect(USAGE));
    assert!(bytes >= 4 && jobs >= 1, "{USAGE}");
    let count = bytes / 4; // INT32 elements
    let job = CollectiveCase {
        kind: Kind::AllReduce,
        op: Operator::Sum,
        dtype: DataType::Int32,
        count,
        in_place: false,
        floats: FloatInputs::Exact,
    };
    let link = LinkConfig::default();
    let scenario = Scenario {
        seed: 1,
        topology: "1-2-4".into(),
        comms: vec![CommWorkload {
            hosts: vec![0, 1, 2, 3],
            mtu: None,
            window: None,
            jobs: vec![job; jobs],
            after: None,
        }],
        host_link: link,
        switch_link: LinkConfig { latency: MICROS, ..link },
        limits: RunLimits::default(),
        deterministic_float: false,
        think_time: 0,
        heterogeneous: false,
        hot_link: None,
        mismatch: None,
        delays: Vec::new(),
        cut_link: None,
    };
    let t = Instant::now();
    let report =
        run(&scenario).unwrap_or_else(|e| panic!("{jobs} x {bytes} B AllReduce failed: {e}"));
    let wall = t.elapsed();
    let switch_rx: u64 = report.switches.iter().map(|(_, c)| c.rx_frames).sum();
    println!(
        "engine_cost: {jobs} x {bytes} B INT32 SUM AllReduce on 1-2-4, verified; {} frames on links, \
         {switch_rx} into switches; {:.1} ms simulated; {:.0} ms wall ({:.0} ns per link frame, \
         harness and reference included)",
        report.links.frames_sent,
        report.sim_time as f64 / 1e6,
        wall.as_secs_f64() * 1e3,
        wall.as_nanos() as f64 / report.links.frames_sent.max(1) as f64,
    );
}
