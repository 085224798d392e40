//! [`RoceSocket`]: batched RoCEv2-over-UDP I/O of one QP on a socket (its own, or the
//! process's shared one, see [`super::port`]), its counters, and the socket's setup.
//! Its send path is in [`super::send`], its receive path in [`super::recv`].

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use inc_wire::EthernetAddress;
use nix::poll::PollFlags;

use super::sys::{self, wait, BATCH};
use super::HEADERS;

/// Bytes per transmit buffer: headers + BTH + extension headers + 4096-byte payload +
/// ICRC.
pub(super) const SLOT: usize = 4608;
/// Bytes per receive buffer: headers + the largest UDP datagram, which UDP GRO fills
/// with several frames a switch sent as one GSO frame.
pub(super) const RX_SLOT: usize = HEADERS + 65_536;
/// Receive buffers per `recvmmsg`.
pub(super) const RX_BATCH: usize = 16;
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
    pub(super) sock: Arc<UdpSocket>,
    pub(super) local: SocketAddrV4,
    pub(super) mac: EthernetAddress,
    pub(super) tx: Vec<u8>,
    pub(super) rx: Vec<u8>,
    pub(super) stats: UdpStats,
    /// Send runs of equal-size frames as UDP GSO sends.
    pub(super) gso: bool,
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
    pub(super) fn on(
        sock: Arc<UdpSocket>,
        local: SocketAddrV4,
        mac: EthernetAddress,
    ) -> RoceSocket {
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

    /// Wait up to `timeout` for a datagram; true if one is queued.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        wait(&[self.sock.as_fd()], PollFlags::POLLIN, Some(timeout))
    }
}

/// A non-blocking UDP socket on `ip:port` with the RoCEv2 options.
pub(super) fn bind_socket(ip: Ipv4Addr, port: u16) -> io::Result<UdpSocket> {
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
