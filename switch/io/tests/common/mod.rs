//! Shared by this crate's namespace tests: two network namespaces joined by a veth
//! pair `a0` <-> `b0`, removed on drop. Each test binary uses a part of it.

#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use inc_switch_io::{Backend, PortSpec};

/// Two namespaces, `names[0]` holding `a0` and `names[1]` holding `b0`; deleted on drop.
pub struct VethPair {
    pub names: Vec<String>,
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

impl VethPair {
    /// Create `{prefix}-{pid}-{tag}-a` and `-b` joined by `a0` <-> `b0`, both up, with
    /// `mtu` if given; `None` (skip) without root or `ip netns` (fails when CI=true).
    pub fn new(prefix: &str, tag: &str, mtu: Option<u32>) -> Option<VethPair> {
        if !inc_test_support::netns_ready(&format!("{prefix}::{tag}")) {
            return None;
        }
        let a = format!("{prefix}-{}-{tag}-a", std::process::id());
        let b = format!("{prefix}-{}-{tag}-b", std::process::id());
        let pair = VethPair { names: vec![a.clone(), b.clone()] };
        assert!(ip(&["netns", "add", &a]) && ip(&["netns", "add", &b]));
        // No IPv6 on the test links: its router solicitations, MLD reports and DAD
        // probes would land in the rings of tests that expect an idle link.
        for ns in [&a, &b] {
            for key in ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
            {
                let ok = Command::new("ip")
                    .args(["netns", "exec", ns, "sysctl", "-qw", key])
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "sysctl {key} in {ns}");
            }
        }
        assert!(ip(&[
            "-n", &a, "link", "add", "a0", "type", "veth", "peer", "name", "b0", "netns", &b
        ]));
        for (ns, ifn) in [(&a, "a0"), (&b, "b0")] {
            if let Some(mtu) = mtu {
                assert!(ip(&["-n", ns, "link", "set", ifn, "mtu", &mtu.to_string()]));
            }
            assert!(ip(&["-n", ns, "link", "set", ifn, "up"]));
        }
        Some(pair)
    }

    /// Port spec of side `i` (0: `a0`, 1: `b0`).
    pub fn port(&self, i: usize) -> PortSpec {
        let ifn = if i == 0 { "a0" } else { "b0" };
        format!("{}/{ifn}", self.names[i]).parse().unwrap()
    }

    /// `ip -n NS link show IFNAME` of side `i`.
    pub fn link_show(&self, i: usize) -> String {
        let ifn = if i == 0 { "a0" } else { "b0" };
        ip_out(&["-n", &self.names[i], "link", "show", ifn])
    }
}

/// Run `ip ARGS`; true on success.
pub fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().map(|s| s.success()).unwrap_or(false)
}

/// Standard output of `ip ARGS`.
pub fn ip_out(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits of 50 ms on an idle backend for 500 ms, asserting that they neither spin nor
/// burn more than `max_ticks` clock ticks of CPU (a tick is 10 ms). Ten waits fill
/// 500 ms and a spinning wait returns thousands of times; up to 20 are allowed because
/// a signal (EINTR) may legitimately end a wait early.
pub fn assert_idle_waits_sleep(be: &mut dyn Backend, max_ticks: u64) {
    let t0 = Instant::now();
    let cpu0 = cpu_ticks();
    let mut waits = 0;
    while t0.elapsed() < Duration::from_millis(500) {
        be.wait(Some(Duration::from_millis(50))).unwrap();
        be.recv_batch(64, &mut |_, _| {}).unwrap();
        waits += 1;
    }
    let burnt = cpu_ticks() - cpu0;
    assert!(waits <= 20, "{}: idle wait returned {waits} times in 500 ms", be.name());
    assert!(burnt <= max_ticks, "{}: {waits} idle waits burnt {burnt} ticks", be.name());
}

/// utime + stime of the calling thread in clock ticks (other tests run in parallel
/// threads of the same process).
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}
