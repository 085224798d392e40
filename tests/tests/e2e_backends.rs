//! Every switch backend end to end: `scripts/demo topologies/1-2-4.yaml --backend B`
//! for every collective and both datatypes, B in af_packet, pcap and af_xdp, plus one
//! process per switch and several data-plane workers. The shipped MTU 4096 makes af_xdp
//! frames span two UMEM chunks; `af_xdp_mtu1024` keeps the one-chunk path covered
//! (`tests/topologies/1-2-4-mtu1024.yaml`). The
//! af_packet matrix of collectives lives in `e2e_netns`; here af_packet runs the worker,
//! process and `--internal-links wire` variants. Skips when not root (fails instead when CI=true).

use inc_tests::cases::{collective_args, host_bin, run_checked};

const T124: &str = "topologies/1-2-4.yaml";
/// 1-2-4 with `mtu: 1024` (test-only copy): frames that fit one UMEM chunk.
const T124_MTU1024: &str = "tests/topologies/1-2-4-mtu1024.yaml";

fn collective(backend: &str, tag: &str, coll: &str, dtype: &str, extra: &[&str]) {
    on_topology(T124, backend, tag, coll, dtype, extra);
}

fn on_topology(topo: &str, backend: &str, tag: &str, coll: &str, dtype: &str, extra: &[&str]) {
    let (op, root) = match coll {
        "reduce" => (Some("sum"), Some("2")),
        "broadcast" => (None, Some("3")),
        "allreduce" if dtype == "float32" => (Some("max"), None),
        _ => (None, None),
    };
    let mut args = vec![topo, "--backend", backend];
    args.extend(collective_args(coll, dtype, op, root));
    args.extend(extra);
    run_checked(tag, &host_bin(coll), &args, &["ALL 4 RANKS PASS"]);
}

macro_rules! matrix {
    ($backend:literal, $m:ident, $t:literal, $topo:expr) => {
        mod $m {
            use super::*;

            #[test]
            fn allreduce_int32() {
                on_topology($topo, $backend, concat!($t, "ai"), "allreduce", "int32", &[]);
            }
            #[test]
            fn allreduce_float32() {
                on_topology($topo, $backend, concat!($t, "af"), "allreduce", "float32", &[]);
            }
            #[test]
            fn reduce_int32() {
                on_topology($topo, $backend, concat!($t, "ri"), "reduce", "int32", &[]);
            }
            #[test]
            fn reduce_float32() {
                on_topology($topo, $backend, concat!($t, "rf"), "reduce", "float32", &[]);
            }
            #[test]
            fn broadcast_int32() {
                on_topology($topo, $backend, concat!($t, "bi"), "broadcast", "int32", &[]);
            }
            #[test]
            fn broadcast_float32() {
                on_topology($topo, $backend, concat!($t, "bf"), "broadcast", "float32", &[]);
            }
            #[test]
            fn barrier() {
                on_topology($topo, $backend, concat!($t, "ba"), "barrier", "int32", &[]);
            }
        }
    };
}

matrix!("pcap", pcap, "p", T124);
matrix!("af_xdp", af_xdp, "x", T124);

#[test]
fn pcap_one_process_per_switch() {
    collective("pcap", "ppp", "allreduce", "int32", &["--switch-procs", "per-switch"]);
}

#[test]
fn af_xdp_mtu1024() {
    on_topology(T124_MTU1024, "af_xdp", "y", "allreduce", "int32", &[]);
}

#[test]
fn af_xdp_one_process_per_switch() {
    collective("af_xdp", "xpp", "allreduce", "int32", &["--switch-procs", "per-switch"]);
}

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

/// One process, one worker, the switch <-> switch frames over the veths (GSO frames
/// split in place) instead of in memory.
#[test]
fn af_packet_internal_links_on_the_wire() {
    collective("af_packet", "awi", "allreduce", "int32", &["--internal-links", "wire"]);
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
