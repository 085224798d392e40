//! DPDK backend (cargo feature `dpdk`): every port is a DPDK ethdev with one receive
//! and one transmit queue, driven by `rte_eth_rx_burst`/`rte_eth_tx_burst` over one
//! mbuf pool; frames are written straight into mbufs.
//!
//! Ports:
//! - a port whose interface name is the name of a device EAL already probed (a PCI
//!   address such as `0000:3b:00.0` allowed with `-a`, or a vdev given in the EAL
//!   arguments) uses that device and its PMD unchanged;
//! - any other name is a kernel interface: the backend hot-plugs a vdev for it
//!   (`net_af_packet` by default, or `net_af_xdp`) **inside the port's network
//!   namespace**. Those PMDs open their sockets (and issue their interface ioctls) in
//!   the namespace of the calling thread, so probe, configure, start and close all run
//!   on a helper thread that entered the namespace (as the AF_PACKET backend does); the
//!   sockets stay bound there. So one process serves ports in many namespaces, and EAL
//!   is initialised once per process.
//!
//! Idle cost: DPDK has no receive readiness to sleep on for these PMDs, so [`Backend::wait`]
//! backs off adaptively: it returns at once for a few empty polls, then, until
//! [`DpdkConfig::busy_poll`] has passed since the last received frame, yields the CPU
//! between polls, then sleeps 1 µs, 2 µs, ... up to [`DpdkConfig::idle_sleep_max`]
//! (interruptible by the [`Waker`]); the first received frame resets the back-off.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::backend::{Backend, IoError, PortCounters, PortDesc, PortSpec, RxRotation, Waker};
use crate::dpdk_ffi::{self, EthPort, Mbuf, Mempool, MAX_BURST};
use crate::sys::{self, EventFd};

/// The vdev driver used for ports that are kernel interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VdevDriver {
    /// `net_af_packet` (TPACKET_V2 rings, copies every frame; works everywhere).
    AfPacket,
    /// `net_af_xdp` (XDP socket; needs an XDP-capable kernel and driver).
    AfXdp,
}

impl VdevDriver {
    fn prefix(self) -> &'static str {
        match self {
            VdevDriver::AfPacket => "net_af_packet_inc",
            VdevDriver::AfXdp => "net_af_xdp_inc",
        }
    }
}

/// Configuration of the DPDK backend.
#[derive(Debug, Clone)]
pub struct DpdkConfig {
    /// EAL arguments, passed through (see [`effective_eal_args`] for what is added).
    pub eal_args: Vec<String>,
    /// Driver of the vdevs hot-plugged for kernel interfaces.
    pub vdev: VdevDriver,
    /// Frames per transmit batch.
    pub tx_batch: usize,
    /// Receive/transmit descriptors per queue (real NICs; vdevs ignore them).
    pub descriptors: u16,
    /// Frames in each af_packet vdev ring (receive and transmit each).
    pub vdev_frames: u32,
    /// Longest idle sleep between empty polls.
    pub idle_sleep_max: Duration,
    /// After a received frame, poll this long (yielding the CPU between polls) before
    /// sleeping: a sleep of the back-off would add up to `idle_sleep_max` to the next
    /// frame's latency, and hosts that busy-poll keep the CPUs from being idle.
    pub busy_poll: Duration,
    /// Put ports in promiscuous mode (left again on close).
    pub promiscuous: bool,
    /// Ports of every DPDK backend this process opens (several workers each open one),
    /// for sizing EAL memory at the first open; 0 means just this backend's.
    pub process_ports: usize,
}

impl Default for DpdkConfig {
    fn default() -> Self {
        DpdkConfig {
            eal_args: Vec::new(),
            vdev: VdevDriver::AfPacket,
            tx_batch: 64,
            descriptors: 512,
            vdev_frames: 512,
            idle_sleep_max: Duration::from_micros(500),
            busy_poll: Duration::from_micros(200),
            promiscuous: true,
            process_ports: 0,
        }
    }
}

/// True if `args` contain option `long` (as `--x` or `--x=v`) or short option `short`
/// (as `-l 0` or `-l0`).
fn has_opt(args: &[String], short: Option<&str>, long: &[&str]) -> bool {
    args.iter().any(|a| {
        long.iter().any(|l| a == l || a.starts_with(&format!("{l}=")))
            || short.is_some_and(|s| a.starts_with(s) && !a.starts_with("--"))
    })
}

/// The EAL arguments used: `user` (default `--no-huge --no-pci` when empty), plus what
/// a switch process needs unless the user chose otherwise: one lcore (`-l` the first
/// CPU this thread may use), `--no-shconf` (no shared runtime files, so several switch
/// processes can run side by side), `--no-telemetry`, `--log-level=notice`, and with
/// `--no-huge` a memory size `-m need_mb`.
pub fn effective_eal_args(user: &[String], first_cpu: usize, need_mb: u32) -> Vec<String> {
    let mut a: Vec<String> =
        if user.is_empty() { vec!["--no-huge".into(), "--no-pci".into()] } else { user.to_vec() };
    if !has_opt(&a, Some("-l"), &["--lcores"]) && !has_opt(&a, Some("-c"), &[]) {
        a.extend(["-l".into(), first_cpu.to_string()]);
    }
    if !has_opt(&a, None, &["--in-memory", "--no-shconf", "--file-prefix", "--proc-type"]) {
        a.push("--no-shconf".into());
    }
    if !has_opt(&a, None, &["--no-telemetry", "--telemetry"]) {
        a.push("--no-telemetry".into());
    }
    if !has_opt(&a, None, &["--log-level"]) {
        a.push("--log-level=notice".into());
    }
    if has_opt(&a, None, &["--no-huge"]) && !has_opt(&a, Some("-m"), &["--socket-mem"]) {
        a.extend(["-m".into(), need_mb.to_string()]);
    }
    a
}

/// Mbuf room (bytes after the headroom) and af_packet frame slot for frames up to
/// `max_frame` bytes: a slot holds the TPACKET_V2 header and address (the frame starts
/// at offset 66 for Ethernet) plus the frame; the PMD requires the room to hold a slot
/// minus 32 bytes.
pub fn frame_slot(max_frame: usize) -> usize {
    (max_frame + 80).next_power_of_two().max(2048)
}

/// Exponential idle back-off: poll again at once for the first few empty polls, yield
/// the CPU until `busy_poll` has passed since the last frame, then sleep 1 µs doubling
/// up to the cap.
#[derive(Debug, Clone)]
struct Backoff {
    empty: u32,
    max: Duration,
    busy_poll: Duration,
    last_rx: std::time::Instant,
}

/// What an idle poll loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idle {
    /// Poll again at once.
    Spin,
    /// Give the CPU to whoever else is runnable, then poll again.
    Yield,
    /// Sleep this long.
    Sleep(Duration),
}

impl Backoff {
    /// Empty polls answered without sleeping: a frame in flight on the next hop
    /// usually arrives within a few polls.
    const SPIN_POLLS: u32 = 4;

    fn new(max: Duration, busy_poll: Duration) -> Self {
        Backoff { empty: 0, max, busy_poll, last_rx: std::time::Instant::now() }
    }

    fn reset(&mut self) {
        self.empty = 0;
        self.last_rx = std::time::Instant::now();
    }

    fn empty_poll(&mut self) {
        self.empty = self.empty.saturating_add(1);
    }

    /// The next step, `since_rx` after the last received frame.
    fn next(&self, since_rx: Duration) -> Idle {
        let Some(k) = self.empty.checked_sub(Self::SPIN_POLLS) else { return Idle::Spin };
        if since_rx < self.busy_poll {
            return Idle::Yield;
        }
        Idle::Sleep(Duration::from_micros(1u64 << k.min(30)).min(self.max))
    }
}

/// Facts about a kernel interface, read inside its namespace.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    mac: [u8; 6],
    mtu: u32,
}

/// MAC and MTU of `ifname` in the calling thread's namespace, `None` if it has none.
fn kernel_iface(ifname: &str) -> Result<Option<Kernel>, IoError> {
    if sys::if_index(ifname).is_err() {
        return Ok(None);
    }
    // Safety: plain syscall; the fd is checked and closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(IoError::Sys {
            op: "socket(AF_INET)",
            source: std::io::Error::last_os_error(),
        });
    }
    let mac = sys::if_mac(fd, ifname);
    let mtu = sys::if_mtu(fd, ifname);
    // Safety: `fd` was opened above and is not used after this.
    unsafe { libc::close(fd) };
    let iface = || ifname.to_string();
    let mac =
        mac.map_err(|source| IoError::Interface { op: "read MAC", iface: iface(), source })?;
    let mtu =
        mtu.map_err(|source| IoError::Interface { op: "read MTU", iface: iface(), source })?;
    Ok(Some(Kernel { mac, mtu }))
}

#[derive(Debug)]
struct Port {
    /// `None` only while being dropped.
    eth: Option<EthPort>,
    netns: Option<String>,
    label: String,
    /// Committed frames waiting for the next flush.
    tx: Vec<Mbuf>,
    /// Bytes of `tx`.
    tx_bytes: u64,
}

/// The DPDK backend.
#[derive(Debug)]
pub struct DpdkBackend {
    // Ports and mbufs are declared (so dropped) before the pool.
    ports: Vec<Port>,
    /// The mbuf last handed out by `tx_buffer`, not yet committed.
    pending: Option<Mbuf>,
    pool: Arc<Mempool>,
    descs: Vec<PortDesc>,
    counters: Vec<PortCounters>,
    config: DpdkConfig,
    max_frame: usize,
    queued: usize,
    rx_rotation: RxRotation,
    idle: Backoff,
    wake: Arc<EventFd>,
}

impl DpdkBackend {
    /// Initialise EAL (first backend of the process), open every port (hot-plugging
    /// vdevs inside their namespaces as needed). Port index = position in `specs`.
    pub fn open(specs: &[PortSpec], config: DpdkConfig) -> Result<Self, IoError> {
        if config.tx_batch == 0 || config.descriptors == 0 || config.vdev_frames == 0 {
            return Err(IoError::Config(
                "bad DPDK geometry: tx batch, descriptors and vdev frames must be positive".into(),
            ));
        }
        let mut kernel = Vec::with_capacity(specs.len());
        for spec in specs {
            let ifname = spec.ifname.clone();
            kernel.push(sys::in_netns(spec.netns.as_deref(), move || kernel_iface(&ifname))?);
        }

        // Memory: at most every port is a real NIC whose rings hold mbufs.
        let guess_frame =
            kernel.iter().flatten().map(|k| k.mtu as usize + 18).max().unwrap_or(1518);
        let desc = usize::from(config.descriptors);
        let all_ports = config.process_ports.max(specs.len());
        let worst_mbufs = all_ports * 2 * desc + 4096 * all_ports.div_ceil(specs.len().max(1));
        let need_mb = (worst_mbufs * (frame_slot(guess_frame) + 512)).div_ceil(1 << 20) + 64;
        let args = effective_eal_args(&config.eal_args, first_cpu(), need_mb as u32);
        dpdk_ffi::eal_init(&args)?;
        dpdk_ffi::register_thread();

        // Which ports are DPDK devices already, which need a vdev.
        let mut named = Vec::with_capacity(specs.len());
        let mut max_frame = 1518usize;
        for (spec, k) in specs.iter().zip(&kernel) {
            let id = dpdk_ffi::port_by_name(&spec.ifname)?;
            let mtu = match (id, k) {
                (Some(id), _) => {
                    if spec.netns.is_some() {
                        warn!(port = %spec, "DPDK device {} is not in a namespace; ignoring it", spec.ifname);
                    }
                    u32::from(dpdk_ffi::port_info(id)?.mtu)
                }
                (None, Some(k)) => k.mtu,
                (None, None) => {
                    return Err(IoError::Config(format!(
                        "port {spec}: no interface `{}` in {} and no DPDK device of that name \
                         (probed by EAL: give it with -a/--vdev in --dpdk-args)",
                        spec.ifname,
                        spec.netns
                            .as_deref()
                            .map_or("this namespace".into(), |n| format!("namespace {n}")),
                    )))
                }
            };
            max_frame = max_frame.max(mtu as usize + 18);
            named.push(id);
        }
        let slot = frame_slot(max_frame);
        let ring_mbufs: usize =
            named.iter().map(|id| if id.is_some() { 2 * desc } else { 0 }).sum();
        let n = (ring_mbufs + specs.len() * 2 * MAX_BURST + config.tx_batch + 2048 + 1)
            .next_power_of_two()
            - 1;
        let pool = Arc::new(Mempool::new(n as u32, slot as u16)?);

        let mut ports = Vec::with_capacity(specs.len());
        let mut descs = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let rings = (config.descriptors, config.descriptors);
            let promisc = config.promiscuous;
            let mtu = (max_frame - 18) as u16;
            let eth = match named[i] {
                Some(id) => EthPort::start(id, None, &pool, rings, mtu, promisc)?,
                None => {
                    let name = dpdk_ffi::unique_name(config.vdev.prefix());
                    let devargs = match config.vdev {
                        VdevDriver::AfPacket => format!(
                            "{name},iface={},qpairs=1,framesz={slot},blocksz={},framecnt={},\
                             qdisc_bypass=1",
                            spec.ifname,
                            slot.max(4096),
                            config.vdev_frames
                        ),
                        VdevDriver::AfXdp => {
                            format!("{name},iface={},start_queue=0,queue_count=1", spec.ifname)
                        }
                    };
                    let pool = pool.clone();
                    sys::in_netns(spec.netns.as_deref(), move || {
                        let id = dpdk_ffi::probe_vdev(&devargs)?;
                        debug!(devargs, port = id, "vdev probed");
                        EthPort::start(id, Some(name), &pool, rings, mtu, promisc)
                    })
                    .map_err(|e| IoError::Config(format!("port {spec}: {e}")))?
                }
            };
            let (mac, mtu) = match kernel[i] {
                Some(k) if named[i].is_none() => (k.mac, k.mtu),
                _ => {
                    let info = dpdk_ffi::port_info(eth.id())?;
                    (info.mac, u32::from(info.mtu))
                }
            };
            info!(port = i, iface = %spec, dpdk_port = eth.id(), mac = ?mac, mtu, "DPDK port open");
            descs.push(PortDesc { spec: spec.clone(), mac, mtu: Some(mtu) });
            ports.push(Port {
                eth: Some(eth),
                netns: if named[i].is_none() { spec.netns.clone() } else { None },
                label: spec.label(),
                tx: Vec::with_capacity(config.tx_batch),
                tx_bytes: 0,
            });
        }
        info!(ports = ports.len(), mbufs = n, slot, max_frame, "DPDK backend ready");
        Ok(DpdkBackend {
            counters: vec![PortCounters::default(); ports.len()],
            ports,
            pending: None,
            pool,
            descs,
            max_frame,
            queued: 0,
            rx_rotation: RxRotation::default(),
            idle: Backoff::new(config.idle_sleep_max, config.busy_poll),
            wake: Arc::new(EventFd::new()?),
            config,
        })
    }

    /// Offer port `p`'s queued frames to its driver until all are taken, retrying a
    /// full queue a bounded number of times; what is left is dropped and counted (the
    /// RC layer retransmits). Returns the frames sent.
    fn flush_port(&mut self, p: usize) -> usize {
        /// Attempts without progress before giving up on the rest of a batch.
        const STALLS: u32 = 64;
        let port = &mut self.ports[p];
        let c = &mut self.counters[p];
        let eth = port.eth.as_mut().expect("port open");
        let (mut sent, mut stalls) = (0, 0);
        while !port.tx.is_empty() {
            let n = eth.tx_burst(&mut port.tx);
            c.tx_batches += 1;
            sent += n;
            if n > 0 {
                stalls = 0;
                continue;
            }
            stalls += 1;
            if stalls >= STALLS {
                let dropped: u64 =
                    port.tx.iter().map(|m| m.data().map_or(0, |d| d.len() as u64)).sum();
                c.tx_dropped += port.tx.len() as u64;
                port.tx_bytes -= dropped;
                debug!(iface = %port.label, dropped = port.tx.len(), "transmit queue full");
                port.tx.clear();
                break;
            }
            std::hint::spin_loop();
        }
        c.tx_packets += sent as u64;
        c.tx_bytes += std::mem::take(&mut port.tx_bytes);
        sent
    }
}

/// First CPU the calling thread may run on (EAL's main lcore), 0 if unknown.
fn first_cpu() -> usize {
    // Safety: cpu_set_t is plain old data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // Safety: `set` is a writable cpu_set_t of the size passed.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return 0;
    }
    // Safety: CPU_ISSET reads the set for CPU indices below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize).find(|&c| unsafe { libc::CPU_ISSET(c, &set) }).unwrap_or(0)
}

impl Backend for DpdkBackend {
    fn name(&self) -> &'static str {
        "dpdk"
    }

    fn ports(&self) -> &[PortDesc] {
        &self.descs
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        dpdk_ffi::register_thread();
        let (ports, counters) = (&mut self.ports, &mut self.counters);
        let total = self.rx_rotation.poll(ports.len(), budget, |p, left| {
            let c = &mut counters[p];
            let eth = ports[p].eth.as_mut().expect("port open");
            let got = eth.rx_burst(left, |m| match m.data() {
                Some(frame) => {
                    c.rx_packets += 1;
                    c.rx_bytes += frame.len() as u64;
                    sink(p, frame);
                }
                None => c.rx_truncated += 1,
            });
            if got > 0 {
                c.rx_batches += 1;
            }
            got
        });
        if total == 0 {
            self.idle.empty_poll();
        } else {
            self.idle.reset();
        }
        Ok(total)
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        if self.queued >= self.config.tx_batch {
            return None;
        }
        if self.pending.is_none() {
            dpdk_ffi::register_thread();
            self.pending = Some(self.pool.alloc()?);
        }
        let max = self.max_frame;
        self.pending.as_mut().map(|m| &mut m.room_mut()[..max])
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        assert!(port < self.ports.len(), "commit_tx to port {port} of {}", self.ports.len());
        let mut m = self.pending.take().expect("commit_tx without a tx_buffer");
        let len = len.min(self.max_frame);
        m.set_len(len);
        self.ports[port].tx.push(m);
        self.ports[port].tx_bytes += len as u64;
        self.queued += 1;
        if self.queued == self.config.tx_batch {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        if self.queued == 0 {
            return Ok(0);
        }
        let mut sent = 0;
        for p in 0..self.ports.len() {
            if !self.ports[p].tx.is_empty() {
                sent += self.flush_port(p);
            }
        }
        self.queued = 0;
        Ok(sent)
    }

    fn max_frame_len(&self) -> usize {
        self.max_frame
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        let nap = match self.idle.next(self.idle.last_rx.elapsed()) {
            Idle::Spin => return Ok(()),
            Idle::Yield => {
                std::thread::yield_now();
                return Ok(());
            }
            Idle::Sleep(nap) => nap,
        };
        let nap = timeout.map_or(nap, |t| t.min(nap));
        if nap.is_zero() {
            return Ok(());
        }
        lower_timer_slack();
        let fd = self.wake.fd().as_fd().as_raw_fd();
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ts = libc::timespec {
            tv_sec: nap.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(nap.subsec_nanos() as i32),
        };
        // Safety: `pfd` is one valid pollfd, `ts` a valid timespec, no signal mask.
        let rc = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(IoError::Sys { op: "ppoll", source: e });
            }
        } else if rc > 0 {
            self.wake.drain();
            self.idle.reset();
        }
        Ok(())
    }

    fn waker(&self) -> Waker {
        Waker::new(self.wake.clone())
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        let mut c = self.counters[port];
        if let Some(eth) = self.ports[port].eth.as_ref() {
            let st = eth.stats();
            c.rx_dropped = st.imissed + st.rx_nombuf + st.ierrors;
            c.tx_dropped += st.oerrors;
        }
        c
    }
}

/// Sleep with microsecond precision: the default 50 µs timer slack would stretch
/// every short back-off sleep. Once per thread.
fn lower_timer_slack() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !DONE.with(|d| d.replace(true)) {
        // Safety: PR_SET_TIMERSLACK only changes the calling thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    }
}

impl Drop for DpdkBackend {
    fn drop(&mut self) {
        self.pending = None;
        for port in &mut self.ports {
            port.tx.clear();
            let Some(eth) = port.eth.take() else { continue };
            // Vdev teardown issues interface ioctls: run it in the port's namespace.
            let label = port.label.clone();
            if let Err(e) = sys::in_netns(port.netns.as_deref(), move || {
                drop(eth);
                Ok(())
            }) {
                warn!(iface = %label, error = %e, "closing DPDK port");
            }
        }
        debug!(free_mbufs = self.pool.available(), "DPDK backend closed");
    }
}

#[cfg(test)]
#[path = "dpdk_tests.rs"]
mod veth_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn eal_args_default_and_additions() {
        let a = effective_eal_args(&[], 1, 96);
        assert_eq!(
            a,
            s(&[
                "--no-huge",
                "--no-pci",
                "-l",
                "1",
                "--no-shconf",
                "--no-telemetry",
                "--log-level=notice",
                "-m",
                "96"
            ])
        );
        // What the user gave is kept and not duplicated.
        let user = s(&["-a", "0000:3b:00.0", "--lcores=2", "--file-prefix=x", "--log-level=debug"]);
        let a = effective_eal_args(&user, 0, 96);
        assert_eq!(a, [user.clone(), s(&["--no-telemetry"])].concat());
        let a = effective_eal_args(&s(&["--no-huge", "-m", "512", "-l0"]), 3, 96);
        assert_eq!(
            a,
            s(&[
                "--no-huge",
                "-m",
                "512",
                "-l0",
                "--no-shconf",
                "--no-telemetry",
                "--log-level=notice"
            ])
        );
    }

    #[test]
    fn frame_slots_hold_the_frame_and_the_tpacket_header() {
        assert_eq!(frame_slot(1518), 2048);
        assert_eq!(frame_slot(4096 + 18), 8192);
        assert_eq!(frame_slot(9000 + 18), 16384);
        for f in [64, 1518, 1982, 4114, 9018] {
            assert!(frame_slot(f) >= f + 66, "{f}");
        }
    }

    #[test]
    fn backoff_spins_then_doubles_to_the_cap() {
        let us = Duration::from_micros;
        let mut b = Backoff::new(us(100), us(200));
        let mut naps = Vec::new();
        for _ in 0..14 {
            b.empty_poll();
            naps.push(b.next(us(200)));
        }
        assert_eq!(&naps[..3], &[Idle::Spin; 3]);
        let doubling: Vec<Idle> = [1, 2, 4, 8, 16, 32, 64].map(|n| Idle::Sleep(us(n))).to_vec();
        assert_eq!(&naps[3..10], &doubling[..]);
        assert!(naps[10..].iter().all(|n| *n == Idle::Sleep(us(100))));
        // Within the busy poll after a frame: yield, never sleep.
        assert_eq!(b.next(us(199)), Idle::Yield);
        b.reset();
        assert_eq!(b.next(us(0)), Idle::Spin);
        // No busy poll: straight to the back-off.
        let mut b = Backoff::new(us(100), Duration::ZERO);
        (0..5).for_each(|_| b.empty_poll());
        assert_eq!(b.next(Duration::ZERO), Idle::Sleep(us(2)));
    }
}
