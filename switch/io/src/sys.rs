//! Thin, audited wrappers over the Linux system calls the backends need: epoll,
//! eventfd, network-namespace entry and interface queries.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use crate::backend::{IoError, Wake};

/// Last OS error as `io::Error`.
fn last() -> io::Error {
    io::Error::last_os_error()
}

/// An epoll instance watching fds for readability (level-triggered).
#[derive(Debug)]
pub(crate) struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub(crate) fn new() -> Result<Self, IoError> {
        // Safety: plain syscall; the returned fd is checked and owned below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(IoError::Sys { op: "epoll_create1", source: last() });
        }
        // Safety: `fd` is a fresh, valid descriptor that nothing else owns.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Watch `fd` for readability.
    pub(crate) fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
        // Safety: `ev` is a valid epoll_event for the duration of the call; both fds are open.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if rc < 0 {
            return Err(last());
        }
        Ok(())
    }

    /// Wait for readiness; `None` blocks indefinitely. Timeouts are rounded up to whole
    /// milliseconds so that a sub-millisecond deadline never turns into a busy loop.
    /// Ready events are written to `events`; returns how many.
    pub(crate) fn wait(
        &self,
        timeout: Option<Duration>,
        events: &mut [libc::epoll_event],
    ) -> io::Result<usize> {
        let ms: libc::c_int = match timeout {
            None => -1,
            Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int,
        };
        // Safety: `events` is a writable array of the length passed.
        let n = unsafe {
            libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, ms)
        };
        if n < 0 {
            let e = last();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize)
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
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> Result<Self, IoError> {
        // Safety: plain syscall; the returned fd is checked and owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(IoError::Sys { op: "eventfd", source: last() });
        }
        // Safety: `fd` is a fresh, valid descriptor that nothing else owns.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reset the counter so the fd stops being readable.
    pub(crate) fn drain(&self) {
        let mut v = 0u64;
        // Safety: reads 8 bytes into a live u64; EAGAIN (nothing pending) is fine.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl Wake for EventFd {
    fn wake(&self) {
        let v = 1u64;
        // Safety: writes 8 bytes from a live u64; a saturated counter (EAGAIN) still wakes.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&v as *const u64).cast(), 8) };
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
            let file = File::open(&path).map_err(|source| IoError::Netns {
                netns: ns.clone(),
                path: path.display().to_string(),
                source,
            })?;
            // Safety: `file` is an open namespace fd; CLONE_NEWNET only switches this
            // helper thread's network namespace.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc < 0 {
                return Err(IoError::Netns {
                    netns: ns,
                    path: path.display().to_string(),
                    source: last(),
                });
            }
            f()
        })
        .map_err(|source| IoError::Sys { op: "spawn netns helper thread", source })?;
    handle.join().map_err(|_| IoError::Config("netns helper thread panicked".into()))?
}

/// Interface index of `ifname` in the calling thread's namespace.
pub(crate) fn if_index(ifname: &str) -> io::Result<u32> {
    let c = CString::new(ifname).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // Safety: `c` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        return Err(last());
    }
    Ok(idx)
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
    // Safety: plain syscall; the fd is checked and owned below.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(last());
    }
    // Safety: `raw` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    Ok((if_mac(fd.as_raw_fd(), ifname)?, if_mtu(fd.as_raw_fd(), ifname)?))
}
