//! What every environment-dependent test of the workspace shares: deciding whether it can
//! run here, and what happens when it cannot.
//!
//! A test that cannot run (not root, a tool or a binary missing) is *skipped* on a
//! developer machine, with a line on stderr and a line appended to the file named by
//! `$INC_SKIP_LOG` (which `scripts/test` prints at the end), so skips are never silent.
//! In CI (`CI=true`) the same condition is a *failure*: CI installs everything, so a
//! missing prerequisite there is a broken pipeline, not a reason to pass.

use std::io::Write;
use std::process::{Command, Stdio};

/// Environment variable naming the file skips are appended to.
pub const SKIP_LOG_ENV: &str = "INC_SKIP_LOG";

/// True when running under CI (`CI=true`, as `.ci/run` sets).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Skips `test` because of `reason`, or panics with the reason in CI.
///
/// Call it and `return` from the test when it returns.
pub fn skip(test: &str, reason: &str) {
    assert!(!in_ci(), "{test}: cannot run in CI: {reason}");
    eprintln!("SKIP {test}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        // One short write per line with O_APPEND: lines from parallel test processes
        // do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all(format!("{test}: {reason}\n").as_bytes());
        }
    }
}

/// True when the process has root's privileges (effective uid 0, as under sudo or a
/// setuid wrapper; the real uid may differ).
pub fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    // "Uid:" real effective saved filesystem
    status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

/// True when `program args...` runs and exits 0 (output discarded).
pub fn command_works(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Why network-namespace tests cannot run here (not root, or no `ip netns`), if so.
pub fn netns_unavailable() -> Option<&'static str> {
    if !is_root() {
        Some("not root (network namespaces need root)")
    } else if !command_works("ip", &["netns", "list"]) {
        Some("`ip netns` is unavailable (install iproute2)")
    } else {
        None
    }
}

/// For tests that need network namespaces: true if they can run; otherwise skips (or
/// fails in CI) with the reason and returns false.
pub fn netns_ready(test: &str) -> bool {
    match netns_unavailable() {
        None => true,
        Some(reason) => {
            skip(test, reason);
            false
        }
    }
}

/// The shortest of 20 idle waits of `timeout`: `wait` waits once and returns whether it
/// saw anything (it must not: nothing is sent). Each wait is checked to last at least
/// `timeout`; the minimum shows whether a wait can end below a millisecond at all,
/// which single waits on a loaded machine may not.
pub fn shortest_idle_wait(
    timeout: std::time::Duration,
    mut wait: impl FnMut(std::time::Duration) -> bool,
) -> std::time::Duration {
    (0..20)
        .map(|_| {
            let start = std::time::Instant::now();
            let ready = wait(timeout);
            let took = start.elapsed();
            assert!(!ready, "an idle wait reported readiness");
            assert!(took >= timeout, "woke after {took:?}, before the {timeout:?} timeout");
            took
        })
        .min()
        .expect("20 waits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_works_reports_exit_status() {
        assert!(command_works("true", &[]));
        assert!(!command_works("false", &[]));
        assert!(!command_works("/nonexistent/program", &[]));
    }

    #[test]
    fn root_check_matches_the_effective_uid() {
        let uid = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
            .unwrap();
        assert_eq!(is_root(), uid == "0");
    }
}
