//! `scripts/netns-up` / `netns-down` against the real kernel: bring 1-2-4 up under a
//! unique prefix, run the controller in its namespace, query it from a host namespace
//! over the management network, tear down and check nothing is left.
//! Skipped (with a message) when not root or when namespaces are unavailable.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &str, args: &[&str]) -> Output {
    Command::new(cmd)
        .args(args)
        .env("INC_CONTROLLER", env!("CARGO_BIN_EXE_inc-controller"))
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let s = repo().join("scripts/netns-down");
        let _ = run(s.to_str().unwrap(), &["--prefix", &self.0, "--kill"]);
    }
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn namespaces(prefix: &str) -> Vec<String> {
    stdout(&run("ip", &["netns", "list"]))
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect()
}

#[test]
fn netns_up_and_down() {
    if !inc_test_support::netns_ready("netns_up_and_down") {
        return;
    }
    let prefix = format!("ct{}", std::process::id() % 100_000);
    let up = repo().join("scripts/netns-up");
    let topo = repo().join("topologies/1-2-4.yaml");
    let guard = Down(prefix.clone());
    let o = run(up.to_str().unwrap(), &[topo.to_str().unwrap(), "--prefix", &prefix]);
    assert!(o.status.success(), "netns-up failed: {}", String::from_utf8_lossy(&o.stderr));
    let mut ns = namespaces(&prefix);
    ns.sort();
    let want: Vec<String> = ["ctrl", "h0", "h1", "h2", "h3", "leaf1", "leaf2", "root"]
        .iter()
        .map(|e| format!("{prefix}-{e}"))
        .collect();
    assert_eq!(ns, want);

    // Host data interface: IP and auto MAC; switch ports: MAC, no IPv4.
    let h0 = format!("{prefix}-h0");
    let a = stdout(&run("ip", &["-n", &h0, "-br", "addr", "show", "eth0"]));
    assert!(a.contains("10.1.1.21/24"), "{a}");
    let l = stdout(&run("ip", &["-n", &h0, "-br", "link", "show", "eth0"]));
    assert!(l.contains("02:00:0a:01:01:15"), "{l}");
    let leaf1 = format!("{prefix}-leaf1");
    let a = stdout(&run("ip", &["-n", &leaf1, "-4", "addr", "show", "h0"]));
    assert!(!a.contains("inet "), "switch port must have no IPv4 address: {a}");
    let f = stdout(&run("ip", &["netns", "exec", &leaf1, "sysctl", "-n", "net.ipv4.ip_forward"]));
    assert_eq!(f.trim(), "0");

    // Controller in its namespace, queried from h0 over the management network.
    let ctrl = Command::new("ip")
        .args(["netns", "exec", &format!("{prefix}-ctrl"), env!("CARGO_BIN_EXE_inc-controller")])
        .args(["serve", "--topology", topo.to_str().unwrap(), "--listen", "10.0.0.1:7000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _ctrl = Kill(ctrl);
    let deadline = Instant::now() + Duration::from_secs(10);
    let report = loop {
        let o = run(
            "ip",
            &[
                "netns",
                "exec",
                &h0,
                env!("CARGO_BIN_EXE_inc-controller"),
                "status",
                "--controller",
                "10.0.0.1:7000",
            ],
        );
        if o.status.success() {
            break stdout(&o);
        }
        assert!(
            Instant::now() < deadline,
            "controller unreachable from h0: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(report.contains("topology 1-2-4") && report.contains("NOT CONNECTED"), "{report}");
    drop(_ctrl);

    drop(guard);
    assert!(namespaces(&prefix).is_empty(), "namespaces left behind");
    assert!(!PathBuf::from(format!("/run/inc-emulator/{prefix}.state")).exists());
}
