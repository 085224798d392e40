//! Root-only tests of the DPDK backend over a veth pair in a fresh network namespace
//! (EAL `--no-huge --no-pci`, af_packet vdevs hot-plugged inside the namespace).
//! Skipped when not root, except with CI=true where that is a failure.

use std::process::Command;
use std::time::{Duration, Instant};

use super::*;

/// Ethertype of the test frames (IEEE local experimental), so kernel noise is ignored.
const ETHERTYPE: [u8; 2] = [0x88, 0xb5];

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace holding veth pair `va`/`vb`, deleted on drop.
struct VethNs(String);

impl VethNs {
    fn new(tag: &str) -> Option<Self> {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let root = status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
        if !root {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true but not root");
            eprintln!("SKIP: DPDK veth test needs root");
            return None;
        }
        let name = format!("incdpdk{tag}{}", std::process::id());
        ip(&["netns", "add", &name]);
        let ns = VethNs(name);
        ip(&["-n", &ns.0, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb"]);
        for ifn in ["va", "vb"] {
            ip(&["-n", &ns.0, "link", "set", "dev", ifn, "up"]);
        }
        Some(ns)
    }
}

impl Drop for VethNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Queue a test frame of `len` bytes from port `from` to the other port's MAC.
fn queue(be: &mut DpdkBackend, from: usize, len: usize, seq: u8) {
    let (src, dst) = (be.ports()[from].mac, be.ports()[1 - from].mac);
    let buf = be.tx_buffer().expect("a transmit buffer");
    buf[..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    buf[12..14].copy_from_slice(&ETHERTYPE);
    for (i, b) in buf[14..len].iter_mut().enumerate() {
        *b = seq.wrapping_add(i as u8);
    }
    be.commit_tx(from, len);
}

/// Receive test frames until `n` arrived or 5 s passed.
fn collect(be: &mut DpdkBackend, n: usize) -> Vec<(usize, Vec<u8>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < n && Instant::now() < deadline {
        be.recv_batch(256, &mut |p, f| {
            if f.len() >= 14 && f[12..14] == ETHERTYPE {
                got.push((p, f.to_vec()));
            }
        })
        .unwrap();
        be.wait(Some(Duration::from_millis(10))).unwrap();
    }
    got
}

#[test]
fn frames_of_every_size_cross_a_veth_pair_both_ways() {
    let Some(ns) = VethNs::new("x") else { return };
    let specs: Vec<PortSpec> =
        ["va", "vb"].iter().map(|i| format!("{}/{i}", ns.0).parse().unwrap()).collect();
    let mut be = DpdkBackend::open(&specs, DpdkConfig::default()).expect("open DPDK ports");
    assert_eq!(be.name(), "dpdk");
    assert_eq!(be.ports().len(), 2);
    for p in be.ports() {
        assert_eq!(p.mtu, Some(1500));
        assert_ne!(p.mac, [0; 6]);
        assert!(ip(&["-n", &ns.0, "link", "show", &p.spec.ifname]).contains("PROMISC"));
    }
    assert_eq!(be.max_frame_len(), 1518);

    let sizes = [60usize, 61, 1000, 1514];
    for from in [0, 1] {
        for (k, &len) in sizes.iter().enumerate() {
            queue(&mut be, from, len, k as u8);
        }
        assert_eq!(be.flush().unwrap(), sizes.len());
        let got = collect(&mut be, sizes.len());
        assert_eq!(got.len(), sizes.len(), "frames from port {from}");
        for (k, (port, frame)) in got.iter().enumerate() {
            assert_eq!(*port, 1 - from);
            assert_eq!(frame.len(), sizes[k]);
            assert_eq!(frame[..6], be.ports()[1 - from].mac);
            assert!(frame[14..]
                .iter()
                .enumerate()
                .all(|(i, b)| *b == (k as u8).wrapping_add(i as u8)));
        }
    }
    let total: u64 = sizes.iter().map(|&l| l as u64).sum();
    for p in 0..2 {
        let c = be.port_counters(p);
        assert_eq!((c.tx_packets, c.tx_bytes, c.tx_dropped), (4, total, 0), "port {p}: {c:?}");
        assert!(c.rx_packets >= 4 && c.rx_bytes >= total, "port {p}: {c:?}");
    }

    // Idle: after many empty polls the back-off naps; the waker cuts a nap short
    // (with a 60 s cap, returning at all shows the wake-up worked).
    be.idle.max = Duration::from_secs(60);
    for _ in 0..64 {
        be.idle.empty_poll();
    }
    let waker = be.waker();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        waker.wake();
    });
    let start = Instant::now();
    be.wait(None).unwrap();
    assert!(start.elapsed() < Duration::from_secs(30), "waker did not interrupt the idle nap");
    t.join().unwrap();

    drop(be);
    for ifn in ["va", "vb"] {
        assert!(
            !ip(&["-n", &ns.0, "link", "show", ifn]).contains("PROMISC"),
            "{ifn} left promiscuous"
        );
    }
}

#[test]
fn a_missing_interface_is_named_in_the_error() {
    let Some(ns) = VethNs::new("m") else { return };
    let spec: PortSpec = format!("{}/nosuch0", ns.0).parse().unwrap();
    let err = DpdkBackend::open(&[spec], DpdkConfig::default()).unwrap_err().to_string();
    assert!(err.contains("nosuch0") && err.contains(&ns.0), "{err}");
}
