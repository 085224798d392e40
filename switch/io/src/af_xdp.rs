//! AF_XDP backend: one XSK socket per port (bound to receive queue 0) with its own UMEM
//! and fill, completion, receive and transmit rings, written directly over the kernel
//! ABI (`linux/if_xdp.h`); the XDP program of [`crate::xdp_prog`] sends ARP and RoCEv2
//! to the socket and everything else to the kernel.
//!
//! The program is attached in native (driver) mode when the device allows it (veth
//! does), else in generic mode; the mode is reported per port. Sockets are bound in
//! copy mode (veth has no zero-copy): the kernel copies each received frame into a
//! UMEM chunk, and each transmitted chunk into a socket buffer.
//!
//! UMEM layout per port: `rx_frames` chunks owned by the fill/receive rings, then
//! `tx_frames` chunks on a free list for transmit; a chunk returns to the free list
//! when the completion ring reports it sent. The batch API hands out a staging buffer
//! because a frame is written before its port (and so its UMEM) is known; `commit_tx`
//! copies it into a chunk of that port's UMEM.
//!
//! Limit: a frame must fit one chunk (4096 bytes minus the 256-byte XDP headroom on
//! receive), so RoCEv2 payloads up to 2048 bytes work on any link MTU; larger frames
//! are dropped by the kernel and counted in `rx_dropped` (not yet: multi-buffer
//! `XDP_USE_SG`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::backend::{Backend, IoError, PortCounters, PortDesc, PortSpec, RxRotation, Waker};
use crate::libpcap::ROCE_UDP_PORT;
use crate::sys::{self, Epoll, EventFd};
use crate::xdp_prog::{XdpMode, XdpProgram};

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

/// A shared mapping (UMEM or ring), unmapped on drop.
#[derive(Debug)]
struct Mapping {
    base: *mut u8,
    len: usize,
}

// Safety: the mapping is owned by this value and only accessed through its owner
// (`&mut` or atomics shared with the kernel); moving it between threads is sound.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(fd: Option<RawFd>, len: usize, offset: u64) -> std::io::Result<Self> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1),
        };
        // Safety: a fresh mapping of `len` bytes; the result is checked and owned here.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base: base.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Safety: base/len are exactly what mmap returned; nothing borrows it any more.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// One single-producer/single-consumer ring shared with the kernel. We are the
/// producer of fill and tx rings and the consumer of rx and completion rings.
#[derive(Debug)]
struct Ring<T> {
    map: Mapping,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    mask: u32,
    /// Our copy of the index we own (producer or consumer).
    local: u32,
    _t: std::marker::PhantomData<T>,
}

impl<T: Copy> Ring<T> {
    fn open(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: u64,
    ) -> std::io::Result<Self> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Mapping::new(Some(fd), len, pgoff)?;
        Ok(Ring {
            map,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            flags: off.flags as usize,
            desc: off.desc as usize,
            mask: size - 1,
            local: 0,
            _t: std::marker::PhantomData,
        })
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        // Safety: producer/consumer/flags offsets come from XDP_MMAP_OFFSETS and lie in
        // the mapping, 4-aligned; the kernel updates them concurrently, hence atomics.
        unsafe { &*(self.map.base.add(at) as *const AtomicU32) }
    }

    fn needs_wakeup(&self) -> bool {
        self.word(self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Entries the kernel produced that we have not consumed.
    fn available(&self) -> u32 {
        self.word(self.producer).load(Ordering::Acquire).wrapping_sub(self.local)
    }

    fn read(&self, i: u32) -> T {
        let at = self.desc + (i & self.mask) as usize * std::mem::size_of::<T>();
        // Safety: slot (i & mask) lies inside the descriptor array of the mapping; the
        // kernel published it before advancing the producer (acquire in `available`).
        unsafe { std::ptr::read_volatile(self.map.base.add(at) as *const T) }
    }

    fn write(&mut self, i: u32, v: T) {
        let at = self.desc + (i & self.mask) as usize * std::mem::size_of::<T>();
        // Safety: slot (i & mask) lies inside the descriptor array and is ours until
        // the producer index passes it (release in `publish`).
        unsafe { std::ptr::write_volatile(self.map.base.add(at) as *mut T, v) };
    }

    /// Consumer side: release entries up to `local`.
    fn release(&self) {
        self.word(self.consumer).store(self.local, Ordering::Release);
    }

    /// Producer side: publish entries up to `local`.
    fn publish(&self) {
        self.word(self.producer).store(self.local, Ordering::Release);
    }

    /// Producer side: entries the kernel has not consumed yet.
    fn in_flight(&self) -> u32 {
        self.local.wrapping_sub(self.word(self.consumer).load(Ordering::Acquire))
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
    label: String,
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

    let sxdp = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: 0,
        sxdp_shared_umem_fd: 0,
    };
    // Safety: `sxdp` is a valid sockaddr_xdp of the length passed.
    let rc = unsafe {
        libc::bind(
            raw,
            (&sxdp as *const libc::sockaddr_xdp).cast(),
            std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(e("bind XSK to queue 0")(std::io::Error::last_os_error()));
    }

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
        label,
    };
    Ok((port, PortDesc { spec: spec.clone(), mac, mtu: Some(mtu) }))
}

impl XskPort {
    /// Move sent chunks from the completion ring back to the free list.
    fn reclaim(&mut self, c: &mut PortCounters) {
        let n = self.comp.available();
        for i in 0..n {
            let addr = self.comp.read(self.comp.local.wrapping_add(i));
            let idx = (addr as usize / FRAME).wrapping_sub(self.rx_frames as usize);
            if let Some(&len) = self.tx_len.get(idx) {
                c.tx_packets += 1;
                c.tx_bytes += u64::from(len);
                self.free_tx.push(addr - addr % FRAME as u64);
            }
        }
        self.comp.local = self.comp.local.wrapping_add(n);
        self.comp.release();
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
    config: AfXdpConfig,
    ports: Vec<PortDesc>,
    socks: Vec<XskPort>,
    counters: Vec<PortCounters>,
    epoll: Epoll,
    wake: Arc<EventFd>,
    /// Staging buffer: frames are written before their port (and UMEM) is known.
    staging: Vec<u8>,
    /// Frames committed since the last flush.
    batched: usize,
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
            info!(port = i, iface = %spec, xdp = sock.mode.as_str(), "AF_XDP port open");
            socks.push(sock);
            descs.push(desc);
        }
        Ok(AfXdpBackend {
            staging: vec![0; FRAME],
            batched: 0,
            counters: vec![PortCounters::default(); ports.len()],
            ports: descs,
            socks,
            epoll,
            wake,
            rx_rotation: RxRotation::default(),
            config,
        })
    }

    /// XDP attach mode of a port.
    pub fn mode(&self, port: usize) -> XdpMode {
        self.socks[port].mode
    }

    fn recv_port(&mut self, p: usize, budget: usize, sink: &mut dyn FnMut(usize, &[u8])) -> usize {
        let s = &mut self.socks[p];
        let c = &mut self.counters[p];
        let n = s.rx.available().min(budget as u32);
        if n == 0 {
            return 0;
        }
        let mut delivered = 0;
        for i in 0..n {
            let d = s.rx.read(s.rx.local.wrapping_add(i));
            let (addr, len) = (d.addr as usize, d.len as usize);
            if addr.checked_add(len).is_some_and(|end| end <= s.umem.len) {
                // Safety: [addr, addr+len) lies inside the UMEM (checked) and belongs to
                // us until the chunk goes back on the fill ring below.
                let frame = unsafe { std::slice::from_raw_parts(s.umem.base.add(addr), len) };
                c.rx_packets += 1;
                c.rx_bytes += len as u64;
                sink(p, frame);
                delivered += 1;
            } else {
                c.rx_truncated += 1;
            }
            s.fill.write(s.fill.local, (addr - addr % FRAME) as u64);
            s.fill.local = s.fill.local.wrapping_add(1);
        }
        s.rx.local = s.rx.local.wrapping_add(n);
        s.rx.release();
        s.fill.publish();
        c.rx_batches += 1;
        if s.fill.needs_wakeup() {
            // Safety: a zero-length receive with no buffer only wakes the fill path.
            unsafe {
                libc::recvfrom(
                    s.fd.as_raw_fd(),
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
        let n_ports = self.socks.len();
        // Taken out for the call: `recv_port` needs all of `self`.
        let mut rotation = std::mem::take(&mut self.rx_rotation);
        let total = rotation.poll(n_ports, budget, |p, left| self.recv_port(p, left, sink));
        self.rx_rotation = rotation;
        Ok(total)
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        if self.batched >= self.config.tx_batch {
            return None;
        }
        Some(&mut self.staging[..])
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        assert!(port < self.socks.len(), "commit_tx to port {port} of {}", self.socks.len());
        let len = len.min(FRAME);
        let s = &mut self.socks[port];
        let c = &mut self.counters[port];
        if s.free_tx.is_empty() {
            s.reclaim(c);
        }
        if s.free_tx.is_empty() {
            // Every chunk is still queued in the kernel: push them out, then look again.
            s.kick(c);
            s.reclaim(c);
        }
        let Some(addr) = s.free_tx.pop() else {
            c.tx_dropped += 1;
            return;
        };
        // Safety: chunk `addr` is a transmit chunk inside the UMEM, off the free list
        // and so not in use by the kernel; `len` <= FRAME; the staging buffer does not
        // overlap the UMEM.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.staging.as_ptr(),
                s.umem.base.add(addr as usize),
                len,
            )
        };
        s.tx_len[addr as usize / FRAME - s.rx_frames as usize] = len as u32;
        let slot = s.tx.local;
        s.tx.write(slot, libc::xdp_desc { addr, len: len as u32, options: 0 });
        s.tx.local = slot.wrapping_add(1);
        s.tx_unpublished += 1;
        self.batched += 1;
        if self.batched == self.config.tx_batch {
            c.tx_batch_full += 1;
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        let sent = self.batched;
        self.batched = 0;
        for (s, c) in self.socks.iter_mut().zip(self.counters.iter_mut()) {
            if s.tx_unpublished > 0 || s.kick_needed {
                s.kick(c);
            }
            s.reclaim(c);
        }
        Ok(sent)
    }

    fn max_frame_len(&self) -> usize {
        FRAME
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
            .map_err(|source| IoError::Sys { op: "epoll_wait", source })?;
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
