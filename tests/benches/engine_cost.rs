//! CPU cost of the protocol engines per frame, free of the kernel and of the machine's
//! load: one INT32 SUM AllReduce on `1-2-4` through the real controller, switch and host
//! engines over the lossless in-memory fabric of the simulation suite.
//!
//! `cargo bench -p inc-tests --bench engine_cost [-- MIB]` prints frames and wall time.
//! Wall time moves with load; instruction counts do not. For those, run the bench
//! binary under callgrind and divide the engines' inclusive costs by the frames:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=cg.out target/release/deps/engine_cost-HASH 4
//! callgrind_annotate --inclusive=yes cg.out | grep -E 'SwitchEngine::(handle_frame|poll_transmit)|HostEngine::'
//! ```

use std::time::Instant;

use inc_tests::sim::cases::{CollectiveCase, FloatInputs};
use inc_tests::sim::reference::{Dtype, Kind, Op};
use inc_tests::sim::scenario::{run, CommWorkload, Scenario};
use inc_tests::sim::{LinkConfig, RunLimits, MICROS};

fn main() {
    let mib: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse().expect("usage: engine_cost [MIB] (a whole number of MiB)"))
        .unwrap_or(16);
    let count = mib << 18; // INT32 elements
    let job = CollectiveCase {
        kind: Kind::AllReduce,
        op: Op::Sum,
        dtype: Dtype::Int32,
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
            jobs: vec![job],
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
    let report = run(&scenario).unwrap_or_else(|e| panic!("{mib} MiB AllReduce failed: {e}"));
    let wall = t.elapsed();
    let switch_rx: u64 = report.switches.iter().map(|(_, c)| c.rx_frames).sum();
    println!(
        "engine_cost: {mib} MiB INT32 SUM AllReduce on 1-2-4, verified; {} frames on links, \
         {switch_rx} into switches; {:.1} ms simulated; {:.0} ms wall ({:.0} ns per link frame, \
         harness and reference included)",
        report.links.frames_sent,
        report.sim_time as f64 / 1e6,
        wall.as_secs_f64() * 1e3,
        wall.as_nanos() as f64 / report.links.frames_sent.max(1) as f64,
    );
}
