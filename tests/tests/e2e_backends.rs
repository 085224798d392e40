//! Every switch backend end to end: `scripts/demo topologies/1-2-4.yaml --backend B`
//! for every collective and both datatypes, B in af_packet, pcap and af_xdp, plus one
//! process per switch and several data-plane workers. The af_packet matrix of
//! collectives lives in `e2e_netns`; here af_packet runs the worker and process
//! variants. Skips when not root (fails instead when CI=true).

use std::time::Duration;

use inc_tests::netns::{assert_clean, run_demo, skip_reason, unique_prefix};

const T124: &str = "topologies/1-2-4.yaml";
const COUNT: &str = "100000";

fn demo(tag: &str, host_bin: &str, args: &[&str]) {
    if let Some(why) = skip_reason(&[host_bin]) {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("e2e {tag} cannot run in CI: {why}");
        }
        eprintln!("SKIP e2e {tag}: {why}");
        return;
    }
    let prefix = unique_prefix(tag);
    let out = run_demo(&prefix, args, Duration::from_secs(120));
    assert!(out.success(), "demo {args:?} failed\n{}", out.transcript());
    assert!(out.stdout.contains("ALL 4 RANKS PASS"), "not every rank passed\n{}", out.transcript());
    assert!(!out.stdout.contains("FAIL"), "a rank failed\n{}", out.transcript());
    assert_clean(&prefix);
}

fn collective(backend: &str, tag: &str, coll: &str, dtype: &str, extra: &[&str]) {
    let bin = format!("inccl-{coll}");
    let mut args = vec![T124, "--backend", backend, "--collective", coll];
    if coll != "barrier" {
        args.extend(["--dtype", dtype, "--count", COUNT]);
    } else {
        args.extend(["--iters", "10"]);
    }
    match coll {
        "reduce" => args.extend(["--op", "sum", "--root", "2"]),
        "broadcast" => args.extend(["--root", "3"]),
        "allreduce" if dtype == "float32" => args.extend(["--op", "max"]),
        _ => {}
    }
    args.extend(extra);
    demo(tag, &bin, &args);
}

macro_rules! matrix {
    ($backend:literal, $m:ident, $t:literal) => {
        mod $m {
            use super::collective;

            #[test]
            fn allreduce_int32() {
                collective($backend, concat!($t, "ai"), "allreduce", "int32", &[]);
            }
            #[test]
            fn allreduce_float32() {
                collective($backend, concat!($t, "af"), "allreduce", "float32", &[]);
            }
            #[test]
            fn reduce_int32() {
                collective($backend, concat!($t, "ri"), "reduce", "int32", &[]);
            }
            #[test]
            fn reduce_float32() {
                collective($backend, concat!($t, "rf"), "reduce", "float32", &[]);
            }
            #[test]
            fn broadcast_int32() {
                collective($backend, concat!($t, "bi"), "broadcast", "int32", &[]);
            }
            #[test]
            fn broadcast_float32() {
                collective($backend, concat!($t, "bf"), "broadcast", "float32", &[]);
            }
            #[test]
            fn barrier() {
                collective($backend, concat!($t, "ba"), "barrier", "int32", &[]);
            }
            #[test]
            fn one_process_per_switch() {
                let extra = ["--switch-procs", "per-switch"];
                collective($backend, concat!($t, "pp"), "allreduce", "int32", &extra);
            }
        }
    };
}

matrix!("pcap", pcap, "p");
matrix!("af_xdp", af_xdp, "x");

fn with_workers(backend: &str, tag: &str, workers: &str) {
    collective(backend, tag, "allreduce", "int32", &["--workers", workers]);
}

#[test]
fn af_packet_two_workers() {
    with_workers("af_packet", "aw2", "2");
}

#[test]
fn af_packet_three_workers() {
    with_workers("af_packet", "aw3", "3");
}

#[test]
fn af_packet_one_process_per_switch() {
    collective("af_packet", "app", "allreduce", "float32", &["--switch-procs", "per-switch"]);
}

#[test]
fn pcap_two_workers() {
    with_workers("pcap", "pw2", "2");
}

#[test]
fn af_xdp_two_workers() {
    with_workers("af_xdp", "xw2", "2");
}
