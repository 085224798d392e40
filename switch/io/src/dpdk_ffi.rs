//! Safe wrapper over the system DPDK ([`inc_dpdk_sys`]): EAL initialisation once per
//! process, mbuf pools, Ethernet ports (vdev hot-plug, configure, one queue pair,
//! start/stop/close) and rx/tx bursts with mbuf ownership in types.
//!
//! Ownership rules this module relies on:
//! - an [`Mbuf`] owns one single-segment mbuf and frees it on drop; a [`Mempool`] must
//!   outlive every mbuf taken from it and every port whose receive queue uses it (the
//!   backend declares its pool after its ports and mbufs, so it is dropped last);
//! - an [`EthPort`] owns a started port and stops, closes (and, for a hot-plugged vdev,
//!   removes) it on drop.

use std::ffi::{CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use inc_dpdk_sys as sys;
use tracing::{debug, info, warn};

use crate::backend::IoError;

/// Most mbufs one rx burst returns.
pub(crate) const MAX_BURST: usize = 64;

/// `rte_strerror(rte_errno)` of the calling thread.
fn rte_error() -> String {
    // Safety: reading the calling thread's rte_errno has no preconditions.
    let errno = unsafe { sys::inc_rte_errno() };
    errno_text(errno)
}

/// Text of a DPDK (or negated errno) error code.
fn errno_text(code: i32) -> String {
    let code = code.abs();
    // Safety: rte_strerror returns a pointer to a static or thread-local NUL-terminated
    // string that stays valid until the next call on this thread; it is copied at once.
    let text = unsafe { CStr::from_ptr(sys::rte_strerror(code)) };
    format!("{} (code {code})", text.to_string_lossy())
}

fn dpdk_err(what: String) -> impl FnOnce(String) -> IoError {
    move |cause| IoError::Config(format!("DPDK: {what}: {cause}"))
}

/// The EAL arguments actually used and the outcome, fixed by the first initialisation.
static EAL: OnceLock<Result<Vec<String>, String>> = OnceLock::new();

/// Initialise the EAL once per process with `args` (without argv\[0\]); later calls
/// return the first call's outcome and warn if they asked for different arguments.
///
/// The calling thread keeps its CPU affinity: EAL pins the thread that initialises it
/// to the main lcore's CPU, which would tie every switch thread to one core.
pub(crate) fn eal_init(args: &[String]) -> Result<(), IoError> {
    let res = EAL.get_or_init(|| eal_init_once(args));
    match res {
        Ok(used) if used.as_slice() != args => {
            warn!(first = ?used, now = ?args, "DPDK EAL already initialised; keeping its arguments");
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(e) => Err(IoError::Config(e.clone())),
    }
}

fn eal_init_once(args: &[String]) -> Result<Vec<String>, String> {
    let mut owned: Vec<CString> = Vec::with_capacity(args.len() + 1);
    owned.push(CString::new("inc-switch").expect("no NUL"));
    for a in args {
        owned.push(CString::new(a.as_str()).map_err(|_| format!("EAL argument {a:?} has a NUL"))?);
    }
    // EAL may keep pointers into argv (and reorders it), so argv lives for the process.
    let argv: &'static mut [*mut libc::c_char] =
        Box::leak(owned.into_iter().map(CString::into_raw).collect::<Vec<_>>().into_boxed_slice());

    // Safety: cpu_set_t is plain old data; all-zero is an empty set.
    let mut cpus: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // Safety: `cpus` is a writable cpu_set_t of the size passed; pid 0 is this thread.
    let saved = unsafe { libc::sched_getaffinity(0, size, &mut cpus) } == 0;

    info!(args = ?args, version = sys::DPDK_VERSION, "initialising DPDK EAL");
    // Safety: argv holds argc valid NUL-terminated strings that live forever (leaked
    // above); rte_eal_init runs once per process (guarded by the OnceLock).
    let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
    if rc < 0 {
        return Err(format!("rte_eal_init({}) failed: {}", args.join(" "), rte_error()));
    }
    if saved {
        // Safety: `cpus` is the set read above, passed with its size.
        if unsafe { libc::sched_setaffinity(0, size, &cpus) } != 0 {
            warn!(error = %std::io::Error::last_os_error(), "cannot restore CPU affinity after EAL init");
        }
    }
    Ok(args.to_vec())
}

/// Make the calling thread known to DPDK (an lcore id gives it a per-thread mempool
/// cache); a no-op for threads that already have one. Failure (all lcore ids taken)
/// only costs speed, so it is logged once per thread and otherwise ignored.
pub(crate) fn register_thread() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if DONE.with(|d| d.replace(true)) {
        return;
    }
    // Safety: EAL is initialised (callers hold a Mempool or EthPort, which need it);
    // both calls only touch the calling thread's lcore state.
    unsafe {
        if sys::inc_rte_lcore_id() == sys::LCORE_ID_ANY && sys::rte_thread_register() != 0 {
            debug!(error = %rte_error(), "rte_thread_register failed; no mempool cache");
        }
    }
}

/// Process-wide counter for unique pool and vdev names.
static NAMES: AtomicU32 = AtomicU32::new(0);

/// A unique name `PREFIXn` (DPDK names are global to the process).
pub(crate) fn unique_name(prefix: &str) -> String {
    format!("{prefix}{}", NAMES.fetch_add(1, Ordering::Relaxed))
}

/// A pool of packet mbufs.
#[derive(Debug)]
pub(crate) struct Mempool {
    ptr: NonNull<sys::rte_mempool>,
    name: String,
}

// Safety: DPDK mempools (ring_mp_mc handler) are safe to use from several threads; the
// pointer is owned by this value.
unsafe impl Send for Mempool {}
// Safety: as above; every method takes `&self` and DPDK synchronises internally.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// A pool of `n` mbufs with `room` data bytes after the standard headroom.
    pub(crate) fn new(n: u32, room: u16) -> Result<Self, IoError> {
        let name = unique_name("incpool");
        let cname = CString::new(name.clone()).expect("no NUL");
        // Safety: DPDK's default headroom constant, no preconditions.
        let headroom = unsafe { sys::inc_rte_pktmbuf_headroom() };
        let data_room = room.checked_add(headroom).ok_or_else(|| {
            IoError::Config(format!("DPDK: mbuf room {room} + headroom {headroom} > 65535"))
        })?;
        // Safety: `cname` is a valid C string for the call; SOCKET_ID_ANY (-1) is allowed.
        let ptr = unsafe {
            sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, 256.min(n / 4), 0, data_room, -1)
        };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            IoError::Config(format!(
                "DPDK: cannot create mbuf pool {name} ({n} mbufs of {data_room} bytes): {} \
                 (with --no-huge, raise -m in --dpdk-args)",
                rte_error()
            ))
        })?;
        debug!(pool = %name, n, data_room, "mbuf pool created");
        Ok(Mempool { ptr, name })
    }

    /// A fresh single-segment mbuf, or `None` when the pool is empty.
    pub(crate) fn alloc(&self) -> Option<Mbuf> {
        // Safety: the pool is valid while `self` lives.
        NonNull::new(unsafe { sys::inc_rte_pktmbuf_alloc(self.ptr.as_ptr()) }).map(Mbuf)
    }

    /// Mbufs currently free in the pool (including per-thread caches).
    pub(crate) fn available(&self) -> u32 {
        // Safety: the pool is valid while `self` lives.
        unsafe { sys::rte_mempool_avail_count(self.ptr.as_ptr()) }
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        debug!(pool = %self.name, "freeing mbuf pool");
        // Safety: nothing uses the pool any more: ports and mbufs are dropped first
        // (module ownership rules).
        unsafe { sys::rte_mempool_free(self.ptr.as_ptr()) };
    }
}

/// One owned, single-segment packet buffer.
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct Mbuf(NonNull<sys::rte_mbuf>);

// Safety: an mbuf is exclusively owned by this value; freeing it from another thread
// is allowed by DPDK (mempool put is thread-safe).
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// The packet bytes, or `None` for a multi-segment packet (never produced here:
    /// scatter is not enabled, so a frame always lies in one segment).
    pub(crate) fn data(&self) -> Option<&[u8]> {
        // Safety: the mbuf is valid and owned; for one segment the data lies at mtod
        // and spans data_len bytes inside the mbuf's buffer.
        unsafe {
            let m = self.0.as_ptr();
            if sys::inc_rte_pktmbuf_nb_segs(m) != 1 {
                return None;
            }
            let len = usize::from(sys::inc_rte_pktmbuf_data_len(m));
            Some(std::slice::from_raw_parts(sys::inc_rte_pktmbuf_mtod(m), len))
        }
    }

    /// The whole writable room of a fresh mbuf (from its data start to the buffer end).
    pub(crate) fn room_mut(&mut self) -> &mut [u8] {
        // Safety: the mbuf is valid and exclusively owned; [mtod, mtod + room) lies in
        // its buffer, which nothing else references while `&mut self` is held.
        unsafe {
            let m = self.0.as_ptr();
            let room = usize::from(sys::inc_rte_pktmbuf_room(m));
            std::slice::from_raw_parts_mut(sys::inc_rte_pktmbuf_mtod(m), room)
        }
    }

    /// Make this a packet of the first `len` bytes of its room (clamped to the room).
    pub(crate) fn set_len(&mut self, len: usize) {
        // Safety: the mbuf is valid and exclusively owned; the length fits the room.
        unsafe {
            let m = self.0.as_ptr();
            let room = usize::from(sys::inc_rte_pktmbuf_room(m));
            sys::inc_rte_pktmbuf_set_len(m, len.min(room) as u16);
        }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // Safety: the mbuf is owned by this value and not referenced elsewhere.
        unsafe { sys::inc_rte_pktmbuf_free(self.0.as_ptr()) };
    }
}

/// DPDK's own view of a port.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortInfo {
    pub(crate) mac: [u8; 6],
    pub(crate) mtu: u16,
    pub(crate) max_rx_pktlen: u32,
}

/// Cumulative driver counters of a port (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PortStats {
    /// Frames the hardware/driver dropped because its receive ring was full.
    pub(crate) imissed: u64,
    /// Receive errors.
    pub(crate) ierrors: u64,
    /// Receive mbuf allocation failures.
    pub(crate) rx_nombuf: u64,
    /// Transmit errors.
    pub(crate) oerrors: u64,
}

/// Serialises hot-plug: rte_dev_probe/remove are not documented as thread-safe.
static HOTPLUG: Mutex<()> = Mutex::new(());

/// Hot-plug a virtual device (`devargs` = `NAME,key=value,...`, e.g.
/// `net_af_packet3,iface=p0`) in the calling thread's network namespace. Returns its
/// port id.
pub(crate) fn probe_vdev(devargs: &str) -> Result<u16, IoError> {
    let c = CString::new(devargs).expect("no NUL");
    let _g = HOTPLUG.lock().unwrap_or_else(|p| p.into_inner());
    // Safety: EAL is initialised; `c` is a valid C string for the call.
    let rc = unsafe { sys::rte_dev_probe(c.as_ptr()) };
    if rc < 0 {
        return Err(dpdk_err(format!("hot-plugging vdev `{devargs}`"))(errno_text(rc)));
    }
    let name = devargs.split(',').next().unwrap_or(devargs);
    port_by_name(name)?.ok_or_else(|| {
        IoError::Config(format!("DPDK: vdev `{devargs}` was probed but no port `{name}` exists"))
    })
}

/// Remove a hot-plugged virtual device (after its port was closed).
fn remove_vdev(name: &str) {
    let bus = CString::new("vdev").expect("no NUL");
    let dev = CString::new(name).expect("no NUL");
    let _g = HOTPLUG.lock().unwrap_or_else(|p| p.into_inner());
    // Safety: both are valid C strings; the device's port is closed.
    let rc = unsafe { sys::rte_eal_hotplug_remove(bus.as_ptr(), dev.as_ptr()) };
    if rc < 0 {
        debug!(vdev = name, error = %errno_text(rc), "vdev removal failed");
    }
}

/// The port id of the ethdev called `name` (a PCI address, a vdev name), if any.
pub(crate) fn port_by_name(name: &str) -> Result<Option<u16>, IoError> {
    let Ok(c) = CString::new(name) else { return Ok(None) };
    let mut id = 0u16;
    // Safety: EAL is initialised; `c` is a valid C string and `id` a writable u16.
    let rc = unsafe { sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
    Ok((rc == 0).then_some(id))
}

/// MAC, MTU and frame limit of port `id`.
pub(crate) fn port_info(id: u16) -> Result<PortInfo, IoError> {
    let mut info = sys::rte_eth_dev_info::default();
    // Safety: `info` is a writable rte_eth_dev_info; an invalid id returns an error.
    let rc = unsafe { sys::rte_eth_dev_info_get(id, &mut info) };
    if rc != 0 {
        return Err(dpdk_err(format!("device info of port {id}"))(errno_text(rc)));
    }
    let mut mac = sys::rte_ether_addr::default();
    // Safety: `mac` is a writable rte_ether_addr.
    let rc = unsafe { sys::rte_eth_macaddr_get(id, &mut mac) };
    if rc != 0 {
        return Err(dpdk_err(format!("MAC address of port {id}"))(errno_text(rc)));
    }
    let mut mtu = 0u16;
    // Safety: `mtu` is a writable u16.
    let rc = unsafe { sys::rte_eth_dev_get_mtu(id, &mut mtu) };
    if rc != 0 {
        mtu = 1500;
    }
    Ok(PortInfo { mac: mac.addr_bytes, mtu, max_rx_pktlen: info.max_rx_pktlen })
}

/// A configured and started port with one receive and one transmit queue.
#[derive(Debug)]
pub(crate) struct EthPort {
    id: u16,
    /// Name of the vdev this backend hot-plugged for the port (removed on drop).
    vdev: Option<String>,
    promiscuous: bool,
}

impl EthPort {
    /// Configure port `id` (one queue pair, `rx_desc`/`tx_desc` descriptors, receive
    /// mbufs from `pool`, MTU `mtu` if the device can take it), start it and optionally
    /// enable promiscuous mode. Runs in the port's namespace for vdevs whose driver
    /// issues interface ioctls (af_packet does for promiscuous mode).
    pub(crate) fn start(
        id: u16,
        vdev: Option<String>,
        pool: &Mempool,
        (rx_desc, tx_desc): (u16, u16),
        mtu: u16,
        promiscuous: bool,
    ) -> Result<Self, IoError> {
        // From here on, drop stops/closes/removes whatever was set up.
        let mut port = EthPort { id, vdev, promiscuous: false };
        let info = port_info(id)?;
        let mut conf = sys::rte_eth_conf::default();
        // Only ask for a larger MTU where the device says it can receive such frames;
        // vdevs over kernel interfaces ignore it (the interface MTU applies).
        if u32::from(mtu) + 18 <= info.max_rx_pktlen && mtu > 1500 {
            conf.rxmode.mtu = u32::from(mtu);
        }
        // Safety: `conf` is a valid, zero-initialised configuration (no offloads, no RSS).
        let rc = unsafe { sys::rte_eth_dev_configure(id, 1, 1, &conf) };
        if rc != 0 {
            return Err(dpdk_err(format!("configuring port {id}"))(errno_text(rc)));
        }
        let (mut nrx, mut ntx) = (rx_desc, tx_desc);
        // Safety: both are writable u16s; the port is configured.
        let rc = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nrx, &mut ntx) };
        if rc != 0 {
            return Err(dpdk_err(format!("descriptor counts of port {id}"))(errno_text(rc)));
        }
        // Safety: the port is configured; a null rxconf means the driver's defaults; the
        // pool outlives the port (module ownership rules). SOCKET_ID_ANY: no NUMA pin.
        let rc = unsafe {
            sys::rte_eth_rx_queue_setup(id, 0, nrx, u32::MAX, std::ptr::null(), pool.ptr.as_ptr())
        };
        if rc != 0 {
            return Err(dpdk_err(format!("receive queue of port {id}"))(errno_text(rc)));
        }
        // Safety: as above, null txconf means the driver's defaults.
        let rc = unsafe { sys::rte_eth_tx_queue_setup(id, 0, ntx, u32::MAX, std::ptr::null()) };
        if rc != 0 {
            return Err(dpdk_err(format!("transmit queue of port {id}"))(errno_text(rc)));
        }
        // Safety: queues are set up.
        let rc = unsafe { sys::rte_eth_dev_start(id) };
        if rc != 0 {
            return Err(dpdk_err(format!("starting port {id}"))(errno_text(rc)));
        }
        if promiscuous {
            // Safety: the port is started.
            let rc = unsafe { sys::rte_eth_promiscuous_enable(id) };
            if rc != 0 {
                return Err(dpdk_err(format!("promiscuous mode on port {id}"))(errno_text(rc)));
            }
            port.promiscuous = true;
        }
        debug!(port = id, rx_desc = nrx, tx_desc = ntx, "DPDK port started");
        Ok(port)
    }

    /// DPDK port id.
    pub(crate) fn id(&self) -> u16 {
        self.id
    }

    /// Receive up to `max` frames, handing each mbuf to `each`. Returns how many.
    pub(crate) fn rx_burst(&mut self, max: usize, mut each: impl FnMut(Mbuf)) -> usize {
        let mut ptrs = [std::ptr::null_mut::<sys::rte_mbuf>(); MAX_BURST];
        let want = max.min(MAX_BURST) as u16;
        // Safety: the port is started with queue 0; `ptrs` has room for `want` pointers.
        let n = unsafe { sys::inc_rte_eth_rx_burst(self.id, 0, ptrs.as_mut_ptr(), want) };
        for &p in &ptrs[..usize::from(n)] {
            // The driver hands over ownership of each returned, non-null mbuf.
            if let Some(p) = NonNull::new(p) {
                each(Mbuf(p));
            }
        }
        usize::from(n)
    }

    /// Offer the queued mbufs to the driver; the ones it accepted (a prefix) leave
    /// `pkts`. Returns how many were accepted.
    pub(crate) fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let want = pkts.len().min(usize::from(u16::MAX)) as u16;
        // Safety: Mbuf is repr(transparent) over a non-null rte_mbuf pointer, so the
        // Vec's buffer is an array of `want` valid mbuf pointers; the port is started.
        let n = unsafe { sys::inc_rte_eth_tx_burst(self.id, 0, pkts.as_mut_ptr().cast(), want) };
        let n = usize::from(n);
        // The driver owns the first n now: forget them without freeing.
        pkts.drain(..n).for_each(std::mem::forget);
        n
    }

    /// Driver counters.
    pub(crate) fn stats(&self) -> PortStats {
        let mut st = sys::rte_eth_stats::default();
        // Safety: `st` is a writable rte_eth_stats.
        if unsafe { sys::rte_eth_stats_get(self.id, &mut st) } != 0 {
            return PortStats::default();
        }
        PortStats {
            imissed: st.imissed,
            ierrors: st.ierrors,
            rx_nombuf: st.rx_nombuf,
            oerrors: st.oerrors,
        }
    }

    /// Leave promiscuous mode. Af_packet vdevs set the interface flag (which outlives
    /// the process) through an ioctl in the calling thread's namespace, so a port is
    /// dropped inside its namespace (see the backend).
    fn leave_promiscuous(&mut self) {
        if self.promiscuous {
            // Safety: the port is valid until drop.
            let rc = unsafe { sys::rte_eth_promiscuous_disable(self.id) };
            if rc != 0 {
                debug!(port = self.id, error = %errno_text(rc), "promiscuous disable failed");
            }
            self.promiscuous = false;
        }
    }
}

impl Drop for EthPort {
    fn drop(&mut self) {
        self.leave_promiscuous();
        // Safety: the port is ours; stop then close is the documented teardown. Mbufs
        // the driver still holds go back to the pool, which outlives the port.
        unsafe {
            let _ = sys::rte_eth_dev_stop(self.id);
            let _ = sys::rte_eth_dev_close(self.id);
        }
        if let Some(name) = self.vdev.take() {
            remove_vdev(&name);
        }
    }
}
