//! Opening one port inside its namespace: the AF_PACKET socket and its options
//! (TPACKET version, virtio-net headers, receive ring, qdisc bypass, promiscuous
//! membership), what the interface offers (MAC, MTU, TX checksum offload, driver),
//! and the state the backend keeps per port.

use std::os::fd::{AsRawFd, OwnedFd};

use tracing::{debug, warn};

use super::ring::{self, Ring};
use super::{AfPacketConfig, RxRing};
use crate::backend::{IoError, PortDesc, PortSpec};
use crate::sys;

/// One port: its socket, its receive ring, and what may be sent on it.
#[derive(Debug)]
pub(super) struct PortSock {
    pub(super) fd: OwnedFd,
    pub(super) ring: Ring,
    pub(super) label: String,
    /// Drops reported by PACKET_STATISTICS so far (the kernel resets on read).
    pub(super) kernel_drops: u64,
    /// Every frame sent carries a virtio-net header (`PACKET_VNET_HDR`).
    pub(super) vnet: bool,
    /// The interface offloads TX checksums, so GSO frames leave it whole.
    pub(super) whole_gso_frames: bool,
    /// The port faces a host
    /// ([`Backend::set_host_port`](crate::Backend::set_host_port)): runs of frames may
    /// go out as UDP GSO frames.
    pub(super) host_port: bool,
    /// The port's peer is a port of this backend ([`AfPacketConfig::gso_links`]).
    pub(super) gso_link: bool,
    /// The receive ring takes whole GSO frames from a host on a veth
    /// ([`AfPacketConfig::host_ports`]).
    pub(super) takes_gso_frames: bool,
    /// The kernel refused a GSO frame on this socket: no more of them.
    pub(super) gso_refused: bool,
}

/// Turns a failure of `op` on `spec`'s interface into an [`IoError`] naming both.
fn iface_err(op: &'static str, spec: &PortSpec) -> impl FnOnce(std::io::Error) -> IoError {
    let iface = spec.label();
    move |source| IoError::Interface { op, iface, source }
}

/// Open one port: socket, ring, options, bind. Runs inside the port's namespace.
pub(super) fn open_port(
    spec: &PortSpec,
    cfg: &AfPacketConfig,
) -> Result<(PortSock, PortDesc), IoError> {
    // Protocol 0: receive nothing until bound, so no frame lands in the socket's
    // ordinary queue (which would keep poll readable) before the ring exists.
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let fd = socket(AddressFamily::Packet, SockType::Raw, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| iface_err("socket(AF_PACKET)", spec)(e.into()))?;
    let raw = fd.as_raw_fd();
    let ifindex = sys::if_index(&spec.ifname).map_err(iface_err("find interface", spec))?;
    let mac = sys::if_mac(fd.as_raw_fd(), &spec.ifname).map_err(iface_err("read MAC", spec))?;
    let mtu = sys::if_mtu(fd.as_raw_fd(), &spec.ifname).ok();
    // A host's userspace RoCE socket sees a GSO frame's segments with their IPv4 IDs
    // (which the ICRCs cover) only if the frame reaches it whole (UDP GRO); if this
    // interface has no TX checksum offload, the kernel cuts it up right here.
    let whole_gso_frames = sys::if_tx_checksum_offload(fd.as_raw_fd(), &spec.ifname)
        .inspect_err(|e| debug!(iface = %spec, error = %e, "ETHTOOL_GTXCSUM failed"))
        .unwrap_or(false);
    let gso_link = cfg.ring == RxRing::V2 && cfg.gso_links.contains(spec);
    // Only a veth: what reaches it was cut (if at all) by this machine's kernel, which
    // numbers segments as the host stamped their ICRCs; a NIC's segmentation is not
    // ours to predict.
    let gso_from_host = cfg.ring == RxRing::V2
        && cfg.host_ports.contains(spec)
        && sys::if_driver(raw, &spec.ifname)
            .inspect_err(|e| debug!(iface = %spec, error = %e, "ETHTOOL_GDRVINFO failed"))
            .is_ok_and(|d| d == "veth");

    let what = if gso_link || gso_from_host {
        ring::RingUse::Gso
    } else if cfg.quiet_ports.contains(spec) {
        ring::RingUse::Quiet
    } else {
        ring::RingUse::Plain
    };
    let (version, req) = ring::request(cfg, mtu, what);
    let v = version as libc::c_int;
    sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VERSION, &v)
        .map_err(iface_err("set TPACKET version", spec))?;
    // A virtio-net header in front of every frame sent lets one send carry a run of
    // frames to a host as one UDP GSO frame (see `send_port`). It must be set before
    // the ring exists; without it (or on a V3 ring) frames go one by one.
    let one: libc::c_int = 1;
    let vnet = cfg.ring == RxRing::V2
        && sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_VNET_HDR, &one)
            .inspect_err(|e| debug!(iface = %spec, error = %e, "PACKET_VNET_HDR unavailable"))
            .is_ok();
    ring::set_rx_ring(raw, cfg.ring, &req).map_err(iface_err("set up PACKET_RX_RING", spec))?;
    let ring = Ring::map(raw, cfg.ring, &req).map_err(iface_err("mmap receive ring", spec))?;

    if let Err(e) = sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one) {
        warn!(iface = %spec, error = %e, "PACKET_QDISC_BYPASS unavailable");
    }
    if let Err(e) = sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one) {
        // Outgoing frames are also filtered by packet type on receive (`rx::deliver`).
        debug!(iface = %spec, error = %e, "PACKET_IGNORE_OUTGOING unavailable");
    }
    let sndbuf: libc::c_int = 4 << 20;
    let _ = sys::setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, &sndbuf);

    // Safety: sockaddr_ll is plain old data; all-zero is valid before the fields are set.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sll.sll_ifindex = ifindex as i32;
    // Safety: `sll` is a valid sockaddr_ll of the length passed.
    let rc = unsafe {
        libc::bind(
            raw,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(iface_err("bind", spec)(std::io::Error::last_os_error()));
    }
    if cfg.promiscuous {
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as i32,
            mr_type: libc::PACKET_MR_PROMISC as u16,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq)
            .map_err(iface_err("enable promiscuous mode", spec))?;
    }
    let desc = PortDesc { spec: spec.clone(), mac, mtu };
    let sock = PortSock {
        fd,
        ring,
        label: spec.label(),
        kernel_drops: 0,
        vnet,
        whole_gso_frames,
        host_port: false,
        gso_link: gso_link && vnet,
        takes_gso_frames: gso_from_host && vnet,
        gso_refused: false,
    };
    Ok((sock, desc))
}
