//! End-to-end tests of the switch's DPDK backend: `scripts/demo --backend dpdk` on the
//! 1-2-4 tree (EAL `--no-huge --no-pci`, one af_packet vdev per switch port hot-plugged
//! in the port's namespace) for every collective and both datatypes, with all switches
//! in one process and once with a process per switch.
//!
//! Needs root and the DPDK development files (`pkg-config libdpdk`; the harness then
//! builds the switch with `--features dpdk`). Without them the tests skip with a
//! message, and fail when CI=true.

use inc_tests::cases::{collective_args, host_bin, run_checked};
use inc_tests::netns::dpdk_available;

/// `scripts/demo topologies/1-2-4.yaml --backend dpdk` with one collective and `extra`.
fn demo(tag: &str, coll: &str, dtype: &str, op: Option<&str>, root: Option<&str>, extra: &[&str]) {
    if !dpdk_available() {
        let why = "libdpdk not found by pkg-config (sudo scripts/setup --dpdk)";
        return inc_test_support::skip(&format!("e2e dpdk {tag}"), why);
    }
    let mut args = vec!["topologies/1-2-4.yaml", "--backend", "dpdk"];
    args.extend(collective_args(coll, dtype, op, root));
    args.extend_from_slice(extra);
    run_checked(tag, &host_bin(coll), &args, &["switch backend dpdk", "ALL 4 RANKS PASS"]);
}

#[test]
fn dpdk_allreduce_int32_sum() {
    demo("dai", "allreduce", "int32", None, None, &[]);
}

#[test]
fn dpdk_allreduce_float32_sum() {
    demo("daf", "allreduce", "float32", Some("sum"), None, &[]);
}

#[test]
fn dpdk_reduce_int32_sum() {
    demo("dri", "reduce", "int32", None, Some("2"), &[]);
}

#[test]
fn dpdk_reduce_float32_min() {
    demo("drf", "reduce", "float32", Some("min"), Some("1"), &[]);
}

#[test]
fn dpdk_broadcast_int32() {
    demo("dbi", "broadcast", "int32", None, Some("3"), &[]);
}

#[test]
fn dpdk_broadcast_float32() {
    demo("dbf", "broadcast", "float32", None, Some("0"), &[]);
}

/// Barrier carries no data, so it has no datatype to vary.
#[test]
fn dpdk_barrier() {
    demo("dba", "barrier", "int32", None, None, &[]);
}

/// One switch process per namespace: each process initialises its own EAL.
#[test]
fn dpdk_allreduce_process_per_switch() {
    demo("dps", "allreduce", "int32", None, None, &["--switch-procs", "per-switch"]);
}
