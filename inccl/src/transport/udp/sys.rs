//! System calls of the userspace transport: socket options, batched UDP I/O
//! (`sendmmsg`/`recvmmsg` through nix, UDP GSO) and readiness waits (`ppoll`).
//! `IP_MTU_DISCOVER` and the `ETHTOOL_GTXCSUM` ioctl are what neither nix nor socket2
//! covers; they are the only `unsafe` of the UDP transport.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem;
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::socket::{
    recvmmsg, sendmmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    MultiHeaders, SockaddrIn,
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

/// `UDP_GRO`: the kernel may hand a UDP GSO frame sent to this socket over whole, its
/// segment size in a control message, instead of cutting it into datagrams first. A
/// switch sends runs of frames to hosts that way; a receiver without this option would
/// get the datagrams, but not know each one's IPv4 ID, which the ICRC covers.
pub(crate) fn set_udp_gro(fd: BorrowedFd<'_>) -> io::Result<()> {
    setsockopt(&fd, sockopt::UdpGroSegment, &true).map_err(io::Error::from)
}

/// Send up to [`BATCH`] messages to `to` in one `sendmmsg`; returns how many were sent
/// (0 if the socket buffer is full). A message is the UDP payloads of one or more
/// frames; with `gso_size`, each message goes out as one GSO send that the kernel cuts
/// into datagrams of `gso_size` bytes (UDP_SEGMENT: all but the last exactly that
/// long), otherwise each message must be one datagram.
pub(crate) fn send_batch(
    fd: BorrowedFd<'_>,
    msgs: &[&[IoSlice<'_>]],
    to: SocketAddrV4,
    gso_size: Option<u16>,
) -> io::Result<usize> {
    let n = msgs.len().min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    let addrs = [Some(SockaddrIn::from(to)); BATCH];
    let gso = gso_size.as_ref().map(ControlMessage::UdpGsoSegments);
    let mut hdrs =
        MultiHeaders::<SockaddrIn>::preallocate(n, gso.is_some().then(|| nix::cmsg_space!(u16)));
    let result = sendmmsg(
        fd.as_raw_fd(),
        &mut hdrs,
        &msgs[..n],
        &addrs[..n],
        gso.as_slice(),
        MsgFlags::MSG_DONTWAIT,
    )
    .map(|sent| sent.count());
    match result {
        Ok(sent) => Ok(sent),
        Err(Errno::EAGAIN) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// `ETHTOOL_GTXCSUM`: whether `iface` computes transmit checksums itself (`None` if the
/// kernel does not say, e.g. no such interface). Without that offload the kernel also
/// cuts UDP GSO sends into datagrams itself, before the driver, the way
/// [`send_batch`]'s callers rely on (see `RoceSocket`).
pub(crate) fn tx_checksum_offload(fd: BorrowedFd<'_>, iface: &str) -> Option<bool> {
    /// `struct ethtool_value`.
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const ETHTOOL_GTXCSUM: u32 = 0x16;
    let mut value = EthtoolValue { cmd: ETHTOOL_GTXCSUM, data: 0 };
    // Safety: `value` is the `ethtool_value` that ETHTOOL_GTXCSUM reads and writes.
    unsafe { ethtool(fd, iface, &mut value) }.then_some(value.data != 0)
}

/// The driver of `iface` (`veth`, `mlx5_core`, ...), or `None` if the kernel does not
/// say.
pub(crate) fn driver(fd: BorrowedFd<'_>, iface: &str) -> Option<String> {
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
    // Safety: plain old data (integers and byte arrays); all zeroes is a valid value.
    let mut info: EthtoolDrvinfo = unsafe { mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // Safety: `info` is the `ethtool_drvinfo` that ETHTOOL_GDRVINFO fills.
    if !unsafe { ethtool(fd, iface, &mut info) } {
        return None;
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(info.driver.len());
    Some(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// `SIOCETHTOOL` on `iface` with `data` (whose first field is the command); false if
/// the name does not fit or the kernel refuses.
///
/// # Safety
/// `T` must be the structure the command in its first field reads and writes.
unsafe fn ethtool<T>(fd: BorrowedFd<'_>, iface: &str, data: &mut T) -> bool {
    let name = iface.as_bytes();
    // Safety: `ifreq` is plain old data (byte arrays, integers and a pointer union);
    // all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { mem::zeroed() };
    if name.is_empty() || name.len() >= ifr.ifr_name.len() {
        return false;
    }
    for (d, b) in ifr.ifr_name.iter_mut().zip(name) {
        *d = *b as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (data as *mut T).cast();
    // Safety: `fd` is an open socket for the borrow's lifetime; `ifr` is a live,
    // NUL-terminated `ifreq` whose data pointer points at `data`, which outlives the
    // call and is what the command expects (the caller's contract).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
    r == 0
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
    /// UDP GRO: the datagram is several the sender sent as one GSO frame, each this
    /// many bytes but the last (`None`: one datagram).
    pub segment: Option<usize>,
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
    let mut hdrs = MultiHeaders::<SockaddrIn>::preallocate(n, Some(nix::cmsg_space!(libc::c_int)));
    let got = match recvmmsg(fd.as_raw_fd(), &mut hdrs, &mut iovs, MsgFlags::MSG_DONTWAIT, None) {
        Ok(msgs) => {
            let mut got = 0;
            for (m, out) in msgs.zip(meta.iter_mut()) {
                let from = m.address.map_or(SocketAddrV4::new([0, 0, 0, 0].into(), 0), |a| {
                    SocketAddrV4::new(a.ip(), a.port())
                });
                let segment = m.cmsgs().ok().into_iter().flatten().find_map(|c| match c {
                    ControlMessageOwned::UdpGroSegments(size) => usize::try_from(size).ok(),
                    _ => None,
                });
                *out = RecvMeta {
                    len: m.bytes,
                    from,
                    truncated: m.flags.contains(MsgFlags::MSG_TRUNC),
                    segment: segment.filter(|&s| s > 0 && s < m.bytes),
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
        let iovs: Vec<[IoSlice<'_>; 1]> = payloads.iter().map(|p| [IoSlice::new(p)]).collect();
        let msgs: Vec<&[IoSlice<'_>]> = iovs.iter().map(|m| &m[..]).collect();
        assert_eq!(send_batch(tx.as_fd(), &msgs, to, None).unwrap(), 10);
        let slot = 256;
        let mut slots = vec![0u8; slot * BATCH];
        let mut meta = [RecvMeta { len: 0, from: to, truncated: false, segment: None }; BATCH];
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

    /// Receive `want` datagrams (bounded wait); their lengths and contents.
    fn recv_n(rx: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
        let slot = 512;
        let mut slots = vec![0u8; slot * BATCH];
        let mut meta = [RecvMeta {
            len: 0,
            from: SocketAddrV4::new([0; 4].into(), 0),
            truncated: false,
            segment: None,
        }; BATCH];
        let mut got = Vec::new();
        for _ in 0..100 {
            let n = recv_batch(rx.as_fd(), &mut slots, slot, 0, &mut meta).unwrap();
            got.extend(
                meta[..n]
                    .iter()
                    .enumerate()
                    .map(|(i, m)| slots[i * slot..i * slot + m.len].to_vec()),
            );
            if got.len() >= want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        got
    }

    #[test]
    fn gso_messages_arrive_as_one_datagram_per_segment() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        set_pmtudisc_do(tx.as_fd()).unwrap();
        let to = match rx.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        // Message 1: three full segments and a short last one, from four slices;
        // message 2: one short datagram (not cut).
        let segs: Vec<Vec<u8>> =
            [100, 100, 100, 40, 20].iter().enumerate().map(|(i, &n)| vec![i as u8; n]).collect();
        let first: Vec<IoSlice<'_>> = segs[..4].iter().map(|s| IoSlice::new(s)).collect();
        let second = [IoSlice::new(&segs[4])];
        assert_eq!(send_batch(tx.as_fd(), &[&first, &second], to, Some(100)).unwrap(), 2);
        let got = recv_n(&rx, 5);
        assert_eq!(got, segs, "one datagram per segment, in order, nothing merged");
    }

    #[test]
    fn tx_checksum_offload_is_reported_for_loopback_only_if_it_exists() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(
            tx_checksum_offload(sock.as_fd(), "lo").is_some(),
            "loopback answers ETHTOOL_GTXCSUM"
        );
        assert_eq!(tx_checksum_offload(sock.as_fd(), "no-such-if0"), None);
        assert_eq!(tx_checksum_offload(sock.as_fd(), ""), None);
        assert_eq!(tx_checksum_offload(sock.as_fd(), "an-interface-name-too-long"), None);
    }

    #[test]
    fn driver_of_an_interface_that_does_not_exist_is_unknown() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(driver(sock.as_fd(), "no-such-if0"), None);
        assert_eq!(driver(sock.as_fd(), ""), None);
    }

    /// The shortest of 20 waits of `timeout` on a socket nothing is sent to.
    fn shortest_idle_wait(timeout: Duration) -> Duration {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        inc_test_support::shortest_idle_wait(timeout, |t| {
            wait(&[rx.as_fd()], PollFlags::POLLIN, Some(t)).unwrap()
        })
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
        assert_eq!(send_batch(tx.as_fd(), &[&[IoSlice::new(&big)]], to, None).unwrap(), 1);
        let mut slots = vec![0u8; 128];
        let mut meta = [RecvMeta { len: 0, from: to, truncated: false, segment: None }; 1];
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
