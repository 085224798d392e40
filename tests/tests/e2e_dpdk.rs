//! End-to-end tests of the switch's DPDK backend: `scripts/demo --backend dpdk` on the
//! 1-2-4 tree (EAL `--no-huge --no-pci`, one af_packet vdev per switch port hot-plugged
//! in the port's namespace) for every collective and both datatypes, with all switches
//! in one process and once with a process per switch.
//!
//! Needs root and the DPDK development files (`pkg-config libdpdk`; the harness then
//! builds the switch with `--features dpdk`). Without them the tests skip with a
//! message, and fail when CI=true.

use std::time::Duration;

use inc_tests::netns::{assert_clean, dpdk_available, run_demo, skip_reason, unique_prefix};

fn skip(tag: &str, why: &str) {
    assert!(std::env::var("CI").as_deref() != Ok("true"), "e2e dpdk {tag} cannot run in CI: {why}");
    eprintln!("SKIP e2e dpdk {tag}: {why}");
}

fn demo(tag: &str, host_bin: &str, args: &[&str]) {
    if !dpdk_available() {
        return skip(tag, "libdpdk not found by pkg-config (sudo scripts/setup --dpdk)");
    }
    if let Some(why) = skip_reason(&[host_bin]) {
        return skip(tag, &why);
    }
    let prefix = unique_prefix(tag);
    let mut all = vec!["topologies/1-2-4.yaml", "--backend", "dpdk"];
    all.extend_from_slice(args);
    let out = run_demo(&prefix, &all, Duration::from_secs(120));
    assert!(out.success(), "demo {all:?} failed\n{}", out.transcript());
    assert!(
        out.stdout.contains("switch backend dpdk"),
        "not the dpdk backend\n{}",
        out.transcript()
    );
    assert!(out.stdout.contains("ALL 4 RANKS PASS"), "not every rank passed\n{}", out.transcript());
    assert!(!out.stdout.contains("FAIL"), "a rank failed\n{}", out.transcript());
    assert_clean(&prefix);
}

const COUNT: &str = "100000";

#[test]
fn dpdk_allreduce_int32_sum() {
    demo(
        "dai",
        "inccl-allreduce",
        &["--collective", "allreduce", "--dtype", "int32", "--count", COUNT],
    );
}

#[test]
fn dpdk_allreduce_float32_sum() {
    demo(
        "daf",
        "inccl-allreduce",
        &["--collective", "allreduce", "--dtype", "float32", "--op", "sum", "--count", COUNT],
    );
}

#[test]
fn dpdk_reduce_int32_sum() {
    demo(
        "dri",
        "inccl-reduce",
        &["--collective", "reduce", "--dtype", "int32", "--count", COUNT, "--root", "2"],
    );
}

#[test]
fn dpdk_reduce_float32_min() {
    demo(
        "drf",
        "inccl-reduce",
        &[
            "--collective",
            "reduce",
            "--dtype",
            "float32",
            "--op",
            "min",
            "--count",
            COUNT,
            "--root",
            "1",
        ],
    );
}

#[test]
fn dpdk_broadcast_int32() {
    demo(
        "dbi",
        "inccl-broadcast",
        &["--collective", "broadcast", "--dtype", "int32", "--count", COUNT, "--root", "3"],
    );
}

#[test]
fn dpdk_broadcast_float32() {
    demo(
        "dbf",
        "inccl-broadcast",
        &["--collective", "broadcast", "--dtype", "float32", "--count", COUNT, "--root", "0"],
    );
}

/// Barrier carries no data, so it has no datatype to vary.
#[test]
fn dpdk_barrier() {
    demo("dba", "inccl-barrier", &["--collective", "barrier", "--iters", "10"]);
}

/// One switch process per namespace: each process initialises its own EAL.
#[test]
fn dpdk_allreduce_process_per_switch() {
    demo(
        "dps",
        "inccl-allreduce",
        &[
            "--collective",
            "allreduce",
            "--dtype",
            "int32",
            "--count",
            COUNT,
            "--switch-procs",
            "per-switch",
        ],
    );
}
