//! The in-memory fabric: nodes joined by point-to-point full-duplex links, one event
//! queue ordered by (simulated time, sequence number), and seeded per-frame faults.
//!
//! Nothing here reads a clock, spawns a thread or touches a socket: the same seed
//! always produces the same run, event for event.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Simulated time in nanoseconds since the start of the run.
pub type Nanos = u64;

/// One microsecond in [`Nanos`].
pub const MICROS: Nanos = 1_000;
/// One millisecond in [`Nanos`].
pub const MILLIS: Nanos = 1_000_000;
/// One second in [`Nanos`].
pub const SECONDS: Nanos = 1_000_000_000;

/// Largest frame a node may emit (jumbo frames included).
pub const MAX_FRAME: usize = 9216;

/// Offset of the InfiniBand BTH in an untagged Ethernet/IPv4(no options)/UDP frame.
const BTH_OFFSET: usize = 14 + 20 + 8;
/// The BTH byte (FECN, BECN, reserved) that the ICRC masks out: corrupting it would
/// be invisible to the receiver, so the fault injector never picks it.
const BTH_MASKED_BYTE: usize = BTH_OFFSET + 4;

/// A sans-IO endpoint the fabric drives: a switch with several ports, or a host machine.
pub trait Node {
    /// A frame arrived on `port`.
    fn handle_frame(&mut self, now: Nanos, port: usize, frame: &[u8]);
    /// A frame arrived on `port` over an in-memory link that emulates no corruption
    /// ([`LinkConfig::in_memory`]): its bytes are the sender's.
    fn handle_intact_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
        self.handle_frame(now, port, frame);
    }
    /// The deadline returned by [`Node::poll_timeout`] passed.
    fn handle_timeout(&mut self, now: Nanos);
    /// Next frame to send: writes it into `buf`, returns `(port, len)`.
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(usize, usize)>;
    /// Earliest time the node wants [`Node::handle_timeout`] to be called.
    fn poll_timeout(&self) -> Option<Nanos>;
    /// A monotonically increasing measure of useful work (delivered data, completed
    /// collectives); the driver fails a run whose total progress stops moving.
    fn progress(&self) -> u64 {
        0
    }
}

/// Faults injected independently on every frame crossing one direction of a link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// Probability that the frame is lost.
    pub drop: f64,
    /// Probability that the frame is delivered twice.
    pub duplicate: f64,
    /// Probability that the frame is held back by an extra delay (reordering it
    /// behind later frames).
    pub reorder: f64,
    /// Probability that one byte the ICRC protects is changed.
    pub corrupt: f64,
    /// Largest extra delay of a reordered or duplicated frame.
    pub reorder_max_delay: Nanos,
}

impl FaultConfig {
    /// A perfect link.
    pub const NONE: FaultConfig =
        FaultConfig { drop: 0.0, duplicate: 0.0, reorder: 0.0, corrupt: 0.0, reorder_max_delay: 0 };

    /// The same probability `p` of loss, duplication and reordering (no corruption).
    pub fn uniform(p: f64) -> FaultConfig {
        FaultConfig {
            drop: p,
            duplicate: p,
            reorder: p,
            corrupt: 0.0,
            reorder_max_delay: 20 * MICROS,
        }
    }

    /// True if no fault can ever be injected.
    pub fn is_lossless(&self) -> bool {
        self.drop == 0.0 && self.duplicate == 0.0 && self.reorder == 0.0 && self.corrupt == 0.0
    }
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig::NONE
    }
}

/// Physical properties and faults of a link (the same in both directions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// Propagation delay.
    pub latency: Nanos,
    /// Bits per second; frames are serialised one after another at this rate.
    pub bandwidth_bps: u64,
    /// Uniform random extra delay in `[0, jitter]` per frame. Jitter larger than a
    /// frame's serialisation time reorders frames.
    pub jitter: Nanos,
    /// Faults injected per frame.
    pub faults: FaultConfig,
    /// The link stands for one between two switches of one process, carried in memory
    /// (`inc_switch_io::in_process`): unless its faults corrupt, frames arrive through
    /// [`Node::handle_intact_frame`], as the switch's event loop hands them over.
    pub in_memory: bool,
}

impl Default for LinkConfig {
    /// 10 Gb/s, 2 µs, no jitter, no faults.
    fn default() -> Self {
        LinkConfig {
            latency: 2 * MICROS,
            bandwidth_bps: 10_000_000_000,
            jitter: 0,
            faults: FaultConfig::NONE,
            in_memory: false,
        }
    }
}

/// Counters of one direction of a link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames the sender put on the link.
    pub frames_sent: u64,
    /// Bytes the sender put on the link.
    pub bytes_sent: u64,
    /// Frames lost.
    pub dropped: u64,
    /// Extra copies created.
    pub duplicated: u64,
    /// Frames held back by an extra delay.
    pub reordered: u64,
    /// Copies delivered with a changed byte.
    pub corrupted: u64,
    /// Copies handed to the receiver.
    pub delivered: u64,
}

impl LinkStats {
    fn add(&mut self, o: &LinkStats) {
        self.frames_sent += o.frames_sent;
        self.bytes_sent += o.bytes_sent;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.reordered += o.reordered;
        self.corrupted += o.corrupted;
        self.delivered += o.delivered;
    }
}

/// Index of a node in the fabric.
pub type NodeId = usize;

/// One end of a link: a node and one of its ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The node.
    pub node: NodeId,
    /// Its port index.
    pub port: usize,
}

#[derive(Debug)]
struct Direction {
    to: Endpoint,
    busy_until: Nanos,
    stats: LinkStats,
}

#[derive(Debug)]
struct Link {
    config: LinkConfig,
    /// `dirs[0]` carries frames from `a` to `b`, `dirs[1]` from `b` to `a`.
    dirs: [Direction; 2],
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    time: Nanos,
    seq: u64,
    to: EndpointKey,
    corrupted: bool,
    /// Delivered through [`Node::handle_intact_frame`].
    intact: bool,
    frame: Vec<u8>,
}

/// `Endpoint` with a total order, kept out of the public type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointKey(NodeId, usize);

/// Bounds on a run, so that a protocol bug fails a test instead of hanging it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// Fail if total node progress does not move for this long (simulated).
    pub stall: Nanos,
    /// Fail if the run is not done by this simulated time.
    pub max_time: Nanos,
    /// Fail if a node's timer stays due after this many `handle_timeout` calls at the
    /// same instant (a timer that never re-arms into the future).
    pub max_timer_spins: u32,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits { stall: 10 * SECONDS, max_time: 3600 * SECONDS, max_timer_spins: 1000 }
    }
}

/// Why a run stopped before it was done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// No frame in flight and no timer armed, but the run is not done.
    #[error("deadlock at t={now}ns: no frame in flight and no timer armed")]
    Deadlock {
        /// Simulated time.
        now: Nanos,
    },
    /// Frames and timers keep firing but nothing completes.
    #[error("stalled at t={now}ns: no progress since t={last_progress}ns")]
    Stalled {
        /// Simulated time.
        now: Nanos,
        /// Time of the last progress.
        last_progress: Nanos,
    },
    /// The run exceeded [`RunLimits::max_time`].
    #[error("time limit reached at t={now}ns")]
    TimeLimit {
        /// Simulated time.
        now: Nanos,
    },
    /// A node's timer stays due after `handle_timeout`.
    #[error("node {node}: timer still due after {spins} handle_timeout calls at t={now}ns")]
    TimerSpin {
        /// The node.
        node: NodeId,
        /// Simulated time.
        now: Nanos,
        /// Calls made.
        spins: u32,
    },
    /// A node sent a frame on a port that has no link.
    #[error("node {node} sent a frame on port {port}, which has no link")]
    UnlinkedPort {
        /// The node.
        node: NodeId,
        /// The port.
        port: usize,
    },
    /// A node emitted a frame longer than [`MAX_FRAME`] or empty.
    #[error("node {node} emitted a frame of {len} bytes on port {port}")]
    BadFrameLength {
        /// The node.
        node: NodeId,
        /// The port.
        port: usize,
        /// Reported length.
        len: usize,
    },
}

/// The fabric: nodes, links, the event queue and the seeded fault generator.
#[derive(Debug)]
pub struct Fabric<N> {
    nodes: Vec<N>,
    links: Vec<Link>,
    ports: HashMap<Endpoint, (usize, usize)>,
    queue: BinaryHeap<Reverse<Event>>,
    rng: ChaCha8Rng,
    now: Nanos,
    seq: u64,
    events: u64,
    corrupted_delivered: u64,
    buf: Vec<u8>,
}

impl<N: Node> Fabric<N> {
    /// An empty fabric whose faults and jitter are drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Fabric {
            nodes: Vec::new(),
            links: Vec::new(),
            ports: HashMap::new(),
            queue: BinaryHeap::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: 0,
            seq: 0,
            events: 0,
            corrupted_delivered: 0,
            buf: vec![0; MAX_FRAME],
        }
    }

    /// Adds a node and returns its id.
    pub fn add_node(&mut self, node: N) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Connects two ports with a full-duplex link; returns the link index.
    ///
    /// # Panics
    /// If either port is already linked or a node does not exist (a harness bug).
    pub fn connect(&mut self, a: Endpoint, b: Endpoint, config: LinkConfig) -> usize {
        assert!(a.node < self.nodes.len() && b.node < self.nodes.len(), "unknown node");
        let id = self.links.len();
        for (end, dir) in [(a, 0), (b, 1)] {
            let prev = self.ports.insert(end, (id, dir));
            assert!(prev.is_none(), "node {} port {} linked twice", end.node, end.port);
        }
        let dir = |to| Direction { to, busy_until: 0, stats: LinkStats::default() };
        self.links.push(Link { config, dirs: [dir(b), dir(a)] });
        id
    }

    /// Changes the faults of a link (both directions) from now on.
    pub fn set_faults(&mut self, link: usize, faults: FaultConfig) {
        self.links[link].config.faults = faults;
    }

    /// Current simulated time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Events (frame deliveries and timeouts) processed so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The nodes, by id.
    pub fn nodes(&self) -> &[N] {
        &self.nodes
    }

    /// The nodes, mutably (to start work between runs).
    pub fn nodes_mut(&mut self) -> &mut [N] {
        &mut self.nodes
    }

    /// Number of links.
    pub fn link_count(&self) -> usize {
        self.links.len()
    }

    /// The two ends of a link (`a`, `b` as connected) and its configuration.
    pub fn link(&self, link: usize) -> (Endpoint, Endpoint, LinkConfig) {
        let l = &self.links[link];
        (l.dirs[1].to, l.dirs[0].to, l.config)
    }

    /// Counters of one link: `[a→b, b→a]`.
    pub fn link_stats(&self, link: usize) -> [LinkStats; 2] {
        [self.links[link].dirs[0].stats, self.links[link].dirs[1].stats]
    }

    /// Counters summed over all links and directions.
    pub fn total_stats(&self) -> LinkStats {
        let mut t = LinkStats::default();
        for l in &self.links {
            t.add(&l.dirs[0].stats);
            t.add(&l.dirs[1].stats);
        }
        t
    }

    /// Corrupted frames handed to a node so far (a corrupted frame still in flight when
    /// a run ends is not counted): every one must show up in some receiver's drop
    /// counters.
    pub fn corrupted_delivered(&self) -> u64 {
        self.corrupted_delivered
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Runs until `done(nodes)` holds, or fails on a deadlock, a stall or a limit.
    ///
    /// After every event the driver drains `poll_transmit` of every node, then advances
    /// time to the earlier of the next frame arrival and the earliest node timeout.
    pub fn run_until(
        &mut self,
        limits: &RunLimits,
        mut done: impl FnMut(&[N]) -> bool,
    ) -> Result<(), SimError> {
        let mut last_progress_value = self.total_progress();
        let mut last_progress_time = self.now;
        let mut spins: u32 = 0;
        let mut spin_at = (usize::MAX, Nanos::MAX);
        loop {
            self.drain_transmits()?;
            if done(&self.nodes) {
                return Ok(());
            }
            let progress = self.total_progress();
            if progress != last_progress_value {
                last_progress_value = progress;
                last_progress_time = self.now;
            } else if self.now.saturating_sub(last_progress_time) > limits.stall {
                return Err(SimError::Stalled { now: self.now, last_progress: last_progress_time });
            }
            if self.now > limits.max_time {
                return Err(SimError::TimeLimit { now: self.now });
            }
            let next_frame = self.queue.peek().map(|Reverse(e)| e.time);
            // Deterministic tie-break: the lowest node id with the earliest deadline.
            let next_timer = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| n.poll_timeout().map(|t| (t, i)))
                .min();
            match (next_frame, next_timer) {
                (None, None) => return Err(SimError::Deadlock { now: self.now }),
                (Some(tf), timer) if timer.is_none_or(|(tt, _)| tf <= tt) => {
                    let Reverse(ev) = self.queue.pop().expect("peeked");
                    self.now = self.now.max(ev.time);
                    self.events += 1;
                    let EndpointKey(node, port) = ev.to;
                    self.corrupted_delivered += u64::from(ev.corrupted);
                    if ev.intact {
                        self.nodes[node].handle_intact_frame(self.now, port, &ev.frame);
                    } else {
                        self.nodes[node].handle_frame(self.now, port, &ev.frame);
                    }
                }
                (_, Some((tt, node))) => {
                    self.now = self.now.max(tt);
                    self.events += 1;
                    if spin_at == (node, self.now) {
                        spins += 1;
                        if spins >= limits.max_timer_spins {
                            return Err(SimError::TimerSpin { node, now: self.now, spins });
                        }
                    } else {
                        spin_at = (node, self.now);
                        spins = 1;
                    }
                    self.nodes[node].handle_timeout(self.now);
                }
                (Some(_), None) => unreachable!("guard covers a frame without timers"),
            }
        }
    }

    fn total_progress(&self) -> u64 {
        self.nodes.iter().map(|n| n.progress()).sum()
    }

    /// Drains every node's transmit queue onto its links, repeating until no node has
    /// anything left (a node may only produce frames in response to being polled).
    fn drain_transmits(&mut self) -> Result<(), SimError> {
        let mut buf = std::mem::take(&mut self.buf);
        let result = (|| {
            for node in 0..self.nodes.len() {
                while let Some((port, len)) = self.nodes[node].poll_transmit(self.now, &mut buf) {
                    if len == 0 || len > buf.len() {
                        return Err(SimError::BadFrameLength { node, port, len });
                    }
                    self.send(Endpoint { node, port }, &buf[..len])?;
                }
            }
            Ok(())
        })();
        self.buf = buf;
        result
    }

    fn send(&mut self, from: Endpoint, frame: &[u8]) -> Result<(), SimError> {
        let &(link, dir) = self
            .ports
            .get(&from)
            .ok_or(SimError::UnlinkedPort { node: from.node, port: from.port })?;
        let now = self.now;
        let rng = &mut self.rng;
        let l = &mut self.links[link];
        let cfg = l.config;
        let d = &mut l.dirs[dir];
        d.stats.frames_sent += 1;
        d.stats.bytes_sent += frame.len() as u64;
        // Serialisation: frames leave one after another at the link rate.
        let ser = (frame.len() as u128 * 8 * 1_000_000_000 / u128::from(cfg.bandwidth_bps.max(1)))
            as Nanos;
        let depart = now.max(d.busy_until);
        d.busy_until = depart + ser;
        let base = d.busy_until + cfg.latency;
        let f = cfg.faults;
        let to = d.to;
        let mut arrivals: Vec<Nanos> = Vec::with_capacity(2);
        if rng.gen_bool(f.drop.clamp(0.0, 1.0)) {
            d.stats.dropped += 1;
        } else {
            arrivals.push(base);
        }
        if rng.gen_bool(f.duplicate.clamp(0.0, 1.0)) {
            d.stats.duplicated += 1;
            arrivals.push(base + rng.gen_range(0..=f.reorder_max_delay));
        }
        let mut copies = Vec::with_capacity(arrivals.len());
        for mut at in arrivals {
            if cfg.jitter > 0 {
                at += rng.gen_range(0..=cfg.jitter);
            }
            if rng.gen_bool(f.reorder.clamp(0.0, 1.0)) {
                d.stats.reordered += 1;
                at += rng.gen_range(1..=f.reorder_max_delay.max(1));
            }
            let mut copy = frame.to_vec();
            let corrupted = rng.gen_bool(f.corrupt.clamp(0.0, 1.0)) && corrupt(rng, &mut copy);
            d.stats.corrupted += u64::from(corrupted);
            d.stats.delivered += 1;
            copies.push((at, corrupted, copy));
        }
        let intact = cfg.in_memory && f.corrupt == 0.0;
        for (time, corrupted, frame) in copies {
            self.seq += 1;
            let to = EndpointKey(to.node, to.port);
            self.queue.push(Reverse(Event { time, seq: self.seq, to, corrupted, intact, frame }));
        }
        Ok(())
    }
}

/// Changes one ICRC-protected byte (BTH onwards, except the masked BTH byte) to a
/// different value. Returns false if the frame has no such byte.
fn corrupt(rng: &mut ChaCha8Rng, frame: &mut [u8]) -> bool {
    if frame.len() <= BTH_MASKED_BYTE + 1 {
        return false;
    }
    let mut at = rng.gen_range(BTH_OFFSET..frame.len() - 1);
    if at >= BTH_MASKED_BYTE {
        at += 1;
    }
    frame[at] ^= rng.gen_range(1..=255u8);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoes every frame back on the port it came in on.
    #[derive(Debug, Default)]
    struct Echo {
        out: Vec<(usize, Vec<u8>)>,
        received: u64,
        received_intact: u64,
    }

    impl Node for Echo {
        fn handle_frame(&mut self, _now: Nanos, port: usize, frame: &[u8]) {
            self.received += 1;
            self.out.push((port, frame.to_vec()));
        }
        fn handle_intact_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
            self.received_intact += 1;
            self.handle_frame(now, port, frame);
        }
        fn handle_timeout(&mut self, _now: Nanos) {}
        fn poll_transmit(&mut self, _now: Nanos, buf: &mut [u8]) -> Option<(usize, usize)> {
            if self.out.is_empty() {
                return None;
            }
            let (port, f) = self.out.remove(0);
            buf[..f.len()].copy_from_slice(&f);
            Some((port, f.len()))
        }
        fn poll_timeout(&self) -> Option<Nanos> {
            None
        }
        fn progress(&self) -> u64 {
            self.received
        }
    }

    /// Sends `total` numbered frames of `len` bytes, one every `gap` ns (timer driven),
    /// and records the numbers and arrival times of echoes.
    #[derive(Debug)]
    struct Pinger {
        total: u32,
        sent: u32,
        len: usize,
        gap: Nanos,
        next_send: Nanos,
        due: bool,
        echoes: Vec<(u32, Nanos, bool)>,
    }

    impl Pinger {
        fn new(total: u32, len: usize, gap: Nanos) -> Self {
            Pinger { total, sent: 0, len, gap, next_send: 0, due: true, echoes: Vec::new() }
        }
    }

    impl Node for Pinger {
        fn handle_frame(&mut self, now: Nanos, _port: usize, frame: &[u8]) {
            let n = u32::from_be_bytes(frame[BTH_OFFSET..BTH_OFFSET + 4].try_into().unwrap());
            let intact = frame[BTH_OFFSET + 4..].iter().all(|&b| b == 0xAB);
            self.echoes.push((n, now, intact));
        }
        fn handle_timeout(&mut self, now: Nanos) {
            if now >= self.next_send {
                self.due = true;
            }
        }
        fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(usize, usize)> {
            if !self.due || self.sent == self.total {
                return None;
            }
            self.due = false;
            buf[..self.len].fill(0xAB);
            buf[BTH_OFFSET..BTH_OFFSET + 4].copy_from_slice(&self.sent.to_be_bytes());
            self.sent += 1;
            self.next_send = now + self.gap;
            Some((0, self.len))
        }
        fn poll_timeout(&self) -> Option<Nanos> {
            (self.sent < self.total && !self.due).then_some(self.next_send)
        }
        fn progress(&self) -> u64 {
            self.echoes.len() as u64
        }
    }

    #[derive(Debug)]
    enum TestNode {
        Echo(Echo),
        Pinger(Pinger),
    }

    impl Node for TestNode {
        fn handle_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
            match self {
                TestNode::Echo(n) => n.handle_frame(now, port, frame),
                TestNode::Pinger(n) => n.handle_frame(now, port, frame),
            }
        }
        fn handle_intact_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
            match self {
                TestNode::Echo(n) => n.handle_intact_frame(now, port, frame),
                TestNode::Pinger(n) => n.handle_intact_frame(now, port, frame),
            }
        }
        fn handle_timeout(&mut self, now: Nanos) {
            match self {
                TestNode::Echo(n) => n.handle_timeout(now),
                TestNode::Pinger(n) => n.handle_timeout(now),
            }
        }
        fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(usize, usize)> {
            match self {
                TestNode::Echo(n) => n.poll_transmit(now, buf),
                TestNode::Pinger(n) => n.poll_transmit(now, buf),
            }
        }
        fn poll_timeout(&self) -> Option<Nanos> {
            match self {
                TestNode::Echo(n) => n.poll_timeout(),
                TestNode::Pinger(n) => n.poll_timeout(),
            }
        }
        fn progress(&self) -> u64 {
            match self {
                TestNode::Echo(n) => n.progress(),
                TestNode::Pinger(n) => n.progress(),
            }
        }
    }

    fn pinger(f: &Fabric<TestNode>) -> &Pinger {
        match &f.nodes()[0] {
            TestNode::Pinger(p) => p,
            TestNode::Echo(_) => unreachable!(),
        }
    }

    /// A pinger and an echo on one link; runs until `total` echoes or all traffic ends.
    fn ping_run(seed: u64, total: u32, gap: Nanos, cfg: LinkConfig) -> Fabric<TestNode> {
        let mut f = Fabric::new(seed);
        let p = f.add_node(TestNode::Pinger(Pinger::new(total, 100, gap)));
        let e = f.add_node(TestNode::Echo(Echo::default()));
        f.connect(Endpoint { node: p, port: 0 }, Endpoint { node: e, port: 0 }, cfg);
        let limits = RunLimits { stall: SECONDS, ..RunLimits::default() };
        let r = f.run_until(&limits, |n| match &n[0] {
            TestNode::Pinger(p) => p.echoes.len() as u32 >= total,
            TestNode::Echo(_) => unreachable!(),
        });
        if cfg.faults.is_lossless() {
            r.unwrap();
        }
        f
    }

    #[test]
    fn lossless_echo_keeps_order_and_timing() {
        let cfg = LinkConfig::default();
        let f = ping_run(1, 50, 10 * MICROS, cfg);
        let p = pinger(&f);
        assert_eq!(p.echoes.len(), 50);
        // 100 bytes at 10 Gb/s = 80 ns each way, plus 2 µs latency each way.
        let rtt = 2 * (80 + 2 * MICROS);
        for (i, &(n, at, intact)) in p.echoes.iter().enumerate() {
            assert_eq!(n, i as u32);
            assert!(intact);
            assert_eq!(at, i as u64 * 10 * MICROS + rtt);
        }
        assert_eq!(f.total_stats().dropped, 0);
        assert_eq!(f.total_stats().delivered, 100);
    }

    /// An in-memory link hands its frames over as intact unless it corrupts.
    #[test]
    fn in_memory_links_deliver_intact_frames_unless_they_corrupt() {
        let echo_intact = |cfg: LinkConfig| match &ping_run(3, 200, MICROS, cfg).nodes()[1] {
            TestNode::Echo(e) => (e.received, e.received_intact),
            TestNode::Pinger(_) => unreachable!(),
        };
        assert_eq!(echo_intact(LinkConfig::default()), (200, 0));
        let in_memory = LinkConfig { in_memory: true, ..LinkConfig::default() };
        assert_eq!(echo_intact(in_memory), (200, 200));
        let faults = FaultConfig { corrupt: 0.01, ..FaultConfig::NONE };
        let (received, intact) = echo_intact(LinkConfig { faults, ..in_memory });
        assert!(received > 0 && intact == 0, "{received} received, {intact} intact");
    }

    #[test]
    fn back_to_back_frames_are_serialised() {
        // All frames sent at t=0 (gap 0 means the timer is due immediately).
        let f = ping_run(1, 4, 0, LinkConfig::default());
        let times: Vec<Nanos> = pinger(&f).echoes.iter().map(|e| e.1).collect();
        // Sender side queues them 80 ns apart; the echo side keeps the spacing.
        assert_eq!(times, vec![4160, 4240, 4320, 4400]);
    }

    #[test]
    fn faults_are_injected_at_roughly_the_configured_rate() {
        let faults = FaultConfig { corrupt: 0.05, ..FaultConfig::uniform(0.05) };
        let cfg = LinkConfig { faults, ..LinkConfig::default() };
        let f = ping_run(7, 4000, MICROS, cfg);
        let s = f.link_stats(0)[0];
        assert_eq!(s.frames_sent, 4000);
        for (what, n) in [
            ("dropped", s.dropped),
            ("duplicated", s.duplicated),
            ("reordered", s.reordered),
            ("corrupted", s.corrupted),
        ] {
            assert!((120..=300).contains(&n), "{what} = {n}, expected ~200");
        }
        assert_eq!(s.delivered, s.frames_sent - s.dropped + s.duplicated);
        let p = pinger(&f);
        let corrupted = p.echoes.iter().filter(|e| !e.2).count();
        let injected = f.link_stats(0)[0].corrupted + f.link_stats(0)[1].corrupted;
        assert!(f.corrupted_delivered() <= injected && f.corrupted_delivered() + 5 >= injected);
        assert!(corrupted > 300, "corruption on both directions should show: {corrupted}");
        let out_of_order = p.echoes.windows(2).filter(|w| w[1].0 < w[0].0).count();
        assert!(out_of_order > 0);
    }

    #[test]
    fn same_seed_same_run_other_seed_other_run() {
        let cfg =
            LinkConfig { jitter: 300, faults: FaultConfig::uniform(0.1), ..Default::default() };
        let trace = |seed| pinger(&ping_run(seed, 500, 100, cfg)).echoes.clone();
        assert_eq!(trace(3), trace(3));
        assert_ne!(trace(3), trace(4));
    }

    #[test]
    fn lost_frames_end_in_a_deadlock_error() {
        let cfg = LinkConfig {
            faults: FaultConfig { drop: 1.0, ..FaultConfig::NONE },
            ..Default::default()
        };
        let mut f = Fabric::new(0);
        let p = f.add_node(TestNode::Pinger(Pinger::new(3, 100, MICROS)));
        let e = f.add_node(TestNode::Echo(Echo::default()));
        f.connect(Endpoint { node: p, port: 0 }, Endpoint { node: e, port: 0 }, cfg);
        let err = f.run_until(&RunLimits::default(), |_| false).unwrap_err();
        assert_eq!(err, SimError::Deadlock { now: 2 * MICROS });
    }

    #[test]
    fn a_node_that_never_progresses_is_reported_stalled() {
        #[derive(Debug)]
        struct Ticker(Nanos);
        impl Node for Ticker {
            fn handle_frame(&mut self, _: Nanos, _: usize, _: &[u8]) {}
            fn handle_timeout(&mut self, now: Nanos) {
                self.0 = now + MILLIS;
            }
            fn poll_transmit(&mut self, _: Nanos, _: &mut [u8]) -> Option<(usize, usize)> {
                None
            }
            fn poll_timeout(&self) -> Option<Nanos> {
                Some(self.0)
            }
        }
        let mut f = Fabric::new(0);
        f.add_node(Ticker(0));
        let limits = RunLimits { stall: SECONDS, ..RunLimits::default() };
        let err = f.run_until(&limits, |_| false).unwrap_err();
        assert!(matches!(err, SimError::Stalled { last_progress: 0, .. }), "{err:?}");
    }

    #[test]
    fn a_timer_that_stays_due_is_reported() {
        #[derive(Debug)]
        struct Stuck;
        impl Node for Stuck {
            fn handle_frame(&mut self, _: Nanos, _: usize, _: &[u8]) {}
            fn handle_timeout(&mut self, _: Nanos) {}
            fn poll_transmit(&mut self, _: Nanos, _: &mut [u8]) -> Option<(usize, usize)> {
                None
            }
            fn poll_timeout(&self) -> Option<Nanos> {
                Some(5)
            }
        }
        let mut f = Fabric::new(0);
        f.add_node(Stuck);
        let err = f.run_until(&RunLimits::default(), |_| false).unwrap_err();
        assert_eq!(err, SimError::TimerSpin { node: 0, now: 5, spins: 1000 });
    }

    #[test]
    fn sending_on_an_unlinked_port_is_an_error() {
        let mut f = Fabric::new(0);
        f.add_node(TestNode::Pinger(Pinger::new(1, 100, 0)));
        let err = f.run_until(&RunLimits::default(), |_| false).unwrap_err();
        assert_eq!(err, SimError::UnlinkedPort { node: 0, port: 0 });
    }

    #[test]
    fn corruption_never_touches_unprotected_bytes() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for _ in 0..2000 {
            let mut f = vec![0u8; 70];
            assert!(corrupt(&mut rng, &mut f));
            let at = f.iter().position(|&b| b != 0).unwrap();
            assert!(at >= BTH_OFFSET && at != BTH_MASKED_BYTE, "{at}");
            assert_eq!(f.iter().filter(|&&b| b != 0).count(), 1);
        }
    }
}
