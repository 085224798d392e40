//! Userspace RoCEv2 over an unconnected UDP socket per QP.
//!
//! The socket is bound to the data-plane IP and its own UDP port (registered as the
//! rank's `udp_port`, so the switch sends there) with `IP_PMTUDISC_DO`: the kernel then
//! writes IPv4 ID 0, DF, TTL 64, TOS 0, exactly the bytes the engine's ICRC covers.
//! Sending strips the 42-byte Ethernet/IPv4/UDP headers of an engine frame and sends
//! BTH..ICRC to the switch; receiving lands the datagram at offset 42 of a slot and
//! rebuilds the headers in front of it (ID 0, DF, TTL 64, addresses and ports from the
//! datagram) so the engine verifies the ICRC over what was on the wire.

mod sys;

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use inc_ctrl_proto::{HostEndpoint, Mac, RankEndpoint};
use inc_protocol::Time;
use inc_wire::{
    EtherType, EthernetAddress, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr, UdpPacket,
    UdpRepr,
};
use inccl_engine::{CollectiveSpec, HostEngine, HostOptions, HostQpConfig, OpBuffers};
use nix::poll::PollFlags;
use tracing::{debug, trace};

use self::sys::{RecvMeta, BATCH};
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
}

/// Batched RoCEv2-over-UDP I/O of one QP: an unconnected UDP socket with
/// `IP_PMTUDISC_DO`, `sendmmsg` of the UDP payloads of complete frames, `recvmmsg` into
/// buffers with room for the rebuilt Ethernet/IPv4/UDP headers. Public (hidden) for the
/// point-to-point benchmark in `hosts/`.
#[derive(Debug)]
pub struct RoceSocket {
    sock: UdpSocket,
    local: SocketAddrV4,
    mac: Mac,
    tx: Vec<u8>,
    rx: Vec<u8>,
    stats: UdpStats,
}

impl RoceSocket {
    /// Bind `ip:port` (port 0: any); `mac` is the destination MAC of rebuilt frames.
    pub fn bind(ip: Ipv4Addr, port: u16, mac: Mac) -> io::Result<RoceSocket> {
        let sock = UdpSocket::bind(SocketAddrV4::new(ip, port))?;
        sys::set_pmtudisc_do(sock.as_fd())?;
        sys::set_buffers(sock.as_fd(), RCVBUF, SNDBUF);
        sock.set_nonblocking(true)?;
        let local = match sock.local_addr()? {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(a) => {
                return Err(io::Error::other(format!("socket bound to non-IPv4 {a}")));
            }
        };
        Ok(RoceSocket {
            sock,
            local,
            mac,
            tx: vec![0; SLOT * BATCH],
            rx: vec![0; SLOT * BATCH],
            stats: UdpStats::default(),
        })
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
            let deadline = Instant::now() + Duration::from_secs(5);
            while done < n {
                match sys::send_batch(self.sock.as_fd(), &pkts[done..n]) {
                    Ok(0) if Instant::now() < deadline => {
                        wait(&self.sock, PollFlags::POLLOUT, Duration::from_millis(10))?;
                    }
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("socket {} stayed full for 5 s sending to {to}", self.local),
                        ))
                    }
                    Ok(k) => done += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            sent += n;
            self.stats.tx_packets += n as u64;
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
        peer_mac: Mac,
        mut handle: impl FnMut(&[u8]),
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
                // A switch sends from a per-connection source port (not 4791): only its
                // address identifies it; the engine checks the QPN and the ICRC.
                if m.truncated || *m.from.ip() != from_ip {
                    trace!(from = %m.from, len = m.len, truncated = m.truncated, "datagram dropped");
                    self.stats.rx_dropped += 1;
                    continue;
                }
                let frame = &mut self.rx[i * SLOT..i * SLOT + HEADERS + m.len];
                if rebuild_headers(frame, m.from, self.local, peer_mac, self.mac).is_err() {
                    self.stats.rx_dropped += 1;
                    continue;
                }
                handle(frame);
                handled += 1;
            }
            self.stats.rx_packets += got as u64;
            if got < BATCH {
                return Ok(handled);
            }
        }
    }

    /// Wait up to `timeout` for a datagram; true if one is queued.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        wait(&self.sock, PollFlags::POLLIN, timeout)
    }
}

#[derive(Debug)]
pub(crate) struct UdpTransport {
    io: RoceSocket,
    rank: u16,
    qpn: u32,
    start_psn: u32,
    op_timeout: Duration,
    epoch: Instant,
    peer: Option<Peer>,
}

#[derive(Debug)]
struct Peer {
    engine: HostEngine,
    switch: SocketAddrV4,
    switch_mac: Mac,
    comm_id: u32,
    switch_id: u32,
}

impl UdpTransport {
    pub(crate) fn open(dp: &DataPlane, rank: u16, cfg: &CommConfig) -> Result<Self> {
        let io = RoceSocket::bind(dp.ip, 0, dp.mac).map_err(|e| {
            Error::io(format!("rank {rank}: data-plane UDP socket on {}", dp.ip), e)
        })?;
        let (qpn, start_psn) = random_qpn_psn();
        debug!(rank, local = %io.local_addr(), qpn, start_psn, "userspace RoCEv2 QP created");
        Ok(UdpTransport {
            io,
            rank,
            qpn,
            start_psn,
            op_timeout: cfg.op_timeout,
            epoch: Instant::now(),
            peer: None,
        })
    }

    fn now(&self) -> Time {
        Time::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn fail(&self, reason: String) -> Error {
        let comm_id = self.peer.as_ref().map_or(0, |p| p.comm_id);
        Error::Collective { rank: self.rank, comm_id, reason }
    }

    /// Send everything the engine has ready. Returns packets sent.
    fn flush(&mut self, bufs: &OpBuffers<'_>) -> Result<usize> {
        let UdpTransport { io, peer, epoch, .. } = self;
        let peer = peer.as_mut().expect("connected");
        let to = peer.switch;
        let engine = &mut peer.engine;
        let r = io.send_frames(to, |slot| {
            engine.poll_transmit(Time::from_nanos(epoch.elapsed().as_nanos() as u64), slot, bufs)
        });
        r.map_err(|e| {
            self.fail(format!("sending to switch {to} from {}: {e}", self.io.local_addr()))
        })
    }

    /// Receive every queued datagram and feed the engine. Returns packets handled.
    fn receive(&mut self, bufs: &mut OpBuffers<'_>) -> Result<usize> {
        let now = self.now();
        let UdpTransport { io, peer, .. } = self;
        let peer = peer.as_mut().expect("connected");
        let engine = &mut peer.engine;
        let r = io.recv_frames(*peer.switch.ip(), peer.switch_mac, |frame| {
            engine.handle_frame(now, frame, bufs)
        });
        r.map_err(|e| self.fail(format!("receiving on {}: {e}", self.io.local_addr())))
    }
}

impl Transport for UdpTransport {
    fn local_endpoint(&self) -> RankEndpoint {
        let local = self.io.local_addr();
        RankEndpoint {
            rank: self.rank,
            ip: *local.ip(),
            mac: Some(self.io.mac),
            qpn: self.qpn,
            start_psn: self.start_psn,
            udp_port: local.port(),
        }
    }

    fn connect(&mut self, ep: &HostEndpoint, world_size: u16) -> Result<()> {
        let local = self.io.local_addr();
        if ep.host_qpn != self.qpn || ep.host_udp_port != local.port() || ep.rank != self.rank {
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
                    local.port()
                ),
            });
        }
        let config = HostQpConfig::from_endpoint(
            ep,
            world_size,
            EthernetAddress(self.io.mac.0),
            *local.ip(),
        );
        let opts = HostOptions { progress_timeout: self.op_timeout, ..HostOptions::default() };
        self.peer = Some(Peer {
            engine: HostEngine::with_options(config, opts),
            switch: SocketAddrV4::new(ep.switch_ip, inc_wire::ROCEV2_PORT),
            switch_mac: ep.switch_mac,
            comm_id: ep.comm_id,
            switch_id: ep.switch_id,
        });
        Ok(())
    }

    fn run(&mut self, spec: CollectiveSpec, mut bufs: OpBuffers<'_>) -> Result<()> {
        let now = self.now();
        let Some(peer) = self.peer.as_mut() else {
            return Err(Error::Unusable("communicator", "its QP is not connected".into()));
        };
        peer.engine.start(now, spec).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        // Backstop for the engine's own progress timeout (which names the stalled PSN
        // and fires first): give up if nothing at all arrives for longer.
        let stall_limit = self.op_timeout + Duration::from_secs(1);
        let mut last_rx = Instant::now();
        loop {
            self.flush(&bufs)?;
            let peer = self.peer.as_mut().expect("connected");
            if let Some(done) = peer.engine.poll_completion() {
                trace!(stats = ?self.io.stats(), "collective finished");
                return done.map_err(|e| self.fail(e.to_string()));
            }
            let now = Time::from_nanos(self.epoch.elapsed().as_nanos() as u64);
            let until_timer =
                peer.engine.poll_timeout().map(|t| if t > now { t - now } else { Duration::ZERO });
            let stall_left = stall_limit.saturating_sub(last_rx.elapsed());
            let wait_for = until_timer.map_or(stall_left, |t| t.min(stall_left));
            let readable = self
                .io
                .wait_readable(wait_for)
                .map_err(|e| self.fail(format!("poll on {}: {e}", self.io.local_addr())))?;
            if readable && self.receive(&mut bufs)? > 0 {
                last_rx = Instant::now();
            }
            let now = self.now();
            let peer = self.peer.as_mut().expect("connected");
            if peer.engine.poll_timeout().is_some_and(|t| t <= now) {
                peer.engine.handle_timeout(now);
            }
            if last_rx.elapsed() >= stall_limit {
                let (switch, switch_id) = (peer.switch, peer.switch_id);
                let counters = peer.engine.counters();
                return Err(self.fail(format!(
                    "{:?} of {} elements made no progress for {stall_limit:?}: nothing received \
                     from switch {switch_id} at {switch} (a peer rank or switch may be down); \
                     engine {counters:?}; socket {:?}",
                    spec.kind,
                    spec.count,
                    self.io.stats()
                )));
            }
        }
    }
}

/// Wait up to `timeout` for `events` on the socket; true if ready.
fn wait(sock: &UdpSocket, events: PollFlags, timeout: Duration) -> io::Result<bool> {
    use nix::poll::{poll, PollFd, PollTimeout};
    // Round up so a sub-millisecond timer does not become a busy loop.
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(u128::from(u16::MAX)) as u16;
    let mut fds = [PollFd::new(sock.as_fd(), events)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Write the Ethernet/IPv4/UDP headers in front of a received RoCEv2 datagram that
/// occupies `frame[HEADERS..]`: what a packet socket would have captured from the wire
/// for a datagram sent with `IP_PMTUDISC_DO` (ID 0, DF, TTL 64, TOS 0).
pub(crate) fn rebuild_headers(
    frame: &mut [u8],
    from: SocketAddrV4,
    to: SocketAddrV4,
    src_mac: Mac,
    dst_mac: Mac,
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
