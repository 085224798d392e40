//! Garbage for a running switch: frames of each kind a broken or hostile neighbour can
//! send, each with the drop reason the switch must count it under, and an injector
//! that sends them from inside a namespace over AF_PACKET (the switch's own backend,
//! so the test needs no `unsafe`).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use inc_switch_io::af_packet::{AfPacketBackend, AfPacketConfig};
use inc_switch_io::{Backend, PortSpec, Waker};
use inc_wire::{
    BthRepr, EthAddrs, EtherType, EthernetAddress, EthernetFrame, Opcode, Psn, RoceRepr,
};
use rand::Rng;

/// Payload marker of injected frames with a valid ICRC: a switch that forwarded one
/// would put these bytes on another link.
pub const MARKER: &[u8; 16] = b"INC-FAULT-MARKER";

/// Kinds of garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Garbage {
    /// Random bytes (half of them dressed as IPv4/UDP:4791 to get past the first checks).
    Random,
    /// A valid RoCEv2 frame cut short.
    Truncated,
    /// A valid RoCEv2 frame to a known QP with one ICRC bit flipped.
    BadIcrc,
    /// A valid RoCEv2 frame to a QPN the switch does not have.
    UnknownQpn,
    /// A valid RoCEv2 frame to a known QP from another source address.
    Spoofed,
}

impl Garbage {
    /// Every kind.
    pub const ALL: [Garbage; 5] = [
        Garbage::Random,
        Garbage::Truncated,
        Garbage::BadIcrc,
        Garbage::UnknownQpn,
        Garbage::Spoofed,
    ];
}

/// Where garbage goes and what it pretends to be.
#[derive(Debug, Clone)]
pub struct Target {
    /// The switch port's MAC and IP.
    pub port_mac: [u8; 6],
    /// The switch port's IP.
    pub port_ip: Ipv4Addr,
    /// MAC of the injecting host.
    pub host_mac: [u8; 6],
    /// IP of the injecting host (the rightful peer of `known_qpn`).
    pub host_ip: Ipv4Addr,
    /// An address that is not the peer of `known_qpn`.
    pub spoof_ip: Ipv4Addr,
    /// A switch-side QPN installed for the injecting host.
    pub known_qpn: u32,
    /// Every switch-side QPN installed on the switch (unknown ones avoid these).
    pub installed: Vec<u32>,
}

fn roce(t: &Target, src: Ipv4Addr, qpn: u32, psn: u32, buf: &mut [u8]) -> usize {
    let mut r = RoceRepr::new(
        EthAddrs { src: EthernetAddress(t.host_mac), dst: EthernetAddress(t.port_mac) },
        src,
        t.port_ip,
        49152,
        BthRepr::new(Opcode::RcSendOnly, qpn, Psn::new(psn)),
    );
    r.payload_len = 64;
    r.emit(buf, |p| {
        p.fill(0);
        p[..MARKER.len()].copy_from_slice(MARKER);
    })
    .expect("emit")
}

/// Write one frame of kind `kind` into `buf` (at least 1514 bytes); returns its length
/// and the drop reason the switch must count (a key of its `drops` counters).
pub fn make(
    kind: Garbage,
    t: &Target,
    rng: &mut impl Rng,
    buf: &mut [u8],
) -> (usize, &'static str) {
    loop {
        let len = match kind {
            Garbage::Random => {
                let len = rng.gen_range(60..=1514);
                rng.fill_bytes(&mut buf[..len]);
                buf[..6].copy_from_slice(&t.port_mac);
                if rng.gen_bool(0.5) {
                    buf[12..14].copy_from_slice(&[0x08, 0x00]);
                    buf[14] = 0x45;
                    buf[14 + 9] = 17;
                    buf[36..38].copy_from_slice(&inc_wire::ROCEV2_PORT.to_be_bytes());
                }
                len
            }
            Garbage::Truncated => {
                let full = roce(t, t.host_ip, t.known_qpn, rng.gen_range(0..1 << 24), buf);
                rng.gen_range(14..full)
            }
            Garbage::BadIcrc => {
                let len = roce(t, t.host_ip, t.known_qpn, rng.gen_range(0..1 << 24), buf);
                buf[len - 1 - rng.gen_range(0..4)] ^= 1 << rng.gen_range(0..8);
                len
            }
            Garbage::UnknownQpn => {
                let qpn = loop {
                    let q = rng.gen_range(2..1 << 24);
                    if !t.installed.contains(&q) {
                        break q;
                    }
                };
                roce(t, t.host_ip, qpn, rng.gen_range(0..1 << 24), buf)
            }
            Garbage::Spoofed => roce(t, t.spoof_ip, t.known_qpn, rng.gen_range(0..1 << 24), buf),
        };
        if let Some(reason) = classify(&buf[..len], t) {
            return (len, reason);
        }
        // An ARP frame by chance: the switch answers those; draw again.
    }
}

/// The drop reason the switch engine gives `frame` (mirrors its checks, in order);
/// `None` for ARP, which is not dropped.
pub fn classify(frame: &[u8], t: &Target) -> Option<&'static str> {
    let Ok(eth) = EthernetFrame::new_checked(frame) else { return Some("malformed") };
    if eth.ethertype() == EtherType::Arp {
        return None;
    }
    let parsed = match RoceRepr::parse(frame) {
        Ok(p) => p,
        Err(inc_wire::Error::NotRoce { .. }) => return Some("not_roce"),
        Err(_) => return Some("malformed"),
    };
    if !parsed.icrc_ok {
        return Some("bad_icrc");
    }
    let r = &parsed.repr;
    if !t.installed.contains(&r.bth.dest_qp) {
        return Some("unknown_qpn");
    }
    if r.ip_src != t.host_ip || r.ip_dst != t.port_ip {
        return Some("wrong_peer");
    }
    panic!("garbage generator made a frame the switch accepts: {r:?}");
}

/// Sends raw frames out of one interface.
#[derive(Debug)]
pub struct Injector {
    io: AfPacketBackend,
}

impl Injector {
    /// Open `ifname` in namespace `netns`.
    pub fn open(netns: &str, ifname: &str) -> Injector {
        let spec = PortSpec { netns: Some(netns.to_string()), ifname: ifname.to_string() };
        let cfg = AfPacketConfig { promiscuous: false, ..AfPacketConfig::default() };
        let io = AfPacketBackend::open(&[spec], cfg).expect("AF_PACKET injector");
        Injector { io }
    }

    /// Send `frame`; frames are flushed in batches (call [`Injector::flush`] at the end).
    pub fn send(&mut self, frame: &[u8]) {
        if self.io.tx_buffer().is_none() {
            self.io.flush().expect("injector flush");
        }
        let buf = self.io.tx_buffer().expect("tx buffer after flush");
        buf[..frame.len()].copy_from_slice(frame);
        self.io.commit_tx(0, frame.len());
    }

    /// Send what is queued.
    pub fn flush(&mut self) {
        self.io.flush().expect("injector flush");
    }

    /// Frames that could not be sent.
    pub fn tx_dropped(&mut self) -> u64 {
        self.io.port_counters(0).tx_dropped
    }
}

/// What a [`Sniffer`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sniffed {
    /// Frames seen.
    pub frames: u64,
    /// Frames carrying [`MARKER`].
    pub marked: u64,
    /// Frames the kernel dropped because the sniffer's ring was full.
    pub missed: u64,
}

/// Counts, on a thread of its own, the received frames of one interface that carry
/// [`MARKER`], until [`Sniffer::stop`].
#[derive(Debug)]
pub struct Sniffer {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<JoinHandle<Sniffed>>,
}

impl Sniffer {
    /// Listen on `ifname` in namespace `netns`.
    pub fn open(netns: &str, ifname: &str) -> Sniffer {
        let spec = PortSpec { netns: Some(netns.to_string()), ifname: ifname.to_string() };
        let cfg = AfPacketConfig { promiscuous: false, ..AfPacketConfig::default() };
        let mut io = AfPacketBackend::open(&[spec], cfg).expect("AF_PACKET sniffer");
        let stop = Arc::new(AtomicBool::new(false));
        let waker = io.waker();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Sniffed::default();
            while !flag.load(Ordering::Relaxed) {
                io.recv_batch(256, &mut |_, f| {
                    seen.frames += 1;
                    if f.windows(MARKER.len()).any(|w| w == MARKER) {
                        seen.marked += 1;
                    }
                })
                .expect("sniffer receive");
                io.wait(Some(Duration::from_millis(50))).expect("sniffer wait");
            }
            seen.missed = io.port_counters(0).rx_dropped;
            seen
        });
        Sniffer { stop, waker, thread: Some(thread) }
    }

    /// Stop listening; what was seen.
    pub fn stop(mut self) -> Sniffed {
        self.stop.store(true, Ordering::Relaxed);
        self.waker.wake();
        self.thread.take().map(|t| t.join().expect("sniffer thread")).unwrap_or_default()
    }
}

impl Drop for Sniffer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
