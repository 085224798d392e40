//! AF_PACKET backend: a TPACKET_V2 receive ring per port (the default: per-frame
//! hand-over, lowest latency) or, on request, a TPACKET_V3 one (per-block hand-over),
//! batched `sendmmsg` transmit, `PACKET_QDISC_BYPASS`, `PACKET_IGNORE_OUTGOING`,
//! promiscuous membership, and one epoll over every ring plus an eventfd waker.
//!
//! Ports may live in other network namespaces: each socket is created inside its
//! namespace on a helper thread (see [`crate::sys`]) and stays bound to it, so one
//! process can serve all switches of a topology.
//!
//! Latency note: TPACKET_V3 hands a block to user space when it is full or when its
//! retire timer (whole milliseconds) fires. Small blocks keep the delay short under
//! moderate load; the timer bounds it when the link is nearly idle. TPACKET_V2
//! ([`RxRing::V2`]) hands over every frame at once (one wakeup per frame when idle),
//! which removes that delay from every hop.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use inc_protocol::QueuedFrame;
use tracing::{debug, warn};

use crate::backend::{
    Backend, IoError, PortCounters, PortDesc, PortSpec, RxRotation, TxStaging, Waker,
};
use crate::sys::{self, Epoll, EventFd};

/// Size of `tpacket3_hdr` rounded up to TPACKET_ALIGNMENT: where the sockaddr_ll starts.
const TPACKET3_HDR_ALIGNED: usize =
    (std::mem::size_of::<libc::tpacket3_hdr>() + libc::TPACKET_ALIGNMENT - 1)
        & !(libc::TPACKET_ALIGNMENT - 1);

/// Receive ring layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxRing {
    /// TPACKET_V3: variable-size frames packed in blocks, handed over per block.
    V3,
    /// TPACKET_V2: fixed frame slots sized for the interface MTU, handed over per frame.
    V2,
}

/// Size of `tpacket2_hdr` rounded up to TPACKET_ALIGNMENT.
const TPACKET2_HDR_ALIGNED: usize =
    (std::mem::size_of::<libc::tpacket2_hdr>() + libc::TPACKET_ALIGNMENT - 1)
        & !(libc::TPACKET_ALIGNMENT - 1);

/// Ring and batch geometry.
#[derive(Debug, Clone)]
pub struct AfPacketConfig {
    /// Receive ring layout.
    pub ring: RxRing,
    /// V3: receive block size in bytes (multiple of the page size); frames larger than
    /// a block are dropped and counted. V2: ignored (slots fit the interface MTU).
    pub block_size: u32,
    /// V3: receive blocks per port. V2: a quarter of the frame slots per port (frames
    /// arrive one per slot, so V2 needs more of them for the same burst).
    pub block_count: u32,
    /// Block retire timeout in milliseconds (>= 1).
    pub block_timeout_ms: u32,
    /// Frames per transmit batch.
    pub tx_batch: usize,
    /// Largest frame transmitted (bytes, Ethernet header to end of ICRC).
    pub max_frame: usize,
    /// Put the interfaces in promiscuous mode (membership, undone on close).
    pub promiscuous: bool,
    /// Ports whose link peer is another port of this process on this backend (two
    /// switches of one `inc-switch`): runs of frames between them travel as UDP GSO
    /// frames, which their receive rings take whole (V2 slots of 64 KiB and more)
    /// and split. Any other peer (another process, another backend) would get frames
    /// it cannot read, so only ports listed here send GSO frames towards switches.
    pub gso_links: Vec<PortSpec>,
    /// Ports that face hosts (from the topology). On a veth their receive rings take
    /// whole UDP GSO frames (like [`Self::gso_links`]) and the port says so
    /// ([`Backend::takes_gso_frames`]), so that a host whose own kernel would
    /// otherwise cut its GSO sends into datagrams can hand them over whole.
    pub host_ports: Vec<PortSpec>,
}

impl Default for AfPacketConfig {
    fn default() -> Self {
        AfPacketConfig {
            ring: RxRing::V2,
            block_size: 16 * 1024,
            block_count: 128,
            block_timeout_ms: 1,
            tx_batch: 64,
            max_frame: 9216,
            promiscuous: true,
            gso_links: Vec::new(),
            host_ports: Vec::new(),
        }
    }
}

/// Receive ring mapped from the kernel: `slot_count` slots of `slot_size` bytes; a
/// slot is a block (V3) or a frame (V2).
#[derive(Debug)]
struct Ring {
    base: *mut u8,
    len: usize,
    version: RxRing,
    slot_size: usize,
    slot_count: usize,
    /// Next slot to look at.
    cur: usize,
}

// Safety: the mapping is owned by this Ring and only touched through `&mut self` or
// atomics; moving it to another thread is sound.
unsafe impl Send for Ring {}

impl Ring {
    /// Status word of slot `i`, shared with the kernel.
    fn status(&self, i: usize) -> &AtomicU32 {
        let field = match self.version {
            RxRing::V3 => std::mem::offset_of!(libc::tpacket_block_desc, hdr),
            RxRing::V2 => std::mem::offset_of!(libc::tpacket2_hdr, tp_status),
        };
        let off = i * self.slot_size + field;
        // Safety: slot i lies inside the mapping; the status is a 4-aligned u32 at the
        // start of the slot's header (slots start 16-aligned), and the kernel accesses it
        // concurrently, hence an atomic view.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    fn ready(&self) -> bool {
        self.status(self.cur).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Safety: base/len are exactly what mmap returned; nothing borrows the ring now.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[derive(Debug)]
struct PortSock {
    fd: OwnedFd,
    ring: Ring,
    label: String,
    /// Drops reported by PACKET_STATISTICS so far (the kernel resets on read).
    kernel_drops: u64,
    /// Every frame sent carries a virtio-net header (`PACKET_VNET_HDR`).
    vnet: bool,
    /// The interface offloads TX checksums, so GSO frames leave it whole.
    whole_gso_frames: bool,
    /// The port faces a host ([`Backend::set_host_port`]): runs of frames may go out
    /// as UDP GSO frames.
    host_port: bool,
    /// The port's peer is a port of this backend ([`AfPacketConfig::gso_links`]).
    gso_link: bool,
    /// The receive ring takes whole GSO frames from a host on a veth
    /// ([`AfPacketConfig::host_ports`]).
    takes_gso_frames: bool,
    /// The kernel refused a GSO frame on this socket: no more of them.
    gso_refused: bool,
}

/// The AF_PACKET backend.
#[derive(Debug)]
pub struct AfPacketBackend {
    config: AfPacketConfig,
    ports: Vec<PortDesc>,
    socks: Vec<PortSock>,
    counters: Vec<PortCounters>,
    epoll: Epoll,
    wake: Arc<EventFd>,
    /// Frames written and committed since the last flush.
    tx: TxStaging,
    /// Port to start the next receive round at (fairness).
    rx_rotation: RxRotation,
}

fn iface_err(op: &'static str, spec: &PortSpec) -> impl FnOnce(std::io::Error) -> IoError {
    let iface = spec.label();
    move |source| IoError::Interface { op, iface, source }
}

/// Open one port: socket, ring, options, bind. Runs inside the port's namespace.
fn open_port(spec: &PortSpec, cfg: &AfPacketConfig) -> Result<(PortSock, PortDesc), IoError> {
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

    let (version, req) = match cfg.ring {
        RxRing::V3 => {
            let frame_size = 2048u32;
            let req = libc::tpacket_req3 {
                tp_block_size: cfg.block_size,
                tp_block_nr: cfg.block_count,
                tp_frame_size: frame_size,
                tp_frame_nr: cfg.block_size / frame_size * cfg.block_count,
                tp_retire_blk_tov: cfg.block_timeout_ms.max(1),
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            (libc::tpacket_versions::TPACKET_V3, req)
        }
        RxRing::V2 => {
            // One frame per block: a slot holds header, address and a full-MTU frame.
            let need =
                TPACKET2_HDR_ALIGNED + std::mem::size_of::<libc::sockaddr_ll>() + 16 + VNET_HDR_LEN;
            // A GSO link's slots hold a whole GSO frame (up to 64 KiB of UDP payload);
            // half as many of them, as each usually holds several frames.
            let (frame, slots) = if gso_link || gso_from_host {
                (inc_wire::gso::MAX_PAYLOAD + UDP_PAYLOAD_AT, cfg.block_count * 2)
            } else {
                (mtu.unwrap_or(1500) as usize + 14, cfg.block_count * 4)
            };
            let slot = (need + frame).div_ceil(4096) * 4096;
            let req = libc::tpacket_req3 {
                tp_block_size: slot as u32,
                tp_block_nr: slots,
                tp_frame_size: slot as u32,
                tp_frame_nr: slots,
                tp_retire_blk_tov: 0,
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            (libc::tpacket_versions::TPACKET_V2, req)
        }
    };
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
    // V2 reads only the leading tpacket_req fields of the same layout.
    let set = match cfg.ring {
        RxRing::V3 => sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req),
        RxRing::V2 => {
            let req2 = libc::tpacket_req {
                tp_block_size: req.tp_block_size,
                tp_block_nr: req.tp_block_nr,
                tp_frame_size: req.tp_frame_size,
                tp_frame_nr: req.tp_frame_nr,
            };
            sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req2)
        }
    };
    set.map_err(iface_err("set up PACKET_RX_RING", spec))?;
    let len = req.tp_block_size as usize * req.tp_block_nr as usize;
    // Safety: maps the ring just configured on `raw`; the result is checked and owned
    // by `Ring`, which unmaps it on drop.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            raw,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(iface_err("mmap receive ring", spec)(std::io::Error::last_os_error()));
    }
    let ring = Ring {
        base: base.cast(),
        len,
        version: cfg.ring,
        slot_size: req.tp_block_size as usize,
        slot_count: req.tp_block_nr as usize,
        cur: 0,
    };

    if let Err(e) = sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_QDISC_BYPASS, &one) {
        warn!(iface = %spec, error = %e, "PACKET_QDISC_BYPASS unavailable");
    }
    if let Err(e) = sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one) {
        // Outgoing frames are also filtered by packet type below.
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

/// Hand one received frame to `sink` unless it is truncated, outgoing or out of bounds.
/// `hdr` is the offset of its tpacket header in the ring, `sll_at` the aligned header
/// size after which the sockaddr_ll follows, `(mac, snaplen, len)` from the header.
/// With `vnet` (PACKET_VNET_HDR) a UDP GSO frame is handed over as its segments.
/// Returns the frames delivered.
#[allow(clippy::too_many_arguments)]
fn deliver(
    ring: &Ring,
    hdr: usize,
    sll_at: usize,
    (mac, snap, len): (usize, u32, u32),
    vnet: bool,
    port: usize,
    c: &mut PortCounters,
    sink: &mut dyn FnMut(usize, &[u8]),
) -> usize {
    let slot_end = (hdr / ring.slot_size + 1) * ring.slot_size;
    let sll = hdr + sll_at;
    if hdr + mac + snap as usize > slot_end
        || sll + std::mem::size_of::<libc::sockaddr_ll>() > slot_end
    {
        return 0;
    }
    if snap < len {
        // Larger than a slot holds: never hand a cut frame to the engine.
        c.rx_truncated += 1;
        return 0;
    }
    // Safety: the sockaddr_ll follows the aligned header inside the user-owned slot
    // (bounds checked above).
    let pkttype = unsafe { (*(ring.base.add(sll) as *const libc::sockaddr_ll)).sll_pkttype };
    if pkttype == libc::PACKET_OUTGOING {
        return 0;
    }
    let vnet = (vnet && mac >= VNET_HDR_LEN).then(|| {
        // Safety: with PACKET_VNET_HDR the kernel writes a virtio-net header right in
        // front of the frame, inside the user-owned slot; it may be unaligned.
        unsafe {
            std::ptr::read_unaligned(ring.base.add(hdr + mac - VNET_HDR_LEN) as *const VirtioNetHdr)
        }
    });
    // Safety: [hdr+mac, hdr+mac+snap) lies inside the user-owned slot (checked above),
    // which nothing else reads or writes until it is handed back to the kernel.
    let frame = unsafe { std::slice::from_raw_parts_mut(ring.base.add(hdr + mac), snap as usize) };
    match vnet.filter(|v| v.gso_type == VIRTIO_NET_HDR_GSO_UDP_L4 && v.gso_size > 0) {
        Some(v) if is_plain_udp(frame) => {
            c.rx_gso_frames += 1;
            split_gso_frame(frame, v.gso_size.into(), port, c, sink)
        }
        _ => {
            c.rx_packets += 1;
            c.rx_bytes += u64::from(snap);
            sink(port, frame);
            1
        }
    }
}

/// Hand the segments of a received UDP GSO frame to `sink` as the frames they were
/// sent as: segment `k` gets the first frame's headers with its own lengths, IPv4 ID
/// (first + `k`, as segmentation numbers them and the sender stamped its ICRC for) and
/// checksums, written
/// in place over the last 42 bytes of segment `k - 1`, which `sink` is done with.
fn split_gso_frame(
    frame: &mut [u8],
    size: usize,
    port: usize,
    c: &mut PortCounters,
    sink: &mut dyn FnMut(usize, &[u8]),
) -> usize {
    let mut head = [0u8; UDP_PAYLOAD_AT];
    head.copy_from_slice(&frame[..UDP_PAYLOAD_AT]);
    let base = ident(&head);
    let payload = frame.len() - UDP_PAYLOAD_AT;
    let mut n = 0;
    for (k, start) in (0..payload).step_by(size).enumerate() {
        let seg = size.min(payload - start);
        let at = start; // the segment's headers end where its payload starts
        let f = &mut frame[at..at + UDP_PAYLOAD_AT + seg];
        f[..UDP_PAYLOAD_AT].copy_from_slice(&head);
        f[16..18].copy_from_slice(&((28 + seg) as u16).to_be_bytes());
        f[18..20].copy_from_slice(&base.wrapping_add(k as u16).to_be_bytes());
        f[24..26].copy_from_slice(&[0, 0]);
        let ip_csum = inc_wire::ipv4::internet_checksum(&f[14..34]);
        f[24..26].copy_from_slice(&ip_csum.to_be_bytes());
        f[38..40].copy_from_slice(&((8 + seg) as u16).to_be_bytes());
        f[40..42].copy_from_slice(&[0, 0]);
        c.rx_packets += 1;
        c.rx_bytes += f.len() as u64;
        sink(port, f);
        n += 1;
    }
    n
}

impl AfPacketBackend {
    /// Open every port (entering namespaces as needed). Port index = position in `ports`.
    pub fn open(ports: &[PortSpec], config: AfPacketConfig) -> Result<Self, IoError> {
        let page = 4096u32;
        if config.block_size == 0
            || config.block_size % page != 0
            || config.block_count == 0
            || config.tx_batch == 0
            || config.max_frame < 64
        {
            return Err(IoError::Config(format!(
                "bad AF_PACKET geometry: block size {} must be a positive multiple of {page}; \
                 block count and tx batch must be positive; max frame at least 64 bytes",
                config.block_size
            )));
        }
        let epoll = Epoll::new()?;
        let wake = Arc::new(EventFd::new()?);
        epoll
            .add(wake.fd(), u64::MAX)
            .map_err(|source| IoError::Sys { op: "epoll add", source })?;
        let mut socks = Vec::with_capacity(ports.len());
        let mut descs = Vec::with_capacity(ports.len());
        for (i, spec) in ports.iter().enumerate() {
            let (s, c) = (spec.clone(), config.clone());
            let (sock, desc) = sys::in_netns(spec.netns.as_deref(), move || open_port(&s, &c))?;
            epoll.add(&sock.fd, i as u64).map_err(|source| IoError::Interface {
                op: "epoll add",
                iface: spec.label(),
                source,
            })?;
            debug!(port = i, iface = %spec, mac = ?desc.mac, "AF_PACKET port open");
            socks.push(sock);
            descs.push(desc);
        }
        Ok(AfPacketBackend {
            tx: TxStaging::new(config.tx_batch, config.max_frame),
            counters: vec![PortCounters::default(); ports.len()],
            ports: descs,
            socks,
            epoll,
            wake,
            rx_rotation: RxRotation::default(),
            config,
        })
    }

    /// Hand the frames of port `p`'s ready slots to `sink`, up to `budget` frames (whole
    /// V3 blocks: a block is released only when all its frames are handed over).
    fn recv_port(&mut self, p: usize, budget: usize, sink: &mut dyn FnMut(usize, &[u8])) -> usize {
        let sock = &mut self.socks[p];
        let c = &mut self.counters[p];
        let vnet = sock.vnet;
        let ring = &mut sock.ring;
        let mut n = 0;
        while n < budget && ring.ready() {
            let slot = ring.cur * ring.slot_size;
            match ring.version {
                RxRing::V3 => {
                    // Safety: the block is owned by user space (TP_STATUS_USER, acquired
                    // in ready()) until handed back below; its header is at the start.
                    let (num, first) = unsafe {
                        let bd = &*(ring.base.add(slot) as *const libc::tpacket_block_desc);
                        (bd.hdr.bh1.num_pkts as usize, bd.hdr.bh1.offset_to_first_pkt as usize)
                    };
                    let mut off = first;
                    for _ in 0..num {
                        if off + std::mem::size_of::<libc::tpacket3_hdr>() > ring.slot_size {
                            break; // malformed block; release it rather than read past it
                        }
                        // Safety: `off` stays inside the user-owned block (checked above);
                        // the kernel wrote a 16-aligned tpacket3_hdr there.
                        let h =
                            unsafe { &*(ring.base.add(slot + off) as *const libc::tpacket3_hdr) };
                        let frame = (h.tp_mac as usize, h.tp_snaplen, h.tp_len);
                        n += deliver(
                            ring,
                            slot + off,
                            TPACKET3_HDR_ALIGNED,
                            frame,
                            vnet,
                            p,
                            c,
                            sink,
                        );
                        let next = h.tp_next_offset as usize;
                        if next == 0 {
                            break;
                        }
                        off += next;
                    }
                }
                RxRing::V2 => {
                    // Safety: the frame slot is user-owned (TP_STATUS_USER, acquired in
                    // ready()) until handed back below; its tpacket2_hdr is at the start.
                    let h = unsafe { &*(ring.base.add(slot) as *const libc::tpacket2_hdr) };
                    let frame = (h.tp_mac as usize, h.tp_snaplen, h.tp_len);
                    n += deliver(ring, slot, TPACKET2_HDR_ALIGNED, frame, vnet, p, c, sink);
                }
            }
            c.rx_batches += 1;
            ring.status(ring.cur).store(libc::TP_STATUS_KERNEL, Ordering::Release);
            ring.cur = (ring.cur + 1) % ring.slot_count;
        }
        n
    }

    /// Send the staged frames of `port` with sendmmsg. Returns the frames sent.
    ///
    /// On a port with virtio-net headers (towards a host, or a GSO link), consecutive
    /// frames of one connection (same addresses and ports, all but the last of the same
    /// size, IPv4 IDs counting up as their PSNs do) go out as one UDP GSO frame: one
    /// socket buffer through the kernel instead of one per frame. The kernel (or the
    /// host's UDP GRO socket) cuts it into the original datagrams, giving segment `i`
    /// the first one's IPv4 ID plus `i`: the ID each already carries, so every ICRC
    /// holds as stamped and the frames go out from where they are (queued frames from
    /// their connection's send queue) behind one copy of the first frame's headers.
    fn send_port(&mut self, port: usize) -> usize {
        let sock = &self.socks[port];
        let (fd, vnet) = (sock.fd.as_raw_fd(), sock.vnet);
        let gso = vnet
            && !sock.gso_refused
            && ((sock.host_port && sock.whole_gso_frames) || sock.gso_link);
        let staged: Vec<(usize, usize)> =
            self.tx.port_frames(port).map(|(i, f)| (i, f.len())).collect();
        if staged.is_empty() {
            return 0;
        }
        let runs =
            if gso { gso_runs(&self.tx, &staged) } else { staged.iter().map(|_| 1).collect() };
        let mut hdrs: Vec<(VirtioNetHdr, [u8; UDP_PAYLOAD_AT])> = Vec::with_capacity(runs.len());
        let mut at = 0;
        for &count in &runs {
            let run = &staged[at..at + count];
            hdrs.push(if count > 1 {
                let payload = run.iter().map(|&(_, len)| len - UDP_PAYLOAD_AT).sum();
                gso_run_headers(self.tx.frame_at(run[0].0, run[0].1), payload)
            } else {
                (VirtioNetHdr::default(), [0; UDP_PAYLOAD_AT])
            });
            at += count;
        }
        // Per message: [virtio-net header], the first frame (a GSO run's with its own
        // headers), then the UDP payloads of the rest.
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(staged.len() + 2 * runs.len());
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
        let mut at = 0;
        for (&count, (vhdr, headers)) in runs.iter().zip(&hdrs) {
            let first_iov = iov.len();
            // The kernel only reads through iov_base (a send).
            if vnet {
                iov.push(libc::iovec {
                    iov_base: (vhdr as *const VirtioNetHdr) as *mut libc::c_void,
                    iov_len: VNET_HDR_LEN,
                });
            }
            let mut push = |b: &[u8]| {
                iov.push(libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
            };
            if count > 1 {
                push(headers);
            }
            for (k, &(i, len)) in staged[at..at + count].iter().enumerate() {
                let from = if k == 0 && count == 1 { 0 } else { UDP_PAYLOAD_AT };
                push(&self.tx.frame_at(i, len)[from..]);
            }
            spans.push((first_iov, iov.len() - first_iov));
            at += count;
        }
        let mut msgs: Vec<libc::mmsghdr> = spans
            .iter()
            .map(|&(first, n)| {
                // Safety: msghdr is plain old data; all-zero (no address, no control) is valid.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = iov[first..].as_mut_ptr();
                h.msg_iovlen = n;
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            })
            .collect();
        let mut sent = 0;
        let mut frames_sent = 0;
        while sent < msgs.len() {
            // Safety: msgs[sent..] are valid mmsghdrs whose iovecs point into `hdrs` and
            // the staged frames, which outlive the call; the socket is bound, so no
            // address is needed.
            let rc = unsafe {
                libc::sendmmsg(fd, msgs[sent..].as_mut_ptr(), (msgs.len() - sent) as u32, 0)
            };
            self.counters[port].tx_batches += 1;
            if rc <= 0 {
                let e = std::io::Error::last_os_error();
                if rc < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // A kernel without UDP GSO in virtio-net headers (before Linux 6.2)
                // refuses the GSO frame: frame by frame from now on on this port, and
                // RC resends what is dropped here.
                let refused = matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP));
                if rc < 0 && runs[sent] > 1 && refused {
                    let s = &mut self.socks[port];
                    warn!(iface = %s.label, error = %e, "UDP GSO frames refused: sending frame by frame");
                    s.gso_refused = true;
                }
                let dropped: usize = runs[sent..].iter().sum();
                self.counters[port].tx_dropped += dropped as u64;
                debug!(iface = %self.socks[port].label, error = %e, dropped, "sendmmsg failed");
                break;
            }
            for m in sent..sent + rc as usize {
                let (first, n) = spans[m];
                let bytes: usize = iov[first..first + n].iter().map(|v| v.iov_len).sum();
                let vnet_len = if vnet { VNET_HDR_LEN } else { 0 };
                self.counters[port].tx_packets += runs[m] as u64;
                // Wire bytes: every segment carries the first frame's 42 header bytes.
                self.counters[port].tx_bytes +=
                    (bytes - vnet_len + (runs[m] - 1) * UDP_PAYLOAD_AT) as u64;
                frames_sent += runs[m];
            }
            sent += rc as usize;
        }
        frames_sent
    }
}

/// `struct virtio_net_hdr` (what `PACKET_VNET_HDR` puts in front of a frame).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct VirtioNetHdr {
    flags: u8,
    gso_type: u8,
    hdr_len: u16,
    gso_size: u16,
    csum_start: u16,
    csum_offset: u16,
}

const VNET_HDR_LEN: usize = std::mem::size_of::<VirtioNetHdr>();
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
/// Ethernet (14) + IPv4 without options (20) + UDP (8).
const UDP_PAYLOAD_AT: usize = 42;
/// True for an Ethernet/IPv4 (no options)/UDP frame with a payload.
fn is_plain_udp(f: &[u8]) -> bool {
    f.len() > UDP_PAYLOAD_AT && f[12..14] == [0x08, 0x00] && f[14] == 0x45 && f[23] == 17
}

/// Whether `next` can follow `prev` in a GSO run: same Ethernet header, same IPv4
/// addresses, TOS, TTL and flags, same UDP ports.
fn same_flow(prev: &[u8], next: &[u8]) -> bool {
    is_plain_udp(next)
        && prev[..14] == next[..14]
        && prev[15] == next[15]
        && prev[20..24] == next[20..24]
        && prev[26..38] == next[26..38]
}

/// IPv4 ID of a plain UDP frame.
fn ident(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[18], f[19]])
}

/// Split the staged frames of a port into GSO runs (frame counts, in order): frames
/// of one flow, all but the last with the UDP payload size of the first, IPv4 IDs
/// counting up from the first's (what the segmentation gives them), within the
/// kernel's limits.
fn gso_runs(tx: &TxStaging, staged: &[(usize, usize)]) -> Vec<usize> {
    let frame = |k: usize| tx.frame_at(staged[k].0, staged[k].1);
    let payload = |k: usize| staged[k].1.saturating_sub(UDP_PAYLOAD_AT);
    let mut runs = Vec::new();
    inc_wire::gso::runs(
        staged.len(),
        payload,
        payload,
        |first, next| {
            let (f, n) = (frame(first), frame(next));
            is_plain_udp(f)
                && same_flow(f, n)
                && ident(n) == ident(f).wrapping_add((next - first) as u16)
        },
        |_, count| runs.push(count),
    );
    runs
}

/// The headers of a GSO run (at least two frames) starting with `first`, whose
/// segments carry `payload` UDP payload bytes in all: `first`'s headers with the
/// whole run's lengths, IPv4 checksum and the UDP pseudo-header sum, and the
/// virtio-net header.
fn gso_run_headers(first: &[u8], payload: usize) -> (VirtioNetHdr, [u8; UDP_PAYLOAD_AT]) {
    let mut f = [0u8; UDP_PAYLOAD_AT];
    f.copy_from_slice(&first[..UDP_PAYLOAD_AT]);
    let udp_len = (8 + payload) as u16;
    f[16..18].copy_from_slice(&(20 + udp_len).to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let ip_csum = inc_wire::ipv4::internet_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&ip_csum.to_be_bytes());
    f[38..40].copy_from_slice(&udp_len.to_be_bytes());
    // NEEDS_CSUM: the UDP checksum field holds the pseudo-header sum; the kernel (or
    // the receiver's checksum-offload path) completes each segment's checksum.
    let pseudo = pseudo_header_sum(&f[26..30], &f[30..34], udp_len);
    f[40..42].copy_from_slice(&pseudo.to_be_bytes());
    let vhdr = VirtioNetHdr {
        flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: VIRTIO_NET_HDR_GSO_UDP_L4,
        hdr_len: UDP_PAYLOAD_AT as u16,
        gso_size: (first.len() - UDP_PAYLOAD_AT) as u16,
        csum_start: 34,
        csum_offset: 6,
    };
    (vhdr, f)
}

/// One's-complement sum (folded, not inverted) of the UDP pseudo-header.
fn pseudo_header_sum(src: &[u8], dst: &[u8], udp_len: u16) -> u16 {
    let mut ph = [0u8; 12];
    ph[..4].copy_from_slice(src);
    ph[4..8].copy_from_slice(dst);
    ph[9] = inc_wire::ipv4::PROTOCOL_UDP;
    ph[10..].copy_from_slice(&udp_len.to_be_bytes());
    !inc_wire::ipv4::internet_checksum(&ph)
}

impl Backend for AfPacketBackend {
    fn name(&self) -> &'static str {
        "af_packet"
    }

    fn ports(&self) -> &[PortDesc] {
        &self.ports
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        let n_ports = self.socks.len();
        // Taken out for the call: `recv_port` needs all of `self`.
        let mut rotation = std::mem::take(&mut self.rx_rotation);
        let total = rotation.poll(n_ports, budget, |p, left| self.recv_port(p, left, sink));
        self.rx_rotation = rotation;
        Ok(total)
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        self.tx.buffer()
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        if self.tx.commit(port, len, self.socks.len()) {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn commit_frame(&mut self, port: usize, frame: QueuedFrame) {
        if self.tx.commit_queued(port, frame, self.socks.len()) {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        if self.tx.is_empty() {
            return Ok(0);
        }
        // Frames keep their order within a port; ports are flushed one after another.
        let sent = (0..self.socks.len()).map(|port| self.send_port(port)).sum();
        self.tx.clear();
        Ok(sent)
    }

    fn max_frame_len(&self) -> usize {
        self.config.max_frame
    }

    fn rx_ready(&self) -> Option<bool> {
        Some(self.socks.iter().any(|s| s.ring.ready()))
    }

    fn set_host_port(&mut self, port: usize) {
        if let Some(s) = self.socks.get_mut(port) {
            s.host_port = true;
        }
    }

    fn takes_gso_frames(&self, port: usize) -> bool {
        self.socks.get(port).is_some_and(|s| s.takes_gso_frames)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        if self.socks.iter().any(|s| s.ring.ready()) {
            return Ok(());
        }
        let mut events = sys::events::<16>();
        let n = self
            .epoll
            .wait(timeout, &mut events)
            .map_err(|source| IoError::Sys { op: "epoll wait", source })?;
        for ev in &events[..n] {
            let token = sys::token(ev);
            if token == u64::MAX {
                self.wake.drain();
            } else if sys::is_error(ev) {
                // A pending socket error (interface down or gone) keeps the fd ready;
                // take it so the loop does not spin, and report it once.
                let p = token as usize;
                if let Some(e) = sys::take_socket_error(self.socks[p].fd.as_raw_fd()) {
                    self.counters[p].link_errors += 1;
                    warn!(iface = %self.socks[p].label, error = %e, "port error");
                }
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        Waker::new(self.wake.clone())
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        let s = &mut self.socks[port];
        // Safety: tpacket_stats_v3 is plain old data; all-zero is valid.
        let mut st: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        if sys::getsockopt(s.fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_STATISTICS, &mut st)
            .is_ok()
        {
            s.kernel_drops += u64::from(st.tp_drops);
        }
        let mut c = self.counters[port];
        c.rx_dropped = s.kernel_drops;
        c
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use inc_wire::{BthRepr, EthAddrs, EthernetAddress, Opcode, Psn, RoceRepr};

    use super::*;

    /// A RoCEv2 frame of one connection with `payload` bytes, PSN `psn` and, as a
    /// switch stamps them, the PSN's low 16 bits as IPv4 ID.
    fn frame(psn: u32, payload: usize, src_port: u16) -> Vec<u8> {
        let mut r = RoceRepr::new(
            EthAddrs { src: EthernetAddress([2, 0, 0, 0, 0, 1]), dst: EthernetAddress([2; 6]) },
            Ipv4Addr::new(10, 1, 1, 1),
            Ipv4Addr::new(10, 1, 1, 21),
            src_port,
            BthRepr::new(Opcode::RcSendOnly, 0x101, Psn::new(psn)),
        );
        r.payload_len = payload;
        r.ip_ident = psn as u16;
        let mut buf = vec![0u8; 9000];
        let n = r.emit(&mut buf, |p| p.fill(psn as u8)).unwrap();
        buf.truncate(n);
        buf
    }

    /// The frames staged for port 0: odd ones copied into their buffers, even ones
    /// committed as queued frames.
    fn stage(frames: &[Vec<u8>]) -> (TxStaging, Vec<(usize, usize)>) {
        let mut tx = TxStaging::new(64, 9216);
        for (k, f) in frames.iter().enumerate() {
            if k % 2 == 0 {
                tx.commit_queued(0, QueuedFrame::from(f.clone()), 1);
            } else {
                tx.buffer().unwrap()[..f.len()].copy_from_slice(f);
                tx.commit(0, f.len(), 1);
            }
        }
        let staged = tx.port_frames(0).map(|(i, f)| (i, f.len())).collect();
        (tx, staged)
    }

    /// What the kernel's UDP segmentation makes of a GSO frame: the first frame's
    /// headers with per-segment lengths and IPv4 ID base + k, and the k-th payload.
    fn segment(gso: &[u8], size: usize, k: usize) -> Vec<u8> {
        let payload = &gso[UDP_PAYLOAD_AT..];
        let part = &payload[k * size..((k + 1) * size).min(payload.len())];
        let mut f = gso[..UDP_PAYLOAD_AT].to_vec();
        let base = ident(&f);
        f[16..18].copy_from_slice(&((28 + part.len()) as u16).to_be_bytes());
        f[18..20].copy_from_slice(&base.wrapping_add(k as u16).to_be_bytes());
        f[38..40].copy_from_slice(&((8 + part.len()) as u16).to_be_bytes());
        f.extend_from_slice(part);
        f
    }

    #[test]
    fn runs_follow_one_flow_of_full_frames_within_64_kib() {
        let full = |psn| frame(psn, 4096, 0xc001);
        let mut frames: Vec<Vec<u8>> = (0..20).map(full).collect();
        let (tx, staged) = stage(&frames);
        assert_eq!(gso_runs(&tx, &staged), [15, 5], "15 x 4112 bytes fit 64 KiB");
        // A short frame ends a run; another connection (source port) starts a new one.
        frames.truncate(4);
        frames.insert(2, frame(2, 100, 0xc001));
        frames.push(frame(9, 4096, 0xc002));
        frames.push(frame(10, 4096, 0xc002));
        let (tx, staged) = stage(&frames);
        assert_eq!(gso_runs(&tx, &staged), [3, 2, 2]);
        // IPv4 IDs that do not count up (PSN gap, or a retransmission behind newer
        // frames) end a run: the segmentation would give the next another ID.
        let frames = [full(7), full(8), full(10), full(11), full(3), full(4)];
        let (tx, staged) = stage(&frames);
        assert_eq!(gso_runs(&tx, &staged), [2, 2, 2]);
        let wrap = [full(0xffff), full(0x1_0000), full(0x1_0001)];
        let (tx, staged) = stage(&wrap);
        assert_eq!(gso_runs(&tx, &staged), [3], "IDs wrap with the PSN's low 16 bits");
        // Not UDP: alone.
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let (tx, staged) = stage(&[arp.clone(), arp]);
        assert_eq!(gso_runs(&tx, &staged), [1, 1]);
    }

    /// The GSO frame of a run as the kernel gets it (without the virtio-net header):
    /// the run's headers, the first frame's UDP payload, then the others'.
    fn gso_frame(tx: &TxStaging, staged: &[(usize, usize)]) -> (VirtioNetHdr, Vec<u8>) {
        let payload = staged.iter().map(|&(_, len)| len - UDP_PAYLOAD_AT).sum();
        let (hdr, headers) = gso_run_headers(tx.frame_at(staged[0].0, staged[0].1), payload);
        let mut gso = headers.to_vec();
        for &(i, len) in staged {
            gso.extend_from_slice(&tx.frame_at(i, len)[UDP_PAYLOAD_AT..]);
        }
        (hdr, gso)
    }

    #[test]
    fn segments_of_a_run_are_the_original_frames_with_valid_icrcs() {
        let mut frames: Vec<Vec<u8>> = (0..5).map(|p| frame(p + 300, 4096, 0xc001)).collect();
        frames.push(frame(305, 1000, 0xc001));
        let (tx, staged) = stage(&frames);
        assert_eq!(gso_runs(&tx, &staged), [6]);
        let (hdr, gso) = gso_frame(&tx, &staged);
        assert_eq!(
            (hdr.flags, hdr.gso_type, hdr.hdr_len, hdr.gso_size, hdr.csum_start, hdr.csum_offset),
            (VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_UDP_L4, 42, 4112, 34, 6)
        );
        assert_eq!(u16::from_be_bytes([gso[16], gso[17]]) as usize, gso.len() - 14);
        assert_eq!(inc_wire::ipv4::internet_checksum(&gso[14..34]), 0, "IPv4 checksum");
        for (k, original) in frames.iter().enumerate() {
            let seg = segment(&gso, 4112, k);
            assert_eq!(seg.len(), original.len());
            assert_eq!(u16::from_be_bytes([seg[18], seg[19]]), 300 + k as u16, "IPv4 ID");
            assert!(inc_wire::icrc::verify(&seg[14..]), "segment {k}: ICRC as stamped");
            assert_eq!(seg[42..], original[42..], "UDP payload {k}");
        }
        assert_eq!(tx.frame_at(staged[0].0, staged[0].1), &frames[0][..], "first frame untouched");
    }

    #[test]
    fn a_received_gso_frame_is_split_into_the_frames_sent() {
        let mut frames: Vec<Vec<u8>> = (0..4).map(|p| frame(p, 4096, 0xc001)).collect();
        frames.push(frame(4, 1500, 0xc001));
        let (tx, staged) = stage(&frames);
        let (hdr, mut gso) = gso_frame(&tx, &staged);
        let mut c = PortCounters::default();
        let mut got = Vec::new();
        let n = split_gso_frame(&mut gso, hdr.gso_size.into(), 3, &mut c, &mut |port, f| {
            assert_eq!(port, 3);
            got.push(f.to_vec());
        });
        assert_eq!((n, got.len(), c.rx_packets), (5, 5, 5));
        for (k, (seg, original)) in got.iter().zip(&frames).enumerate() {
            assert_eq!(seg, original, "segment {k}");
            assert!(inc_wire::icrc::verify(&seg[14..]), "segment {k}: ICRC");
        }
    }

    #[test]
    fn pseudo_header_sum_completes_to_a_valid_udp_checksum() {
        let f = frame(1, 64, 0xc001);
        let udp_len = (f.len() - 34) as u16;
        let sum = pseudo_header_sum(&f[26..30], &f[30..34], udp_len);
        // Finishing the checksum over the UDP header (checksum field = pseudo sum) and
        // payload, as the kernel does for NEEDS_CSUM, gives one that verifies.
        let mut udp = f[34..].to_vec();
        udp[6..8].copy_from_slice(&sum.to_be_bytes());
        let check = inc_wire::ipv4::internet_checksum(&udp);
        udp[6..8].copy_from_slice(&check.to_be_bytes());
        let mut all = Vec::new();
        all.extend_from_slice(&f[26..34]);
        all.extend_from_slice(&[0, 17]);
        all.extend_from_slice(&udp_len.to_be_bytes());
        all.extend_from_slice(&udp);
        assert_eq!(inc_wire::ipv4::internet_checksum(&all), 0);
    }
}
