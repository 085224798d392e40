//! [`LinkEmuBackend`]: link emulation as a middleware around any [`Backend`].

use std::time::{Duration, Instant};

use inc_protocol::{QueuedFrame, Time};
use serde::Serialize;

use super::{seed_for, Impairments, LinkEmu, LinkEmuCounters, PortLinkEmu, Verdict};
use crate::backend::{commit_frame_by_copy, Backend, IoError, PortCounters, PortDesc, Waker};

/// Settings and counters of one direction, for the stats endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkEmuStats {
    /// The impairments in spec form (`loss=1%,...`).
    pub spec: String,
    /// What happened so far.
    pub counters: LinkEmuCounters,
}

/// Link emulation counters of one port.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PortLinkEmuStats {
    /// Transmit direction.
    pub tx: Option<LinkEmuStats>,
    /// Receive direction.
    pub rx: Option<LinkEmuStats>,
}

#[derive(Debug, Default)]
struct Directions {
    tx: Option<LinkEmu>,
    rx: Option<LinkEmu>,
}

fn stats(l: &Option<LinkEmu>) -> Option<LinkEmuStats> {
    l.as_ref().map(|l| LinkEmuStats { spec: l.impairments().to_string(), counters: l.counters() })
}

/// A [`Backend`] that passes every frame of an emulated port through a [`LinkEmu`]:
/// on transmit (lost frames are never committed to the inner backend, held ones are
/// committed at their deadline) and on receive. Ports without emulation cost one
/// branch per frame. [`Backend::wait`] also wakes for the earliest held frame.
#[derive(Debug)]
pub struct LinkEmuBackend<B> {
    inner: B,
    ports: Vec<Directions>,
    active: bool,
    epoch: Instant,
    scratch: Vec<u8>,
}

impl<B: Backend> LinkEmuBackend<B> {
    /// Wrap `inner`; `config[i]` applies to port `i` (ports past the end: none). Each
    /// direction's RNG is seeded from its seed and the port's label, so runs repeat.
    pub fn new(inner: B, config: Vec<PortLinkEmu>) -> Result<Self, IoError> {
        let n = inner.ports().len();
        if config.len() > n {
            return Err(IoError::Config(format!(
                "link emulation given for {} ports but the backend has {n}",
                config.len()
            )));
        }
        let mut ports: Vec<Directions> = (0..n).map(|_| Directions::default()).collect();
        for (i, c) in config.into_iter().enumerate() {
            let label = inner.ports()[i].spec.label();
            let make = |imp: Option<Impairments>, dir: &str| {
                imp.filter(|imp| !imp.is_noop()).map(|imp| {
                    let seed = seed_for(imp.seed, &format!("{label}/{dir}"));
                    tracing::info!(port = %label, dir, spec = %imp, "link emulation");
                    LinkEmu::new(imp, seed)
                })
            };
            ports[i] = Directions { tx: make(c.tx, "tx"), rx: make(c.rx, "rx") };
        }
        let active = ports.iter().any(|d| d.tx.is_some() || d.rx.is_some());
        Ok(LinkEmuBackend {
            scratch: vec![0; inner.max_frame_len()],
            inner,
            ports,
            active,
            epoch: Instant::now(),
        })
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// True if some port is emulated.
    pub fn is_active(&self) -> bool {
        self.active
    }

    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn next_due(&self) -> Option<Time> {
        self.ports
            .iter()
            .flat_map(|d| [d.tx.as_ref(), d.rx.as_ref()])
            .flatten()
            .filter_map(LinkEmu::next_due)
            .min()
    }
}

impl<B: Backend> Backend for LinkEmuBackend<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn ports(&self) -> &[PortDesc] {
        self.inner.ports()
    }

    /// Intact below and no corruption emulated on any port: a frame between two
    /// in-process ports may have passed one port's transmit and the other's receive
    /// emulation, and this layer does not know which ports are paired.
    fn rx_intact(&self, port: usize) -> bool {
        let corrupts =
            |l: &Option<LinkEmu>| l.as_ref().is_some_and(|l| l.impairments().corrupt > 0.0);
        self.inner.rx_intact(port) && !self.ports.iter().any(|d| corrupts(&d.tx) || corrupts(&d.rx))
    }

    fn recv_batch(
        &mut self,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<usize, IoError> {
        if !self.active {
            return self.inner.recv_batch(budget, sink);
        }
        let now = self.now();
        let LinkEmuBackend { inner, ports, scratch, .. } = self;
        let mut n = 0;
        for (port, d) in ports.iter_mut().enumerate() {
            if let Some(rx) = d.rx.as_mut() {
                rx.pop_due(now, &mut |f| {
                    if n >= budget {
                        return false;
                    }
                    sink(port, f);
                    n += 1;
                    true
                });
            }
        }
        if n >= budget {
            return Ok(n);
        }
        inner.recv_batch(budget - n, &mut |port, frame| {
            match ports.get_mut(port).and_then(|d| d.rx.as_mut()) {
                None => {
                    sink(port, frame);
                    n += 1;
                }
                Some(rx) => {
                    // Received frames are borrowed read-only; corruption needs a copy.
                    scratch.clear();
                    scratch.extend_from_slice(frame);
                    if rx.offer(now, scratch) == Verdict::Send {
                        sink(port, scratch);
                        n += 1;
                    }
                }
            }
        })?;
        Ok(n)
    }

    fn tx_buffer(&mut self) -> Option<&mut [u8]> {
        self.inner.tx_buffer()
    }

    fn commit_tx(&mut self, port: usize, len: usize) {
        if !self.active {
            return self.inner.commit_tx(port, len);
        }
        let now = self.now();
        let LinkEmuBackend { inner, ports, .. } = self;
        let Some(tx) = ports.get_mut(port).and_then(|d| d.tx.as_mut()) else {
            return inner.commit_tx(port, len);
        };
        // The contract: until committed, tx_buffer returns the same buffer again.
        let Some(buf) = inner.tx_buffer() else { return inner.commit_tx(port, len) };
        let len = len.min(buf.len());
        if tx.offer(now, &mut buf[..len]) == Verdict::Send {
            inner.commit_tx(port, len);
        }
    }

    fn commit_frame(&mut self, port: usize, frame: QueuedFrame) {
        let emulated = self.active && self.ports.get(port).is_some_and(|d| d.tx.is_some());
        if !emulated {
            return self.inner.commit_frame(port, frame);
        }
        // The emulation may corrupt or hold the frame: it works on a copy.
        commit_frame_by_copy(self, port, &frame);
    }

    fn flush(&mut self) -> Result<usize, IoError> {
        if !self.active {
            return self.inner.flush();
        }
        let now = self.now();
        let LinkEmuBackend { inner, ports, .. } = self;
        let mut sent = 0;
        let mut error = None;
        for (port, d) in ports.iter_mut().enumerate() {
            let Some(tx) = d.tx.as_mut() else { continue };
            tx.pop_due(now, &mut |frame| {
                if inner.tx_buffer().is_none() {
                    match inner.flush() {
                        Ok(k) => sent += k,
                        Err(e) => {
                            error = Some(e);
                            return false;
                        }
                    }
                }
                let Some(buf) = inner.tx_buffer() else { return false };
                let len = frame.len().min(buf.len());
                buf[..len].copy_from_slice(&frame[..len]);
                inner.commit_tx(port, len);
                true
            });
            if let Some(e) = error {
                return Err(e);
            }
        }
        Ok(sent + inner.flush()?)
    }

    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }

    fn set_host_port(&mut self, port: usize) {
        self.inner.set_host_port(port);
    }

    fn takes_gso_frames(&self, port: usize) -> bool {
        self.inner.takes_gso_frames(port)
    }

    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), IoError> {
        let timeout = match self.next_due() {
            None => timeout,
            Some(due) => {
                let now = self.now();
                if due <= now {
                    return Ok(());
                }
                let left = due - now;
                Some(timeout.map_or(left, |t| t.min(left)))
            }
        };
        self.inner.wait(timeout)
    }

    fn waker(&self) -> Waker {
        self.inner.waker()
    }

    fn rx_ready(&self) -> Option<bool> {
        if self.next_due().is_some_and(|due| due <= self.now()) {
            return Some(true);
        }
        self.inner.rx_ready()
    }

    fn port_counters(&mut self, port: usize) -> PortCounters {
        self.inner.port_counters(port)
    }

    fn link_emu_stats(&self, port: usize) -> Option<PortLinkEmuStats> {
        let d = self.ports.get(port)?;
        if d.tx.is_none() && d.rx.is_none() {
            return None;
        }
        Some(PortLinkEmuStats { tx: stats(&d.tx), rx: stats(&d.rx) })
    }
}
