//! Validation 2 of issue [16], small enough for CI: `inc-sim` on a topology predicts the
//! emulator's collective time (AllReduce, Reduce, Broadcast, and ReduceScatter and
//! AllGather of [14]) on the same topology when every link is rate-limited by
//! the switches' link emulation, low enough that the links, not the machine's CPU, set
//! the pace. The full validation (4, 9 and 64 hosts, 1 and 16 MiB, with and without
//! loss, 3 runs each) is `sim/validate-emulator.sh` (docs/SIMULATION.md).
//!
//! Real processes in network namespaces (1-2-4, one process per switch, af_packet,
//! userspace RoCEv2 hosts). Skipped when not root or without `ip netns`; when CI=true a
//! skip is a failure. The bound asserted is loose on purpose, for a shared 2-core CI
//! machine: the emulator may not beat the link rate the simulation models (5 % margin),
//! and may not take more than 1.5 times the prediction; the error is printed. The hosts
//! send at their links' rate, a few frames ahead, as inc-sim's NICs do: the switches'
//! emulation of the median host's link may hold at most [`HOST_LINK_HELD_MAX`] frames,
//! where hosts that sent their window at once made every link hold over 100.

use std::path::PathBuf;
use std::time::Duration;

use inc_controller::Topology;
use inc_sim::{Collective, Sim, SimConfig};
use inc_tests::deploy::{Deployment, HostOutcome};
use inc_tests::netns::{assert_clean, repo_root, skip_reason, unique_prefix};

const T124: &str = "topologies/1-2-4.yaml";
/// Every link direction at this rate: about 3,000 frames per second per link, far below
/// what the switch processes forward on 2 CPUs.
const RATE: &str = "100mbit";
const RATE_BPS: u64 = 100_000_000;
/// 4 MiB of int32 per rank: about 0.35 s at the rate, long against scheduling noise.
const COUNT: u64 = 1 << 20;
/// Most frames the emulation of a host's link may hold. A paced host keeps 8 on its link
/// (`inccl` `NIC_AHEAD`), but the switch reads its ring in batches, so frames that
/// arrived paced reach its emulation together after the switch process waited for a
/// CPU: 10-26 were seen on a quiet machine, and a loaded one stalls the switch longer.
/// Hosts that hand the link their window at once (`INCCL_NIC_PACING=off`) made it hold
/// 113-185.
const HOST_LINK_HELD_MAX: u64 = 64;

/// `bytes` is the vector per rank, or ReduceScatter's and AllGather's whole vector.
fn predicted_ms(collective: Collective, bytes: u64) -> f64 {
    let path: PathBuf = repo_root().join(T124);
    let topo = Topology::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let cfg = SimConfig { collective, bytes, link_rate_bps: RATE_BPS, ..SimConfig::default() };
    let report = Sim::new(topo, cfg).expect("simulation set-up").run().expect("simulated run");
    assert_eq!(report.retransmissions, 0, "the simulated run is lossless");
    report.time_ns as f64 / 1e6
}

#[test]
fn inc_sim_predicts_the_rate_limited_emulator() {
    let programs = [
        "inccl-allreduce",
        "inccl-reduce",
        "inccl-broadcast",
        "inccl-reducescatter",
        "inccl-allgather",
    ];
    if let Some(why) = skip_reason(&programs) {
        inc_test_support::skip("e2e_sim_validation", &why);
        return;
    }
    let prefix = unique_prefix("v2");
    let emu = format!("rate={RATE}");
    let d = Deployment::up(&prefix, T124, &[emu.as_str()]);
    // ReduceScatter and AllGather: blocks of COUNT / world elements, so the whole vector
    // is the 4 MiB of the others.
    let world = d.plan.hosts.len() as u64;
    let block = COUNT / world;
    let cases: [(&str, &str, &[&str], Collective, u64); 5] = [
        ("allreduce", "inccl-allreduce", &[], Collective::AllReduce, COUNT),
        ("reduce", "inccl-reduce", &["--root", "0"], Collective::Reduce { root: 0 }, COUNT),
        (
            "broadcast",
            "inccl-broadcast",
            &["--root", "0"],
            Collective::Broadcast { root: 0 },
            COUNT,
        ),
        ("reducescatter", "inccl-reducescatter", &[], Collective::ReduceScatter, block),
        ("allgather", "inccl-allgather", &[], Collective::AllGather, block),
    ];
    println!("\n1-2-4, every link {RATE}, {} MiB of int32 per rank:", (COUNT * 4) >> 20);
    println!("  collective   emulator (ms, slowest rank's p50 of 3)   inc-sim (ms)   error");
    let mut failures = Vec::new();
    for (job, (name, program, extra, collective, count)) in cases.into_iter().enumerate() {
        let mut args = extra.to_vec();
        args.extend(["--iters", "3", "--warmup", "1"]);
        let out =
            d.start_hosts(job as u16, program, count, &args, &[]).wait(Duration::from_secs(120));
        d.assert_all_pass(name, &out);
        let measured = out.iter().filter_map(HostOutcome::time_us).fold(0.0, f64::max) / 1000.0;
        assert!(measured > 0.0, "{name}: no rank reported a time");
        let whole = if collective.is_blockwise() { count * world } else { count };
        let predicted = predicted_ms(collective, whole * 4);
        let error = measured / predicted - 1.0;
        println!("  {name:<12} {measured:>38.1}   {predicted:>12.1}   {:+.1}%", error * 100.0);
        if !(-0.05..=0.5).contains(&error) {
            failures.push(format!(
                "{name}: emulator {measured:.1} ms, inc-sim {predicted:.1} ms ({:+.1}%)",
                error * 100.0
            ));
        }
    }
    let held = host_link_max_held(&d);
    println!("  most frames held on a host's link: {held:?}");
    drop(d);
    assert_clean(&prefix);
    // The median host link: a stall of one switch process on a loaded machine lets one
    // link's frames bunch up (66 once in CI, beside 13-17 on the others), while hosts
    // that do not pace make every link hold over 100.
    let mut counts: Vec<u64> = held.iter().map(|(_, n)| *n).collect();
    counts.sort_unstable();
    let median = counts[counts.len() / 2];
    assert!(
        median <= HOST_LINK_HELD_MAX,
        "the median host link held {median} frames (are the hosts pacing?): {held:?}"
    );
    assert!(failures.is_empty(), "outside -5 % .. +50 %: {}", failures.join("; "));
}

/// Per host port (`switch:port`): the most frames the emulation of the host's link (the
/// switch's receive side) held.
fn host_link_max_held(d: &Deployment) -> Vec<(String, u64)> {
    let out: Vec<_> = d
        .link_emu_counters()
        .into_iter()
        .filter(|((_, _, dir), _)| *dir == "rx")
        .filter_map(|((sw, port, _), c)| Some((format!("{sw}:{port}"), c["max_held"].as_u64()?)))
        .collect();
    assert!(!out.is_empty(), "no switch reports link emulation on a host port");
    out
}
