//! What the `scripts/demo` end-to-end suites (`e2e_netns`, `e2e_backends`,
//! `e2e_dpdk`) share: the arguments of one collective case and one checked run.

use std::time::Duration;

use crate::netns::{assert_clean, run_demo, skip_reason, unique_prefix};

/// Data elements per rank of the collective cases (large enough for many windows).
pub const COUNT: &str = "100000";

/// One collective case: `--collective COLL`, then `--iters 10` for a barrier (it has no
/// data), else `--dtype DTYPE --count COUNT` and `--op`/`--root` when given.
pub fn collective_args<'a>(
    coll: &'a str,
    dtype: &'a str,
    op: Option<&'a str>,
    root: Option<&'a str>,
) -> Vec<&'a str> {
    let mut args = vec!["--collective", coll];
    if coll == "barrier" {
        args.extend(["--iters", "10"]);
        return args;
    }
    args.extend(["--dtype", dtype, "--count", COUNT]);
    if let Some(op) = op {
        args.extend(["--op", op]);
    }
    if let Some(root) = root {
        args.extend(["--root", root]);
    }
    args
}

/// The host program of a collective (`inccl-allreduce`, ...).
pub fn host_bin(coll: &str) -> String {
    format!("inccl-{coll}")
}

/// Run `scripts/demo ARGS` under a fresh namespace prefix made from `tag` and check it:
/// it exits 0, its output contains every string of `expect` and no `FAIL`, and nothing
/// with the prefix is left behind. Skips (fails when CI=true) when root, `ip netns`,
/// the binaries or `host_bin` are missing.
pub fn run_checked(tag: &str, host_bin: &str, args: &[&str], expect: &[&str]) {
    if let Some(why) = skip_reason(&[host_bin]) {
        inc_test_support::skip(&format!("e2e {tag}"), &why);
        return;
    }
    let prefix = unique_prefix(tag);
    let out = run_demo(&prefix, args, Duration::from_secs(120));
    assert!(out.success(), "demo {args:?} failed\n{}", out.transcript());
    for e in expect {
        assert!(out.stdout.contains(e), "no `{e}` in the output\n{}", out.transcript());
    }
    assert!(!out.stdout.contains("FAIL"), "a rank failed\n{}", out.transcript());
    assert_clean(&prefix);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn barrier_has_no_data_arguments_and_the_rest_do() {
        assert_eq!(
            collective_args("barrier", "int32", Some("sum"), Some("1")),
            ["--collective", "barrier", "--iters", "10"]
        );
        assert_eq!(
            collective_args("reduce", "float32", Some("min"), Some("2")),
            [
                "--collective",
                "reduce",
                "--dtype",
                "float32",
                "--count",
                COUNT,
                "--op",
                "min",
                "--root",
                "2"
            ]
        );
        assert_eq!(host_bin("broadcast"), "inccl-broadcast");
    }
}
