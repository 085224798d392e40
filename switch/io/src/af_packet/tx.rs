//! The send path: a port's staged frames go out through `sendmmsg` from where they
//! are staged, and on ports with virtio-net headers runs of one connection's frames
//! go out as single UDP GSO frames.

use std::os::fd::AsRawFd;

use tracing::{debug, warn};

use super::gso::{gso_run_headers, gso_runs, VirtioNetHdr, UDP_PAYLOAD_AT, VNET_HDR_LEN};
use super::AfPacketBackend;

impl AfPacketBackend {
    /// Send the staged frames of `port` with sendmmsg. Returns the frames sent.
    ///
    /// On a port with virtio-net headers (towards a host, or a GSO link), consecutive
    /// frames of one connection (same addresses and ports, all but the last of the same
    /// size, IPv4 IDs counting up as their PSNs do) go out as one UDP GSO frame: one
    /// socket buffer through the kernel instead of one per frame. The kernel (or the
    /// host's UDP GRO socket) cuts it into the original datagrams, giving segment `i`
    /// the first one's IPv4 ID plus `i`: the ID each already carries, so every ICRC
    /// holds as stamped and the frames go out from where they are (queued frames from
    /// their connection's send queue) behind one copy of the first frame's headers.
    pub(super) fn send_port(&mut self, port: usize) -> usize {
        let sock = &self.socks[port];
        let (fd, vnet) = (sock.fd.as_raw_fd(), sock.vnet);
        let gso = vnet
            && !sock.gso_refused
            && ((sock.host_port && sock.whole_gso_frames) || sock.gso_link);
        let staged: Vec<(usize, usize)> =
            self.tx.port_frames(port).map(|(i, f)| (i, f.len())).collect();
        if staged.is_empty() {
            return 0;
        }
        let runs =
            if gso { gso_runs(&self.tx, &staged) } else { staged.iter().map(|_| 1).collect() };
        let mut hdrs: Vec<(VirtioNetHdr, [u8; UDP_PAYLOAD_AT])> = Vec::with_capacity(runs.len());
        let mut at = 0;
        for &count in &runs {
            let run = &staged[at..at + count];
            hdrs.push(if count > 1 {
                let payload = run.iter().map(|&(_, len)| len - UDP_PAYLOAD_AT).sum();
                gso_run_headers(self.tx.frame_at(run[0].0, run[0].1), payload)
            } else {
                (VirtioNetHdr::default(), [0; UDP_PAYLOAD_AT])
            });
            at += count;
        }
        // Per message: [virtio-net header], the first frame (a GSO run's with its own
        // headers), then the UDP payloads of the rest.
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(staged.len() + 2 * runs.len());
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
        let mut at = 0;
        for (&count, (vhdr, headers)) in runs.iter().zip(&hdrs) {
            let first_iov = iov.len();
            // The kernel only reads through iov_base (a send).
            if vnet {
                iov.push(libc::iovec {
                    iov_base: (vhdr as *const VirtioNetHdr) as *mut libc::c_void,
                    iov_len: VNET_HDR_LEN,
                });
            }
            let mut push = |b: &[u8]| {
                iov.push(libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
            };
            if count > 1 {
                push(headers);
            }
            for (k, &(i, len)) in staged[at..at + count].iter().enumerate() {
                let from = if k == 0 && count == 1 { 0 } else { UDP_PAYLOAD_AT };
                push(&self.tx.frame_at(i, len)[from..]);
            }
            spans.push((first_iov, iov.len() - first_iov));
            at += count;
        }
        let mut msgs: Vec<libc::mmsghdr> = spans
            .iter()
            .map(|&(first, n)| {
                // Safety: msghdr is plain old data; all-zero (no address, no control) is valid.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = iov[first..].as_mut_ptr();
                h.msg_iovlen = n;
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            })
            .collect();
        let mut sent = 0;
        let mut frames_sent = 0;
        while sent < msgs.len() {
            // Safety: msgs[sent..] are valid mmsghdrs whose iovecs point into `hdrs` and
            // the staged frames, which outlive the call; the socket is bound, so no
            // address is needed.
            let rc = unsafe {
                libc::sendmmsg(fd, msgs[sent..].as_mut_ptr(), (msgs.len() - sent) as u32, 0)
            };
            self.counters[port].tx_batches += 1;
            if rc <= 0 {
                let e = std::io::Error::last_os_error();
                if rc < 0 && e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // A kernel without UDP GSO in virtio-net headers (before Linux 6.2)
                // refuses the GSO frame: frame by frame from now on on this port, and
                // RC resends what is dropped here.
                let refused = matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP));
                if rc < 0 && runs[sent] > 1 && refused {
                    let s = &mut self.socks[port];
                    warn!(iface = %s.label, error = %e, "UDP GSO frames refused: sending frame by frame");
                    s.gso_refused = true;
                }
                let dropped: usize = runs[sent..].iter().sum();
                self.counters[port].tx_dropped += dropped as u64;
                debug!(iface = %self.socks[port].label, error = %e, dropped, "sendmmsg failed");
                break;
            }
            for m in sent..sent + rc as usize {
                let (first, n) = spans[m];
                let bytes: usize = iov[first..first + n].iter().map(|v| v.iov_len).sum();
                let vnet_len = if vnet { VNET_HDR_LEN } else { 0 };
                self.counters[port].tx_packets += runs[m] as u64;
                // Wire bytes: every segment carries the first frame's 42 header bytes.
                self.counters[port].tx_bytes +=
                    (bytes - vnet_len + (runs[m] - 1) * UDP_PAYLOAD_AT) as u64;
                frames_sent += runs[m];
            }
            sent += rc as usize;
        }
        frames_sent
    }
}
