//! The controller may die and come back (issue [18]), on real processes in network
//! namespaces (1-2-4 tree, one af_packet switch process per switch, userspace RoCEv2
//! hosts running `inccl-allreduce`, the controller killed with SIGKILL by its PID):
//!
//! - killed mid-AllReduce and restarted while it runs: every rank exact and exits 0,
//!   the switches re-register with the new controller, which adopts the communicator
//!   so rank 0's destroy (over a new connection, with its key) removes it at once; a
//!   new group and communicator then pass and slot memory returns to idle;
//! - killed, the ranks destroy while it is down (exit 0 with a warning), restarted:
//!   the switches hold no communicator within the orphan timeout plus a sweep;
//! - restarted with another topology file or another token: the switches are refused
//!   with a clear message and nothing crashes; with the right ones they come back.
//!
//! Each test prints what it measured (re-registration, recovery, cleanup). Skipped
//! when not root or without `ip netns` (CI=true: a failure). Serial with the other
//! end-to-end tests (scripts/nextest.toml; the deployment also holds the e2e lock).
//! `INC_RESTART_ITERS` sets the iterations of the long AllReduce (default 150 of 4 MiB,
//! a few seconds here).

use std::time::{Duration, Instant};

use inc_controller::Credentials;
use inc_tests::deploy::Deployment;
use inc_tests::netns::{assert_clean, repo_root, skip_reason, unique_prefix};
use serde_json::Value;

const T124: &str = "topologies/1-2-4.yaml";
/// 4 MiB of INT32 per rank.
const COUNT: u64 = 1 << 20;
/// The switches' orphan idle timeout in these tests (seconds; default 120).
const ORPHAN_S: u64 = 3;
/// Bootstrap bound of the hosts (INCCL_TIMEOUT_MS): every controller wait.
const HOST_ENV: [(&str, &str); 1] = [("INCCL_TIMEOUT_MS", "10000")];

fn can_run(tag: &str) -> bool {
    match skip_reason(&["inccl-allreduce"]) {
        None => true,
        Some(why) => {
            inc_test_support::skip(&format!("e2e_controller_restart::{tag}"), &why);
            false
        }
    }
}

fn iters() -> String {
    std::env::var("INC_RESTART_ITERS").unwrap_or_else(|_| "150".into())
}

fn names(d: &Deployment) -> Vec<String> {
    d.plan.switches.iter().map(|s| s.name.clone()).collect()
}

/// Communicators held and slot memory of every switch.
fn held(d: &Deployment) -> Vec<(String, usize, u64)> {
    names(d)
        .into_iter()
        .map(|n| {
            let s = &d.stats(&n)["switches"][0];
            let comms = s["communicators"].as_array().map_or(0, Vec::len);
            (n, comms, s["slot_memory_bytes"].as_u64().unwrap_or(u64::MAX))
        })
        .collect()
}

fn idle(d: &Deployment) -> bool {
    held(d).iter().all(|(_, c, m)| *c == 0 && *m == 0)
}

/// Poll `ok` every 50 ms for up to `timeout`; when it held, or `None`.
fn wait_for(timeout: Duration, mut ok: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if ok() {
            return Some(Instant::now());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sum of a per-switch counter path (e.g. `["orphans", "expired"]`) over the switches.
fn total(d: &Deployment, path: &[&str]) -> u64 {
    names(d)
        .iter()
        .map(|n| {
            let mut v: &Value = &d.stats(n)["switches"][0];
            for p in path {
                v = &v[*p];
            }
            v.as_u64().unwrap_or(0)
        })
        .sum()
}

/// Kill the controller and start it again with the same files; returns how long the
/// switches took to register with the new one (all of them).
fn restart_controller(d: &mut Deployment, down_for: Duration) -> Duration {
    let before: Vec<(String, usize)> =
        names(d).into_iter().map(|n| (n.clone(), d.registrations(&n))).collect();
    assert!(d.kill_controller().is_some(), "no controller to kill");
    std::thread::sleep(down_for);
    d.start_controller(None, None);
    let t0 = Instant::now();
    for (n, k) in &before {
        assert!(
            d.wait_registrations(n, k + 1, Duration::from_secs(15)),
            "switch {n} did not register with the restarted controller:\n{}",
            d.logs()
        );
    }
    t0.elapsed()
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[test]
fn controller_killed_mid_allreduce_and_restarted() {
    if !can_run("killed_mid_allreduce") {
        return;
    }
    let t_test = Instant::now();
    let prefix = unique_prefix("cr1");
    let orphan = ORPHAN_S.to_string();
    let mut d = Deployment::up_with(&prefix, T124, &[], &["--orphan-idle-timeout", &orphan]);
    assert!(idle(&d), "{:?}", held(&d));
    let iters = iters();
    let mut run = d.start_hosts(0, "inccl-allreduce", COUNT, &["--iters", &iters], &HOST_ENV);
    wait_for(Duration::from_secs(30), || held(&d).iter().all(|(_, c, _)| *c == 1)).unwrap_or_else(
        || panic!("communicator never on every switch: {:?}\n{}", held(&d), d.logs()),
    );
    std::thread::sleep(Duration::from_millis(500));
    let rereg = restart_controller(&mut d, Duration::from_millis(500));
    let still_running = run.running();
    let out = run.wait(Duration::from_secs(180));
    let done = Instant::now();
    d.assert_all_pass("AllReduce across a controller restart", &out);
    let cleaned = wait_for(Duration::from_secs(ORPHAN_S + 5), || idle(&d))
        .unwrap_or_else(|| panic!("switches still hold {:?}\n{}", held(&d), d.logs()));
    let cleanup = cleaned.duration_since(done);
    let ctl_log = std::fs::read_to_string(d.controller_log()).unwrap_or_default();
    if still_running == out.len() {
        // Restarted before the ranks destroyed: the new controller adopted the
        // communicator and rank 0's destroy reached it, so the switches did not wait
        // for their orphan timeout.
        assert!(ctl_log.contains("communicator adopted"), "{ctl_log}");
        assert!(ctl_log.contains("destroyed what=communicator"), "{ctl_log}");
        assert!(cleanup < Duration::from_secs(ORPHAN_S), "cleanup took {cleanup:?}");
    }
    // A new group and communicator on the same switches.
    let run = d.start_hosts(1, "inccl-allreduce", 1 << 16, &["--iters", "3"], &HOST_ENV);
    d.assert_all_pass("new job after the restart", &run.wait(Duration::from_secs(60)));
    let back = wait_for(Duration::from_secs(10), || idle(&d));
    assert!(back.is_some(), "slot memory not back to idle: {:?}", held(&d));
    println!(
        "controller killed mid-AllReduce ({iters} x 4 MiB), restarted after 0.5 s: switches \
         re-registered in {}, ranks still running then: {still_running}/4, all exact; switch \
         state freed {} after the ranks exited; new job passed; test took {}",
        secs(rereg),
        secs(cleanup),
        secs(t_test.elapsed())
    );
    drop(d);
    assert_clean(&prefix);
}

#[test]
fn communicators_destroyed_while_the_controller_is_down_are_freed() {
    if !can_run("destroyed_while_down") {
        return;
    }
    let t_test = Instant::now();
    let prefix = unique_prefix("cr2");
    // Longer than the re-registration can take (backoff up to 2 s), so the restarted
    // controller adopts the orphans before the switches free them.
    let orphan_s = 5;
    let orphan = orphan_s.to_string();
    let mut d = Deployment::up_with(&prefix, T124, &[], &["--orphan-idle-timeout", &orphan]);
    let iters = iters();
    let run = d.start_hosts(0, "inccl-allreduce", COUNT, &["--iters", &iters], &HOST_ENV);
    wait_for(Duration::from_secs(30), || held(&d).iter().all(|(_, c, _)| *c == 1)).unwrap_or_else(
        || panic!("communicator never on every switch: {:?}\n{}", held(&d), d.logs()),
    );
    assert!(d.kill_controller().is_some());
    let out = run.wait(Duration::from_secs(180));
    let done = Instant::now();
    d.assert_all_pass("AllReduce with the controller gone", &out);
    assert!(
        out[0].output.contains("could not be told")
            && out[0].output.contains("group destroyed locally"),
        "rank 0 should warn that the controller could not be told:\n{}",
        out[0].output
    );
    let still = held(&d);
    assert!(still.iter().all(|(_, c, _)| *c == 1), "freed too early: {still:?}");

    // A new job while the controller is down fails within the bootstrap timeout (10 s),
    // every rank naming the controller's address.
    let addr = d.plan.controller_addr.clone();
    let t_new = Instant::now();
    let failed = d.start_hosts(1, "inccl-allreduce", 1 << 10, &[], &HOST_ENV);
    let failed = failed.wait(Duration::from_secs(30));
    let t_fail = t_new.elapsed();
    for o in &failed {
        assert!(
            o.status.is_some_and(|s| !s.success()) && o.output.contains(&addr),
            "rank {} should fail naming {addr}: {:?}\n{}",
            o.rank,
            o.status,
            o.output
        );
    }
    assert!(t_fail < Duration::from_secs(10 + 5), "took {t_fail:?}");

    let before: Vec<(String, usize)> =
        names(&d).into_iter().map(|n| (n.clone(), d.registrations(&n))).collect();
    d.start_controller(None, None);
    let restarted = Instant::now();
    for (n, k) in &before {
        assert!(d.wait_registrations(n, k + 1, Duration::from_secs(15)), "{n} did not register");
    }
    let rereg = restarted.elapsed();
    // Bound: the orphan timeout from the last frame (before the ranks exited), plus one
    // sweep (a quarter of the timeout, at most 1 s), plus slack for the loaded machine.
    let bound = Duration::from_secs(orphan_s + 3);
    let freed = wait_for(bound, || idle(&d)).unwrap_or_else(|| {
        panic!("switches still hold {:?} {bound:?} after the ranks exited\n{}", held(&d), d.logs())
    });
    let cleanup = freed.duration_since(done);
    // The first switch to find it idle frees it and tells the controller, which removes
    // it from the others.
    assert!(total(&d, &["orphans", "expired"]) >= 1, "expired orphans are counted");
    // The controller adopted them and forgot them when the switches reported them expired.
    let forgotten = wait_for(Duration::from_secs(5), || {
        d.controller_status()
            .is_some_and(|s| s["communicators"].as_array().is_some_and(Vec::is_empty))
    });
    assert!(forgotten.is_some(), "controller status: {:?}", d.controller_status());
    let ctl_log = std::fs::read_to_string(d.controller_log()).unwrap_or_default();
    let adopted = ctl_log.contains("communicator adopted");
    println!(
        "ranks destroyed with the controller down (exit 0, warning logged); a new job then \
         failed on every rank naming {addr} in {}; restarted {} after the ranks exited: \
         switches re-registered in {}, communicator adopted: {adopted}; switches held nothing \
         {} after the ranks exited (bound {}); test took {}",
        secs(t_fail),
        secs(restarted.duration_since(done)),
        secs(rereg),
        secs(cleanup),
        secs(bound),
        secs(t_test.elapsed())
    );
    drop(d);
    assert_clean(&prefix);
}

#[test]
fn a_controller_with_another_topology_or_token_is_refused() {
    if !can_run("other_topology_or_token") {
        return;
    }
    let t_test = Instant::now();
    let prefix = unique_prefix("cr3");
    let mut d = Deployment::up(&prefix, T124, &[]);
    let names = names(&d);
    let refused = |d: &Deployment, what: &str| -> Duration {
        let t0 = Instant::now();
        let seen = wait_for(Duration::from_secs(15), || {
            names
                .iter()
                .all(|n| std::fs::read_to_string(d.switch_log(n)).is_ok_and(|l| l.contains(what)))
        });
        assert!(seen.is_some(), "switches did not log `{what}`:\n{}", d.logs());
        t0.elapsed()
    };
    let alive = |d: &mut Deployment, when: &str| {
        assert!(d.controller_running(), "controller died {when}:\n{}", d.logs());
        for n in &names {
            assert!(d.switch_running(n), "switch {n} died {when}:\n{}", d.logs());
            assert!(d.try_stats(n).is_some(), "switch {n} does not answer {when}");
        }
    };

    // Another topology file (the same layout with another default RoCE MTU).
    let other = repo_root().join("tests/topologies/1-2-4-mtu1024.yaml");
    d.kill_controller();
    d.start_controller(Some(&other), None);
    let t_topo = refused(&d, "but this controller serves");
    std::thread::sleep(Duration::from_secs(1));
    alive(&mut d, "with another topology");
    let log = std::fs::read_to_string(d.controller_log()).unwrap_or_default();
    assert!(log.contains("switch registration refused"), "{log}");

    // Another token file: other credentials.
    let tokens = d.logdir.join("other.token");
    Credentials::load_or_create(&tokens).expect("token file");
    d.kill_controller();
    d.start_controller(None, Some(&tokens));
    let t_token = refused(&d, "authentication failed");
    std::thread::sleep(Duration::from_secs(1));
    alive(&mut d, "with another token");

    // The right files again: every switch back, a job passes.
    let rereg = restart_controller(&mut d, Duration::ZERO);
    let run = d.start_hosts(0, "inccl-allreduce", 1 << 16, &["--iters", "3"], &HOST_ENV);
    d.assert_all_pass("job after the refusals", &run.wait(Duration::from_secs(60)));
    println!(
        "restarted with another topology: refused (all switches logged it) within {}; with \
         another token: within {}; with the right files: re-registered in {}; test took {}",
        secs(t_topo),
        secs(t_token),
        secs(rereg),
        secs(t_test.elapsed())
    );
    drop(d);
    assert_clean(&prefix);
}
