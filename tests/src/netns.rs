//! End-to-end harness over network namespaces.
//!
//! Each test runs `scripts/demo` (the same orchestration a person uses) with its own
//! namespace prefix, a bounded time, and a guard that always tears the namespaces down
//! and checks nothing is left behind. Tests skip, with a message, when not root or when
//! `ip netns` or the release binaries are unavailable.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Binaries the end-to-end tests need in the binary directory.
pub const BINARIES: [&str; 2] = ["inc-switch", "inc-controller"];

/// Workspace root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Directory of the binaries under test: `$INC_BIN_DIR`, or the `test`-profile output
/// directory that [`build_binaries`] fills.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os("INC_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo_root().join("target"));
            target.join("debug")
        }
    }
}

/// Build the switch, controller, host and bench programs once per test process (unless
/// `$INC_BIN_DIR` points at prebuilt ones). The `test` profile (optimised, with debug
/// assertions) reuses what `cargo test`/`nextest` already compiled, so this mostly links.
pub fn build_binaries() -> Result<(), String> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if std::env::var_os("INC_BIN_DIR").is_some() {
                return Ok(());
            }
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            // With libdpdk present the one switch binary also has the dpdk backend, so
            // the dpdk and the other e2e tests never rebuild it back and forth.
            let features: &[&str] =
                if dpdk_available() { &["--features", "inc-switch/dpdk"] } else { &[] };
            let out = Command::new(cargo)
                .args(["build", "--quiet", "--profile", "test", "--bins"])
                .args(["-p", "inc-switch", "-p", "inc-controller"])
                .args(["-p", "inccl-hosts", "-p", "inc-bench"])
                .args(features)
                .current_dir(repo_root())
                .output()
                .map_err(|e| format!("cannot run cargo: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("building binaries failed:\n{}", String::from_utf8_lossy(&out.stderr)))
            }
        })
        .clone()
}

/// True if the system DPDK development files are installed (`pkg-config libdpdk`):
/// then [`build_binaries`] builds the switch with its `dpdk` backend.
pub fn dpdk_available() -> bool {
    Command::new("pkg-config").args(["--exists", "libdpdk"]).status().is_ok_and(|s| s.success())
}

/// Why end-to-end tests cannot run here, if they cannot. Builds the binaries first
/// (see [`build_binaries`]) and panics if that fails: a broken build is a failure.
/// In CI (`CI=true`) any reason is a failure too: this panics instead of returning it.
pub fn skip_reason(extra_bins: &[&str]) -> Option<String> {
    let reason = why_not_ready(extra_bins);
    if let Some(why) = &reason {
        assert!(!inc_test_support::in_ci(), "end-to-end test cannot run in CI: {why}");
    }
    reason
}

fn why_not_ready(extra_bins: &[&str]) -> Option<String> {
    if let Some(why) = inc_test_support::netns_unavailable() {
        return Some(why.into());
    }
    if let Err(e) = build_binaries() {
        panic!("{e}");
    }
    let dir = bin_dir();
    let missing: Vec<&str> =
        BINARIES.iter().chain(extra_bins).copied().filter(|b| !dir.join(b).is_file()).collect();
    if !missing.is_empty() {
        return Some(format!(
            "binaries {missing:?} not in {} (not built by this workspace yet?)",
            dir.display()
        ));
    }
    None
}

/// A short namespace prefix unique to this test process and tag.
pub fn unique_prefix(tag: &str) -> String {
    format!("t{}{}", std::process::id() % 100_000, tag)
}

/// Names of existing network namespaces that start with `prefix`.
pub fn namespaces_with_prefix(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// Tears the namespaces of a prefix down when dropped, whatever happened.
#[derive(Debug)]
pub struct TeardownGuard {
    prefix: String,
}

impl TeardownGuard {
    /// Guard for `prefix`.
    pub fn new(prefix: &str) -> Self {
        TeardownGuard { prefix: prefix.to_string() }
    }
}

impl Drop for TeardownGuard {
    fn drop(&mut self) {
        let script = repo_root().join("scripts/netns-down");
        let _ = Command::new(script)
            .args(["--prefix", &self.prefix])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // Anything the script missed (e.g. it is broken) is removed here.
        for ns in namespaces_with_prefix(&self.prefix) {
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

/// Outcome of one `scripts/demo` run.
#[derive(Debug)]
pub struct DemoOutcome {
    /// Exit status (`None` if it had to be killed at the deadline).
    pub status: Option<ExitStatus>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl DemoOutcome {
    /// True if the demo exited 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Everything printed, for assertion messages.
    pub fn transcript(&self) -> String {
        format!(
            "status: {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Run `scripts/demo --no-build --prefix P ARGS...`: up to `run_time` waiting for the
/// lock plus `run_time` running; past that the whole process group gets SIGTERM (the
/// script's trap tears down), then SIGKILL.
/// Runs are serialised across test processes (nextest runs tests in parallel) with
/// `flock` on a lock file: the machine is small and the runs are timing-sensitive.
pub fn run_demo(prefix: &str, args: &[&str], run_time: Duration) -> DemoOutcome {
    let _guard = TeardownGuard::new(prefix);
    let root = repo_root();
    let lock = std::env::temp_dir().join("inc-e2e.lock");
    let wait = run_time.as_secs().to_string();
    let deadline = run_time * 2;
    let mut child = Command::new("flock")
        .arg("-w")
        .arg(&wait)
        .arg(&lock)
        .arg(root.join("scripts/demo"))
        .args(["--no-build", "--prefix", prefix])
        .args(args)
        .env("INC_BIN_DIR", bin_dir())
        .current_dir(&root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("cannot start scripts/demo");
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let pgid = child.id().to_string();
    let mut status = None;
    let mut termed = false;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            if !termed {
                status = Some(s);
            }
            break;
        }
        let elapsed = start.elapsed();
        if elapsed > deadline && !termed {
            let _ = Command::new("kill").args(["-TERM", "--", &format!("-{pgid}")]).status();
            termed = true;
        }
        if elapsed > deadline + Duration::from_secs(20) {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).status();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    DemoOutcome {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    }
}

/// Processes whose command line mentions `prefix` (switches, controller, hosts of a run).
pub fn processes_with_prefix(prefix: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter(|e| e.file_name().to_string_lossy() != me)
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(prefix).then(|| format!("{}: {cmd}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Assert that a finished run left no namespace or process of `prefix` behind.
pub fn assert_clean(prefix: &str) {
    let left = namespaces_with_prefix(prefix);
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    let procs = processes_with_prefix(prefix);
    assert!(procs.is_empty(), "processes left behind: {procs:?}");
}
