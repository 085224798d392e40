//! Userspace RoCEv2 over an unconnected UDP socket on the RoCEv2 port.
//!
//! One socket per process and data-plane IP, bound to `ip:4791` and shared by every QP
//! of the process (demultiplexed by destination QPN, see [`port`]), with
//! `IP_PMTUDISC_DO`: the kernel then writes IPv4 ID 0, DF, TTL 64, TOS 0, exactly the
//! bytes the engine's ICRC covers. The rank registers port 4791, so switches send to it
//! as to any RoCE device.
//! Sending strips the 42-byte Ethernet/IPv4/UDP headers of an engine frame and sends
//! BTH..ICRC to the switch; receiving lands the datagram at offset 42 of a slot and
//! rebuilds the headers in front of it (ID 0, DF, TTL 64, addresses and ports from the
//! datagram) so the engine verifies the ICRC over what was on the wire.
//!
//! Inside a collective the caller's thread drives the engine; between collectives a
//! progress thread does (ACKs, RNR NAKs, RC timers), as an RDMA NIC would, so the
//! switch's RC connection never times out while the application computes. The thread
//! sleeps in `ppoll` on the socket and the engine's next timer.

mod port;
mod sys;

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inc_ctrl_proto::{HostEndpoint, RankEndpoint};
use inc_protocol::Time;
use inc_wire::{
    EtherType, EthernetAddress, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr, UdpPacket,
    UdpRepr,
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
/// Bytes per packet buffer: headers + BTH + extension headers + 4096-byte payload + ICRC.
const SLOT: usize = 4608;
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
            rx: vec![0; SLOT * BATCH],
            stats: UdpStats::default(),
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
    /// frame into the buffer it is given and returns its length. Sent in batches of up
    /// to 64 per `sendmmsg`, waiting (bounded) while the socket buffer is full.
    /// Returns frames sent.
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
            let mut pkts: [(&[u8], SocketAddrV4); BATCH] = [(&[], to); BATCH];
            for (i, len) in lens[..n].iter().enumerate() {
                pkts[i] = (&self.tx[i * SLOT + HEADERS..i * SLOT + len], to);
                self.stats.tx_bytes += (len - HEADERS) as u64;
            }
            let mut done = 0;
            let mut lost = 0;
            let deadline = Instant::now() + SEND_BLOCKED_LIMIT;
            while done < n {
                match sys::send_batch(self.sock.as_fd(), &pkts[done..n]) {
                    Ok(0) if Instant::now() < deadline => {
                        wait(
                            &[self.sock.as_fd()],
                            PollFlags::POLLOUT,
                            Some(Duration::from_millis(10)),
                        )?;
                    }
                    // Full for too long: what is left is lost; RC resends it.
                    Ok(0) => {
                        debug!(socket = %self.local, %to, frames = n - done, "send buffer full: dropped");
                        lost += n - done;
                        done = n;
                    }
                    Ok(k) => done += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // `sendmmsg` reports an error only for its first datagram.
                    Err(e) if is_local_drop(&e) => {
                        trace!(socket = %self.local, %to, error = %e, "datagram refused locally: lost");
                        lost += 1;
                        done += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            sent += n;
            self.stats.tx_packets += (n - lost) as u64;
            self.stats.tx_dropped += lost as u64;
            if n < BATCH {
                return Ok(sent);
            }
        }
    }

    /// Receive every queued datagram without blocking; datagrams from `from_ip` are
    /// given Ethernet/IPv4/UDP headers (source MAC `peer_mac`) and handed to `handle`
    /// as complete frames, others are dropped. Returns frames handled.
    pub fn recv_frames(
        &mut self,
        from_ip: Ipv4Addr,
        peer_mac: EthernetAddress,
        mut handle: impl FnMut(&[u8]),
    ) -> io::Result<usize> {
        let (local, mac) = (self.local, self.mac);
        self.recv_datagrams(|from, frame| {
            if !accept_frame(frame, from, local, from_ip, peer_mac, mac) {
                return false;
            }
            handle(frame);
            true
        })
    }

    /// Receive every queued datagram without blocking and give each to `handle` with
    /// [`HEADERS`] bytes of headroom in front (`frame[HEADERS..]` is the datagram);
    /// `handle` returns false for a datagram it drops. Returns datagrams taken.
    fn recv_datagrams(
        &mut self,
        mut handle: impl FnMut(SocketAddrV4, &mut [u8]) -> bool,
    ) -> io::Result<usize> {
        let mut handled = 0;
        let mut meta = [RecvMeta { len: 0, from: self.local, truncated: false }; BATCH];
        loop {
            let got =
                match sys::recv_batch(self.sock.as_fd(), &mut self.rx, SLOT, HEADERS, &mut meta) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
            for (i, m) in meta[..got].iter().enumerate() {
                self.stats.rx_bytes += m.len as u64;
                if m.truncated {
                    trace!(from = %m.from, len = m.len, "truncated datagram dropped");
                    self.stats.rx_dropped += 1;
                    continue;
                }
                if handle(m.from, &mut self.rx[i * SLOT..i * SLOT + HEADERS + m.len]) {
                    handled += 1;
                } else {
                    self.stats.rx_dropped += 1;
                }
            }
            self.stats.rx_packets += got as u64;
            if got < BATCH {
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
    sys::set_buffers(sock.as_fd(), RCVBUF, SNDBUF);
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// Check that a received datagram comes from the switch and give it the headers it had
/// on the wire. A switch sends from a per-connection source port (not 4791): only its
/// address identifies it; the engine checks the QPN and the ICRC.
fn accept_frame(
    frame: &mut [u8],
    from: SocketAddrV4,
    local: SocketAddrV4,
    switch_ip: Ipv4Addr,
    switch_mac: EthernetAddress,
    mac: EthernetAddress,
) -> bool {
    if *from.ip() != switch_ip {
        trace!(%from, "datagram not from the switch dropped");
        return false;
    }
    rebuild_headers(frame, from, local, switch_mac, mac).is_ok()
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
        for (from, mut frame) in qp.take_forwarded() {
            if accept_frame(&mut frame, from, local, switch_ip, *switch_mac, mac) {
                engine.handle_frame(now, &frame, bufs);
                handled += 1;
            }
        }
        io.recv_datagrams(|from, frame| {
            if !qp.is_mine(from, frame) {
                return true;
            }
            if !accept_frame(frame, from, local, switch_ip, *switch_mac, mac) {
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
    /// exhausts its retries while the application computes.
    fn service_idle(&mut self) -> io::Result<()> {
        let mut none = OpBuffers::None;
        self.receive(&mut none)?;
        self.fire_timers();
        self.flush(&none)?;
        Ok(())
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

fn progress_loop(core: Arc<Mutex<Core>>, sock: Arc<UdpSocket>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let (timer, inbox) = {
            let mut c = lock(&core);
            if let Err(e) = c.service_idle() {
                debug!(error = %e, "progress thread: socket error");
            }
            (c.next_timer(), c.qp.inbox_handle())
        };
        // Receiving drained the inbox's wake-up socket, which also carries the stop
        // request: look again before sleeping on it.
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // A timer already due makes this return at once; `service_idle` fires it next.
        wait(&[sock.as_fd(), inbox.wake_fd()], PollFlags::POLLIN, timer).ok();
        // While a collective runs, the caller holds the lock and this thread waits on
        // it above instead of spinning on the readable socket.
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
}

impl UdpTransport {
    pub(crate) fn open(dp: &DataPlane, rank: u16, cfg: &CommConfig) -> Result<Self> {
        let ctx = || format!("rank {rank}: data-plane UDP socket on {}", dp.ip);
        let port =
            SharedPort::get(dp.ip, |p| bind_socket(dp.ip, p)).map_err(|e| Error::io(ctx(), e))?;
        let qp = port.attach(|| random_qpn_psn().0).map_err(|e| Error::io(ctx(), e))?;
        let (qpn, start_psn) = (qp.qpn(), random_qpn_psn().1);
        let local = port.local_addr();
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
        let core = Arc::new(Mutex::new(Core {
            io: RoceSocket::on(sock.clone(), self.local, self.mac),
            qp,
            epoch: Instant::now(),
            engine: HostEngine::with_options(config, opts),
            switch: SocketAddrV4::new(ep.switch_ip, inc_wire::ROCEV2_PORT),
            switch_mac: ep.switch_mac,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (core, stop) = (core.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("inccl-progress-{}", ep.comm_id))
                .spawn(move || progress_loop(core, sock, stop))
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

    fn run(&mut self, spec: CollectiveSpec, mut bufs: OpBuffers<'_>) -> Result<()> {
        let Some(core) = self.core.clone() else {
            return Err(Error::Unusable("communicator", "its QP is not connected".into()));
        };
        // Held for the whole collective: the progress thread only runs between them.
        let mut c = lock(&core);
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
                .wait_readable(wait_for)
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

/// Write the Ethernet/IPv4/UDP headers in front of a received RoCEv2 datagram that
/// occupies `frame[HEADERS..]`: what a packet socket would have captured from the wire
/// for a datagram sent with `IP_PMTUDISC_DO` (ID 0, DF, TTL 64, TOS 0).
pub(crate) fn rebuild_headers(
    frame: &mut [u8],
    from: SocketAddrV4,
    to: SocketAddrV4,
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
        ident: 0,
        dont_frag: true,
    }
    .emit(&mut Ipv4Packet::new_unchecked(&mut frame[14..34]))?;
    UdpRepr { src_port: from.port(), dst_port: to.port(), payload_len: udp_len - 8 }
        .emit(&mut UdpPacket::new_unchecked(&mut frame[34..42]))?;
    Ok(())
}
