//! The backend trait and the types every backend shares.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use inc_protocol::QueuedFrame;
use serde::Serialize;

/// Errors of packet I/O backends. Each names the interface (and namespace) at fault.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// A system call failed on an interface.
    #[error("{op} on interface {iface}: {source}")]
    Interface {
        /// What was attempted.
        op: &'static str,
        /// `netns/ifname` or `ifname`.
        iface: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A network namespace could not be entered.
    #[error("cannot enter network namespace `{netns}` ({path}): {source}")]
    Netns {
        /// Namespace name.
        netns: String,
        /// Path tried.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A system call failed that belongs to no single interface.
    #[error("{op}: {source}")]
    Sys {
        /// What was attempted.
        op: &'static str,
        /// Cause.
        source: std::io::Error,
    },
    /// Invalid configuration (bad port spec, bad ring geometry).
    #[error("{0}")]
    Config(String),
}

/// Where a port lives: an interface, optionally in another network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// Network namespace name (as in `ip netns`); `None` is the current namespace.
    pub netns: Option<String>,
    /// Interface name inside that namespace.
    pub ifname: String,
}

impl PortSpec {
    /// `netns/ifname` or `ifname`, for messages.
    pub fn label(&self) -> String {
        match &self.netns {
            Some(ns) => format!("{ns}/{}", self.ifname),
            None => self.ifname.clone(),
        }
    }
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl FromStr for PortSpec {
    type Err = IoError;

    /// Parses `ifname` or `netns/ifname`.
    fn from_str(s: &str) -> Result<Self, IoError> {
        let (netns, ifname) = match s.split_once('/') {
            Some((ns, ifn)) => (Some(ns.to_string()), ifn),
            None => (None, s),
        };
        let bad_ns = netns.as_deref().is_some_and(|ns| ns.is_empty() || ns.contains('/'));
        // IFNAMSIZ is 16 including the terminating NUL.
        if ifname.is_empty() || ifname.len() > 15 || ifname.contains('/') || bad_ns {
            return Err(IoError::Config(format!(
                "bad interface `{s}`: expected IFNAME or NETNS/IFNAME (IFNAME at most 15 bytes)"
            )));
        }
        Ok(PortSpec { netns, ifname: ifname.to_string() })
    }
}

/// A port as opened by a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortDesc {
    /// Where it lives.
    pub spec: PortSpec,
    /// MAC address of the interface (all zero if the backend has none).
    pub mac: [u8; 6],
    /// Interface MTU in bytes (IP packet size), if known.
    pub mtu: Option<u32>,
}

/// Per-port counters, cumulative since the backend was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PortCounters {
    /// Frames handed to the caller.
    pub rx_packets: u64,
    /// Bytes handed to the caller.
    pub rx_bytes: u64,
    /// Frames the kernel or the backend dropped before the caller saw them (ring full).
    pub rx_dropped: u64,
    /// Frames dropped because they did not fit a receive buffer (AF_PACKET: block size).
    pub rx_truncated: u64,
    /// UDP GSO frames received whole and split into the datagrams counted in
    /// `rx_packets`.
    pub rx_gso_frames: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames that could not be sent (send error, peer gone).
    pub tx_dropped: u64,
    /// Times the transmit batch was full and had to be flushed early.
    pub tx_batch_full: u64,
    /// Errors reported by the port (interface went down or away).
    pub link_errors: u64,
    /// Receive batches (blocks for AF_PACKET) processed.
    pub rx_batches: u64,
    /// Transmit system calls (or batch hand-offs).
    pub tx_batches: u64,
}

/// Something that can interrupt [`Backend::wait`] from another thread.
pub trait Wake: Send + Sync + fmt::Debug {
    /// Make the current or next `wait` return promptly.
    fn wake(&self);
}

/// Cloneable handle that interrupts [`Backend::wait`] from any thread (controller
/// session, stats server, signal handler thread).
#[derive(Debug, Clone)]
pub struct Waker(Arc<dyn Wake>);

impl Waker {
    /// Wrap a wake implementation.
    pub fn new(inner: Arc<dyn Wake>) -> Self {
        Waker(inner)
    }

    /// Interrupt the backend's wait.
    pub fn wake(&self) {
        self.0.wake();
    }
}

/// A batched packet I/O backend serving every port of a process.
///
/// Ports are numbered `0..ports().len()` in the order they were given to the backend.
/// A backend is driven by one thread; only its [`Waker`] crosses threads.
pub trait Backend: Send + fmt::Debug {
    /// Backend name as chosen on the command line.
    fn name(&self) -> &'static str;

    /// Opened ports, by port index.
    fn ports(&self) -> &[PortDesc];

    /// Hand up to about `budget` received frames to `sink(port, frame)`; frames are
    /// borrowed from the backend and released when `sink` returns. Never blocks.
    /// Returns the number of frames handed over.
    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError>;

    /// A free transmit buffer of at least [`Backend::max_frame_len`] bytes, or `None`
    /// when the transmit batch is full (call [`Backend::flush`]). The buffer is only
    /// used if [`Backend::commit_tx`] follows; otherwise the next call returns it again.
    fn tx_buffer(&mut self) -> Option<&mut [u8]>;

    /// Queue the first `len` bytes of the buffer last returned by
    /// [`Backend::tx_buffer`] for transmission on `port`.
    fn commit_tx(&mut self, port: usize, len: usize);

    /// Queue a connection's queued request `frame` for transmission on `port`. Like
    /// [`Backend::commit_tx`], only after [`Backend::tx_buffer`] returned a buffer. A
    /// backend that can send the bytes where they are keeps the frame until
    /// [`Backend::flush`] (AF_PACKET hands them to the kernel, in-process links to the
    /// other port) instead of copying it into that buffer, as the others do.
    fn commit_frame(&mut self, port: usize, frame: QueuedFrame) {
        commit_frame_by_copy(self, port, &frame);
    }

    /// Send every queued frame. Returns the number of frames sent.
    fn flush(&mut self) -> Result<usize, IoError>;

    /// Largest frame (Ethernet header to end, without FCS) a transmit buffer holds.
    fn max_frame_len(&self) -> usize;

    /// Block until a frame may be ready on any port, the [`Waker`] fired, or `timeout`
    /// passed (`None`: no timeout). Returns at once if frames are already waiting.
    /// Spurious returns are allowed.
    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError>;

    /// A handle that interrupts [`Backend::wait`].
    fn waker(&self) -> Waker;

    /// Counters of one port (panics if `port` is out of range).
    fn port_counters(&mut self, port: usize) -> PortCounters;

    /// How a port is driven when the backend has a choice (AF_XDP: `xdp=native` or
    /// `xdp=generic`), for the stats; `None` when there is nothing to report.
    fn port_detail(&self, _port: usize) -> Option<String> {
        None
    }

    /// The port faces an end host (a kernel IP stack behind the link), as the
    /// installed rules say: a backend that can may hand runs of frames for it to the
    /// kernel as one UDP GSO frame, which the host's kernel cuts into the datagrams
    /// again. Never called for ports towards switches, whose backends read raw frames.
    fn set_host_port(&mut self, _port: usize) {}

    /// A host may send runs of datagrams to this port as one UDP GSO frame, cut by
    /// nobody on the way: the backend splits it into the datagrams (counted in
    /// [`PortCounters::rx_gso_frames`]). Reported to the controller, which tells the
    /// hosts behind the port. False unless a backend knows better.
    fn takes_gso_frames(&self, _port: usize) -> bool {
        false
    }

    /// Every frame [`Backend::recv_batch`] hands over from `port` was built by this
    /// process and never left its memory (an in-process link, see
    /// [`InProcessLinks`](crate::in_process::InProcessLinks)), so its ICRC needs no
    /// check. False unless a backend knows better.
    fn rx_intact(&self, _port: usize) -> bool {
        false
    }

    /// Whether a received frame is waiting, found out cheaply (from memory shared with
    /// the kernel, or a zero-timeout `poll`), so the event loop can busy-poll before it
    /// sleeps in [`Backend::wait`]. `None`: this backend cannot tell cheaply (it is then
    /// never busy-polled).
    fn rx_ready(&self) -> Option<bool> {
        None
    }

    /// Link emulation settings and counters of one port, if it is emulated (see
    /// [`LinkEmuBackend`](crate::link_emu::LinkEmuBackend)).
    fn link_emu_stats(&self, _port: usize) -> Option<crate::link_emu::PortLinkEmuStats> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_spec_parses_both_forms() {
        let p: PortSpec = "veth0".parse().unwrap();
        assert_eq!(p, PortSpec { netns: None, ifname: "veth0".into() });
        let p: PortSpec = "inc-s1/p0".parse().unwrap();
        assert_eq!(p, PortSpec { netns: Some("inc-s1".into()), ifname: "p0".into() });
        assert_eq!(p.label(), "inc-s1/p0");
        for bad in ["", "ns/", "/if", "a/b/c", "averyveryverylongname"] {
            assert!(bad.parse::<PortSpec>().is_err(), "{bad}");
        }
    }
}

/// Fair receive order over a backend's ports: each `recv_batch` starts one port later
/// than the previous one, so a busy port cannot starve the others of the budget.
#[derive(Debug, Default)]
pub(crate) struct RxRotation {
    next: usize,
}

impl RxRotation {
    /// Calls `recv_port(port, remaining_budget)` (which returns the frames it delivered)
    /// on each of `n_ports` ports in rotated order until `budget` frames are delivered;
    /// returns the total.
    pub(crate) fn poll(
        &mut self,
        n_ports: usize,
        budget: usize,
        mut recv_port: impl FnMut(usize, usize) -> usize,
    ) -> usize {
        let mut total = 0;
        for k in 0..n_ports {
            if total >= budget {
                break;
            }
            total += recv_port((self.next + k) % n_ports, budget - total);
        }
        if n_ports > 0 {
            self.next = (self.next + 1) % n_ports;
        }
        total
    }
}

#[cfg(test)]
mod rx_rotation_tests {
    use super::RxRotation;

    #[test]
    fn starts_one_port_later_each_call_and_stops_at_the_budget() {
        let mut rot = RxRotation::default();
        let mut order = Vec::new();
        let got = rot.poll(3, 10, |p, left| {
            order.push((p, left));
            4
        });
        assert_eq!((got, order), (12, vec![(0, 10), (1, 6), (2, 2)]));
        let mut first = None;
        rot.poll(3, 1, |p, _| {
            first.get_or_insert(p);
            1
        });
        assert_eq!(first, Some(1));
        assert_eq!(rot.poll(0, 5, |_, _| unreachable!()), 0);
    }
}

/// [`Backend::commit_frame`] of a backend that copies: `frame` into the transmit
/// buffer, committed there.
pub(crate) fn commit_frame_by_copy<B: Backend + ?Sized>(
    backend: &mut B,
    port: usize,
    frame: &[u8],
) {
    let Some(buf) = backend.tx_buffer() else {
        debug_assert!(false, "commit_frame without a tx_buffer");
        return;
    };
    let len = frame.len().min(buf.len());
    buf[..len].copy_from_slice(&frame[..len]);
    backend.commit_tx(port, len);
}

/// The transmit half of the [`Backend`] batch API for backends that copy frames out
/// (AF_PACKET, pcap, AF_XDP, memory): `batch` buffers of `max_frame` bytes in one
/// area, handed out in order by [`TxStaging::buffer`], and the port and length of each
/// committed one. The backend's `flush` reads [`TxStaging::frames`] and hands them to
/// its kernel or driver call, then calls [`TxStaging::clear`]. A backend that sends
/// queued frames where they are ([`Backend::commit_frame`]) commits them with
/// [`TxStaging::commit_queued`]: they take a place in the batch, not their buffer.
#[derive(Debug)]
pub(crate) struct TxStaging {
    area: Vec<u8>,
    max_frame: usize,
    /// Committed frames: (port, len); buffer index = position.
    queue: Vec<(usize, usize)>,
    /// By buffer index: the frame committed as it is, if it was.
    queued: Vec<Option<QueuedFrame>>,
}

impl TxStaging {
    /// `batch` buffers of `max_frame` bytes each.
    pub(crate) fn new(batch: usize, max_frame: usize) -> Self {
        TxStaging {
            area: vec![0; batch * max_frame],
            max_frame,
            queue: Vec::with_capacity(batch),
            queued: Vec::with_capacity(batch),
        }
    }

    /// The next free buffer, or `None` when every buffer holds a committed frame.
    pub(crate) fn buffer(&mut self) -> Option<&mut [u8]> {
        let i = self.queue.len();
        self.area.get_mut(i * self.max_frame..(i + 1) * self.max_frame)
    }

    /// Commit the first `len` bytes (at most `max_frame`) of the buffer last handed
    /// out for `port`, one of `n_ports`. Returns true when this filled the batch (the
    /// backend counts that in `tx_batch_full` of `port`).
    pub(crate) fn commit(&mut self, port: usize, len: usize, n_ports: usize) -> bool {
        self.push(port, len.min(self.max_frame), None, n_ports)
    }

    /// Commit `frame` for `port` as it is, in the place of the buffer last handed out
    /// (which stays unused). Returns true when this filled the batch.
    pub(crate) fn commit_queued(
        &mut self,
        port: usize,
        frame: QueuedFrame,
        n_ports: usize,
    ) -> bool {
        let len = frame.len().min(self.max_frame);
        self.push(port, len, Some(frame), n_ports)
    }

    fn push(
        &mut self,
        port: usize,
        len: usize,
        frame: Option<QueuedFrame>,
        n_ports: usize,
    ) -> bool {
        assert!(self.queue.len() < self.capacity(), "commit_tx without a tx_buffer");
        assert!(port < n_ports, "commit_tx to port {port} of {n_ports}");
        self.queue.push((port, len));
        self.queued.push(frame);
        self.queue.len() == self.capacity()
    }

    /// Committed frames in commit order: (buffer index, port, frame).
    pub(crate) fn frames(&self) -> impl Iterator<Item = (usize, usize, &[u8])> + '_ {
        self.queue.iter().enumerate().map(|(i, &(port, len))| (i, port, self.frame(i, len)))
    }

    /// Committed frames of one `port`, in commit order: (buffer index, frame).
    pub(crate) fn port_frames(&self, port: usize) -> impl Iterator<Item = (usize, &[u8])> + '_ {
        self.frames().filter(move |f| f.1 == port).map(|(i, _, f)| (i, f))
    }

    fn frame(&self, i: usize, len: usize) -> &[u8] {
        match &self.queued[i] {
            Some(frame) => &frame[..len],
            None => &self.area[i * self.max_frame..i * self.max_frame + len],
        }
    }

    /// Committed frame `i` (buffer index) of `len` bytes, as [`TxStaging::port_frames`]
    /// reported it.
    pub(crate) fn frame_at(&self, i: usize, len: usize) -> &[u8] {
        self.frame(i, len)
    }

    /// Frames committed since the last [`TxStaging::clear`].
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when no frame is committed.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Forget the committed frames (after the flush sent or dropped them).
    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.queued.clear();
    }

    fn capacity(&self) -> usize {
        self.area.len().checked_div(self.max_frame).unwrap_or(0)
    }
}

#[cfg(test)]
mod tx_staging_tests {
    use super::TxStaging;

    #[test]
    fn hands_out_buffers_in_order_until_the_batch_is_full() {
        let mut st = TxStaging::new(3, 8);
        for (k, port) in [(0u8, 1usize), (1, 0), (2, 1)] {
            let buf = st.buffer().expect("free buffer");
            assert_eq!(buf.len(), 8);
            buf[..3].copy_from_slice(&[k; 3]);
            assert_eq!(st.commit(port, if k == 2 { 100 } else { 3 }, 2), k == 2);
        }
        assert!(st.buffer().is_none());
        assert_eq!(st.len(), 3);
        let all: Vec<(usize, usize, Vec<u8>)> =
            st.frames().map(|(i, p, f)| (i, p, f.to_vec())).collect();
        assert_eq!(
            all,
            vec![(0, 1, vec![0; 3]), (1, 0, vec![1; 3]), (2, 1, [vec![2; 3], vec![0; 5]].concat())],
            "lengths are capped at the buffer size"
        );
        let port1: Vec<usize> = st.port_frames(1).map(|(i, _)| i).collect();
        assert_eq!(port1, vec![0, 2]);
        st.clear();
        assert!(st.is_empty());
        assert!(st.buffer().is_some());
    }

    #[test]
    #[should_panic(expected = "commit_tx to port 2 of 2")]
    fn commit_to_a_port_out_of_range_panics() {
        TxStaging::new(1, 8).commit(2, 1, 2);
    }

    #[test]
    #[should_panic(expected = "commit_tx without a tx_buffer")]
    fn commit_past_the_batch_panics() {
        let mut st = TxStaging::new(1, 8);
        st.commit(0, 1, 1);
        st.commit(0, 1, 1);
    }
}
