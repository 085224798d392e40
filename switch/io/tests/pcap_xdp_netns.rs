//! pcap and AF_XDP backends over a veth pair between two network namespaces created
//! (and always removed) by this test: frames cross in order, the filter keeps only ARP
//! and RoCEv2, the XDP program is attached natively, detached on drop, and a program
//! left on the interface is replaced, and each reports a waiting frame through
//! `rx_ready`. Skips when not root (fails when CI=true).

#![cfg(target_os = "linux")]

use std::fs::File;
use std::time::{Duration, Instant};

use inc_switch_io::af_packet::{AfPacketBackend, AfPacketConfig};
use inc_switch_io::af_xdp::{AfXdpBackend, AfXdpConfig};
use inc_switch_io::libpcap::{PcapBackend, PcapConfig};
use inc_switch_io::xdp_prog::{netlink_set_xdp, XdpMode, XdpProgram};
use inc_switch_io::{Backend, PortSpec};

mod common;
use common::VethPair;

/// Two namespaces joined by a veth pair `a0` <-> `b0` (MTU 9000), or `None` (skip).
fn setup(tag: &str) -> Option<VethPair> {
    VethPair::new("incxp", tag, Some(9000))
}

/// Ethernet/IPv4/UDP frame to `dport` with `seq` in the payload, or an ARP request.
fn frame(src: [u8; 6], dst: [u8; 6], kind: Kind, seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    match kind {
        Kind::Arp => {
            f[12..14].copy_from_slice(&[0x08, 0x06]);
            f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
            f[38..42].copy_from_slice(&seq.to_be_bytes()); // target IP field
        }
        Kind::Udp(dport) => {
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            let ip_len = (len - 14) as u16;
            f[14] = 0x45;
            f[16..18].copy_from_slice(&ip_len.to_be_bytes());
            f[22] = 64;
            f[23] = 17;
            f[26..30].copy_from_slice(&[10, 0, 0, 1]);
            f[30..34].copy_from_slice(&[10, 0, 0, 2]);
            f[34..36].copy_from_slice(&0xc000u16.to_be_bytes());
            f[36..38].copy_from_slice(&dport.to_be_bytes());
            f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
            f[42..46].copy_from_slice(&seq.to_be_bytes());
        }
    }
    f
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Arp,
    Udp(u16),
}

/// What a received frame is: (kind, seq).
fn classify(f: &[u8]) -> Option<(Kind, u32)> {
    match (f.get(12..14)?, f.len()) {
        ([0x08, 0x06], n) if n >= 42 => {
            Some((Kind::Arp, u32::from_be_bytes(f[38..42].try_into().ok()?)))
        }
        ([0x08, 0x00], n) if n >= 46 && f[23] == 17 => {
            let dport = u16::from_be_bytes([f[36], f[37]]);
            Some((Kind::Udp(dport), u32::from_be_bytes(f[42..46].try_into().ok()?)))
        }
        _ => None,
    }
}

/// Send `n` frames of `kind` from `tx` port 0 and collect what `rx` hands over within
/// a deadline (paced so no ring overflows).
fn exchange(
    tx: &mut dyn Backend,
    rx: &mut dyn Backend,
    kinds: &[Kind],
    n: u32,
    len: usize,
) -> Vec<(Kind, u32)> {
    let (src, dst) = (tx.ports()[0].mac, rx.ports()[0].mac);
    let mut got = Vec::new();
    let mut next = 0u32;
    let per_round = kinds.iter().filter(|k| **k != Kind::Udp(9999)).count();
    let want = n as usize * per_round;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        while next < n && (next as usize) * per_round < got.len() + 256 {
            for &k in kinds {
                if tx.tx_buffer().is_none() {
                    tx.flush().unwrap();
                }
                let buf = tx.tx_buffer().unwrap();
                let f = frame(src, dst, k, next, len);
                buf[..f.len()].copy_from_slice(&f);
                tx.commit_tx(0, f.len());
            }
            next += 1;
        }
        tx.flush().unwrap();
        rx.wait(Some(Duration::from_millis(20))).unwrap();
        rx.recv_batch(1024, &mut |p, f| {
            assert_eq!(p, 0);
            if let Some(c) = classify(f) {
                if f.len() == len {
                    got.push(c);
                }
            }
        })
        .unwrap();
        if next == n && got.len() >= want {
            // Give a wrongly passed frame a moment to show up too.
            std::thread::sleep(Duration::from_millis(50));
            rx.recv_batch(1024, &mut |_, f| got.extend(classify(f).filter(|_| f.len() == len)))
                .unwrap();
            break;
        }
    }
    got
}

fn check_filtered_in_order(got: &[(Kind, u32)], n: u32) {
    for k in [Kind::Udp(4791), Kind::Arp] {
        let seqs: Vec<u32> = got.iter().filter(|g| g.0 == k).map(|g| g.1).collect();
        assert_eq!(seqs, (0..n).collect::<Vec<_>>(), "{k:?} frames lost or reordered");
    }
    assert!(!got.iter().any(|g| g.0 == Kind::Udp(9999)), "UDP to port 9999 passed the filter");
}

const KINDS: [Kind; 3] = [Kind::Udp(4791), Kind::Arp, Kind::Udp(9999)];

#[test]
fn pcap_receives_arp_and_roce_in_order_and_filters_the_rest() {
    let Some(ns) = setup("p") else { return };
    let mut a = AfPacketBackend::open(&[ns.port(0)], AfPacketConfig::default()).unwrap();
    let mut b = PcapBackend::open(&[ns.port(1)], PcapConfig::default()).unwrap();
    let got = exchange(&mut a, &mut b, &KINDS, 500, 1100);
    check_filtered_in_order(&got, 500);
    // And the other way round: pcap transmits.
    let got = exchange(&mut b, &mut a, &[Kind::Udp(4791)], 500, 1100);
    assert_eq!(got.len(), 500);
    assert_eq!(b.port_counters(0).tx_packets, 500);
}

#[test]
fn af_xdp_receives_arp_and_roce_in_order_natively_and_passes_the_rest() {
    let Some(ns) = setup("x") else { return };
    let mut a = AfPacketBackend::open(&[ns.port(0)], AfPacketConfig::default()).unwrap();
    let mut b = AfXdpBackend::open(&[ns.port(1)], AfXdpConfig::default()).unwrap();
    assert_eq!(b.mode(0), XdpMode::Native);
    assert_eq!(b.port_detail(0).as_deref(), Some("xdp=native"));
    assert!(ns.link_show(1).contains("xdp"));
    let got = exchange(&mut a, &mut b, &KINDS, 2000, 1100);
    check_filtered_in_order(&got, 2000);
    // AF_XDP transmits: more frames than the transmit UMEM holds, so chunks recycle.
    let got = exchange(&mut b, &mut a, &[Kind::Udp(4791)], 5000, 1100);
    assert_eq!(got.len(), 5000);
    let c = b.port_counters(0);
    assert_eq!(c.tx_packets, 5000);
    assert_eq!(c.tx_dropped, 0);
    drop(b);
    assert!(
        !ns.link_show(1).contains("xdp"),
        "XDP program still attached after the backend closed"
    );
}

#[test]
fn af_xdp_generic_mode_works_when_asked_for() {
    let Some(ns) = setup("g") else { return };
    let mut a = AfPacketBackend::open(&[ns.port(0)], AfPacketConfig::default()).unwrap();
    let cfg = AfXdpConfig { force_generic: true, ..AfXdpConfig::default() };
    let mut b = AfXdpBackend::open(&[ns.port(1)], cfg).unwrap();
    assert_eq!(b.mode(0), XdpMode::Generic);
    let got = exchange(&mut a, &mut b, &KINDS, 500, 1100);
    check_filtered_in_order(&got, 500);
}

/// Frames larger than one 4 KiB UMEM chunk (RoCE MTU 4096 and jumbo frames) cross
/// both ways: received over several descriptors and reassembled, and transmitted over
/// several chunks, in native and in generic mode.
#[test]
fn af_xdp_carries_frames_larger_than_a_chunk_both_ways() {
    for (tag, force_generic) in [("j", false), ("k", true)] {
        let Some(ns) = setup(tag) else { return };
        let mut a = AfPacketBackend::open(&[ns.port(0)], AfPacketConfig::default()).unwrap();
        let cfg = AfXdpConfig { force_generic, ..AfXdpConfig::default() };
        let mut b = AfXdpBackend::open(&[ns.port(1)], cfg).unwrap();
        assert!(b.max_frame_len() >= 9014, "max frame {}", b.max_frame_len());
        let mut sent = 0;
        for len in [4200, 9000, 4096 + 74, 3900] {
            let got = exchange(&mut a, &mut b, &KINDS, 300, len);
            check_filtered_in_order(&got, 300);
            let got = exchange(&mut b, &mut a, &[Kind::Udp(4791)], 1000, len);
            assert_eq!(got.len(), 1000, "{len}-byte frames from AF_XDP (generic: {force_generic})");
            sent += 1000;
        }
        let c = b.port_counters(0);
        assert_eq!((c.tx_packets, c.tx_dropped, c.rx_truncated), (sent, 0, 0), "{c:?}");
        assert_eq!(c.rx_dropped, 0, "{c:?}");
    }
}

#[test]
fn af_xdp_replaces_a_program_left_on_the_interface() {
    let Some(ns) = setup("l") else { return };
    // Attach a program the old way (netlink), as a crashed tool would leave it.
    let netns = ns.names[1].clone();
    std::thread::spawn(move || {
        let f = File::open(format!("/run/netns/{netns}")).unwrap();
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let prog = XdpProgram::load(&[4791]).unwrap();
        let idx = nix::net::if_::if_nametoindex("b0").unwrap();
        netlink_set_xdp(idx, prog.prog_fd(), XdpMode::Native).unwrap();
    })
    .join()
    .unwrap();
    assert!(ns.link_show(1).contains("xdp"));
    let mut a = AfPacketBackend::open(&[ns.port(0)], AfPacketConfig::default()).unwrap();
    let mut b = AfXdpBackend::open(&[ns.port(1)], AfXdpConfig::default()).unwrap();
    let got = exchange(&mut a, &mut b, &[Kind::Udp(4791)], 100, 500);
    assert_eq!(got.len(), 100);
    drop(b);
    assert!(!ns.link_show(1).contains("xdp"));
}

#[test]
fn idle_pcap_and_af_xdp_waits_do_not_spin() {
    let Some(ns) = setup("w") else { return };
    let backends: Vec<Box<dyn Backend>> = vec![
        Box::new(PcapBackend::open(&[ns.port(0)], PcapConfig::default()).unwrap()),
        Box::new(AfXdpBackend::open(&[ns.port(1)], AfXdpConfig::default()).unwrap()),
    ];
    for mut be in backends {
        common::assert_idle_waits_sleep(&mut *be, 3);
        let w = be.waker();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w.wake();
        });
        let t0 = Instant::now();
        be.wait(Some(Duration::from_secs(10))).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5), "{} waker ignored", be.name());
        h.join().unwrap();
    }
}

#[test]
fn missing_interfaces_are_named() {
    let Some(ns) = setup("e") else { return };
    let bad: PortSpec = format!("{}/nope0", ns.names[0]).parse().unwrap();
    let e = PcapBackend::open(std::slice::from_ref(&bad), PcapConfig::default()).unwrap_err();
    assert!(e.to_string().contains("nope0"), "{e}");
    let e = AfXdpBackend::open(&[bad], AfXdpConfig::default()).unwrap_err();
    assert!(e.to_string().contains("nope0"), "{e}");
}

/// What the event loop busy-polls: an idle port is not ready, a frame from the peer
/// makes it ready without a wait, and receiving it makes it idle again.
#[test]
fn rx_ready_reports_a_waiting_frame() {
    let Some(ns) = setup("r") else { return };
    let mut tx = AfPacketBackend::open(&[ns.port(0)], AfPacketConfig::default()).unwrap();
    // One at a time: AF_XDP's program would take the frames from the others.
    for kind in 0..3 {
        let port = [ns.port(1)];
        let mut rx: Box<dyn Backend> = match kind {
            0 => Box::new(PcapBackend::open(&port, PcapConfig::default()).unwrap()),
            1 => Box::new(AfXdpBackend::open(&port, AfXdpConfig::default()).unwrap()),
            _ => Box::new(AfPacketBackend::open(&port, AfPacketConfig::default()).unwrap()),
        };
        let name = rx.name();
        // Whatever the open left behind (e.g. IPv6 router solicitations) goes first.
        rx.recv_batch(1024, &mut |_, _| {}).unwrap();
        let (src, dst) = (tx.ports()[0].mac, rx.ports()[0].mac);
        let f = frame(src, dst, Kind::Udp(4791), 1, 128);
        tx.tx_buffer().unwrap()[..f.len()].copy_from_slice(&f);
        tx.commit_tx(0, f.len());
        tx.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        while rx.rx_ready() != Some(true) {
            assert!(Instant::now() < deadline, "{name}: frame never reported ready");
            std::thread::yield_now();
        }
        let mut got = 0;
        rx.recv_batch(1024, &mut |_, g| {
            got += usize::from(classify(g) == Some((Kind::Udp(4791), 1)))
        })
        .unwrap();
        assert_eq!(got, 1, "{name}");
        assert_eq!(rx.rx_ready(), Some(false), "{name}: ready after the ring was drained");
    }
}
