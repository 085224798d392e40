//! System calls of the userspace transport: socket options and batched UDP I/O
//! (`sendmmsg`/`recvmmsg`). The only `unsafe` of the UDP transport lives here.

use std::io;
use std::mem;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, BorrowedFd};

/// Datagrams per system call.
pub(crate) const BATCH: usize = 64;

fn setsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // Safety: `fd` is a valid open socket for the borrow's lifetime; the option value
    // is a live c_int on the stack and its exact size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: an unconnected socket then sends DF set and IPv4
/// ID 0, the header bytes the engine's ICRC covers.
pub(crate) fn set_pmtudisc_do(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
}

/// Grow the socket buffers; `*BUFFORCE` (root) passes `rmem_max`, otherwise the plain
/// option is capped by the kernel limits.
pub(crate) fn set_buffers(fd: BorrowedFd<'_>, rcv: usize, snd: usize) {
    let rcv = rcv.min(i32::MAX as usize) as libc::c_int;
    let snd = snd.min(i32::MAX as usize) as libc::c_int;
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, rcv).is_err() {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, rcv).ok();
    }
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, snd).is_err() {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, snd).ok();
    }
}

fn to_sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

fn from_sockaddr(s: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)), u16::from_be(s.sin_port))
}

/// Send up to [`BATCH`] datagrams in one `sendmmsg`; returns how many were sent
/// (0 if the socket buffer is full).
pub(crate) fn send_batch(fd: BorrowedFd<'_>, pkts: &[(&[u8], SocketAddrV4)]) -> io::Result<usize> {
    let n = pkts.len().min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    // Safety: all-zero is a valid value for these plain C structs (null pointers,
    // zero lengths).
    let mut addrs: [libc::sockaddr_in; BATCH] = unsafe { mem::zeroed() };
    // Safety: as above.
    let mut iov: [libc::iovec; BATCH] = unsafe { mem::zeroed() };
    // Safety: as above.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { mem::zeroed() };
    for (i, (data, to)) in pkts[..n].iter().enumerate() {
        addrs[i] = to_sockaddr(*to);
        iov[i] = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        hdrs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_in).cast();
        hdrs[i].msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        hdrs[i].msg_hdr.msg_iov = &mut iov[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
    }
    // Safety: `hdrs[..n]` point into `addrs`/`iov` and the caller's slices, all alive
    // and unmoved for the duration of the call; the kernel only reads the payloads.
    let r = unsafe {
        libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT)
    };
    if r >= 0 {
        return Ok(r as usize);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(0)
    } else {
        Err(e)
    }
}

/// What one received datagram was.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvMeta {
    /// Datagram length (bytes written at the slot's offset).
    pub len: usize,
    /// Sender.
    pub from: SocketAddrV4,
    /// The datagram did not fit the slot and was cut.
    pub truncated: bool,
}

/// Receive up to [`BATCH`] datagrams without blocking into `slots`, a buffer of
/// `slot_len`-byte slots; datagram `i` lands at `slots[i * slot_len + offset..]`.
/// Returns how many arrived (0 if none is queued).
pub(crate) fn recv_batch(
    fd: BorrowedFd<'_>,
    slots: &mut [u8],
    slot_len: usize,
    offset: usize,
    meta: &mut [RecvMeta],
) -> io::Result<usize> {
    let n = (slots.len() / slot_len).min(BATCH).min(meta.len());
    assert!(offset < slot_len, "receive offset inside the slot");
    // Safety: all-zero is a valid value for these plain C structs.
    let mut addrs: [libc::sockaddr_in; BATCH] = unsafe { mem::zeroed() };
    // Safety: as above.
    let mut iov: [libc::iovec; BATCH] = unsafe { mem::zeroed() };
    // Safety: as above.
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { mem::zeroed() };
    let base = slots.as_mut_ptr();
    for i in 0..n {
        iov[i] = libc::iovec {
            // Safety: `i * slot_len + offset < n * slot_len <= slots.len()`, so the
            // pointer stays inside `slots`.
            iov_base: unsafe { base.add(i * slot_len + offset) }.cast(),
            iov_len: slot_len - offset,
        };
        hdrs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_in).cast();
        hdrs[i].msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        hdrs[i].msg_hdr.msg_iov = &mut iov[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
    }
    // Safety: every iovec covers a disjoint range of `slots`, which is exclusively
    // borrowed for the call; the address and header arrays outlive the call.
    let r = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
    }
    let got = r as usize;
    for i in 0..got {
        meta[i] = RecvMeta {
            len: hdrs[i].msg_len as usize,
            from: from_sockaddr(&addrs[i]),
            truncated: hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
        };
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn batch_round_trip_over_loopback() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_pmtudisc_do(tx.as_fd()).unwrap();
        set_buffers(rx.as_fd(), 1 << 20, 1 << 20);
        let to = match rx.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let pkts: Vec<(&[u8], SocketAddrV4)> = payloads.iter().map(|p| (&p[..], to)).collect();
        assert_eq!(send_batch(tx.as_fd(), &pkts).unwrap(), 10);
        let slot = 256;
        let mut slots = vec![0u8; slot * BATCH];
        let mut meta = [RecvMeta { len: 0, from: to, truncated: false }; BATCH];
        let mut got = 0;
        for _ in 0..100 {
            got += recv_batch(rx.as_fd(), &mut slots[got * slot..], slot, 42, &mut meta[got..])
                .unwrap();
            if got == 10 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(got, 10);
        for (i, m) in meta[..10].iter().enumerate() {
            assert_eq!(m.len, 100 + i);
            assert!(!m.truncated);
            assert_eq!(m.from.port(), tx.local_addr().unwrap().port());
            assert_eq!(&slots[i * slot + 42..i * slot + 42 + m.len], &payloads[i][..]);
        }
        // Nothing queued: no blocking, zero.
        assert_eq!(recv_batch(rx.as_fd(), &mut slots, slot, 42, &mut meta).unwrap(), 0);
    }
}
