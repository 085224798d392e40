//! AF_PACKET backend over a veth pair between two network namespaces created (and
//! always removed) by this test. Skips when not root or without `ip netns`.

#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use inc_switch_io::af_packet::{AfPacketBackend, AfPacketConfig, RxRing};
use inc_switch_io::{Backend, PortSpec};

mod common;
use common::{ip, VethPair};

/// Two namespaces joined by a veth pair `a0` <-> `b0`, or `None` (skip).
fn setup(tag: &str) -> Option<VethPair> {
    VethPair::new("incio", tag, None)
}

fn frame(src: [u8; 6], dst: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental ethertype
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    f
}

#[test]
fn frames_cross_a_veth_pair_between_namespaces_v3() {
    frames_cross(RxRing::V3, "x3");
}

#[test]
fn frames_cross_a_veth_pair_between_namespaces_v2() {
    frames_cross(RxRing::V2, "x2");
}

fn frames_cross(ring: RxRing, tag: &str) {
    let Some(ns) = setup(tag) else { return };
    let pa: PortSpec = format!("{}/a0", ns.names[0]).parse().unwrap();
    let pb: PortSpec = format!("{}/b0", ns.names[1]).parse().unwrap();
    let cfg = AfPacketConfig { ring, ..AfPacketConfig::default() };
    let mut a = AfPacketBackend::open(&[pa], cfg.clone()).unwrap();
    let mut b = AfPacketBackend::open(&[pb], cfg).unwrap();
    let (mac_a, mac_b) = (a.ports()[0].mac, b.ports()[0].mac);
    assert_ne!(mac_a, [0; 6]);

    const N: u32 = 1000;
    let mut seqs = Vec::new();
    let mut next = 0u32;
    let deadline = Instant::now() + Duration::from_secs(10);
    while (seqs.len() as u32) < N && Instant::now() < deadline {
        // Send in batches of up to 64, paced by what arrived, so no ring overflows.
        while next < N && next < seqs.len() as u32 + 256 {
            let Some(buf) = a.tx_buffer() else { break };
            let f = frame(mac_a, mac_b, next, 1000);
            buf[..f.len()].copy_from_slice(&f);
            a.commit_tx(0, f.len());
            next += 1;
        }
        a.flush().unwrap();
        b.wait(Some(Duration::from_millis(50))).unwrap();
        b.recv_batch(1024, &mut |p, f| {
            assert_eq!(p, 0);
            if f.len() == 1000 && f[12..14] == [0x88, 0xb5] {
                seqs.push(u32::from_be_bytes(f[14..18].try_into().unwrap()));
            }
        })
        .unwrap();
    }
    assert_eq!(seqs, (0..N).collect::<Vec<_>>(), "frames lost or reordered");
    let ca = a.port_counters(0);
    let cb = b.port_counters(0);
    assert_eq!(ca.tx_packets, u64::from(N));
    assert!(cb.rx_packets >= u64::from(N));
    // Own transmissions are not looped back into the sender's receive ring.
    let mut echoed = 0;
    a.recv_batch(1 << 20, &mut |_, f| echoed += usize::from(f.len() == 1000)).unwrap();
    assert_eq!(echoed, 0);
}

#[test]
fn wait_blocks_until_timeout_or_waker_without_spinning() {
    for (ring, tag) in [(RxRing::V3, "w3"), (RxRing::V2, "w2")] {
        idle_wait(ring, tag);
    }
}

fn idle_wait(ring: RxRing, tag: &str) {
    let Some(ns) = setup(tag) else { return };
    let pa: PortSpec = format!("{}/a0", ns.names[0]).parse().unwrap();
    let cfg = AfPacketConfig { ring, ..AfPacketConfig::default() };
    let mut a = AfPacketBackend::open(&[pa], cfg).unwrap();
    // 500 ms of waiting must cost far less than 5% of a core (25 ms = 2.5 ticks).
    common::assert_idle_waits_sleep(&mut a, 3);

    let w = a.waker();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        w.wake();
    });
    let t0 = Instant::now();
    a.wait(Some(Duration::from_secs(10))).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "waker did not interrupt wait");
    h.join().unwrap();
}

#[test]
fn frames_larger_than_a_block_are_dropped_and_counted() {
    let Some(ns) = setup("t") else { return };
    for n in &ns.names {
        let ifn = if n.ends_with("-a") { "a0" } else { "b0" };
        assert!(ip(&["-n", n, "link", "set", ifn, "mtu", "9000"]));
    }
    let pa: PortSpec = format!("{}/a0", ns.names[0]).parse().unwrap();
    let pb: PortSpec = format!("{}/b0", ns.names[1]).parse().unwrap();
    let mut a = AfPacketBackend::open(&[pa], AfPacketConfig::default()).unwrap();
    let small = AfPacketConfig { ring: RxRing::V3, block_size: 4096, ..AfPacketConfig::default() };
    let mut b = AfPacketBackend::open(&[pb], small).unwrap();
    let (mac_a, mac_b) = (a.ports()[0].mac, b.ports()[0].mac);
    for (seq, len) in [(1u32, 6000usize), (2, 1000)] {
        let f = frame(mac_a, mac_b, seq, len);
        let buf = a.tx_buffer().unwrap();
        buf[..f.len()].copy_from_slice(&f);
        a.commit_tx(0, f.len());
    }
    a.flush().unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_empty() && Instant::now() < deadline {
        b.wait(Some(Duration::from_millis(50))).unwrap();
        b.recv_batch(64, &mut |_, f| {
            if f[12..14] == [0x88, 0xb5] {
                got.push(f.len());
            }
        })
        .unwrap();
    }
    assert_eq!(got, vec![1000]);
    assert_eq!(b.port_counters(0).rx_truncated, 1);
}

#[test]
fn a_vanished_interface_is_reported_without_spinning() {
    let Some(ns) = setup("g") else { return };
    let pa: PortSpec = format!("{}/a0", ns.names[0]).parse().unwrap();
    let mut a = AfPacketBackend::open(&[pa], AfPacketConfig::default()).unwrap();
    assert!(ip(&["-n", &ns.names[0], "link", "del", "a0"]));
    common::assert_idle_waits_sleep(&mut a, 5);
    assert!(a.port_counters(0).link_errors >= 1);
}

#[test]
fn missing_interface_and_namespace_are_named_in_errors() {
    let Some(ns) = setup("e") else { return };
    let bad_if: PortSpec = format!("{}/nope0", ns.names[0]).parse().unwrap();
    let e = AfPacketBackend::open(&[bad_if], AfPacketConfig::default()).unwrap_err();
    assert!(e.to_string().contains("nope0"), "{e}");
    let bad_ns: PortSpec = "incio-no-such-ns/a0".parse().unwrap();
    let e = AfPacketBackend::open(&[bad_ns], AfPacketConfig::default()).unwrap_err();
    assert!(e.to_string().contains("incio-no-such-ns"), "{e}");
}

/// A host on a veth with transmit checksum offload (the kernel's default) hands a UDP
/// GSO send to the link whole; a host-facing port says it takes such frames, splits
/// one into the datagrams sent (IPv4 IDs first + k, what the sender stamped ICRCs for)
/// and counts it. A port not listed as host-facing does not claim to.
#[test]
fn a_host_facing_veth_port_splits_a_whole_gso_send_into_its_datagrams() {
    let Some(ns) = setup("h") else { return };
    let pb = ns.port(1);
    let host_facing = AfPacketConfig { host_ports: vec![pb.clone()], ..AfPacketConfig::default() };
    let mut b = AfPacketBackend::open(std::slice::from_ref(&pb), host_facing).unwrap();
    assert!(b.takes_gso_frames(0), "a veth listed in host_ports takes whole GSO frames");
    let plain = AfPacketBackend::open(&[pb], AfPacketConfig::default()).unwrap();
    assert!(!plain.takes_gso_frames(0));
    drop(plain);

    let mac_b = b.ports()[0].mac;
    let mac_b = mac_b.map(|x| format!("{x:02x}")).join(":");
    let a = &ns.names[0];
    assert!(ip(&["-n", a, "addr", "add", "10.99.0.1/24", "dev", "a0"]));
    assert!(ip(&[
        "-n",
        a,
        "neigh",
        "add",
        "10.99.0.2",
        "lladdr",
        &mac_b,
        "dev",
        "a0",
        "nud",
        "permanent"
    ]));
    // Three datagrams of 1000 bytes (the last 500) in one send: UDP_SEGMENT (103).
    let send = "import socket\n\
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
        s.setsockopt(socket.IPPROTO_UDP, 103, 1000)\n\
        s.sendto(bytes(k // 1000 + 1 for k in range(2500)), ('10.99.0.2', 4791))\n";
    let ok = std::process::Command::new("ip")
        .args(["netns", "exec", a, "python3", "-c", send])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "GSO send from {a}");

    let mut got: Vec<(u16, usize, u8)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < 3 && Instant::now() < deadline {
        b.wait(Some(Duration::from_millis(50))).unwrap();
        b.recv_batch(64, &mut |_, f| {
            let udp = f.len() >= 42 && f[12..14] == [0x08, 0x00] && f[23] == 17;
            if udp && f[36..38] == 4791u16.to_be_bytes() {
                let ident = u16::from_be_bytes([f[18], f[19]]);
                let ip_len = usize::from(u16::from_be_bytes([f[16], f[17]]));
                assert_eq!(ip_len, f.len() - 14, "IPv4 total length of a segment");
                assert_eq!(inc_wire::ipv4::internet_checksum(&f[14..34]), 0, "IPv4 checksum");
                got.push((ident, f.len() - 42, f[42]));
            }
        })
        .unwrap();
    }
    let base = got.first().map_or(0, |g| g.0);
    let want: Vec<_> = [(1000, 1), (1000, 2), (500, 3)]
        .iter()
        .enumerate()
        .map(|(k, &(len, first))| (base.wrapping_add(k as u16), len, first))
        .collect();
    assert_eq!(got, want, "segments (IPv4 ID, UDP payload length, first byte)");
    let c = b.port_counters(0);
    assert_eq!((c.rx_gso_frames, c.rx_truncated), (1, 0), "{c:?}");
}
