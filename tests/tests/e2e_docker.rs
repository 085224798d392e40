//! End-to-end test of the container deployment: `scripts/compose-demo --stop-test` builds
//! the images from the binaries under test, deploys 1-2-4 with Docker Compose, runs
//! AllReduce (int32 sum, float32 max), Reduce, Broadcast and Barrier on the four host
//! containers, stops a leaf switch's container in the middle of a long AllReduce
//! (every rank must fail with an error within a bound), starts it again and runs a new
//! communicator. Authentication is on: every container has only its role's credential
//! file, and a client without one is refused. Afterwards no container or network of
//! the run may remain.
//!
//! Skipped (logged by inc-test-support) without root or a running Docker engine with
//! Compose; in CI (`CI=true`) that is a failure instead.

use std::process::Command;
use std::time::Duration;

use inc_test_support::{command_works, is_root, skip};
use inc_tests::netns::{bin_dir, build_binaries, repo_root};
use inc_tests::process::run_bounded;

/// Bound of the whole run: a cold image build (Debian packages) plus the deployment.
const DEADLINE: Duration = Duration::from_secs(900);

fn skip_reason() -> Option<&'static str> {
    if !is_root() {
        return Some("not root (the images' build and the containers' networks need root)");
    }
    if !command_works("docker", &["info"]) {
        return Some("no Docker engine answers `docker info`");
    }
    if !command_works("docker", &["compose", "version"])
        && !command_works("docker-compose", &["version"])
    {
        return Some("neither `docker compose` nor docker-compose is installed");
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
        skip("e2e_docker", why);
        return;
    }
    if let Err(e) = build_binaries() {
        panic!("{e}");
    }
    let project = format!("inct{}", std::process::id());
    let mut cmd = Command::new(repo_root().join("scripts/compose-demo"));
    cmd.args(["--no-build", "--stop-test", "--project", &project])
        .env("INC_BIN_DIR", bin_dir())
        .current_dir(repo_root());
    // Past the deadline SIGTERM: the script's trap removes the containers and networks.
    let run = run_bounded(cmd, DEADLINE, Duration::from_secs(30));
    let (stdout, transcript) = (&run.stdout, run.transcript());
    eprintln!("{transcript}");
    assert!(run.success(), "compose-demo failed\n{transcript}");
    // 5 collectives before and 1 after the restart, 4 ranks each.
    let passes =
        stdout.lines().filter(|l| l.trim_end().ends_with("PASS") && l.contains(" h")).count();
    assert_eq!(passes, 24, "expected 24 PASS lines\n{transcript}");
    assert!(!stdout.contains("FAIL"), "a rank failed\n{transcript}");
    assert!(stdout.contains("STOP TEST PASS"), "{transcript}");
    // The controller refused a client without a credential; no credential in any
    // container's configuration.
    assert!(stdout.contains("AUTH CHECK PASS"), "{transcript}");
    // Every rank reported the stall as an error naming what it waited for.
    let stopped: Vec<&str> = stdout.lines().filter(|l| l.starts_with("stop test h")).collect();
    assert_eq!(stopped.len(), 4, "{transcript}");
    assert!(stopped.iter().all(|l| l.contains("exit 2") && l.contains("error")), "{stopped:#?}");
    let left = leftovers(&project);
    assert!(left.is_empty(), "left behind: {left:?}");
}
