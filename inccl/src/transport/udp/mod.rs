//! Userspace RoCEv2 over an unconnected UDP socket on the RoCEv2 port.
//!
//! One socket per process, network namespace and data-plane IP, bound to `ip:4791` and
//! shared by every QP of the process in that namespace (demultiplexed by destination
//! QPN, see [`port`]), with `IP_PMTUDISC_DO`: the kernel then writes IPv4 ID 0, DF,
//! TTL 64, TOS 0, exactly the bytes the engine's ICRC covers. The rank registers port 4791, so switches send to it
//! as to any RoCE device.
//! Sending strips the 42-byte Ethernet/IPv4/UDP headers of an engine frame and sends
//! BTH..ICRC to the switch; receiving lands the datagram at offset 42 of a slot and
//! rebuilds the headers in front of it (ID 0, DF, TTL 64, addresses and ports from the
//! datagram) so the engine verifies the ICRC over what was on the wire.
//!
//! Inside a collective the caller's thread drives the engine; between collectives a
//! progress thread does (ACKs, RNR NAKs, RC timers), as an RDMA NIC would, so the
//! switch's RC connection never times out while the application computes. The thread
//! sleeps in `ppoll` on the engine's next timer, and on the socket too once no
//! collective has run for [`CALLER_GRACE`]: while collectives follow each other, their
//! callers read every datagram, and a second thread woken by each of them would only
//! cost a wake-up per datagram on a busy machine.

mod port;
mod sys;

use std::io::{self, IoSlice};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inc_ctrl_proto::{HostEndpoint, RankEndpoint};
use inc_protocol::Time;
use inc_wire::{
    BthPacket, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr,
    UdpPacket, UdpRepr,
};
use inccl_engine::{CollectiveSpec, HostEngine, HostOptions, HostQpConfig, OpBuffers};
use nix::poll::PollFlags;
use tracing::{debug, trace};

use self::port::{Attachment, Inbox, SharedPort};
use self::sys::{wait, RecvMeta, BATCH};
use super::{random_qpn_psn, Transport};
use crate::config::CommConfig;
use crate::error::{Error, Result};
use crate::iface::DataPlane;

/// Ethernet (14) + IPv4 (20) + UDP (8).
pub(crate) const HEADERS: usize = 42;
/// Bytes per transmit buffer: headers + BTH + extension headers + 4096-byte payload +
/// ICRC.
const SLOT: usize = 4608;
/// Bytes per receive buffer: headers + the largest UDP datagram, which UDP GRO fills
/// with several frames a switch sent as one GSO frame.
const RX_SLOT: usize = HEADERS + 65_536;
/// Receive buffers per `recvmmsg`.
const RX_BATCH: usize = 16;
/// How long after a collective the progress thread leaves the socket to the next
/// collective's caller (it still runs the RC timers, e.g. a deferred ACK). Well under
/// the switch's RTO floor (1 ms), so a request that does arrive in between is ACKed
/// before the switch resends it.
const CALLER_GRACE: Duration = Duration::from_micros(500);
/// Socket buffer sizes; a full window of packets must fit in the receive buffer.
const RCVBUF: usize = 16 << 20;
const SNDBUF: usize = 4 << 20;

/// Counters of a [`RoceSocket`] (the engine keeps the protocol counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams sent.
    pub tx_packets: u64,
    /// UDP payload bytes sent.
    pub tx_bytes: u64,
    /// Datagrams received.
    pub rx_packets: u64,
    /// UDP payload bytes received.
    pub rx_bytes: u64,
    /// Datagrams dropped: from another address, or larger than a packet buffer.
    pub rx_dropped: u64,
    /// Datagrams the local stack refused (firewall EPERM, ENOBUFS, a socket buffer
    /// full for too long): lost, and recovered by RC like any loss.
    pub tx_dropped: u64,
}

/// Batched RoCEv2-over-UDP I/O of one QP: an unconnected UDP socket with
/// `IP_PMTUDISC_DO`, `sendmmsg` of the UDP payloads of complete frames, `recvmmsg` into
/// buffers with room for the rebuilt Ethernet/IPv4/UDP headers. Public (hidden) for the
/// point-to-point benchmark in `hosts/`.
#[derive(Debug)]
pub struct RoceSocket {
    sock: Arc<UdpSocket>,
    local: SocketAddrV4,
    mac: EthernetAddress,
    tx: Vec<u8>,
    rx: Vec<u8>,
    stats: UdpStats,
    /// Send runs of equal-size frames as UDP GSO sends.
    gso: bool,
}

impl RoceSocket {
    /// Bind `ip:port` (port 0: any); `mac` is the destination MAC of rebuilt frames.
    pub fn bind(ip: Ipv4Addr, port: u16, mac: EthernetAddress) -> io::Result<RoceSocket> {
        let sock = bind_socket(ip, port)?;
        let local = match sock.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(a) => {
                return Err(io::Error::other(format!("socket bound to non-IPv4 {a}")));
            }
        };
        Ok(RoceSocket::on(Arc::new(sock), local, mac))
    }

    /// Batched I/O (with buffers of its own) on a socket shared with other QPs.
    fn on(sock: Arc<UdpSocket>, local: SocketAddrV4, mac: EthernetAddress) -> RoceSocket {
        RoceSocket {
            sock,
            local,
            mac,
            tx: vec![0; SLOT * BATCH],
            rx: vec![0; RX_SLOT * RX_BATCH],
            stats: UdpStats::default(),
            gso: false,
        }
    }

    /// Bound address.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    /// Counters.
    pub fn stats(&self) -> UdpStats {
        self.stats
    }

    /// Send frames to `to` until `next` has none: `next` writes one complete Ethernet
    /// frame into the buffer it is given and returns its length. Up to 64 frames per
    /// `sendmmsg`, runs of equal-size frames as one UDP GSO send each when enabled
    /// (see [`RoceSocket::set_gso`]), waiting (bounded) while the socket buffer is
    /// full. Returns frames sent.
    pub fn send_frames(
        &mut self,
        to: SocketAddrV4,
        mut next: impl FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let mut sent = 0;
        loop {
            let mut n = 0;
            let mut lens = [0usize; BATCH];
            while n < BATCH {
                match next(&mut self.tx[n * SLOT..(n + 1) * SLOT]) {
                    Some(len) if len > HEADERS && len <= SLOT => {
                        lens[n] = len;
                        n += 1;
                    }
                    Some(len) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                            "frame of {len} bytes is not a RoCEv2 frame of at most {SLOT} bytes"
                        ),
                        ))
                    }
                    None => break,
                }
            }
            if n == 0 {
                return Ok(sent);
            }
            self.send_batch(to, &lens[..n])?;
            sent += n;
            if n < BATCH {
                return Ok(sent);
            }
        }
    }

    /// Send the `lens.len()` frames staged in `tx`.
    fn send_batch(&mut self, to: SocketAddrV4, lens: &[usize]) -> io::Result<()> {
        let n = lens.len();
        let mut runs = [(0usize, 0usize); BATCH];
        let mut gso = self.gso.then(|| gso_segment_size(lens)).flatten();
        let mut nruns = match gso {
            Some(size) => gso_runs(lens, size, &mut runs),
            None => plain_runs(n, &mut runs),
        };
        if gso.is_some() {
            self.stamp_gso_idents(lens, &runs[..nruns], true);
        }
        self.stats.tx_bytes += lens.iter().map(|l| (l - HEADERS) as u64).sum::<u64>();
        let mut done = 0;
        let mut lost = 0;
        let deadline = Instant::now() + SEND_BLOCKED_LIMIT;
        while done < nruns {
            let result = {
                let mut iovs = [IoSlice::new(&[]); BATCH];
                for (i, len) in lens.iter().enumerate() {
                    iovs[i] = IoSlice::new(&self.tx[i * SLOT + HEADERS..i * SLOT + len]);
                }
                let mut msgs: [&[IoSlice<'_>]; BATCH] = [&[]; BATCH];
                for (m, &(first, count)) in msgs.iter_mut().zip(&runs[done..nruns]) {
                    *m = &iovs[first..first + count];
                }
                let size = gso.map(|s| s as u16);
                sys::send_batch(self.sock.as_fd(), &msgs[..nruns - done], to, size)
            };
            match result {
                Ok(0) if Instant::now() < deadline => {
                    sys::wait(
                        &[self.sock.as_fd()],
                        PollFlags::POLLOUT,
                        Some(Duration::from_millis(10)),
                    )?;
                }
                // Full for too long: what is left is lost; RC resends it.
                Ok(0) => {
                    let frames: usize = runs[done..nruns].iter().map(|r| r.1).sum();
                    debug!(socket = %self.local, %to, frames, "send buffer full: dropped");
                    lost += frames;
                    done = nruns;
                }
                Ok(k) => done += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The kernel takes no GSO on this socket after all: un-stamp what is
                // left and send it (and everything after) one datagram at a time.
                Err(e) if gso.is_some() && refuses_gso(&e) => {
                    debug!(socket = %self.local, error = %e, "UDP GSO refused: sending datagrams one by one");
                    self.stamp_gso_idents(lens, &runs[done..nruns], false);
                    self.gso = false;
                    gso = None;
                    let first = runs[done].0;
                    nruns = plain_runs(n - first, &mut runs);
                    for r in &mut runs[..nruns] {
                        r.0 += first;
                    }
                    done = 0;
                }
                // `sendmmsg` reports an error only for its first message.
                Err(e) if is_local_drop(&e) => {
                    trace!(socket = %self.local, %to, error = %e, "datagram refused locally: lost");
                    lost += runs[done].1;
                    done += 1;
                }
                Err(e) => return Err(e),
            }
        }
        self.stats.tx_packets += (n - lost) as u64;
        self.stats.tx_dropped += lost as u64;
        Ok(())
    }

    /// Give frame `j` of every GSO run the IPv4 ID the kernel's segmentation gives it
    /// (`j`, counting from the run's ID 0; [`sys::tx_checksum_offload`] explains when
    /// the kernel segments), re-stamping its ICRC; `forward = false` undoes it.
    fn stamp_gso_idents(&mut self, lens: &[usize], runs: &[(usize, usize)], forward: bool) {
        for &(first, count) in runs {
            for j in 1..count {
                let i = first + j;
                let frame = &mut self.tx[i * SLOT..i * SLOT + lens[i]];
                inc_wire::gso::restamp_ident(frame, if forward { j as u16 } else { 0 });
            }
        }
    }

    /// Batch runs of equal-size frames into UDP GSO sends when `enabled` and the
    /// kernel cuts them into datagrams itself (see [`sys::tx_checksum_offload`]).
    pub(crate) fn set_gso(&mut self, enabled: bool) {
        self.gso = enabled;
    }

    /// Receive every queued datagram without blocking; datagrams from `from_ip` are
    /// given Ethernet/IPv4/UDP headers (source MAC `peer_mac`, IPv4 IDs as `rule`
    /// says that sender stamps them) and handed to `handle` as complete frames, others
    /// are dropped. Returns frames handled.
    pub fn recv_frames(
        &mut self,
        from_ip: Ipv4Addr,
        peer_mac: EthernetAddress,
        rule: IdentRule,
        mut handle: impl FnMut(&[u8]),
    ) -> io::Result<usize> {
        let (local, mac) = (self.local, self.mac);
        self.recv_datagrams(|from, ident, frame| {
            if !accept_frame(frame, from, ident, rule, local, from_ip, peer_mac, mac) {
                return false;
            }
            handle(frame);
            true
        })
    }

    /// Receive every queued datagram without blocking and give each to `handle` with
    /// the IPv4 ID it had on the wire and [`HEADERS`] bytes of headroom in front
    /// (`frame[HEADERS..]` is the datagram); `handle` returns false for a datagram it
    /// drops. A UDP GRO datagram (several frames sent as one GSO frame) is handed over
    /// one segment at a time, segment `k` with ID `k` (what a host's kernel gives it
    /// when it cuts such a frame itself; a switch's frames carry their own, see
    /// [`IdentRule`]), its headroom written over the tail of segment `k - 1`, which
    /// `handle` has finished with. Returns datagrams taken.
    fn recv_datagrams(
        &mut self,
        mut handle: impl FnMut(SocketAddrV4, u16, &mut [u8]) -> bool,
    ) -> io::Result<usize> {
        let mut handled = 0;
        let mut meta =
            [RecvMeta { len: 0, from: self.local, truncated: false, segment: None }; RX_BATCH];
        loop {
            let got =
                match sys::recv_batch(self.sock.as_fd(), &mut self.rx, RX_SLOT, HEADERS, &mut meta)
                {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
            for (i, m) in meta[..got].iter().enumerate() {
                self.stats.rx_bytes += m.len as u64;
                if m.truncated {
                    trace!(from = %m.from, len = m.len, "truncated datagram dropped");
                    self.stats.rx_packets += 1;
                    self.stats.rx_dropped += 1;
                    continue;
                }
                let slot = &mut self.rx[i * RX_SLOT..i * RX_SLOT + HEADERS + m.len];
                let seg = m.segment.unwrap_or(m.len);
                for (k, start) in (0..m.len).step_by(seg).enumerate() {
                    let end = (start + seg).min(m.len);
                    self.stats.rx_packets += 1;
                    if handle(m.from, k as u16, &mut slot[start..HEADERS + end]) {
                        handled += 1;
                    } else {
                        self.stats.rx_dropped += 1;
                    }
                }
            }
            if got < RX_BATCH {
                return Ok(handled);
            }
        }
    }

    /// Wait up to `timeout` for a datagram; true if one is queued.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        wait(&[self.sock.as_fd()], PollFlags::POLLIN, Some(timeout))
    }
}

/// A non-blocking UDP socket on `ip:port` with the RoCEv2 options.
fn bind_socket(ip: Ipv4Addr, port: u16) -> io::Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddrV4::new(ip, port))?;
    sys::set_pmtudisc_do(sock.as_fd())?;
    if let Err(e) = sys::set_udp_gro(sock.as_fd()) {
        // Before Linux 5.0. A switch's GSO frames still check when the kernel cuts them
        // (their IPv4 IDs follow their PSNs); a host peer's (inccl-p2p-bench) arrive cut
        // into datagrams whose IDs this socket cannot see, and fail the ICRC check.
        tracing::warn!(%ip, error = %e, "UDP_GRO unavailable: GSO sends of a host peer will fail the ICRC check");
    }
    sys::set_buffers(sock.as_fd(), RCVBUF, SNDBUF);
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// How the sender of a datagram chose its IPv4 ID, which the ICRC covers and a UDP
/// socket does not show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentRule {
    /// A host's kernel (an unconnected socket with DF): 0, or `k` for segment `k` of
    /// one UDP GSO send.
    Kernel,
    /// A switch: the low 16 bits of the frame's PSN
    /// ([`inc_protocol::frame::psn_ident`]), whatever batch it travelled in.
    Psn,
}

/// Check that a received datagram comes from `peer_ip` (the switch) and give it the
/// headers it had on the wire; `segment` is its number in the datagram it arrived in.
/// A switch sends from a per-connection source port (not 4791): only its address
/// identifies it; the engine checks the QPN and the ICRC.
#[allow(clippy::too_many_arguments)]
fn accept_frame(
    frame: &mut [u8],
    from: SocketAddrV4,
    segment: u16,
    rule: IdentRule,
    local: SocketAddrV4,
    peer_ip: Ipv4Addr,
    peer_mac: EthernetAddress,
    mac: EthernetAddress,
) -> bool {
    if *from.ip() != peer_ip {
        trace!(%from, "datagram not from the switch dropped");
        return false;
    }
    let ident = match rule {
        IdentRule::Kernel => segment,
        IdentRule::Psn => match BthPacket::new_checked(&frame[HEADERS..]) {
            Ok(bth) => inc_protocol::frame::psn_ident(bth.psn()),
            Err(_) => return false,
        },
    };
    rebuild_headers(frame, from, local, ident, peer_mac, mac).is_ok()
}

/// The QP state shared by the caller's thread (inside collectives) and the progress
/// thread (between them).
#[derive(Debug)]
struct Core {
    io: RoceSocket,
    qp: Attachment,
    epoch: Instant,
    engine: HostEngine,
    switch: SocketAddrV4,
    switch_mac: EthernetAddress,
    /// When the last collective returned (the QP's creation before the first).
    last_collective: Instant,
}

impl Core {
    fn now(&self) -> Time {
        Time::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// Send everything the engine has ready. Returns packets sent.
    fn flush(&mut self, bufs: &OpBuffers<'_>) -> io::Result<usize> {
        let Core { io, epoch, engine, switch, .. } = self;
        io.send_frames(*switch, |slot| {
            engine.poll_transmit(Time::from_nanos(epoch.elapsed().as_nanos() as u64), slot, bufs)
        })
    }

    /// Feed every datagram for this QP to the engine: those other threads received for
    /// it, then those queued on the socket (handing other QPs theirs). Returns packets
    /// handled.
    fn receive(&mut self, bufs: &mut OpBuffers<'_>) -> io::Result<usize> {
        let now = self.now();
        let Core { io, qp, engine, switch, switch_mac, .. } = self;
        let (local, mac, switch_ip) = (io.local, io.mac, *switch.ip());
        let mut handled = 0;
        for mut f in qp.take_forwarded() {
            let rule = IdentRule::Psn;
            if accept_frame(&mut f.frame, f.from, f.ident, rule, local, switch_ip, *switch_mac, mac)
            {
                engine.handle_frame(now, &f.frame, bufs);
                handled += 1;
            }
        }
        io.recv_datagrams(|from, ident, frame| {
            if !qp.is_mine(from, ident, frame) {
                return true;
            }
            if !accept_frame(frame, from, ident, IdentRule::Psn, local, switch_ip, *switch_mac, mac)
            {
                return false;
            }
            engine.handle_frame(now, frame, bufs);
            handled += 1;
            true
        })?;
        Ok(handled)
    }

    /// Wait up to `timeout` for a datagram on the socket or in this QP's inbox.
    fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        wait(&[self.io.sock.as_fd(), self.qp.inbox().wake_fd()], PollFlags::POLLIN, Some(timeout))
    }

    /// Polls for a datagram for up to `limit`, yielding the CPU between polls (see
    /// [`CommConfig::busy_poll`]); true if one is queued.
    fn busy_poll(&self, limit: Duration) -> io::Result<bool> {
        if limit.is_zero() {
            return Ok(false);
        }
        let t0 = Instant::now();
        loop {
            if self.wait_readable(Duration::ZERO)? {
                return Ok(true);
            }
            if t0.elapsed() >= limit {
                return Ok(false);
            }
            std::thread::yield_now();
        }
    }

    fn fire_timers(&mut self) {
        let now = self.now();
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
    }

    /// Time until the engine's next timer.
    fn next_timer(&self) -> Option<Duration> {
        let now = self.now();
        self.engine.poll_timeout().map(|t| if t > now { t - now } else { Duration::ZERO })
    }

    /// Between collectives: ACK (or RNR-NAK) what arrives and run the RC timers, as an
    /// RDMA NIC does without the application, so the switch's connection never
    /// exhausts its retries while the application computes. Returns how long the
    /// progress thread may sleep and whether it must watch the socket meanwhile.
    fn service_idle(&mut self) -> (Option<Duration>, bool) {
        let mut none = OpBuffers::None;
        let serviced = self.receive(&mut none).and_then(|_| {
            self.fire_timers();
            self.flush(&none)
        });
        if let Err(e) = serviced {
            debug!(error = %e, "progress thread: socket error");
        }
        let timer = self.next_timer();
        match CALLER_GRACE.checked_sub(self.last_collective.elapsed()) {
            Some(left) if !left.is_zero() => (Some(timer.map_or(left, |t| t.min(left))), false),
            _ => (timer, true),
        }
    }
}

fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    // Every step leaves the engine consistent; a panic elsewhere does not poison it.
    core.lock().unwrap_or_else(|p| p.into_inner())
}

/// The progress thread of a connected QP.
#[derive(Debug)]
struct Progress {
    stop: Arc<AtomicBool>,
    inbox: Arc<Inbox>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.inbox.wake();
        if let Some(t) = self.thread.take() {
            t.join().ok();
        }
    }
}

fn progress_loop(
    core: Arc<Mutex<Core>>,
    sock: Arc<UdpSocket>,
    inbox: Arc<Inbox>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let (timer, watch_socket) = match core.try_lock() {
            Ok(mut c) => c.service_idle(),
            // Every step leaves the engine consistent; a panic elsewhere does not poison it.
            Err(TryLockError::Poisoned(p)) => p.into_inner().service_idle(),
            // A collective runs: its caller reads the socket and runs the timers.
            Err(TryLockError::WouldBlock) => (Some(CALLER_GRACE), false),
        };
        // Receiving drained the inbox's wake-up socket, which also carries the stop
        // request: look again before sleeping on it.
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // A timer already due makes this return at once; `service_idle` fires it next.
        if watch_socket {
            wait(&[sock.as_fd(), inbox.wake_fd()], PollFlags::POLLIN, timer).ok();
        } else {
            wait(&[inbox.wake_fd()], PollFlags::POLLIN, timer).ok();
        }
    }
}

#[derive(Debug)]
pub(crate) struct UdpTransport {
    /// Before `connect`: the QP's place on the shared socket.
    qp: Option<Attachment>,
    core: Option<Arc<Mutex<Core>>>,
    progress: Option<Progress>,
    local: SocketAddrV4,
    mac: EthernetAddress,
    rank: u16,
    qpn: u32,
    start_psn: u32,
    op_timeout: Duration,
    comm_id: u32,
    switch_id: u32,
    /// Where UDP GSO sends would be cut (found at open, used at connect).
    gso: GsoPath,
    /// [`CommConfig::busy_poll`].
    busy_poll: Duration,
}

/// How a run of frames may leave for the switch as one UDP GSO send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GsoPath {
    /// The interface has no transmit checksum offload, so this machine's kernel cuts
    /// a GSO send into datagrams before the driver, giving segment `i` IPv4 ID `i`
    /// (what `scripts/netns-up` and the container entrypoint set on hosts' veths).
    KernelCuts,
    /// A veth with the offload: a GSO send reaches the other end whole, and is usable
    /// only if the switch port splits it itself ([`HostEndpoint::switch_takes_gso`]).
    WholeOverVeth,
    /// Anything else (a NIC's segmentation is not ours to predict, or unknown): one
    /// datagram per send.
    None,
}

impl GsoPath {
    fn of(dp: &DataPlane, sock: &UdpSocket) -> GsoPath {
        let name = dp.iface.clone().or_else(|| {
            crate::iface::interfaces()
                .ok()?
                .into_iter()
                .find(|(_, i)| i.ipv4.contains(&dp.ip))
                .map(|(name, _)| name)
        });
        let Some(name) = name else { return GsoPath::None };
        let path = match sys::tx_checksum_offload(sock.as_fd(), &name) {
            Some(false) => GsoPath::KernelCuts,
            Some(true) if sys::driver(sock.as_fd(), &name).as_deref() == Some("veth") => {
                GsoPath::WholeOverVeth
            }
            _ => GsoPath::None,
        };
        debug!(iface = %name, ?path, "UDP GSO path");
        path
    }

    /// Whether GSO sends reach a switch port that does (`takes_whole`) or does not
    /// split whole GSO frames as the datagrams their ICRCs were stamped for.
    fn usable(self, switch_takes_whole: bool) -> bool {
        match self {
            GsoPath::KernelCuts => true,
            GsoPath::WholeOverVeth => switch_takes_whole,
            GsoPath::None => false,
        }
    }
}

impl UdpTransport {
    pub(crate) fn open(dp: &DataPlane, rank: u16, cfg: &CommConfig) -> Result<Self> {
        let ctx = || format!("rank {rank}: data-plane UDP socket on {}", dp.ip);
        let port =
            SharedPort::get(dp.ip, |p| bind_socket(dp.ip, p)).map_err(|e| Error::io(ctx(), e))?;
        let qp = port.attach(|| random_qpn_psn().0).map_err(|e| Error::io(ctx(), e))?;
        let (qpn, start_psn) = (qp.qpn(), random_qpn_psn().1);
        let local = port.local_addr();
        let gso = if cfg.udp_gso { GsoPath::of(dp, port.socket()) } else { GsoPath::None };
        debug!(rank, %local, qpn, start_psn, "userspace RoCEv2 QP created");
        Ok(UdpTransport {
            qp: Some(qp),
            core: None,
            progress: None,
            local,
            mac: dp.mac,
            rank,
            qpn,
            start_psn,
            op_timeout: cfg.op_timeout,
            comm_id: 0,
            switch_id: 0,
            gso,
            busy_poll: cfg.busy_poll,
        })
    }

    fn fail(&self, reason: String) -> Error {
        Error::Collective { rank: self.rank, comm_id: self.comm_id, reason }
    }
}

impl Transport for UdpTransport {
    fn local_endpoint(&self) -> RankEndpoint {
        RankEndpoint {
            rank: self.rank,
            ip: *self.local.ip(),
            mac: Some(self.mac),
            qpn: self.qpn,
            start_psn: self.start_psn,
            udp_port: self.local.port(),
        }
    }

    fn connect(&mut self, ep: &HostEndpoint, world_size: u16) -> Result<()> {
        if ep.host_qpn != self.qpn || ep.host_udp_port != self.local.port() || ep.rank != self.rank
        {
            return Err(Error::Peer {
                rank: self.rank,
                reason: format!(
                    "controller endpoint for rank {} (QPN {:#x}, port {}) does not match this QP \
                     (rank {}, QPN {:#x}, port {})",
                    ep.rank,
                    ep.host_qpn,
                    ep.host_udp_port,
                    self.rank,
                    self.qpn,
                    self.local.port()
                ),
            });
        }
        let Some(qp) = self.qp.take() else {
            return Err(Error::Unusable("communicator", "its QP is already connected".into()));
        };
        let config = HostQpConfig::from_endpoint(
            ep,
            world_size,
            EthernetAddress(self.mac.0),
            *self.local.ip(),
        );
        let opts = HostOptions { progress_timeout: self.op_timeout, ..HostOptions::default() };
        let sock = qp.port().socket().clone();
        let inbox = qp.inbox_handle();
        let mut io = RoceSocket::on(sock.clone(), self.local, self.mac);
        let gso = self.gso.usable(ep.switch_takes_gso);
        debug!(rank = self.rank, path = ?self.gso, switch_takes_gso = ep.switch_takes_gso, gso, "UDP GSO sends");
        io.set_gso(gso);
        let core = Arc::new(Mutex::new(Core {
            io,
            qp,
            epoch: Instant::now(),
            engine: HostEngine::with_options(config, opts),
            switch: SocketAddrV4::new(ep.switch_ip, inc_wire::ROCEV2_PORT),
            switch_mac: ep.switch_mac,
            last_collective: Instant::now(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (core, inbox, stop) = (core.clone(), inbox.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("inccl-progress-{}", ep.comm_id))
                .spawn(move || progress_loop(core, sock, inbox, stop))
                .map_err(|e| {
                    Error::io(format!("rank {}: starting the progress thread", self.rank), e)
                })?
        };
        self.core = Some(core);
        self.progress = Some(Progress { stop, inbox, thread: Some(thread) });
        self.comm_id = ep.comm_id;
        self.switch_id = ep.switch_id;
        Ok(())
    }

    fn run(&mut self, spec: CollectiveSpec, bufs: OpBuffers<'_>) -> Result<()> {
        let Some(core) = self.core.clone() else {
            return Err(Error::Unusable("communicator", "its QP is not connected".into()));
        };
        // Held for the whole collective: the progress thread only runs between them.
        let mut c = lock(&core);
        let result = self.drive(&mut c, spec, bufs);
        c.last_collective = Instant::now();
        result
    }
}

impl UdpTransport {
    /// Runs one collective to its end on the locked QP.
    fn drive(&self, c: &mut Core, spec: CollectiveSpec, mut bufs: OpBuffers<'_>) -> Result<()> {
        let now = c.now();
        c.engine.start(now, spec).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        // Backstop for the engine's own progress timeout (which names the stalled PSN
        // and fires first): give up if nothing at all arrives for longer.
        let stall_limit = self.op_timeout + Duration::from_secs(1);
        let mut last_rx = Instant::now();
        loop {
            c.flush(&bufs).map_err(|e| {
                self.fail(format!("sending to switch {} from {}: {e}", c.switch, self.local))
            })?;
            if let Some(done) = c.engine.poll_completion() {
                trace!(stats = ?c.io.stats(), "collective finished");
                return done.map_err(|e| self.fail(e.to_string()));
            }
            let stall_left = stall_limit.saturating_sub(last_rx.elapsed());
            // A due timer makes this zero: the wait returns at once and `fire_timers`
            // below handles it.
            let wait_for = c.next_timer().map_or(stall_left, |t| t.min(stall_left));
            let readable = c
                .busy_poll(self.busy_poll.min(wait_for))
                .and_then(|ready| if ready { Ok(true) } else { c.wait_readable(wait_for) })
                .map_err(|e| self.fail(format!("poll on {}: {e}", self.local)))?;
            if readable {
                let n = c
                    .receive(&mut bufs)
                    .map_err(|e| self.fail(format!("receiving on {}: {e}", self.local)))?;
                if n > 0 {
                    last_rx = Instant::now();
                }
            }
            c.fire_timers();
            // Finished by what just arrived: return now. The ACK it owes the switch
            // goes out from the progress thread, or with the next collective's first
            // frames, instead of delaying the caller by a send and a switch wake-up.
            if let Some(done) = c.engine.poll_completion() {
                trace!(stats = ?c.io.stats(), "collective finished");
                return done.map_err(|e| self.fail(e.to_string()));
            }
            if last_rx.elapsed() >= stall_limit {
                return Err(self.fail(format!(
                    "{:?} of {} elements made no progress for {stall_limit:?}: nothing received \
                     from switch {} at {} (a peer rank or switch may be down); engine {:?}; \
                     socket {:?}; {} datagrams for no QP of this process, {} dropped from a full \
                     inbox",
                    spec.kind,
                    spec.count,
                    self.switch_id,
                    c.switch,
                    c.engine.counters(),
                    c.io.stats(),
                    c.qp.port().stray(),
                    c.qp.inbox().dropped(),
                )));
            }
        }
    }
}

/// How long a send waits for room in a full socket buffer before the rest of its
/// batch counts as lost (long enough for a busy link, short enough to keep RC timers).
const SEND_BLOCKED_LIMIT: Duration = Duration::from_millis(100);

/// Send errors that mean "this datagram was dropped here", as a lossy link would:
/// a firewall (EPERM), no buffer or memory (ENOBUFS, ENOMEM), no route or neighbour
/// for now (EHOSTUNREACH, ENETUNREACH, ENETDOWN), a reported ICMP error (ECONNREFUSED).
fn is_local_drop(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EPERM
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ENETDOWN
                | libc::ECONNREFUSED
        )
    )
}

/// The GSO segment size of a batch (its largest UDP payload), if GSO can help: at
/// least two frames of that size.
fn gso_segment_size(lens: &[usize]) -> Option<usize> {
    let size = lens.iter().max()? - HEADERS;
    (lens.iter().filter(|&&l| l - HEADERS == size).count() >= 2).then_some(size)
}

/// Split a batch into GSO sends `(first frame, frames)` with segments of `size` bytes
/// (one size for the whole `sendmmsg`, as its control message is shared).
fn gso_runs(lens: &[usize], size: usize, runs: &mut [(usize, usize)]) -> usize {
    let mut nruns = 0;
    inc_wire::gso::runs(
        lens.len(),
        |i| lens[i] - HEADERS,
        |_| size,
        |_, _| true,
        |f, c| {
            runs[nruns] = (f, c);
            nruns += 1;
        },
    );
    nruns
}

/// One frame per send.
fn plain_runs(n: usize, runs: &mut [(usize, usize)]) -> usize {
    for (i, r) in runs[..n].iter_mut().enumerate() {
        *r = (i, 1);
    }
    n
}

/// Errors of a UDP GSO send that mean "not on this socket or route" (no checksum
/// offload path, no GSO support): fall back to one datagram per send.
fn refuses_gso(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

/// Write the Ethernet/IPv4/UDP headers in front of a received RoCEv2 datagram that
/// occupies `frame[HEADERS..]`: what a packet socket would have captured from the wire
/// for a datagram sent with `IP_PMTUDISC_DO` (ID `ident`: 0, or a GSO segment's
/// number; DF, TTL 64, TOS 0).
pub(crate) fn rebuild_headers(
    frame: &mut [u8],
    from: SocketAddrV4,
    to: SocketAddrV4,
    ident: u16,
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
) -> std::result::Result<(), inc_wire::Error> {
    let udp_len = frame.len() - 14 - 20;
    EthernetRepr {
        src_addr: EthernetAddress(src_mac.0),
        dst_addr: EthernetAddress(dst_mac.0),
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut frame[..14]));
    Ipv4Repr {
        src_addr: *from.ip(),
        dst_addr: *to.ip(),
        protocol: inc_wire::ipv4::PROTOCOL_UDP,
        payload_len: udp_len,
        ttl: 64,
        tos: 0,
        ident,
        dont_frag: true,
    }
    .emit(&mut Ipv4Packet::new_unchecked(&mut frame[14..34]))?;
    UdpRepr { src_port: from.port(), dst_port: to.port(), payload_len: udp_len - 8 }
        .emit(&mut UdpPacket::new_unchecked(&mut frame[34..42]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: usize = HEADERS + 12 + 4096 + 4;
    const ACK: usize = HEADERS + 12 + 4 + 4;

    fn runs_of(lens: &[usize]) -> Vec<(usize, usize)> {
        let mut runs = [(0, 0); BATCH];
        let size = gso_segment_size(lens).expect("two full frames");
        let n = gso_runs(lens, size, &mut runs);
        runs[..n].to_vec()
    }

    #[test]
    fn gso_sends_only_where_they_arrive_as_the_datagrams_stamped() {
        use GsoPath::*;
        for takes_whole in [false, true] {
            assert!(KernelCuts.usable(takes_whole), "this kernel cuts: any switch");
            assert!(!GsoPath::None.usable(takes_whole), "unknown path: never");
        }
        assert!(WholeOverVeth.usable(true));
        assert!(!WholeOverVeth.usable(false), "a whole frame to a switch that cannot split it");
    }

    #[test]
    fn gso_runs_keep_every_segment_but_the_last_full_and_within_64_kib() {
        // 20 data frames: 15 fit one send (61,680 bytes), the rest the next.
        assert_eq!(runs_of(&[DATA; 20]), [(0, 15), (15, 5)]);
        // A short frame ends a run; a full one after it starts the next.
        let mut lens = vec![DATA; 4];
        lens.insert(2, ACK);
        assert_eq!(runs_of(&lens), [(0, 3), (3, 2)]);
        // A short frame first stands alone.
        assert_eq!(runs_of(&[ACK, DATA, DATA]), [(0, 1), (1, 2)]);
        // Small equal frames: the segment-count limit.
        assert_eq!(runs_of(&[ACK; 64]), [(0, 64)]);
        // Nothing to batch.
        assert_eq!(gso_segment_size(&[DATA, ACK]), None);
    }
}
