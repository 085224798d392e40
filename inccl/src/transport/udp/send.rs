//! The send path: engine frames go out as `sendmmsg` batches of their UDP payloads
//! (the kernel writes the headers the engine's ICRC covers), runs of equal-size frames
//! as one UDP GSO send each where they reach the switch as the datagrams their ICRCs
//! were stamped for ([`GsoPath`]). A datagram the local stack refuses is lost as on a
//! lossy link, and RC resends it.

use std::io::{self, IoSlice};
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::PollFlags;
use tracing::{debug, trace};

use super::socket::{RoceSocket, SLOT};
use super::sys::{self, BATCH};
use super::HEADERS;
use crate::iface::DataPlane;

impl RoceSocket {
    /// Send frames to `to` until `next` has none: `next` writes one complete Ethernet
    /// frame into the buffer it is given and returns its length. Up to 64 frames per
    /// `sendmmsg`, runs of equal-size frames as one UDP GSO send each when enabled
    /// (see [`RoceSocket::set_gso`]), waiting (bounded) while the socket buffer is
    /// full. Returns frames sent.
    pub fn send_frames(
        &mut self,
        to: SocketAddrV4,
        mut next: impl FnMut(&mut [u8]) -> Option<usize>,
    ) -> io::Result<usize> {
        let mut sent = 0;
        loop {
            let mut n = 0;
            let mut lens = [0usize; BATCH];
            while n < BATCH {
                match next(&mut self.tx[n * SLOT..(n + 1) * SLOT]) {
                    Some(len) if len > HEADERS && len <= SLOT => {
                        lens[n] = len;
                        n += 1;
                    }
                    Some(len) => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                            "frame of {len} bytes is not a RoCEv2 frame of at most {SLOT} bytes"
                        ),
                        ))
                    }
                    None => break,
                }
            }
            if n == 0 {
                return Ok(sent);
            }
            self.send_batch(to, &lens[..n])?;
            sent += n;
            if n < BATCH {
                return Ok(sent);
            }
        }
    }

    /// Send the `lens.len()` frames staged in `tx`.
    fn send_batch(&mut self, to: SocketAddrV4, lens: &[usize]) -> io::Result<()> {
        let n = lens.len();
        let mut runs = [(0usize, 0usize); BATCH];
        let mut gso = self.gso.then(|| gso_segment_size(lens)).flatten();
        let mut nruns = match gso {
            Some(size) => gso_runs(lens, size, &mut runs),
            None => plain_runs(n, &mut runs),
        };
        if gso.is_some() {
            self.stamp_gso_idents(lens, &runs[..nruns], true);
        }
        self.stats.tx_bytes += lens.iter().map(|l| (l - HEADERS) as u64).sum::<u64>();
        let mut done = 0;
        let mut lost = 0;
        let deadline = Instant::now() + SEND_BLOCKED_LIMIT;
        while done < nruns {
            let result = {
                let mut iovs = [IoSlice::new(&[]); BATCH];
                for (i, len) in lens.iter().enumerate() {
                    iovs[i] = IoSlice::new(&self.tx[i * SLOT + HEADERS..i * SLOT + len]);
                }
                let mut msgs: [&[IoSlice<'_>]; BATCH] = [&[]; BATCH];
                for (m, &(first, count)) in msgs.iter_mut().zip(&runs[done..nruns]) {
                    *m = &iovs[first..first + count];
                }
                let size = gso.map(|s| s as u16);
                sys::send_batch(self.sock.as_fd(), &msgs[..nruns - done], to, size)
            };
            match result {
                Ok(0) if Instant::now() < deadline => {
                    sys::wait(
                        &[self.sock.as_fd()],
                        PollFlags::POLLOUT,
                        Some(Duration::from_millis(10)),
                    )?;
                }
                // Full for too long: what is left is lost; RC resends it.
                Ok(0) => {
                    let frames: usize = runs[done..nruns].iter().map(|r| r.1).sum();
                    debug!(socket = %self.local, %to, frames, "send buffer full: dropped");
                    lost += frames;
                    done = nruns;
                }
                Ok(k) => done += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The kernel takes no GSO on this socket after all: un-stamp what is
                // left and send it (and everything after) one datagram at a time.
                Err(e) if gso.is_some() && refuses_gso(&e) => {
                    debug!(socket = %self.local, error = %e, "UDP GSO refused: sending datagrams one by one");
                    self.stamp_gso_idents(lens, &runs[done..nruns], false);
                    self.gso = false;
                    gso = None;
                    let first = runs[done].0;
                    nruns = plain_runs(n - first, &mut runs);
                    for r in &mut runs[..nruns] {
                        r.0 += first;
                    }
                    done = 0;
                }
                // `sendmmsg` reports an error only for its first message.
                Err(e) if is_local_drop(&e) => {
                    trace!(socket = %self.local, %to, error = %e, "datagram refused locally: lost");
                    lost += runs[done].1;
                    done += 1;
                }
                Err(e) => return Err(e),
            }
        }
        self.stats.tx_packets += (n - lost) as u64;
        self.stats.tx_dropped += lost as u64;
        Ok(())
    }

    /// Give frame `j` of every GSO run the IPv4 ID the kernel's segmentation gives it
    /// (`j`, counting from the run's ID 0; [`sys::tx_checksum_offload`] explains when
    /// the kernel segments), re-stamping its ICRC; `forward = false` undoes it.
    fn stamp_gso_idents(&mut self, lens: &[usize], runs: &[(usize, usize)], forward: bool) {
        for &(first, count) in runs {
            for j in 1..count {
                let i = first + j;
                let frame = &mut self.tx[i * SLOT..i * SLOT + lens[i]];
                inc_wire::gso::restamp_ident(frame, if forward { j as u16 } else { 0 });
            }
        }
    }

    /// Batch runs of equal-size frames into UDP GSO sends when `enabled` and the
    /// kernel cuts them into datagrams itself (see [`sys::tx_checksum_offload`]).
    pub(crate) fn set_gso(&mut self, enabled: bool) {
        self.gso = enabled;
    }
}

/// How long a send waits for room in a full socket buffer before the rest of its
/// batch counts as lost (long enough for a busy link, short enough to keep RC timers).
const SEND_BLOCKED_LIMIT: Duration = Duration::from_millis(100);

/// Send errors that mean "this datagram was dropped here", as a lossy link would:
/// a firewall (EPERM), no buffer or memory (ENOBUFS, ENOMEM), no route or neighbour
/// for now (EHOSTUNREACH, ENETUNREACH, ENETDOWN), a reported ICMP error (ECONNREFUSED).
fn is_local_drop(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EPERM
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ENETDOWN
                | libc::ECONNREFUSED
        )
    )
}

/// The GSO segment size of a batch (its largest UDP payload), if GSO can help: at
/// least two frames of that size.
fn gso_segment_size(lens: &[usize]) -> Option<usize> {
    let size = lens.iter().max()? - HEADERS;
    (lens.iter().filter(|&&l| l - HEADERS == size).count() >= 2).then_some(size)
}

/// Split a batch into GSO sends `(first frame, frames)` with segments of `size` bytes
/// (one size for the whole `sendmmsg`, as its control message is shared).
fn gso_runs(lens: &[usize], size: usize, runs: &mut [(usize, usize)]) -> usize {
    let mut nruns = 0;
    inc_wire::gso::runs(
        lens.len(),
        |i| lens[i] - HEADERS,
        |_| size,
        |_, _| true,
        |f, c| {
            runs[nruns] = (f, c);
            nruns += 1;
        },
    );
    nruns
}

/// One frame per send.
fn plain_runs(n: usize, runs: &mut [(usize, usize)]) -> usize {
    for (i, r) in runs[..n].iter_mut().enumerate() {
        *r = (i, 1);
    }
    n
}

/// Errors of a UDP GSO send that mean "not on this socket or route" (no checksum
/// offload path, no GSO support): fall back to one datagram per send.
fn refuses_gso(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
    )
}

/// How a run of frames may leave for the switch as one UDP GSO send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GsoPath {
    /// The interface has no transmit checksum offload, so this machine's kernel cuts
    /// a GSO send into datagrams before the driver, giving segment `i` IPv4 ID `i`
    /// (what `scripts/netns-up` and the container entrypoint set on hosts' veths).
    KernelCuts,
    /// A veth with the offload: a GSO send reaches the other end whole, and is usable
    /// only if the switch port splits it itself ([`HostEndpoint::switch_takes_gso`]).
    ///
    /// [`HostEndpoint::switch_takes_gso`]: inc_ctrl_proto::HostEndpoint::switch_takes_gso
    WholeOverVeth,
    /// Anything else (a NIC's segmentation is not ours to predict, or unknown): one
    /// datagram per send.
    None,
}

impl GsoPath {
    pub(super) fn of(dp: &DataPlane, sock: &UdpSocket) -> GsoPath {
        let name = dp.iface.clone().or_else(|| {
            crate::iface::interfaces()
                .ok()?
                .into_iter()
                .find(|(_, i)| i.ipv4.contains(&dp.ip))
                .map(|(name, _)| name)
        });
        let Some(name) = name else { return GsoPath::None };
        let path = match sys::tx_checksum_offload(sock.as_fd(), &name) {
            Some(false) => GsoPath::KernelCuts,
            Some(true) if sys::driver(sock.as_fd(), &name).as_deref() == Some("veth") => {
                GsoPath::WholeOverVeth
            }
            _ => GsoPath::None,
        };
        debug!(iface = %name, ?path, "UDP GSO path");
        path
    }

    /// Whether GSO sends reach a switch port that does (`takes_whole`) or does not
    /// split whole GSO frames as the datagrams their ICRCs were stamped for.
    pub(super) fn usable(self, switch_takes_whole: bool) -> bool {
        match self {
            GsoPath::KernelCuts => true,
            GsoPath::WholeOverVeth => switch_takes_whole,
            GsoPath::None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: usize = HEADERS + 12 + 4096 + 4;
    const ACK: usize = HEADERS + 12 + 4 + 4;

    fn runs_of(lens: &[usize]) -> Vec<(usize, usize)> {
        let mut runs = [(0, 0); BATCH];
        let size = gso_segment_size(lens).expect("two full frames");
        let n = gso_runs(lens, size, &mut runs);
        runs[..n].to_vec()
    }

    #[test]
    fn gso_sends_only_where_they_arrive_as_the_datagrams_stamped() {
        use GsoPath::*;
        for takes_whole in [false, true] {
            assert!(KernelCuts.usable(takes_whole), "this kernel cuts: any switch");
            assert!(!GsoPath::None.usable(takes_whole), "unknown path: never");
        }
        assert!(WholeOverVeth.usable(true));
        assert!(!WholeOverVeth.usable(false), "a whole frame to a switch that cannot split it");
    }

    #[test]
    fn gso_runs_keep_every_segment_but_the_last_full_and_within_64_kib() {
        // 20 data frames: 15 fit one send (61,680 bytes), the rest the next.
        assert_eq!(runs_of(&[DATA; 20]), [(0, 15), (15, 5)]);
        // A short frame ends a run; a full one after it starts the next.
        let mut lens = vec![DATA; 4];
        lens.insert(2, ACK);
        assert_eq!(runs_of(&lens), [(0, 3), (3, 2)]);
        // A short frame first stands alone.
        assert_eq!(runs_of(&[ACK, DATA, DATA]), [(0, 1), (1, 2)]);
        // Small equal frames: the segment-count limit.
        assert_eq!(runs_of(&[ACK; 64]), [(0, 64)]);
        // Nothing to batch.
        assert_eq!(gso_segment_size(&[DATA, ACK]), None);
    }
}
