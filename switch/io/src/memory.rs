//! In-process backend for tests: frames are injected and collected through a
//! [`MemoryNet`] handle instead of interfaces.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::{Backend, IoError, PortCounters, PortDesc, PortSpec, TxStaging, Wake, Waker};

/// Largest frame the memory backend carries (jumbo Ethernet).
pub const MEMORY_MAX_FRAME: usize = 9216;
/// Transmit buffers per batch.
const TX_BATCH: usize = 64;

#[derive(Debug, Default)]
struct Queues {
    /// Frames waiting for the backend: (port, frame).
    inbound: VecDeque<(usize, Vec<u8>)>,
    /// Frames the backend sent: (port, frame).
    outbound: VecDeque<(usize, Vec<u8>)>,
    /// Set by the waker, cleared by `wait`.
    woken: bool,
    /// Inbound frames refused because the queue was full.
    dropped: Vec<u64>,
}

#[derive(Debug)]
struct Shared {
    queues: Mutex<Queues>,
    /// Signalled when inbound frames arrive or the waker fires.
    to_backend: Condvar,
    /// Signalled when the backend sent frames.
    to_net: Condvar,
    capacity: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panicking test thread must not hide the frames from the others.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Wake for Shared {
    fn wake(&self) {
        self.lock().woken = true;
        self.to_backend.notify_all();
    }
}

/// The test side of a [`MemoryBackend`]: inject received frames, collect sent ones.
#[derive(Debug, Clone)]
pub struct MemoryNet {
    shared: Arc<Shared>,
}

impl MemoryNet {
    /// Deliver `frame` to the backend as received on `port`. Returns false (and counts
    /// a drop) if the inbound queue is full.
    pub fn inject(&self, port: usize, frame: &[u8]) -> bool {
        let mut q = self.shared.lock();
        if q.inbound.len() >= self.shared.capacity {
            if let Some(d) = q.dropped.get_mut(port) {
                *d += 1;
            }
            return false;
        }
        q.inbound.push_back((port, frame.to_vec()));
        drop(q);
        self.shared.to_backend.notify_all();
        true
    }

    /// Next frame the backend sent, waiting up to `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<(usize, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        let mut q = self.shared.lock();
        loop {
            if let Some(f) = q.outbound.pop_front() {
                return Some(f);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            q = self
                .shared
                .to_net
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Every frame sent so far, without waiting.
    pub fn drain(&self) -> Vec<(usize, Vec<u8>)> {
        self.shared.lock().outbound.drain(..).collect()
    }
}

/// In-process backend. Create with [`MemoryBackend::new`], which also returns the
/// [`MemoryNet`] handle that plays the network.
#[derive(Debug)]
pub struct MemoryBackend {
    shared: Arc<Shared>,
    ports: Vec<PortDesc>,
    counters: Vec<PortCounters>,
    /// Frames written and committed since the last flush.
    tx: TxStaging,
}

impl MemoryBackend {
    /// A backend with the given ports; `capacity` bounds the inbound queue (frames).
    /// Port MACs are `02:00:00:00:00:<index+1>`.
    pub fn new(ports: Vec<PortSpec>, capacity: usize) -> (Self, MemoryNet) {
        let n = ports.len();
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues { dropped: vec![0; n], ..Queues::default() }),
            to_backend: Condvar::new(),
            to_net: Condvar::new(),
            capacity,
        });
        let ports = ports
            .into_iter()
            .enumerate()
            .map(|(i, spec)| PortDesc { spec, mac: [2, 0, 0, 0, 0, i as u8 + 1], mtu: Some(9000) })
            .collect();
        let backend = MemoryBackend {
            shared: shared.clone(),
            ports,
            counters: vec![PortCounters::default(); n],
            tx: TxStaging::new(TX_BATCH, MEMORY_MAX_FRAME),
        };
        (backend, MemoryNet { shared })
    }
}

impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn ports(&self) -> &[PortDesc] {
        &self.ports
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        // Take the batch out of the lock so the sink may inject (loopback tests).
        let batch: Vec<(usize, Vec<u8>)> = {
            let mut q = self.shared.lock();
            let n = budget.min(q.inbound.len());
            q.inbound.drain(..n).collect()
        };
        if !batch.is_empty() {
            for c in &mut self.counters {
                c.rx_batches += 1;
            }
        }
        for (port, frame) in &batch {
            let Some(c) = self.counters.get_mut(*port) else { continue };
            c.rx_packets += 1;
            c.rx_bytes += frame.len() as u64;
            sink(*port, frame);
        }
        Ok(batch.len())
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        self.tx.buffer()
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        if self.tx.commit(port, len, self.ports.len()) {
            self.counters[port].tx_batch_full += 1;
        }
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        if self.tx.is_empty() {
            return Ok(0);
        }
        let n = self.tx.len();
        {
            let mut q = self.shared.lock();
            for (_, port, frame) in self.tx.frames() {
                q.outbound.push_back((port, frame.to_vec()));
                let c = &mut self.counters[port];
                c.tx_packets += 1;
                c.tx_bytes += frame.len() as u64;
                c.tx_batches += 1;
            }
        }
        self.tx.clear();
        self.shared.to_net.notify_all();
        Ok(n)
    }

    fn max_frame_len(&self) -> usize {
        MEMORY_MAX_FRAME
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.shared.lock();
        loop {
            if !q.inbound.is_empty() || q.woken {
                q.woken = false;
                return Ok(());
            }
            match deadline {
                None => q = self.shared.to_backend.wait(q).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(());
                    }
                    q = self
                        .shared
                        .to_backend
                        .wait_timeout(q, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    fn waker(&self) -> Waker {
        Waker::new(self.shared.clone())
    }

    fn rx_ready(&self) -> Option<bool> {
        Some(!self.shared.lock().inbound.is_empty())
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        let mut c = self.counters[port];
        c.rx_dropped = self.shared.lock().dropped[port];
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(n: usize) -> (MemoryBackend, MemoryNet) {
        let ports = (0..n).map(|i| format!("p{i}").parse().unwrap()).collect();
        MemoryBackend::new(ports, 4)
    }

    #[test]
    fn frames_cross_in_both_directions_with_counters() {
        let (mut b, net) = backend(2);
        assert!(net.inject(1, b"hello"));
        b.wait(Some(Duration::from_secs(1))).unwrap();
        let mut got = Vec::new();
        assert_eq!(b.recv_batch(16, &mut |p, f| got.push((p, f.to_vec()))).unwrap(), 1);
        assert_eq!(got, vec![(1, b"hello".to_vec())]);

        let buf = b.tx_buffer().unwrap();
        buf[..3].copy_from_slice(b"abc");
        b.commit_tx(0, 3);
        assert_eq!(b.flush().unwrap(), 1);
        assert_eq!(net.recv_timeout(Duration::from_secs(1)), Some((0, b"abc".to_vec())));
        assert_eq!(b.port_counters(1).rx_packets, 1);
        assert_eq!(b.port_counters(0).tx_bytes, 3);
    }

    #[test]
    fn full_inbound_queue_drops_and_counts() {
        let (mut b, net) = backend(1);
        for _ in 0..4 {
            assert!(net.inject(0, b"x"));
        }
        assert!(!net.inject(0, b"x"));
        assert_eq!(b.port_counters(0).rx_dropped, 1);
    }

    #[test]
    fn tx_batch_is_bounded() {
        let (mut b, _net) = backend(1);
        for _ in 0..TX_BATCH {
            assert!(b.tx_buffer().is_some());
            b.commit_tx(0, 1);
        }
        assert!(b.tx_buffer().is_none());
        assert_eq!(b.flush().unwrap(), TX_BATCH);
        assert!(b.tx_buffer().is_some());
    }

    #[test]
    fn waker_interrupts_wait_and_timeout_bounds_it() {
        let (mut b, _net) = backend(1);
        let t0 = Instant::now();
        b.wait(Some(Duration::from_millis(20))).unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(20));
        let w = b.waker();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w.wake();
        });
        let t0 = Instant::now();
        b.wait(None).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5));
        h.join().unwrap();
    }
}
