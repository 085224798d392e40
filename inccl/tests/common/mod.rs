//! In-process test fabric: the real controller service and the real switch engines,
//! driven over UDP sockets, inside a private network namespace of the test thread.
//!
//! The test thread `unshare`s a new network namespace (needs root), brings `lo` up and
//! puts every switch-port and host address of the topology on it, so the topology's
//! own addresses work and no packet leaves the namespace. The namespace disappears
//! with the test thread. Each switch port is a UDP socket on `port_ip:4791`; frames the
//! engines emit are sent from `src_ip:src_port` to `dst_ip:dst_port` of their headers.
#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inc_controller::{Controller, ServiceConfig, Topology};
use inc_ctrl_proto::{PortInfo, Push, PushRequest, SwitchSession};
use inc_protocol::Time;
use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig};
use inc_wire::{
    BthPacket, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr,
    UdpPacket, UdpRepr,
};
use inccl::GroupConfig;

/// Path of a topology in the repository's `topologies/`.
pub fn topology_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../topologies").join(name)
}

/// Move the calling thread into a fresh network namespace with `ips` on `lo`.
/// Returns false (the caller skips) if namespaces are not permitted here.
pub fn enter_netns(ips: &[Ipv4Addr]) -> bool {
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        inc_test_support::skip(
            "inccl namespace test",
            &format!("cannot create a network namespace ({e}); run the tests as root"),
        );
        return false;
    }
    let run = |args: &[&str]| {
        let st = Command::new("ip").args(args).status().expect("running ip(8)");
        assert!(st.success(), "ip {args:?} failed");
    };
    run(&["link", "set", "lo", "up"]);
    for ip in ips {
        run(&["addr", "add", &format!("{ip}/32"), "dev", "lo"]);
    }
    true
}

/// A free TCP port on 127.0.0.1 (for rank 0's bootstrap listener).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Controller + switches of a topology, running in background threads.
pub struct Fabric {
    pub topology: Topology,
    pub controller_addr: String,
    controller: Option<Controller>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

type PushMsg = (u32, PushRequest, Sender<Result<(), String>>);

impl Fabric {
    /// Enter a private namespace and start the fabric; `None` if not permitted.
    pub fn start(topology_file: &str) -> Option<Fabric> {
        let topology = Topology::load(topology_path(topology_file)).expect("topology");
        let mut ips: Vec<Ipv4Addr> = topology.hosts.iter().map(|h| h.addr.ip).collect();
        for s in &topology.switches {
            ips.extend(s.ports.iter().map(|p| p.addr.ip));
        }
        if !enter_netns(&ips) {
            return None;
        }
        Some(Self::start_here(topology))
    }

    fn start_here(topology: Topology) -> Fabric {
        let controller =
            Controller::start(ServiceConfig::insecure(topology.clone()), "127.0.0.1:0")
                .expect("controller");
        let controller_addr = controller.local_addr().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let (push_tx, push_rx) = mpsc::channel::<PushMsg>();
        let mut threads = Vec::new();
        {
            let (topo, stop) = (topology.clone(), stop.clone());
            threads.push(std::thread::spawn(move || data_plane(topo, push_rx, stop)));
        }
        for sw in &topology.switches {
            let ports: Vec<PortInfo> = sw
                .ports
                .iter()
                .map(|p| PortInfo {
                    name: p.name.clone(),
                    ip: Some(p.addr.ip),
                    mac: Some(p.mac),
                    takes_gso: false,
                    rx_rate_bps: None,
                })
                .collect();
            let (id, addr, stop, tx) =
                (sw.id, controller_addr.clone(), stop.clone(), push_tx.clone());
            threads.push(std::thread::spawn(move || control(id, addr, ports, tx, stop)));
        }
        let f = Fabric { topology, controller_addr, controller: Some(controller), stop, threads };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f.controller.as_ref().unwrap().status().switches.iter().all(|s| s.connected) {
            assert!(Instant::now() < deadline, "switches did not register");
            std::thread::sleep(Duration::from_millis(10));
        }
        f
    }

    /// Data-plane IP of rank `r` (the topology's host `r`).
    pub fn host_ip(&self, r: u16) -> Ipv4Addr {
        self.topology.hosts[usize::from(r)].addr.ip
    }

    /// A group configuration for rank `r` of `world` with rank 0 on `master_port`.
    pub fn group_config(&self, world: u16, r: u16, master_port: u16) -> GroupConfig {
        let mut c = GroupConfig::new(world, r, format!("127.0.0.1:{master_port}"));
        c.controller = Some(self.controller_addr.clone());
        c.local_ip = Some(self.host_ip(r));
        c.timeout = Duration::from_secs(10);
        c
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().ok();
        }
        if let Some(c) = self.controller.take() {
            c.stop();
        }
    }
}

/// One switch's controller session: forward pushes to the data plane, ack the result.
fn control(
    id: u32,
    addr: String,
    ports: Vec<PortInfo>,
    tx: Sender<PushMsg>,
    stop: Arc<AtomicBool>,
) {
    let mut session =
        SwitchSession::connect(addr.as_str(), id, None, ports, Duration::from_secs(5))
            .expect("switch session");
    while !stop.load(Ordering::Relaxed) {
        match session.next_push(Duration::from_millis(100)) {
            Ok(Some(req)) => {
                let rid = req.id;
                let (rtx, rrx) = mpsc::channel();
                if tx.send((id, req, rtx)).is_err() {
                    return;
                }
                match rrx.recv() {
                    Ok(Ok(())) => session.ack(rid).ok(),
                    Ok(Err(reason)) => session.reject(rid, reason).ok(),
                    Err(_) => return,
                };
            }
            Ok(None) => {}
            Err(_) => return,
        }
    }
}

const HDR: usize = 42;

/// All switch engines over UDP sockets on their port addresses.
fn data_plane(topo: Topology, pushes: Receiver<PushMsg>, stop: Arc<AtomicBool>) {
    let epoch = Instant::now();
    let now = || Time::from_nanos(epoch.elapsed().as_nanos() as u64);
    let mut engines: Vec<SwitchEngine> = Vec::new();
    let mut socks: Vec<(UdpSocket, usize, usize)> = Vec::new();
    let mut senders: HashMap<SocketAddrV4, UdpSocket> = HashMap::new();
    for (si, sw) in topo.switches.iter().enumerate() {
        let ports = sw
            .ports
            .iter()
            .map(|p| PortConfig {
                name: p.name.clone(),
                ip: p.addr.ip,
                mac: EthernetAddress(p.mac.0),
            })
            .collect();
        engines.push(SwitchEngine::new(SwitchEngineConfig {
            switch_id: sw.id,
            ports,
            ..Default::default()
        }));
        for (pi, p) in sw.ports.iter().enumerate() {
            let a = SocketAddrV4::new(p.addr.ip, inc_wire::ROCEV2_PORT);
            let s = UdpSocket::bind(a).expect("bind switch port");
            s.set_nonblocking(true).unwrap();
            senders.insert(a, s.try_clone().unwrap());
            socks.push((s, si, pi));
        }
    }
    let index: HashMap<u32, usize> =
        topo.switches.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
    let mut buf = vec![0u8; 9000];
    while !stop.load(Ordering::Relaxed) {
        while let Ok((id, req, reply)) = pushes.try_recv() {
            let e = &mut engines[index[&id]];
            let r = match &req.push {
                Push::Install(rules) => e.install(rules, now()).map_err(|e| e.to_string()),
                Push::Remove { comm_id } => e.remove(*comm_id).map_err(|e| e.to_string()),
            };
            reply.send(r).ok();
        }
        for (s, si, pi) in &socks {
            loop {
                match s.recv_from(&mut buf[HDR..]) {
                    Ok((n, SocketAddr::V4(from))) => {
                        let to = SocketAddrV4::new(
                            topo.switches[*si].ports[*pi].addr.ip,
                            inc_wire::ROCEV2_PORT,
                        );
                        let mac = topo.switches[*si].ports[*pi].mac;
                        // A switch stamps the PSN as IPv4 ID, a host's kernel 0.
                        let from_switch = senders.keys().any(|a| a.ip() == from.ip());
                        let ident = match BthPacket::new_checked(&buf[HDR..HDR + n]) {
                            Ok(bth) if from_switch => inc_protocol::frame::psn_ident(bth.psn()),
                            _ => 0,
                        };
                        build_headers(
                            &mut buf[..HDR + n],
                            from,
                            to,
                            ident,
                            inc_ctrl_proto::EthernetAddress::from_ipv4(*from.ip()).0,
                            mac.0,
                        );
                        engines[*si].handle_frame(now(), *pi, &buf[..HDR + n]);
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("switch port receive: {e}"),
                }
            }
        }
        let mut next: Option<Time> = None;
        for e in engines.iter_mut() {
            if e.poll_timeout().is_some_and(|t| t <= now()) {
                e.handle_timeout(now());
            }
            while let Some(t) = e.poll_transmit(now(), &mut buf) {
                let f = &buf[..t.len];
                if t.len <= HDR || EthernetFrame::new_unchecked(f).ethertype() != EtherType::Ipv4 {
                    continue; // ARP: addresses here are static
                }
                let ip = Ipv4Packet::new_unchecked(&f[14..34]);
                let udp = UdpPacket::new_unchecked(&f[34..42]);
                let from = SocketAddrV4::new(ip.src_addr(), udp.src_port());
                let to = SocketAddrV4::new(ip.dst_addr(), udp.dst_port());
                let s = senders.entry(from).or_insert_with(|| {
                    let s = UdpSocket::bind(from).expect("bind switch source port");
                    s.set_nonblocking(true).unwrap();
                    s
                });
                // A full socket buffer is a drop, which RC recovers from.
                s.send_to(&f[HDR..], to).ok();
            }
            while e.poll_event().is_some() {}
            next = match (next, e.poll_timeout()) {
                (Some(a), Some(b)) => Some(if a < b { a } else { b }),
                (a, b) => a.or(b),
            };
        }
        let wait = next.map_or(Duration::from_millis(1), |t| {
            let n = now();
            if t > n {
                (t - n).min(Duration::from_millis(1))
            } else {
                Duration::ZERO
            }
        });
        let mut fds: Vec<nix::poll::PollFd<'_>> = socks
            .iter()
            .map(|(s, _, _)| nix::poll::PollFd::new(s.as_fd(), nix::poll::PollFlags::POLLIN))
            .collect();
        let ms = wait.as_millis().max(u128::from(!wait.is_zero())) as u16;
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)).ok();
    }
    for (sw, e) in topo.switches.iter().zip(&engines) {
        let c = e.counters();
        eprintln!(
            "switch {}: rx {} tx {} drops {:?} retransmits {} slot conflicts {}",
            sw.name,
            c.rx_frames,
            c.tx_frames,
            c.drops,
            c.retransmits(),
            c.slot_conflicts()
        );
    }
}

/// Ethernet/IPv4/UDP headers as the sender's frame had them (IPv4 ID `ident`, DF).
fn build_headers(
    frame: &mut [u8],
    from: SocketAddrV4,
    to: SocketAddrV4,
    ident: u16,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
) {
    let udp_len = frame.len() - 34;
    EthernetRepr {
        src_addr: EthernetAddress(src_mac),
        dst_addr: EthernetAddress(dst_mac),
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut frame[..14]));
    Ipv4Repr {
        src_addr: *from.ip(),
        dst_addr: *to.ip(),
        protocol: 17,
        payload_len: udp_len,
        ttl: 64,
        tos: 0,
        ident,
        dont_frag: true,
    }
    .emit(&mut Ipv4Packet::new_unchecked(&mut frame[14..34]))
    .unwrap();
    UdpRepr { src_port: from.port(), dst_port: to.port(), payload_len: udp_len - 8 }
        .emit(&mut UdpPacket::new_unchecked(&mut frame[34..42]))
        .unwrap();
}
