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

/// Every (type, operator) pair of the tables in turn on one communicator; the rows
/// of the last types and operators are there, so none was left out.
fn every_pair(tag: &str, topology: &str, coll: &str, root: &str) {
    let args = [topology, "--collective", coll, "--dtype", "all", "--op", "all", "--root", root];
    let last_op = if coll == "broadcast" { "bfloat16" } else { " bxor " };
    run_checked(tag, &host_bin(coll), &args, &["RANKS PASS", " float64 ", last_op]);
}

#[test]
fn allreduce_every_type_and_operator_1_2_4() {
    every_pair("pa", T124, "allreduce", "0");
}

#[test]
fn reduce_every_type_and_operator_1_2_4() {
    every_pair("pr", T124, "reduce", "2");
}

#[test]
fn broadcast_every_type_1_2_4() {
    every_pair("pb", T124, "broadcast", "1");
}

#[test]
fn allreduce_every_type_and_operator_three_level_tree() {
    every_pair("l3", "topologies/3-level.yaml", "allreduce", "0");
}

#[test]
fn reduce_every_type_and_operator_three_level_tree() {
    every_pair("r3", "topologies/3-level.yaml", "reduce", "5");
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

/// Every pair of ReduceScatter (every type and operator) or AllGather (every type) at
/// counts per block 1, 7 and 65537 in turn on one communicator, out of place or in
/// place; each rank checks its whole result exactly (in place: also the blocks the
/// collective leaves alone), and the rows of the last types, operators and count are
/// there.
fn every_pair_blocks(tag: &str, topology: &str, coll: &str, in_place: bool) {
    let mut args = vec![topology, "--collective", coll, "--dtype", "all", "--op", "all"];
    args.extend(["--count", "1,7,65537"]);
    if in_place {
        args.push("--in-place");
    }
    let last_op = if coll == "allgather" { " bfloat16 " } else { " bxor " };
    run_checked(tag, &host_bin(coll), &args, &["RANKS PASS", " float64 ", last_op, " 65537 "]);
}

#[test]
fn reducescatter_every_type_and_operator_1_2_4() {
    every_pair_blocks("rs", T124, "reducescatter", false);
}

#[test]
fn reducescatter_every_type_and_operator_in_place_1_2_4() {
    every_pair_blocks("ri", T124, "reducescatter", true);
}

#[test]
fn allgather_every_type_1_2_4() {
    every_pair_blocks("ag", T124, "allgather", false);
}

#[test]
fn allgather_every_type_in_place_1_2_4() {
    every_pair_blocks("gi", T124, "allgather", true);
}

const T3: &str = "topologies/3-level.yaml";

#[test]
fn reducescatter_every_type_and_operator_three_level_tree() {
    every_pair_blocks("s3", T3, "reducescatter", false);
}

#[test]
fn reducescatter_every_type_and_operator_in_place_three_level_tree() {
    every_pair_blocks("i3", T3, "reducescatter", true);
}

#[test]
fn allgather_every_type_three_level_tree() {
    every_pair_blocks("g3", T3, "allgather", false);
}

#[test]
fn allgather_every_type_in_place_three_level_tree() {
    every_pair_blocks("p3", T3, "allgather", true);
}

/// 16 Mi int32 elements per block (a 256 MiB buffer on each of the 4 ranks), SUM.
#[test]
fn reducescatter_and_allgather_16_mi_per_block_1_2_4() {
    for (tag, coll) in [("rb", "reducescatter"), ("ab", "allgather")] {
        let args = [T124, "--collective", coll, "--dtype", "int32", "--count", "16777216"];
        run_checked(tag, &host_bin(coll), &args, &["RANKS PASS", " 16777216 "]);
    }
}

/// Eight collectives started at once per iteration (`--nonblocking 8`) and waited for,
/// each one's result checked: AllReduce in place, ReduceScatter and AllGather.
#[test]
fn nonblocking_eight_at_once_1_2_4() {
    for (tag, coll, extra) in [
        ("na", "allreduce", &["--in-place"][..]),
        ("nr", "reducescatter", &[][..]),
        ("ng", "allgather", &[][..]),
    ] {
        let mut args = vec![T124, "--collective", coll, "--dtype", "int32,float16,float64"];
        args.extend(["--op", "all", "--count", "7,65537", "--iters", "3", "--nonblocking", "8"]);
        args.extend(extra);
        run_checked(tag, &host_bin(coll), &args, &["RANKS PASS", " float64 ", " 65537 "]);
    }
}
