//! End-to-end tests in fresh network namespaces: controller, switches (af_packet) and
//! host programs as separate processes, driven by `scripts/demo`. Each test uses its
//! own namespace prefix and checks that nothing is left behind. Skipped (with a
//! message, logged for `scripts/test`) when not root or without `ip netns`; in CI
//! (`CI=true`) that is a failure instead.

use inc_tests::cases::{collective_args, host_bin, run_checked, COUNT};

fn demo(tag: &str, host_bin: &str, args: &[&str]) {
    run_checked(tag, host_bin, args, &["PASS"]);
}

const T124: &str = "topologies/1-2-4.yaml";

/// One collective on 1-2-4 over af_packet.
fn case(tag: &str, coll: &str, dtype: &str, op: Option<&str>, root: Option<&str>) {
    let mut args = vec![T124];
    args.extend(collective_args(coll, dtype, op, root));
    demo(tag, &host_bin(coll), &args);
}

/// Also: the hosts' veths keep transmit checksum offload (`scripts/netns-up`), so
/// INCCL hands its UDP GSO sends to the AF_PACKET switch whole, which splits them.
#[test]
fn allreduce_int32_sum_1_2_4() {
    let mut args = vec![T124];
    args.extend(collective_args("allreduce", "int32", Some("sum"), None));
    run_checked(
        "ai",
        &host_bin("allreduce"),
        &args,
        &["PASS", "whole UDP GSO frames received and split"],
    );
}

#[test]
fn allreduce_float32_max_1_2_4() {
    case("af", "allreduce", "float32", Some("max"), None);
}

#[test]
fn allreduce_float32_sum_1_2_4() {
    case("as", "allreduce", "float32", Some("sum"), None);
}

#[test]
fn reduce_int32_1_2_4() {
    case("ri", "reduce", "int32", Some("sum"), Some("2"));
}

#[test]
fn reduce_float32_min_1_2_4() {
    case("rf", "reduce", "float32", Some("min"), Some("1"));
}

#[test]
fn broadcast_int32_1_2_4() {
    case("bi", "broadcast", "int32", None, Some("3"));
}

#[test]
fn broadcast_float32_1_2_4() {
    case("bf", "broadcast", "float32", None, Some("0"));
}

#[test]
fn barrier_1_2_4() {
    case("ba", "barrier", "int32", None, None);
}

#[test]
fn allreduce_single_switch_1_4() {
    demo(
        "s4",
        "inccl-allreduce",
        &["topologies/1-4.yaml", "--collective", "allreduce", "--dtype", "int32", "--count", COUNT],
    );
}

#[test]
fn allreduce_three_level_tree() {
    demo(
        "l3",
        "inccl-allreduce",
        &[
            "topologies/3-level.yaml",
            "--collective",
            "allreduce",
            "--dtype",
            "float32",
            "--count",
            COUNT,
        ],
    );
}

#[test]
fn two_communicators_at_once_on_the_same_switches() {
    demo(
        "j2",
        "inccl-allreduce",
        &[T124, "--collective", "allreduce", "--dtype", "int32", "--count", COUNT, "--jobs", "2"],
    );
}

#[test]
fn one_process_per_switch() {
    demo(
        "pp",
        "inccl-allreduce",
        &[
            T124,
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
