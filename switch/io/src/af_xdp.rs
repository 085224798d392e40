//! AF_XDP backend: one XSK socket per port (bound to receive queue 0) with its own UMEM
//! and fill, completion, receive and transmit rings, written directly over the kernel
//! ABI (`linux/if_xdp.h`); the XDP program of [`crate::xdp_prog`] sends ARP and RoCEv2
//! to the socket and everything else to the kernel.
//!
//! The program is attached in native (driver) mode when the device allows it (veth
//! does), else in generic mode; the mode is reported per port. Sockets are bound in
//! copy mode (veth has no zero-copy): the kernel copies each received frame into UMEM
//! chunks, and each transmitted chunk into a socket buffer.
//!
//! UMEM layout per port: `rx_frames` chunks owned by the fill/receive rings, then
//! `tx_frames` chunks on a free list for transmit; a chunk returns to the free list
//! when the completion ring reports it sent. The batch API hands out staging buffers
//! ([`TxStaging`]) because a frame is written before its port (and so its UMEM) is
//! known; `flush` copies each frame into chunks of its port's UMEM.
//!
//! Frames larger than one chunk (RoCE MTU 4096, jumbo frames): sockets are bound with
//! multi-buffer (`XDP_USE_SG`, kernel >= 6.6) and the program is loaded frags-aware, so
//! the kernel spreads a received frame over several chunks (descriptors flagged
//! `XDP_PKT_CONTD` except the last); such a frame is copied into one contiguous receive
//! buffer before the engine sees it (a frame in one chunk is handed over in place). A
//! transmitted frame is split over as many chunks as it needs, the same way. The
//! largest frame is the largest port MTU plus 18 bytes (Ethernet header and a VLAN
//! tag), at least one chunk. Where the kernel refuses `XDP_USE_SG` the socket is
//! bound without it (logged) and frames are limited to one chunk (4096 bytes on
//! transmit, 4096 minus the 256-byte XDP headroom on receive; larger received frames
//! are dropped by the kernel and counted in `rx_dropped`).
//!
//! Drops are counted per port: `rx_dropped` (the kernel's ring-full and dropped
//! counts), `rx_truncated` (bad descriptors, frames larger than the receive buffer),
//! `tx_dropped` (no free transmit chunks after a kick, a frame longer than the largest
//! frame, descriptors the kernel rejected).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::backend::{
    Backend, IoError, PortCounters, PortDesc, PortSpec, RxRotation, TxStaging, Waker,
};
use crate::libpcap::ROCE_UDP_PORT;
use crate::sys::{self, Epoll, EventFd};
use crate::xdp_prog::{XdpMode, XdpProgram};
use crate::xsk_ring::{Mapping, Ring};

/// UMEM chunk size (one page: the largest aligned chunk).
const FRAME: usize = 4096;
/// Kicks of the transmit ring per flush before leaving the rest for the next turn.
const MAX_KICKS: usize = 64;

/// Socket geometry and filter.
#[derive(Debug, Clone)]
pub struct AfXdpConfig {
    /// UMEM chunks for receive per port (power of two: also the fill/rx ring size).
    pub rx_frames: u32,
    /// UMEM chunks for transmit per port (power of two: also the tx/completion ring size).
    pub tx_frames: u32,
    /// UDP destination ports redirected besides ARP (4791 is always included).
    pub udp_ports: Vec<u16>,
    /// Frames per transmit batch.
    pub tx_batch: usize,
    /// Force generic mode (for comparison; otherwise native is tried first).
    pub force_generic: bool,
}

impl Default for AfXdpConfig {
    fn default() -> Self {
        AfXdpConfig {
            rx_frames: 2048,
            tx_frames: 2048,
            udp_ports: Vec::new(),
            tx_batch: 64,
            force_generic: false,
        }
    }
}

#[derive(Debug)]
struct XskPort {
    /// Dropping the link detaches the program: keep it first.
    _link: OwnedFd,
    _prog: XdpProgram,
    mode: XdpMode,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    comp: Ring<u64>,
    fd: OwnedFd,
    umem: Mapping,
    /// Free transmit chunks (UMEM offsets).
    free_tx: Vec<u64>,
    /// Length of the frame queued in each transmit chunk (index: chunk - rx_frames).
    tx_len: Vec<u32>,
    /// Descriptors written but not yet published.
    tx_unpublished: u32,
    /// The kernel still holds published descriptors that need another kick.
    kick_needed: bool,
    rx_frames: u32,
    /// Bound with multi-buffer (`XDP_USE_SG`): frames may span several chunks.
    sg: bool,
    label: String,
}

/// Bind an XSK socket to queue 0 of `ifindex` in copy mode with `extra` bind flags.
fn bind_xsk(raw: RawFd, ifindex: u32, extra: u16) -> std::io::Result<()> {
    let sxdp = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP | extra,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: 0,
        sxdp_shared_umem_fd: 0,
    };
    // Safety: `sxdp` is a valid sockaddr_xdp of the length passed; `raw` is an open fd.
    let rc = unsafe {
        libc::bind(
            raw,
            (&sxdp as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn iface_err(op: &'static str, spec: &PortSpec) -> impl FnOnce(std::io::Error) -> IoError {
    let iface = spec.label();
    move |source| IoError::Interface { op, iface, source }
}

/// Create, map and bind one socket and attach the program. Runs in the port's namespace.
fn open_port(spec: &PortSpec, cfg: &AfXdpConfig) -> Result<(XskPort, PortDesc), IoError> {
    let e = |op| iface_err(op, spec);
    let ifindex = sys::if_index(&spec.ifname).map_err(e("find interface"))?;
    let (mac, mtu) = sys::if_mac_mtu(&spec.ifname).map_err(e("read MAC and MTU"))?;
    // Safety: plain syscall; the fd is checked and owned below.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(e("socket(AF_XDP)")(std::io::Error::last_os_error()));
    }
    // Safety: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let frames = cfg.rx_frames + cfg.tx_frames;
    let umem = Mapping::new(None, frames as usize * FRAME, 0).map_err(e("map UMEM"))?;
    let reg = libc::xdp_umem_reg {
        addr: umem.base as u64,
        len: umem.len as u64,
        chunk_size: FRAME as u32,
        headroom: 0,
        flags: 0,
        tx_metadata_len: 0,
    };
    sys::setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg).map_err(e("register UMEM"))?;
    for (opt, size, what) in [
        (libc::XDP_UMEM_FILL_RING, cfg.rx_frames, "size fill ring"),
        (libc::XDP_UMEM_COMPLETION_RING, cfg.tx_frames, "size completion ring"),
        (libc::XDP_RX_RING, cfg.rx_frames, "size rx ring"),
        (libc::XDP_TX_RING, cfg.tx_frames, "size tx ring"),
    ] {
        sys::setsockopt(raw, libc::SOL_XDP, opt, &size).map_err(e(what))?;
    }
    // Safety: xdp_mmap_offsets is plain old data; all-zero is valid.
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    sys::getsockopt(raw, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS, &mut off)
        .map_err(e("read ring offsets"))?;
    let rx = Ring::open(raw, &off.rx, cfg.rx_frames, libc::XDP_PGOFF_RX_RING as u64)
        .map_err(e("map rx ring"))?;
    let tx = Ring::open(raw, &off.tx, cfg.tx_frames, libc::XDP_PGOFF_TX_RING as u64)
        .map_err(e("map tx ring"))?;
    let mut fill = Ring::open(raw, &off.fr, cfg.rx_frames, libc::XDP_UMEM_PGOFF_FILL_RING)
        .map_err(e("map fill ring"))?;
    let comp = Ring::open(raw, &off.cr, cfg.tx_frames, libc::XDP_UMEM_PGOFF_COMPLETION_RING)
        .map_err(e("map completion ring"))?;
    for i in 0..cfg.rx_frames {
        fill.write(i, u64::from(i) * FRAME as u64);
    }
    fill.local = cfg.rx_frames;
    fill.publish();

    // Multi-buffer first; a kernel without it (< 6.6) rejects the flag, and the socket,
    // still unbound, is bound again without it.
    let sg = match bind_xsk(raw, ifindex, libc::XDP_USE_SG) {
        Ok(()) => true,
        Err(err) if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
            warn!(iface = %spec.label(), error = %err,
                "AF_XDP multi-buffer (XDP_USE_SG) refused: frames limited to one 4 KiB chunk");
            bind_xsk(raw, ifindex, 0).map_err(e("bind XSK to queue 0"))?;
            false
        }
        Err(err) => return Err(e("bind XSK to queue 0 (multi-buffer)")(err)),
    };

    let mut ports = vec![ROCE_UDP_PORT];
    ports.extend(cfg.udp_ports.iter().copied().filter(|&p| p != ROCE_UDP_PORT));
    let prog = XdpProgram::load(&ports).map_err(e("load XDP program"))?;
    prog.set_socket(0, raw).map_err(e("insert XSK into map"))?;
    let label = spec.label();
    let (link, mode) = if cfg.force_generic {
        prog.attach_mode(ifindex, &label, XdpMode::Generic)
    } else {
        prog.attach(ifindex, &label)
    }
    .map_err(e("attach XDP program"))?;

    let rx_frames = cfg.rx_frames;
    let free_tx = (rx_frames..frames).rev().map(|i| u64::from(i) * FRAME as u64).collect();
    let port = XskPort {
        _link: link,
        _prog: prog,
        mode,
        rx,
        tx,
        fill,
        comp,
        fd,
        umem,
        free_tx,
        tx_len: vec![0; cfg.tx_frames as usize],
        tx_unpublished: 0,
        kick_needed: false,
        rx_frames,
        sg,
        label,
    };
    Ok((port, PortDesc { spec: spec.clone(), mac, mtu: Some(mtu) }))
}

/// Descriptors making up the next frame among `avail` published ones, where
/// `contd(k)` says descriptor `k` has `XDP_PKT_CONTD` (more of the frame follows);
/// `None` when the frame's last descriptor is not among them.
fn frame_descs(avail: u32, contd: impl Fn(u32) -> bool) -> Option<u32> {
    (0..avail).find(|&k| !contd(k)).map(|k| k + 1)
}

impl XskPort {
    /// Move sent chunks from the completion ring back to the free list.
    fn reclaim(&mut self, c: &mut PortCounters) {
        let n = self.comp.available();
        for i in 0..n {
            let addr = self.comp.read(self.comp.local.wrapping_add(i));
            let idx = (addr as usize / FRAME).wrapping_sub(self.rx_frames as usize);
            if let Some(&len) = self.tx_len.get(idx) {
                // Only a frame's last chunk carries its length.
                if len > 0 {
                    c.tx_packets += 1;
                    c.tx_bytes += u64::from(len);
                }
                self.free_tx.push(addr - addr % FRAME as u64);
            }
        }
        self.comp.local = self.comp.local.wrapping_add(n);
        self.comp.release();
    }

    /// Queue one frame on the transmit ring over as many chunks as it needs
    /// (`XDP_PKT_CONTD` on all but the last). Drops it, counted, when it is empty, needs
    /// several chunks on a socket without multi-buffer, or finds too few free chunks
    /// even after a kick.
    fn queue_tx(&mut self, frame: &[u8], c: &mut PortCounters) {
        let chunks = frame.len().div_ceil(FRAME);
        if chunks == 0 || (chunks > 1 && !self.sg) {
            c.tx_dropped += 1;
            debug!(iface = %self.label, len = frame.len(), "frame does not fit the socket");
            return;
        }
        if self.free_tx.len() < chunks {
            self.reclaim(c);
        }
        if self.free_tx.len() < chunks {
            // Every chunk is still queued in the kernel: push them out, then look again.
            self.kick(c);
            self.reclaim(c);
        }
        if self.free_tx.len() < chunks {
            c.tx_dropped += 1;
            debug!(iface = %self.label, "no free transmit chunk");
            return;
        }
        for (k, piece) in frame.chunks(FRAME).enumerate() {
            let last = k + 1 == chunks;
            let addr = self.free_tx.pop().expect("free chunks counted above");
            // Safety: chunk `addr` is a transmit chunk inside the UMEM, off the free list
            // and so not in use by the kernel; `piece.len()` <= FRAME; the frame (a
            // staging buffer) does not overlap the UMEM.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    self.umem.base.add(addr as usize),
                    piece.len(),
                )
            };
            self.tx_len[addr as usize / FRAME - self.rx_frames as usize] =
                if last { frame.len() as u32 } else { 0 };
            let options = if last { 0 } else { libc::XDP_PKT_CONTD };
            let slot = self.tx.local;
            self.tx.write(slot, libc::xdp_desc { addr, len: piece.len() as u32, options });
            self.tx.local = slot.wrapping_add(1);
            self.tx_unpublished += 1;
        }
    }

    /// Hand up to `budget` received frames to `sink(port, frame)`; returns how many. A
    /// frame in one chunk is handed over in place; one spread over several descriptors
    /// is copied into `rx_buf` first (dropped and counted in `rx_truncated` when it is
    /// longer). Every consumed chunk goes back on the fill ring.
    fn recv(
        &mut self,
        port: usize,
        budget: usize,
        rx_buf: &mut [u8],
        c: &mut PortCounters,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> usize {
        let avail = self.rx.available();
        let (mut i, mut delivered, mut frames) = (0u32, 0, 0);
        while i < avail && frames < budget {
            // Descriptors i..end make one frame. The kernel publishes a frame's
            // descriptors together; should the rest be missing, leave it for later.
            let rx = &self.rx;
            let more =
                |k: u32| rx.read(rx.local.wrapping_add(i + k)).options & libc::XDP_PKT_CONTD != 0;
            let Some(n) = frame_descs(avail - i, more) else { break };
            let end = i + n;
            frames += 1;
            if end - i == 1 {
                let d = self.rx.read(self.rx.local.wrapping_add(i));
                match self.slice(d) {
                    Some(frame) => {
                        c.rx_packets += 1;
                        c.rx_bytes += frame.len() as u64;
                        sink(port, frame);
                        delivered += 1;
                    }
                    None => c.rx_truncated += 1,
                }
            } else {
                let mut len = 0;
                for k in i..end {
                    let d = self.rx.read(self.rx.local.wrapping_add(k));
                    match self.slice(d) {
                        Some(piece) if len + piece.len() <= rx_buf.len() => {
                            rx_buf[len..len + piece.len()].copy_from_slice(piece);
                            len += piece.len();
                        }
                        _ => {
                            len = usize::MAX;
                            break;
                        }
                    }
                }
                if len == usize::MAX {
                    c.rx_truncated += 1;
                } else {
                    c.rx_packets += 1;
                    c.rx_bytes += len as u64;
                    sink(port, &rx_buf[..len]);
                    delivered += 1;
                }
            }
            for k in i..end {
                let addr = self.rx.read(self.rx.local.wrapping_add(k)).addr;
                self.fill.write(self.fill.local, addr - addr % FRAME as u64);
                self.fill.local = self.fill.local.wrapping_add(1);
            }
            i = end;
        }
        if i == 0 {
            return 0;
        }
        self.rx.local = self.rx.local.wrapping_add(i);
        self.rx.release();
        self.fill.publish();
        c.rx_batches += 1;
        if self.fill.needs_wakeup() {
            // Safety: a zero-length receive with no buffer only wakes the fill path.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        delivered
    }

    /// The bytes a receive descriptor points at, or `None` if it lies outside the UMEM.
    fn slice(&self, d: libc::xdp_desc) -> Option<&[u8]> {
        let (addr, len) = (d.addr as usize, d.len as usize);
        addr.checked_add(len).filter(|&end| end <= self.umem.len)?;
        // Safety: [addr, addr+len) lies inside the UMEM (checked) and belongs to us
        // until its chunk goes back on the fill ring, after the caller is done with it.
        Some(unsafe { std::slice::from_raw_parts(self.umem.base.add(addr), len) })
    }

    /// Publish written descriptors and make the kernel send them (copy mode sends
    /// from `sendto`, at most a small batch per call).
    fn kick(&mut self, c: &mut PortCounters) {
        if self.tx_unpublished > 0 {
            self.tx.publish();
            self.tx_unpublished = 0;
        }
        self.kick_needed = false;
        for _ in 0..MAX_KICKS {
            if self.tx.in_flight() == 0 {
                return;
            }
            // Safety: a zero-length send with no buffer and no address only wakes the
            // socket's transmit path.
            let rc = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            c.tx_batches += 1;
            if rc < 0 {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                    Some(libc::EBUSY) | Some(libc::ENOBUFS) => break,
                    _ => {
                        c.link_errors += 1;
                        debug!(iface = %self.label, error = %err, "XSK transmit kick failed");
                        break;
                    }
                }
            }
        }
        self.kick_needed = self.tx.in_flight() > 0;
    }
}

/// The AF_XDP backend.
#[derive(Debug)]
pub struct AfXdpBackend {
    ports: Vec<PortDesc>,
    socks: Vec<XskPort>,
    counters: Vec<PortCounters>,
    epoll: Epoll,
    wake: Arc<EventFd>,
    /// Frames are written before their port (and so its UMEM) is known: staged here,
    /// copied into chunks at flush.
    tx: TxStaging,
    /// Largest frame (transmit staging and receive reassembly size).
    max_frame: usize,
    /// A received frame spread over several chunks is copied here for the sink.
    rx_buf: Vec<u8>,
    rx_rotation: RxRotation,
}

impl AfXdpBackend {
    /// Open every port (entering namespaces as needed). Port index = position in `ports`.
    pub fn open(ports: &[PortSpec], config: AfXdpConfig) -> Result<Self, IoError> {
        let pow2 = |n: u32| n >= 64 && n.is_power_of_two();
        if !pow2(config.rx_frames) || !pow2(config.tx_frames) || config.tx_batch == 0 {
            return Err(IoError::Config(format!(
                "bad AF_XDP geometry: rx frames {} and tx frames {} must be powers of two \
                 (at least 64); tx batch must be positive",
                config.rx_frames, config.tx_frames
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
            info!(port = i, iface = %spec, xdp = sock.mode.as_str(), sg = sock.sg, "AF_XDP port open");
            socks.push(sock);
            descs.push(desc);
        }
        let max_frame = if socks.iter().all(|s| s.sg) {
            // Ethernet header and a VLAN tag on top of the largest IP MTU.
            let mtu = descs.iter().filter_map(|d| d.mtu).max().unwrap_or(0) as usize;
            (mtu + 18).max(FRAME)
        } else {
            FRAME
        };
        Ok(AfXdpBackend {
            tx: TxStaging::new(config.tx_batch, max_frame),
            rx_buf: vec![0; max_frame],
            max_frame,
            counters: vec![PortCounters::default(); ports.len()],
            ports: descs,
            socks,
            epoll,
            wake,
            rx_rotation: RxRotation::default(),
        })
    }

    /// XDP attach mode of a port.
    pub fn mode(&self, port: usize) -> XdpMode {
        self.socks[port].mode
    }
}

impl Backend for AfXdpBackend {
    fn name(&self) -> &'static str {
        "af_xdp"
    }

    fn ports(&self) -> &[PortDesc] {
        &self.ports
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        let (socks, counters, buf) = (&mut self.socks, &mut self.counters, &mut self.rx_buf);
        Ok(self.rx_rotation.poll(socks.len(), budget, |p, left| {
            socks[p].recv(p, left, buf, &mut counters[p], sink)
        }))
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        self.tx.buffer()
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        if self.tx.commit(port, len, self.socks.len()) {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        let sent = self.tx.len();
        for (_, port, frame) in self.tx.frames() {
            self.socks[port].queue_tx(frame, &mut self.counters[port]);
        }
        self.tx.clear();
        for (s, c) in self.socks.iter_mut().zip(self.counters.iter_mut()) {
            if s.tx_unpublished > 0 || s.kick_needed {
                s.kick(c);
            }
            s.reclaim(c);
        }
        Ok(sent)
    }

    fn max_frame_len(&self) -> usize {
        self.max_frame
    }

    fn rx_ready(&self) -> Option<bool> {
        Some(self.socks.iter().any(|s| s.rx.available() > 0))
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        let mut pending_tx = false;
        for (s, c) in self.socks.iter_mut().zip(self.counters.iter_mut()) {
            if s.kick_needed {
                s.kick(c);
            }
            s.reclaim(c);
            pending_tx |= s.kick_needed;
            if s.rx.available() > 0 {
                return Ok(());
            }
        }
        // Unsent frames need another kick soon; nothing signals when the device has room.
        let timeout = if pending_tx {
            Some(timeout.map_or(Duration::from_millis(1), |t| t.min(Duration::from_millis(1))))
        } else {
            timeout
        };
        let mut events = sys::events::<16>();
        let n = self
            .epoll
            .wait(timeout, &mut events)
            .map_err(|source| IoError::Sys { op: "epoll wait", source })?;
        for ev in &events[..n] {
            if sys::token(ev) == u64::MAX {
                self.wake.drain();
            } else if sys::is_error(ev) {
                let p = sys::token(ev) as usize;
                self.counters[p].link_errors += 1;
                warn!(iface = %self.socks[p].label, "XSK socket error");
            }
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        Waker::new(self.wake.clone())
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        let s = &self.socks[port];
        let mut c = self.counters[port];
        // Safety: xdp_statistics is plain old data; all-zero is valid.
        let mut st: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        if sys::getsockopt(s.fd.as_raw_fd(), libc::SOL_XDP, libc::XDP_STATISTICS, &mut st).is_ok() {
            // XDP_STATISTICS counts since bind and does not reset on read.
            c.rx_dropped = st.rx_dropped + st.rx_ring_full;
            c.rx_truncated += st.rx_invalid_descs;
            c.tx_dropped += st.tx_invalid_descs;
        }
        c
    }

    fn port_detail(&self, port: usize) -> Option<String> {
        Some(format!("xdp={}", self.socks[port].mode.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::frame_descs;

    #[test]
    fn a_frame_ends_at_the_first_descriptor_without_contd() {
        let flags = [true, true, false, false, true];
        assert_eq!(frame_descs(5, |k| flags[k as usize]), Some(3));
        assert_eq!(frame_descs(2, |k| flags[3 + k as usize]), Some(1));
        assert_eq!(frame_descs(1, |k| flags[4 + k as usize]), None, "rest not published");
        assert_eq!(frame_descs(0, |_| unreachable!()), None);
    }
}
