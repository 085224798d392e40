//! System-call helpers of the backends. epoll, eventfd, namespace entry and interface
//! lookup come from `nix`; what it does not cover (packet-socket options, interface
//! ioctls, `epoll_pwait2`) is thin, audited `libc`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::epoll::{self, EpollCreateFlags, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd as NixEventFd};
use tracing::debug;

use crate::backend::{IoError, Wake};

/// A ready event of [`Epoll::wait`].
pub(crate) type Event = epoll::EpollEvent;

/// Token of a ready event (what [`Epoll::add`] was given).
pub(crate) fn token(ev: &Event) -> u64 {
    ev.data()
}

/// True if the event reports an error condition on the fd.
pub(crate) fn is_error(ev: &Event) -> bool {
    ev.events().contains(EpollFlags::EPOLLERR)
}

/// An empty event array for [`Epoll::wait`].
pub(crate) fn events<const N: usize>() -> [Event; N] {
    [Event::empty(); N]
}

/// Last OS error as `io::Error`.
fn last() -> io::Error {
    io::Error::last_os_error()
}

/// An epoll instance watching fds for readability (level-triggered).
#[derive(Debug)]
pub(crate) struct Epoll {
    inner: epoll::Epoll,
    /// `epoll_pwait2` is unavailable (kernel < 5.11, or a seccomp filter): wait with
    /// `epoll_wait`.
    no_pwait2: bool,
}

/// The kernel's `struct __kernel_timespec`, 64-bit on every architecture (unlike
/// `libc::timespec`), as the raw `epoll_pwait2` system call reads it.
#[repr(C)]
struct KernelTimespec {
    tv_sec: i64,
    tv_nsec: i64,
}

impl Epoll {
    pub(crate) fn new() -> Result<Self, IoError> {
        let inner = epoll::Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| IoError::Sys { op: "epoll_create1", source: e.into() })?;
        Ok(Epoll { inner, no_pwait2: false })
    }

    /// Watch `fd` for readability.
    pub(crate) fn add(&self, fd: impl AsFd, token: u64) -> io::Result<()> {
        self.inner.add(fd, Event::new(EpollFlags::EPOLLIN, token)).map_err(io::Error::from)
    }

    /// Wait for readiness; `None` blocks indefinitely, a signal returns 0 events. Ready
    /// events are written to `events`; returns how many.
    ///
    /// The timeout is kept to the nanosecond (`epoll_pwait2`): `epoll_wait`'s whole
    /// milliseconds made engine timers shorter than 1 ms fire up to 1 ms late. Where
    /// `epoll_pwait2` is unavailable (kernel < 5.11, or refused by a seccomp filter) the
    /// first wait finds out and every wait then uses `epoll_wait`, rounded up to
    /// milliseconds.
    pub(crate) fn wait(
        &mut self,
        timeout: Option<Duration>,
        events: &mut [Event],
    ) -> io::Result<usize> {
        let mut res = if self.no_pwait2 {
            self.wait_ms(timeout, events)
        } else {
            self.pwait2(timeout, events)
        };
        // An older seccomp filter (container runtimes) answers EPERM for a system call
        // it does not know; epoll waits fail with EPERM for no other reason.
        if matches!(res, Err(Errno::ENOSYS | Errno::EPERM)) && !self.no_pwait2 {
            debug!("no epoll_pwait2 (kernel < 5.11 or filtered): waits round up to milliseconds");
            self.no_pwait2 = true;
            res = self.wait_ms(timeout, events);
        }
        match res {
            Ok(n) => Ok(n),
            Err(Errno::EINTR) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// `epoll_pwait2` without a signal mask. libc binds it for glibc >= 2.35 only; the
    /// raw system call needs neither that glibc nor a 64-bit `time_t`.
    fn pwait2(&self, timeout: Option<Duration>, events: &mut [Event]) -> Result<usize, Errno> {
        // A timeout past `i64::MAX` seconds is as good as none; the kernel saturates.
        let ts = timeout.map(|t| KernelTimespec {
            tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const KernelTimespec);
        let max = events.len().min(i32::MAX as usize) as libc::c_long;
        // Safety: the epoll fd stays open while `self` is borrowed; `events` is a live,
        // writable array of at least `max` `epoll_event`s (`EpollEvent` is
        // `repr(transparent)` over it); `ts_ptr` is null or points to a live
        // `__kernel_timespec`; with a null signal mask the kernel ignores the mask size.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                libc::c_long::from(self.inner.0.as_raw_fd()),
                events.as_mut_ptr().cast::<libc::epoll_event>(),
                max,
                ts_ptr,
                std::ptr::null::<libc::sigset_t>(),
                0 as libc::c_long,
            )
        };
        Errno::result(rc).map(|n| n as usize)
    }

    /// `epoll_wait`, the timeout rounded up to whole milliseconds so that a
    /// sub-millisecond deadline never turns into a busy loop.
    fn wait_ms(&self, timeout: Option<Duration>, events: &mut [Event]) -> Result<usize, Errno> {
        let timeout = match timeout {
            None => EpollTimeout::NONE,
            Some(t) => {
                let ms = t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
                EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::MAX)
            }
        };
        self.inner.wait(events, timeout)
    }

    /// The events ready now, without waiting (errors count as none ready).
    pub(crate) fn ready_now(&self, events: &mut [Event]) -> usize {
        self.inner.wait(events, EpollTimeout::ZERO).unwrap_or(0)
    }
}

/// Take (and clear) a socket's pending error (`SO_ERROR`).
pub(crate) fn take_socket_error(fd: RawFd) -> Option<io::Error> {
    let mut err: libc::c_int = 0;
    getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut err).ok()?;
    (err != 0).then(|| io::Error::from_raw_os_error(err))
}

/// An eventfd used as a cross-thread waker.
#[derive(Debug)]
pub(crate) struct EventFd {
    inner: NixEventFd,
}

impl EventFd {
    pub(crate) fn new() -> Result<Self, IoError> {
        let inner = NixEventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| IoError::Sys { op: "eventfd", source: e.into() })?;
        Ok(EventFd { inner })
    }

    /// The fd, to watch with [`Epoll::add`].
    pub(crate) fn fd(&self) -> impl AsFd + '_ {
        self.inner.as_fd()
    }

    /// Reset the counter so the fd stops being readable.
    pub(crate) fn drain(&self) {
        // EAGAIN (nothing pending) is fine.
        let _ = self.inner.read();
    }
}

impl Wake for EventFd {
    fn wake(&self) {
        // A saturated counter (EAGAIN) still wakes.
        let _ = self.inner.write(1);
    }
}

/// Path of a named network namespace as created by `ip netns add`.
fn netns_path(name: &str) -> PathBuf {
    let run = PathBuf::from("/run/netns").join(name);
    if run.exists() {
        run
    } else {
        PathBuf::from("/var/run/netns").join(name)
    }
}

/// Run `f` inside network namespace `netns` (or here when `None`).
///
/// The namespace is entered on a short-lived helper thread, so the calling thread never
/// changes namespace; sockets created by `f` stay bound to `netns` after it returns.
pub(crate) fn in_netns<T, F>(netns: Option<&str>, f: F) -> Result<T, IoError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, IoError> + Send + 'static,
{
    let Some(ns) = netns else { return f() };
    let ns = ns.to_string();
    let path = netns_path(&ns);
    let handle = std::thread::Builder::new()
        .name(format!("netns-{ns}"))
        .spawn(move || {
            let fail = |source: io::Error| IoError::Netns {
                netns: ns.clone(),
                path: path.display().to_string(),
                source,
            };
            let file = File::open(&path).map_err(fail)?;
            // Only this helper thread changes namespace.
            setns(file, CloneFlags::CLONE_NEWNET).map_err(|e| fail(e.into()))?;
            f()
        })
        .map_err(|source| IoError::Sys { op: "spawn netns helper thread", source })?;
    handle.join().map_err(|_| IoError::Config("netns helper thread panicked".into()))?
}

/// Interface index of `ifname` in the calling thread's namespace.
pub(crate) fn if_index(ifname: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(ifname).map_err(io::Error::from)
}

/// An `ifreq` naming `ifname`.
fn ifreq(ifname: &str) -> libc::ifreq {
    // Safety: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(ifname.bytes().take(libc::IFNAMSIZ - 1)) {
        *d = s as libc::c_char;
    }
    req
}

/// MAC address of `ifname`, queried through socket `fd` (so in `fd`'s namespace).
pub(crate) fn if_mac(fd: RawFd, ifname: &str) -> io::Result<[u8; 6]> {
    let mut req = ifreq(ifname);
    // Safety: SIOCGIFHWADDR reads the name and writes the hwaddr inside `req`.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR as _, &mut req) };
    if rc < 0 {
        return Err(last());
    }
    // Safety: the kernel filled the hwaddr member of the union.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(mac)
}

/// MTU of `ifname`, queried through socket `fd`.
pub(crate) fn if_mtu(fd: RawFd, ifname: &str) -> io::Result<u32> {
    let mut req = ifreq(ifname);
    // Safety: SIOCGIFMTU reads the name and writes the mtu inside `req`.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU as _, &mut req) };
    if rc < 0 {
        return Err(last());
    }
    // Safety: the kernel filled the mtu member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as u32)
}

/// `ETHTOOL_GTXCSUM`: whether the interface computes transmit checksums itself. Without
/// that offload the kernel also cuts UDP GSO frames into datagrams before the driver.
pub(crate) fn if_tx_checksum_offload(fd: RawFd, ifname: &str) -> io::Result<bool> {
    /// `struct ethtool_value`.
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const ETHTOOL_GTXCSUM: u32 = 0x16;
    let mut value = EthtoolValue { cmd: ETHTOOL_GTXCSUM, data: 0 };
    // Safety: `value` is the `ethtool_value` that ETHTOOL_GTXCSUM reads and writes.
    unsafe { ethtool(fd, ifname, &mut value) }?;
    Ok(value.data != 0)
}

/// `ETHTOOL_GDRVINFO`: the interface's driver name (`veth`, `mlx5_core`, ...).
pub(crate) fn if_driver(fd: RawFd, ifname: &str) -> io::Result<String> {
    /// `struct ethtool_drvinfo`.
    #[repr(C)]
    struct EthtoolDrvinfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        n_priv_flags: u32,
        n_stats: u32,
        testinfo_len: u32,
        eedump_len: u32,
        regdump_len: u32,
    }
    const ETHTOOL_GDRVINFO: u32 = 0x03;
    // Safety: ethtool_drvinfo is plain old data; all-zero is a valid value.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // Safety: `info` is the `ethtool_drvinfo` that ETHTOOL_GDRVINFO fills.
    unsafe { ethtool(fd, ifname, &mut info) }?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(info.driver.len());
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// `SIOCETHTOOL` on `ifname` with `data`, whose first field is the command.
///
/// # Safety
/// `T` must be the structure the command in its first field reads and writes.
unsafe fn ethtool<T>(fd: RawFd, ifname: &str, data: &mut T) -> io::Result<()> {
    let mut req = ifreq(ifname);
    req.ifr_ifru.ifru_data = (data as *mut T).cast();
    // Safety: SIOCETHTOOL reads the name and the data pointer inside `req`; the pointer
    // is to `data`, live for the call, which is what the command expects (the
    // caller's contract).
    let rc = unsafe { libc::ioctl(fd, libc::SIOCETHTOOL as _, &mut req) };
    if rc < 0 {
        return Err(last());
    }
    Ok(())
}

/// `setsockopt` with a plain-data value.
pub(crate) fn setsockopt<T: Copy>(fd: RawFd, level: i32, name: i32, val: &T) -> io::Result<()> {
    // Safety: `val` points to a live `T` of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(last());
    }
    Ok(())
}

/// `getsockopt` into a plain-data value.
pub(crate) fn getsockopt<T: Copy>(fd: RawFd, level: i32, name: i32, val: &mut T) -> io::Result<()> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // Safety: `val` points to a live, writable `T` of the size passed.
    let rc = unsafe { libc::getsockopt(fd, level, name, (val as *mut T).cast(), &mut len) };
    if rc < 0 {
        return Err(last());
    }
    Ok(())
}

/// MAC address and MTU of `ifname` in the calling thread's namespace, through a
/// throw-away datagram socket (for backends whose own sockets take no interface ioctls).
pub(crate) fn if_mac_mtu(ifname: &str) -> io::Result<([u8; 6], u32)> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let fd = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    Ok((if_mac(fd.as_raw_fd(), ifname)?, if_mtu(fd.as_raw_fd(), ifname)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An epoll watching an eventfd (token 7) nothing writes to.
    fn idle_epoll() -> (Epoll, EventFd) {
        let ep = Epoll::new().unwrap();
        let fd = EventFd::new().unwrap();
        ep.add(fd.fd(), 7).unwrap();
        (ep, fd)
    }

    /// The shortest of 20 idle waits of `timeout`.
    fn shortest_idle_wait(ep: &mut Epoll, timeout: Duration) -> Duration {
        let mut events = events::<4>();
        inc_test_support::shortest_idle_wait(timeout, |t| {
            ep.wait(Some(t), &mut events).unwrap() > 0
        })
    }

    #[test]
    fn wait_times_out_below_a_millisecond() {
        let (mut ep, _fd) = idle_epoll();
        // epoll_wait rounded 300 us up to 1 ms; on a loaded machine single waits may
        // still overshoot, the shortest of 20 may not.
        let shortest = shortest_idle_wait(&mut ep, Duration::from_micros(300));
        assert!(!ep.no_pwait2, "epoll_pwait2 is in every kernel since 5.11");
        assert!(shortest < Duration::from_millis(1), "shortest 300 us wait took {shortest:?}");
    }

    #[test]
    fn fallback_rounds_up_to_milliseconds() {
        let (mut ep, _fd) = idle_epoll();
        ep.no_pwait2 = true;
        let shortest = shortest_idle_wait(&mut ep, Duration::from_micros(300));
        assert!(shortest >= Duration::from_millis(1), "epoll_wait took {shortest:?}");
    }

    #[test]
    fn wait_reports_ready_fd() {
        let (mut ep, fd) = idle_epoll();
        let mut events = events::<4>();
        fd.wake();
        // Blocking without a timeout ends at once: the eventfd is readable.
        assert_eq!(ep.wait(None, &mut events).unwrap(), 1);
        assert_eq!(token(&events[0]), 7);
        fd.drain();
        assert_eq!(ep.wait(Some(Duration::ZERO), &mut events).unwrap(), 0);
    }
}
