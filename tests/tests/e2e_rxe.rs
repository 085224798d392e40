//! End-to-end test of hosts on genuine Soft-RoCE: `scripts/rxe-hosts` boots QEMU guests
//! (Debian's kernel with `rdma_rxe`, TCG without KVM) bridged onto their links of the
//! 1-2-4 namespace topology, ranks 0 and 3 (under different leaves) on rxe over
//! ibverbs and ranks 1 and 2 on the userspace transport, one communicator. AllReduce,
//! Reduce and Broadcast of every datatype and operator, and Barrier, must pass on every
//! rank with every element checked, the capture of the switches' ports must have a
//! valid ICRC on every frame, and nothing of the run may remain (guests, namespaces).
//!
//! Skipped (logged by inc-test-support) without root, network namespaces, QEMU or
//! rdma-core's rxe provider (`scripts/setup --rxe`); in CI (`CI=true`) that is a
//! failure instead. The guest kernel is cached in `$INC_RXE_CACHE` (default
//! /var/cache/inc-rxe): a cold run downloads it with apt.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use inc_test_support::{command_works, skip};
use inc_tests::netns::{
    assert_clean, bin_dir, repo_root, skip_reason, unique_prefix, TeardownGuard,
};
use inc_tests::process::run_bounded;

/// What the script may take (guests' boot under TCG and the tests): its own bound.
const SCRIPT_TIMEOUT_S: u64 = 480;

fn rxe_missing() -> Option<&'static str> {
    if !command_works("qemu-system-x86_64", &["--version"]) {
        return Some("qemu-system-x86_64 not installed (scripts/setup --rxe)");
    }
    if !Path::new("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so").exists() {
        return Some("rdma-core's rxe provider not installed (scripts/setup --rxe)");
    }
    None
}

#[test]
fn rxe_and_userspace_ranks_run_every_collective() {
    if let Some(why) = rxe_missing() {
        skip("e2e_rxe", why);
        return;
    }
    if let Some(why) = skip_reason(&["inc-pcap", "inccl-allreduce"]) {
        skip("e2e_rxe", &why);
        return;
    }
    let prefix = unique_prefix("rx");
    let capture = std::env::temp_dir().join(format!("inc-e2e-rxe-{prefix}"));
    let _guard = TeardownGuard::new(&prefix);
    let mut cmd = Command::new(repo_root().join("scripts/rxe-hosts"));
    cmd.args(["--no-build", "--prefix", &prefix, "--rxe-ranks", "0,3", "--counts", "4096"])
        .args(["--dtype", "all", "--op", "all"])
        .arg("--timeout")
        .arg(SCRIPT_TIMEOUT_S.to_string())
        .arg("--capture")
        .arg(&capture)
        .env("INC_BIN_DIR", bin_dir())
        .current_dir(repo_root());
    let run = run_bounded(cmd, Duration::from_secs(SCRIPT_TIMEOUT_S + 60), Duration::from_secs(20));
    let _ = std::fs::remove_dir_all(&capture);
    let t = run.transcript();
    eprintln!("{t}");
    assert!(run.success(), "scripts/rxe-hosts failed\n{t}");
    assert!(run.stdout.contains("ALL 4 RANKS PASS"), "{t}");
    for (rank, kind) in [(0, "rxe"), (1, "userspace"), (2, "userspace"), (3, "rxe")] {
        let line = run.stdout.lines().find(|l| l.starts_with(&format!("rank {rank} ")));
        let line = line.unwrap_or_else(|| panic!("no result line for rank {rank}\n{t}"));
        assert!(line.contains(&format!(", {kind}): PASS (4 of 4 tests)")), "{line}\n{t}");
    }
    assert!(run.stdout.contains("capture check: PASS"), "{t}");
    assert_clean(&prefix);
}
