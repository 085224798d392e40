//! System calls of the userspace transport: socket options, batched UDP I/O
//! (`sendmmsg`/`recvmmsg` through nix) and readiness waits (`ppoll`). `IP_MTU_DISCOVER` is the one option neither nix
//! nor socket2 covers; its `setsockopt` is the only `unsafe` of the UDP transport.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::socket::{
    recvmmsg, sendmmsg, setsockopt, sockopt, ControlMessage, MsgFlags, MultiHeaders, SockaddrIn,
};
use nix::sys::time::TimeSpec;

/// Datagrams per system call.
pub(crate) const BATCH: usize = 64;

/// `IP_MTU_DISCOVER = IP_PMTUDISC_DO`: an unconnected socket then sends DF set and IPv4
/// ID 0, the header bytes the engine's ICRC covers.
pub(crate) fn set_pmtudisc_do(fd: BorrowedFd<'_>) -> io::Result<()> {
    let v: libc::c_int = libc::IP_PMTUDISC_DO;
    // Safety: `fd` is a valid open socket for the borrow's lifetime; the option value
    // is a live c_int on the stack and its exact size is passed.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
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

/// Grow the socket buffers; `*BUFFORCE` (root) passes `rmem_max`, otherwise the plain
/// option is capped by the kernel limits.
pub(crate) fn set_buffers(fd: BorrowedFd<'_>, rcv: usize, snd: usize) {
    if setsockopt(&fd, sockopt::RcvBufForce, &rcv).is_err() {
        setsockopt(&fd, sockopt::RcvBuf, &rcv).ok();
    }
    if setsockopt(&fd, sockopt::SndBufForce, &snd).is_err() {
        setsockopt(&fd, sockopt::SndBuf, &snd).ok();
    }
}

/// Send up to [`BATCH`] datagrams in one `sendmmsg`; returns how many were sent
/// (0 if the socket buffer is full).
pub(crate) fn send_batch(fd: BorrowedFd<'_>, pkts: &[(&[u8], SocketAddrV4)]) -> io::Result<usize> {
    let n = pkts.len().min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iovs = [[IoSlice::new(&[])]; BATCH];
    let mut addrs = [None; BATCH];
    for (i, (data, to)) in pkts[..n].iter().enumerate() {
        iovs[i] = [IoSlice::new(data)];
        addrs[i] = Some(SockaddrIn::from(*to));
    }
    let mut hdrs = MultiHeaders::<SockaddrIn>::preallocate(n, None);
    let none: [ControlMessage<'_>; 0] = [];
    match sendmmsg(fd.as_raw_fd(), &mut hdrs, &iovs[..n], &addrs[..n], none, MsgFlags::MSG_DONTWAIT)
    {
        Ok(sent) => Ok(sent.count()),
        Err(Errno::EAGAIN) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Longest single wait. Callers re-check their deadlines after every wake-up, and the
/// bound keeps `tv_sec` in range of any `time_t`.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Wait up to `timeout` (`None`: until one is ready) for `events` on any of `fds`; true
/// if one is ready, false on timeout or a signal.
///
/// `ppoll` takes nanoseconds: `poll`'s whole milliseconds made every engine timer
/// shorter than 1 ms (ACK delay, tail probe) fire up to 1 ms late. A zero timeout
/// returns at once; callers fire the due timer right after, so they do not spin.
pub(crate) fn wait(
    fds: &[BorrowedFd<'_>],
    events: PollFlags,
    timeout: Option<Duration>,
) -> io::Result<bool> {
    let mut fds: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(*fd, events)).collect();
    let timeout = timeout.map(|t| TimeSpec::from_duration(t.min(MAX_WAIT)));
    match ppoll(&mut fds, timeout, None) {
        Ok(n) => Ok(n > 0),
        Err(Errno::EINTR) => Ok(false),
        Err(e) => Err(e.into()),
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
    let mut iovs: Vec<[IoSliceMut<'_>; 1]> = slots
        .chunks_exact_mut(slot_len)
        .take(n)
        .map(|slot| [IoSliceMut::new(&mut slot[offset..])])
        .collect();
    let mut hdrs = MultiHeaders::<SockaddrIn>::preallocate(n, None);
    let got = match recvmmsg(fd.as_raw_fd(), &mut hdrs, &mut iovs, MsgFlags::MSG_DONTWAIT, None) {
        Ok(msgs) => {
            let mut got = 0;
            for (m, out) in msgs.zip(meta.iter_mut()) {
                let from = m.address.map_or(SocketAddrV4::new([0, 0, 0, 0].into(), 0), |a| {
                    SocketAddrV4::new(a.ip(), a.port())
                });
                *out = RecvMeta {
                    len: m.bytes,
                    from,
                    truncated: m.flags.contains(MsgFlags::MSG_TRUNC),
                };
                got += 1;
            }
            got
        }
        Err(Errno::EAGAIN) => 0,
        Err(e) => return Err(e.into()),
    };
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

    /// The shortest of 20 waits of `timeout` on a socket nothing is sent to; each is
    /// checked to last at least `timeout`.
    fn shortest_idle_wait(timeout: Duration) -> Duration {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        (0..20)
            .map(|_| {
                let start = std::time::Instant::now();
                let ready = wait(&[rx.as_fd()], PollFlags::POLLIN, Some(timeout)).unwrap();
                let took = start.elapsed();
                assert!(!ready, "nothing was sent");
                assert!(took >= timeout, "woke after {took:?}, before the {timeout:?} timeout");
                took
            })
            .min()
            .unwrap()
    }

    #[test]
    fn wait_times_out_below_a_millisecond() {
        // poll() rounded 300 us up to 1 ms; on a loaded machine single waits may still
        // overshoot, the shortest of 20 may not.
        let shortest = shortest_idle_wait(Duration::from_micros(300));
        assert!(shortest < Duration::from_millis(1), "shortest 300 us wait took {shortest:?}");
    }

    #[test]
    fn wait_reports_readiness() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(!wait(&[rx.as_fd()], PollFlags::POLLIN, Some(Duration::ZERO)).unwrap());
        tx.send_to(b"x", rx.local_addr().unwrap()).unwrap();
        // Blocking without a timeout ends when the datagram is queued.
        assert!(wait(&[tx.as_fd(), rx.as_fd()], PollFlags::POLLIN, None).unwrap());
    }

    #[test]
    fn truncated_datagram_is_flagged() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = match rx.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let big = vec![7u8; 300];
        assert_eq!(send_batch(tx.as_fd(), &[(&big[..], to)]).unwrap(), 1);
        let mut slots = vec![0u8; 128];
        let mut meta = [RecvMeta { len: 0, from: to, truncated: false }; 1];
        let mut got = 0;
        for _ in 0..100 {
            got = recv_batch(rx.as_fd(), &mut slots, 128, 42, &mut meta).unwrap();
            if got == 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(got, 1);
        assert!(meta[0].truncated, "a 300-byte datagram in an 86-byte slot is cut");
    }
}
