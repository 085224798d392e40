//! End-to-end test of the container deployment: `scripts/compose-demo --stop-test` builds
//! the images from the binaries under test, deploys 1-2-4 with Docker Compose, runs
//! AllReduce (int32 sum, float32 max), Reduce, Broadcast and Barrier on the four host
//! containers, stops a leaf switch's container in the middle of a long AllReduce
//! (every rank must fail with an error within a bound), starts it again and runs a new
//! communicator. Afterwards no container or network of the run may remain.
//!
//! Skipped (with a message) without root or a running Docker engine with Compose; in CI
//! (`CI=true`) that is a failure instead.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use inc_tests::netns::{bin_dir, build_binaries, repo_root};

/// Bound of the whole run: a cold image build (Debian packages) plus the deployment.
const DEADLINE: Duration = Duration::from_secs(900);

fn quiet_ok(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn skip_reason() -> Option<String> {
    let uid = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if !uid.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")) {
        return Some("not root (the images' build and the containers' networks need root)".into());
    }
    if !quiet_ok("docker", &["info"]) {
        return Some("no Docker engine answers `docker info`".into());
    }
    if !quiet_ok("docker", &["compose", "version"]) && !quiet_ok("docker-compose", &["version"]) {
        return Some("neither `docker compose` nor docker-compose is installed".into());
    }
    None
}

/// Names of containers and networks labelled with the compose project.
fn leftovers(project: &str) -> Vec<String> {
    let label = format!("label=com.docker.compose.project={project}");
    let mut left = Vec::new();
    for what in [&["ps", "-a"][..], &["network", "ls"][..]] {
        let out = Command::new("docker")
            .args(what)
            .args(["--filter", &label, "--format", "{{.Names}}{{.Name}}"])
            .output()
            .expect("docker runs");
        left.extend(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string));
    }
    left
}

#[test]
fn compose_1_2_4_every_collective_and_a_stopped_switch() {
    if let Some(why) = skip_reason() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "e2e docker cannot run in CI: {why}");
        eprintln!("SKIP e2e docker: {why}");
        return;
    }
    if let Err(e) = build_binaries() {
        panic!("{e}");
    }
    let project = format!("inct{}", std::process::id());
    let mut child = Command::new(repo_root().join("scripts/compose-demo"))
        .args(["--no-build", "--stop-test", "--project", &project])
        .env("INC_BIN_DIR", bin_dir())
        .current_dir(repo_root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("cannot start scripts/compose-demo");
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
    let mut status = None;
    while status.is_none() {
        status = child.try_wait().expect("wait for compose-demo");
        if status.is_none() && start.elapsed() > DEADLINE {
            // SIGTERM: the script's trap removes the containers and networks.
            let pgid = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-TERM", "--", &pgid]).status();
            std::thread::sleep(Duration::from_secs(30));
            let _ = Command::new("kill").args(["-KILL", "--", &pgid]).status();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (stdout, stderr) = (out_t.join().unwrap_or_default(), err_t.join().unwrap_or_default());
    let transcript = format!("status {status:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    eprintln!("{transcript}");
    assert!(status.is_some_and(|s| s.success()), "compose-demo failed\n{transcript}");
    // 5 collectives before and 1 after the restart, 4 ranks each.
    let passes =
        stdout.lines().filter(|l| l.trim_end().ends_with("PASS") && l.contains(" h")).count();
    assert_eq!(passes, 24, "expected 24 PASS lines\n{transcript}");
    assert!(!stdout.contains("FAIL"), "a rank failed\n{transcript}");
    assert!(stdout.contains("STOP TEST PASS"), "{transcript}");
    // Every rank reported the stall as an error naming what it waited for.
    let stopped: Vec<&str> = stdout.lines().filter(|l| l.starts_with("stop test h")).collect();
    assert_eq!(stopped.len(), 4, "{transcript}");
    assert!(stopped.iter().all(|l| l.contains("exit 2") && l.contains("error")), "{stopped:#?}");
    let left = leftovers(&project);
    assert!(left.is_empty(), "left behind: {left:?}");
}
