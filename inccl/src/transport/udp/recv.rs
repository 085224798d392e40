//! The receive path: `recvmmsg` lands each datagram after [`HEADERS`] bytes of
//! headroom, a UDP GRO datagram is split into the frames it carries, and the
//! Ethernet/IPv4/UDP headers each had on the wire are rebuilt in front of it (the IPv4
//! ID as its sender chose it, [`IdentRule`]) so the engine verifies the ICRC over what
//! was sent.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsFd;

use inc_wire::{
    BthPacket, EtherType, EthernetAddress, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr,
    UdpPacket, UdpRepr,
};
use tracing::trace;

use super::socket::{RoceSocket, RX_BATCH, RX_SLOT};
use super::sys::{self, RecvMeta};
use super::HEADERS;

impl RoceSocket {
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
    pub(super) fn recv_datagrams(
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
pub(super) fn accept_frame(
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
