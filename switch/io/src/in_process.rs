//! [`InProcessLinks`]: links whose two ends are ports of the same backend, carried in
//! memory instead of through the kernel.
//!
//! When one process serves both switches of a link (all switches in one process, the
//! default of `scripts/demo` and `inc-bench`), sending a frame out of one port only to
//! read it back from the other costs a system call, an skb, a copy into the receive
//! ring and a wake-up per frame, on the thread that is the emulator's bottleneck. The
//! middleware moves such frames from one port's transmit to the other port's receive
//! queue: a connection's queued request as it is ([`Backend::commit_frame`]), anything
//! else with one copy. Everything above it sees the same frames on the same ports in
//! the same order; what is lost is only the frames' passage over the interface
//! (`tcpdump` on the link sees none; `inc-switch --capture` still records them).

use std::collections::VecDeque;
use std::ops::Deref;
use std::time::Duration;

use inc_protocol::QueuedFrame;

use crate::backend::{Backend, IoError, PortCounters, PortDesc, Waker};

/// Most frames in flight on all in-process links together; more are dropped (and
/// counted as the receiving port's `rx_dropped`), as a full receive ring would.
const QUEUE_LIMIT: usize = 8192;

/// A frame on an in-process link.
#[derive(Debug)]
enum InFlight {
    /// Copied out of the transmit buffer (ACKs, ARP).
    Copied(Vec<u8>),
    /// A request, shared with its connection's send queue.
    Queued(QueuedFrame),
}

impl Deref for InFlight {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            InFlight::Copied(v) => v,
            InFlight::Queued(f) => f,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct LinkCounters {
    tx_packets: u64,
    tx_bytes: u64,
    rx_packets: u64,
    rx_bytes: u64,
    rx_dropped: u64,
}

/// A [`Backend`] whose in-process links (pairs of its own ports) carry frames in
/// memory; every other port is the inner backend's.
#[derive(Debug)]
pub struct InProcessLinks<B> {
    inner: B,
    /// `peer[p]`: the port at the other end of port `p`'s in-process link.
    peer: Vec<Option<usize>>,
    /// Frames on their way: (receiving port, frame).
    queue: VecDeque<(usize, InFlight)>,
    /// Buffers of delivered frames, reused.
    pool: Vec<Vec<u8>>,
    /// Frames committed to the queue since the last flush.
    unflushed: usize,
    counters: Vec<LinkCounters>,
}

impl<B: Backend> InProcessLinks<B> {
    /// Wrap `inner`; each pair in `links` names two of its ports (indices) joined by a
    /// link. A port may be in one pair only.
    pub fn new(inner: B, links: &[(usize, usize)]) -> Result<Self, IoError> {
        let n = inner.ports().len();
        let mut peer = vec![None; n];
        for &(a, b) in links {
            let label = |p: usize| inner.ports().get(p).map(|d| d.spec.label());
            if a == b || a >= n || b >= n || peer[a].is_some() || peer[b].is_some() {
                return Err(IoError::Config(format!(
                    "in-process link {a}-{b} ({:?} - {:?}): each end must be a different port \
                     of this backend ({n} ports), in no other link",
                    label(a),
                    label(b)
                )));
            }
            peer[a] = Some(b);
            peer[b] = Some(a);
            tracing::info!(a = ?label(a), b = ?label(b), "link carried in memory");
        }
        Ok(InProcessLinks {
            inner,
            peer,
            queue: VecDeque::new(),
            pool: Vec::new(),
            unflushed: 0,
            counters: vec![LinkCounters::default(); n],
        })
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B> InProcessLinks<B> {
    /// Counts a `len`-byte frame sent on `port` towards `to`; false (and a drop counted
    /// at `to`) when the links' queue is full.
    fn count_and_admit(&mut self, port: usize, to: usize, len: usize) -> bool {
        let c = &mut self.counters[port];
        c.tx_packets += 1;
        c.tx_bytes += len as u64;
        self.unflushed += 1;
        if self.queue.len() >= QUEUE_LIMIT {
            self.counters[to].rx_dropped += 1;
            return false;
        }
        true
    }
}

/// The port at the other end of `port`'s in-process link, if it has one.
fn peer_of(peer: &[Option<usize>], port: usize) -> Option<usize> {
    peer.get(port).copied().flatten()
}

impl<B: Backend> Backend for InProcessLinks<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn ports(&self) -> &[PortDesc] {
        self.inner.ports()
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        let mut n = 0;
        while n < budget {
            let Some((port, frame)) = self.queue.pop_front() else { break };
            let c = &mut self.counters[port];
            c.rx_packets += 1;
            c.rx_bytes += frame.len() as u64;
            sink(port, &frame);
            if let InFlight::Copied(buf) = frame {
                self.pool.push(buf);
            }
            n += 1;
        }
        if n >= budget {
            return Ok(n);
        }
        // The wire of an in-process link carries nothing of ours: what arrives there
        // (the kernel's IPv6 chatter, or anyone's injected frames) is dropped, so that
        // everything such a port delivers is intact (`rx_intact`).
        let InProcessLinks { inner, peer, counters, .. } = self;
        let mut foreign = 0;
        inner
            .recv_batch(budget - n, &mut |port, frame| {
                if peer_of(peer, port).is_some() {
                    counters[port].rx_dropped += 1;
                    foreign += 1;
                } else {
                    sink(port, frame);
                }
            })
            .map(|m| n + m - foreign)
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        self.inner.tx_buffer()
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        let Some(to) = peer_of(&self.peer, port) else {
            return self.inner.commit_tx(port, len);
        };
        // The contract: until committed, tx_buffer returns the same buffer again, so
        // the frame stays where the caller wrote it and the buffer is free for the next.
        let Some(len) = self.inner.tx_buffer().map(|buf| len.min(buf.len())) else { return };
        if !self.count_and_admit(port, to, len) {
            return;
        }
        let Some(buf) = self.inner.tx_buffer() else { return };
        let mut copy = self.pool.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(&buf[..len]);
        self.queue.push_back((to, InFlight::Copied(copy)));
    }

    fn commit_frame(&mut self, port: usize, frame: QueuedFrame) {
        let Some(to) = peer_of(&self.peer, port) else {
            return self.inner.commit_frame(port, frame);
        };
        if self.count_and_admit(port, to, frame.len()) {
            self.queue.push_back((to, InFlight::Queued(frame)));
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        let moved = std::mem::take(&mut self.unflushed);
        Ok(moved + self.inner.flush()?)
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        if !self.queue.is_empty() {
            return Ok(());
        }
        self.inner.wait(timeout)
    }

    fn waker(&self) -> Waker {
        self.inner.waker()
    }

    fn rx_ready(&self) -> Option<bool> {
        if self.queue.is_empty() {
            self.inner.rx_ready()
        } else {
            Some(true)
        }
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        let mut c = self.inner.port_counters(port);
        let l = self.counters[port];
        c.tx_packets += l.tx_packets;
        c.tx_bytes += l.tx_bytes;
        c.rx_packets += l.rx_packets;
        c.rx_bytes += l.rx_bytes;
        c.rx_dropped += l.rx_dropped;
        c
    }

    fn port_detail(&self, port: usize) -> Option<String> {
        let inner = self.inner.port_detail(port);
        let Some(peer) = self.peer[port] else { return inner };
        let link = format!("in-process link to {}", self.inner.ports()[peer].spec.label());
        Some(match inner {
            Some(d) => format!("{d}; {link}"),
            None => link,
        })
    }

    fn set_host_port(&mut self, port: usize) {
        self.inner.set_host_port(port);
    }

    fn takes_gso_frames(&self, port: usize) -> bool {
        peer_of(&self.peer, port).is_none() && self.inner.takes_gso_frames(port)
    }

    fn rx_intact(&self, port: usize) -> bool {
        peer_of(&self.peer, port).is_some()
    }

    fn link_emu_stats(&self, port: usize) -> Option<crate::link_emu::PortLinkEmuStats> {
        self.inner.link_emu_stats(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::PortSpec;

    fn backend(ports: usize) -> (InProcessLinks<MemoryBackend>, crate::memory::MemoryNet) {
        let specs: Vec<PortSpec> = (0..ports).map(|i| format!("p{i}").parse().unwrap()).collect();
        let (b, net) = MemoryBackend::new(specs, 64);
        (InProcessLinks::new(b, &[(1, 2)]).unwrap(), net)
    }

    fn send(b: &mut impl Backend, port: usize, frame: &[u8]) {
        let buf = b.tx_buffer().unwrap();
        buf[..frame.len()].copy_from_slice(frame);
        b.commit_tx(port, frame.len());
    }

    fn recv_all(b: &mut impl Backend) -> Vec<(usize, Vec<u8>)> {
        let mut got = Vec::new();
        b.recv_batch(usize::MAX, &mut |p, f| got.push((p, f.to_vec()))).unwrap();
        got
    }

    #[test]
    fn linked_ports_exchange_frames_in_order_and_others_use_the_wire() {
        let (mut b, net) = backend(3);
        send(&mut b, 1, b"one");
        send(&mut b, 0, b"wire");
        send(&mut b, 2, b"back");
        send(&mut b, 1, b"two");
        assert_eq!(b.flush().unwrap(), 4);
        assert_eq!(net.drain(), vec![(0, b"wire".to_vec())]);
        net.inject(0, b"from outside");
        assert_eq!(
            recv_all(&mut b),
            vec![
                (2, b"one".to_vec()),
                (1, b"back".to_vec()),
                (2, b"two".to_vec()),
                (0, b"from outside".to_vec())
            ]
        );
        let c1 = b.port_counters(1);
        assert_eq!((c1.tx_packets, c1.rx_packets, c1.tx_bytes), (2, 1, 6));
        assert!(b.port_detail(1).unwrap().contains("p2"));
        assert_eq!(b.port_detail(0), None);
    }

    /// Queued frames cross a link as they are (the receiving side reads the sender's
    /// bytes), interleaved in order with copied ones; towards the wire they are
    /// copied into the inner backend's buffers.
    #[test]
    fn queued_frames_cross_links_without_a_copy_and_reach_the_wire() {
        let (mut b, net) = backend(3);
        let queued = QueuedFrame::from(b"queued".to_vec());
        let at = queued.as_ptr();
        b.tx_buffer().unwrap();
        b.commit_frame(1, queued.clone());
        send(&mut b, 1, b"copied");
        b.tx_buffer().unwrap();
        b.commit_frame(0, QueuedFrame::from(b"to the wire".to_vec()));
        assert_eq!(b.flush().unwrap(), 3);
        assert_eq!(net.drain(), vec![(0, b"to the wire".to_vec())]);
        let mut got = Vec::new();
        b.recv_batch(usize::MAX, &mut |p, f| got.push((p, f.as_ptr() == at, f.to_vec()))).unwrap();
        assert_eq!(got, vec![(2, true, b"queued".to_vec()), (2, false, b"copied".to_vec())]);
        let c1 = b.port_counters(1);
        assert_eq!((c1.tx_packets, c1.tx_bytes), (2, 12));
    }

    /// Linked ports deliver only what the process sent them, so their frames are
    /// intact; what arrives on such a port's own wire is dropped and counted.
    #[test]
    fn linked_ports_are_intact_and_drop_what_their_wire_brings() {
        let (mut b, net) = backend(3);
        assert_eq!((0..3).map(|p| b.rx_intact(p)).collect::<Vec<_>>(), [false, true, true]);
        net.inject(1, b"injected");
        net.inject(0, b"host");
        send(&mut b, 2, b"ours");
        b.flush().unwrap();
        let mut got = Vec::new();
        assert_eq!(b.recv_batch(usize::MAX, &mut |p, f| got.push((p, f.to_vec()))).unwrap(), 2);
        assert_eq!(got, vec![(1, b"ours".to_vec()), (0, b"host".to_vec())]);
        // Received from the wire (inner counters) and from memory; the first dropped.
        let c1 = b.port_counters(1);
        assert_eq!((c1.rx_packets, c1.rx_dropped), (2, 1));
    }

    #[test]
    fn budget_leaves_the_rest_queued_and_wait_returns_at_once() {
        let (mut b, _net) = backend(3);
        for i in 0..5u8 {
            send(&mut b, 2, &[i]);
        }
        let mut got = Vec::new();
        assert_eq!(b.recv_batch(3, &mut |_, f| got.push(f[0])).unwrap(), 3);
        // Frames are queued: no blocking however long the timeout.
        b.wait(Some(Duration::from_secs(3600))).unwrap();
        b.recv_batch(10, &mut |_, f| got.push(f[0])).unwrap();
        assert_eq!(got, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn bad_pairs_are_refused_naming_the_ports() {
        let specs: Vec<PortSpec> = (0..3).map(|i| format!("p{i}").parse().unwrap()).collect();
        for links in [vec![(0, 0)], vec![(0, 3)], vec![(0, 1), (1, 2)]] {
            let (b, _) = MemoryBackend::new(specs.clone(), 4);
            let e = InProcessLinks::new(b, &links).unwrap_err();
            assert!(e.to_string().contains("in-process link"), "{e}");
        }
    }
}
