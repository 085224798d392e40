//! End-to-end tests in fresh network namespaces: controller, switches (af_packet) and
//! host programs as separate processes, driven by `scripts/demo`. Each test uses its
//! own namespace prefix and checks that nothing is left behind. Skipped (with a
//! message, logged for `scripts/test`) when not root or without `ip netns`; in CI
//! (`CI=true`) that is a failure instead.

use std::time::Duration;

use inc_tests::netns::{assert_clean, run_demo, skip_reason, unique_prefix};

fn demo(tag: &str, host_bin: &str, args: &[&str]) {
    if let Some(why) = skip_reason(&[host_bin]) {
        inc_test_support::skip(&format!("e2e {tag}"), &why);
        return;
    }
    let prefix = unique_prefix(tag);
    let out = run_demo(&prefix, args, Duration::from_secs(120));
    assert!(out.success(), "demo {args:?} failed\n{}", out.transcript());
    assert!(out.stdout.contains("PASS"), "no PASS line\n{}", out.transcript());
    assert!(!out.stdout.contains("FAIL"), "a rank failed\n{}", out.transcript());
    assert_clean(&prefix);
}

const T124: &str = "topologies/1-2-4.yaml";
const COUNT: &str = "100000";

#[test]
fn allreduce_int32_sum_1_2_4() {
    demo(
        "ai",
        "inccl-allreduce",
        &[T124, "--collective", "allreduce", "--dtype", "int32", "--op", "sum", "--count", COUNT],
    );
}

#[test]
fn allreduce_float32_max_1_2_4() {
    demo(
        "af",
        "inccl-allreduce",
        &[T124, "--collective", "allreduce", "--dtype", "float32", "--op", "max", "--count", COUNT],
    );
}

#[test]
fn allreduce_float32_sum_1_2_4() {
    demo(
        "as",
        "inccl-allreduce",
        &[T124, "--collective", "allreduce", "--dtype", "float32", "--op", "sum", "--count", COUNT],
    );
}

#[test]
fn reduce_int32_1_2_4() {
    demo(
        "ri",
        "inccl-reduce",
        &[
            T124,
            "--collective",
            "reduce",
            "--dtype",
            "int32",
            "--op",
            "sum",
            "--count",
            COUNT,
            "--root",
            "2",
        ],
    );
}

#[test]
fn reduce_float32_min_1_2_4() {
    demo(
        "rf",
        "inccl-reduce",
        &[
            T124,
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
fn broadcast_int32_1_2_4() {
    demo(
        "bi",
        "inccl-broadcast",
        &[T124, "--collective", "broadcast", "--dtype", "int32", "--count", COUNT, "--root", "3"],
    );
}

#[test]
fn broadcast_float32_1_2_4() {
    demo(
        "bf",
        "inccl-broadcast",
        &[T124, "--collective", "broadcast", "--dtype", "float32", "--count", COUNT, "--root", "0"],
    );
}

#[test]
fn barrier_1_2_4() {
    demo("ba", "inccl-barrier", &[T124, "--collective", "barrier", "--iters", "10"]);
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
