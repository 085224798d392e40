//! The network model: one direction of a link (serialisation at a rate, propagation
//! delay, a finite drop-tail output queue, the link emulation of the topology YAML),
//! the frame pool and the event queue.
//!
//! Nothing here allocates per frame once warmed up: frames live in a pool of
//! fixed-size buffers that are recycled, events are three `u64`s in a binary heap.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use inc_link_spec::Impairments;
use serde::Serialize;

/// Simulated time in nanoseconds.
pub type Nanos = u64;

/// Largest frame a node may emit (the engines need `mtu + 70` bytes; jumbo frames).
pub const MAX_FRAME: usize = 9216;

/// SplitMix64, seeded per link direction: the emulator's generator (`inc_switch_io`),
/// so a spec means the same thing in both.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`; draws nothing when `p` is 0.
    #[inline]
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in `0..n` (`n > 0`).
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Counters of one link direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DirStats {
    /// Frames offered by the sender.
    pub frames: u64,
    /// Bytes offered by the sender.
    pub bytes: u64,
    /// Frames put on the wire (serialised).
    pub wire_frames: u64,
    /// Bytes put on the wire.
    pub wire_bytes: u64,
    /// Time the serialiser was busy.
    pub busy_ns: u64,
    /// Frames dropped because the output queue was full.
    pub queue_drops: u64,
    /// Frames lost by the link emulation (random or burst loss).
    pub lost: u64,
    /// Duplicates created.
    pub duplicated: u64,
    /// Frames held back (reordered).
    pub reordered: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Most frames queued at once (waiting or being serialised).
    pub max_queue: u64,
}

/// Emulated impairments of one direction beyond rate and delay.
#[derive(Debug, Clone)]
struct Faults {
    loss: f64,
    duplicate: f64,
    reorder: f64,
    reorder_delay: Nanos,
    corrupt: f64,
    jitter: Nanos,
    /// Gilbert–Elliott: per-frame probabilities to enter / leave the bad state.
    enter_bad: f64,
    leave_bad: f64,
    bursty: bool,
    bad: bool,
}

impl Faults {
    fn new(imp: &Impairments) -> Option<Faults> {
        let jitter = imp.jitter.as_nanos() as Nanos;
        let any = imp.loss > 0.0
            || imp.duplicate > 0.0
            || imp.reorder > 0.0
            || imp.corrupt > 0.0
            || jitter > 0;
        if !any {
            return None;
        }
        let (enter_bad, leave_bad, bursty) = match imp.burst {
            Some(b) if imp.loss > 0.0 => {
                let leave = 1.0 / b;
                ((imp.loss * leave / (1.0 - imp.loss)).min(1.0), leave, true)
            }
            _ => (0.0, 1.0, false),
        };
        Some(Faults {
            loss: imp.loss,
            duplicate: imp.duplicate,
            reorder: imp.reorder,
            reorder_delay: imp.reorder_delay.as_nanos() as Nanos,
            corrupt: imp.corrupt,
            jitter,
            enter_bad,
            leave_bad,
            bursty,
            bad: false,
        })
    }

    fn lose(&mut self, rng: &mut Rng) -> bool {
        if self.bursty {
            if self.bad {
                self.bad = !rng.chance(self.leave_bad);
            } else if rng.chance(self.enter_bad) {
                self.bad = true;
            }
            self.bad
        } else {
            rng.chance(self.loss)
        }
    }
}

/// Static properties of one link direction.
#[derive(Debug, Clone)]
pub struct DirConfig {
    /// Human name, e.g. `leaf1:up -> root:d1` or `h0 -> leaf1:h0`.
    pub name: String,
    /// Receiving node.
    pub to_node: u32,
    /// Receiving port.
    pub to_port: u32,
    /// Bits per second.
    pub rate_bps: u64,
    /// Propagation delay.
    pub delay: Nanos,
    /// Output queue size in frames (waiting or being serialised).
    pub queue_frames: usize,
    /// Extra bytes per frame on the wire (preamble, inter-frame gap, FCS): 0 counts
    /// frame bytes only, as the emulator's rate limiter does.
    pub wire_overhead: u32,
    /// Link emulation (loss, bursts, duplication, reordering, corruption, jitter).
    pub impairments: Option<Impairments>,
    /// Seed of this direction's fault generator.
    pub seed: u64,
    /// Frames may be handed to the receiver as intact (switch-to-switch links of one
    /// process, no corruption): the switch then skips the ICRC check, as in the
    /// emulator's in-process links.
    pub intact: bool,
}

/// What [`Dir::offer`] decided for a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Lost or dropped: the frame's buffer may be reused.
    Dropped,
    /// Delivered at the given time; with `Some(t)` a duplicate as well at `t`.
    Deliver(Nanos, Option<Nanos>),
}

/// One direction of a link.
#[derive(Debug)]
pub struct Dir {
    /// Configuration.
    pub cfg: DirConfig,
    /// Counters.
    pub stats: DirStats,
    faults: Option<Faults>,
    rng: Rng,
    busy_until: Nanos,
    /// End of serialisation of every frame still queued, oldest first.
    queue: VecDeque<Nanos>,
    last_due: Nanos,
}

impl Dir {
    /// A direction as configured.
    pub fn new(cfg: DirConfig) -> Dir {
        let faults = cfg.impairments.as_ref().and_then(Faults::new);
        let rng = Rng(cfg.seed);
        Dir {
            cfg,
            stats: DirStats::default(),
            faults,
            rng,
            busy_until: 0,
            queue: VecDeque::new(),
            last_due: 0,
        }
    }

    /// When the serialiser is free for the next frame.
    #[inline]
    pub fn busy_until(&self) -> Nanos {
        self.busy_until
    }

    /// Frames queued at `now` (waiting for or in serialisation).
    #[inline]
    pub fn backlog(&mut self, now: Nanos) -> usize {
        while self.queue.front().is_some_and(|&t| t <= now) {
            self.queue.pop_front();
        }
        self.queue.len()
    }

    /// A frame of `frame.len()` bytes handed to this direction at `now`: may corrupt
    /// it in place; returns when it arrives at the far end.
    #[inline]
    pub fn offer(&mut self, now: Nanos, frame: &mut [u8]) -> Verdict {
        let len = frame.len() as u64;
        self.stats.frames += 1;
        self.stats.bytes += len;
        let mut duplicate = false;
        let mut extra = 0;
        if let Some(f) = &mut self.faults {
            if f.lose(&mut self.rng) {
                self.stats.lost += 1;
                return Verdict::Dropped;
            }
            duplicate = self.rng.chance(f.duplicate);
            if !frame.is_empty() && self.rng.chance(f.corrupt) {
                let bit = self.rng.below(len * 8);
                frame[(bit / 8) as usize] ^= 1 << (bit % 8);
                self.stats.corrupted += 1;
            }
            if f.jitter > 0 {
                extra = self.rng.below(f.jitter);
            }
        }
        while self.queue.front().is_some_and(|&t| t <= now) {
            self.queue.pop_front();
        }
        if self.queue.len() >= self.cfg.queue_frames {
            self.stats.queue_drops += 1;
            return Verdict::Dropped;
        }
        let bits = u128::from(len + u64::from(self.cfg.wire_overhead)) * 8;
        let ser = (bits * 1_000_000_000).div_ceil(u128::from(self.cfg.rate_bps.max(1))) as Nanos;
        let start = now.max(self.busy_until);
        self.busy_until = start + ser;
        self.queue.push_back(self.busy_until);
        self.stats.max_queue = self.stats.max_queue.max(self.queue.len() as u64);
        self.stats.wire_frames += 1;
        self.stats.wire_bytes += len;
        self.stats.busy_ns += ser;
        // Jitter never reorders (as the emulator's); `reorder` does.
        let mut due = (self.busy_until + self.cfg.delay + extra).max(self.last_due);
        self.last_due = due;
        if let Some(f) = &self.faults {
            if self.rng.chance(f.reorder) {
                due += f.reorder_delay;
                self.stats.reordered += 1;
            }
        }
        if duplicate {
            self.stats.duplicated += 1;
        }
        Verdict::Deliver(due, duplicate.then_some(due))
    }
}

/// Frames up to this many bytes (ACKs, NAKs, ARP, control messages) live in small
/// buffers.
pub const SMALL_FRAME: usize = 256;
const SMALL_BIT: u32 = 1 << 31;

/// Frame buffers in two sizes, recycled: a node writes into a large one (the engines
/// need room for a whole frame), a short frame then moves to a small one, so the
/// frames in flight (a window per connection) take little more memory than their
/// bytes.
#[derive(Debug)]
pub struct Pool {
    large_size: usize,
    large: Vec<Box<[u8]>>,
    small: Vec<Box<[u8]>>,
    large_lens: Vec<u32>,
    small_lens: Vec<u32>,
    free_large: Vec<u32>,
    free_small: Vec<u32>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new(MAX_FRAME)
    }
}

impl Pool {
    /// A pool whose large buffers hold `large_size` bytes.
    pub fn new(large_size: usize) -> Pool {
        Pool {
            large_size: large_size.clamp(SMALL_FRAME, MAX_FRAME),
            large: Vec::new(),
            small: Vec::new(),
            large_lens: Vec::new(),
            small_lens: Vec::new(),
            free_large: Vec::new(),
            free_small: Vec::new(),
        }
    }

    /// A free large buffer's index.
    #[inline]
    pub fn take(&mut self) -> u32 {
        if let Some(i) = self.free_large.pop() {
            return i;
        }
        self.large.push(vec![0u8; self.large_size].into_boxed_slice());
        self.large_lens.push(0);
        (self.large.len() - 1) as u32
    }

    fn take_small(&mut self) -> u32 {
        if let Some(i) = self.free_small.pop() {
            return i | SMALL_BIT;
        }
        self.small.push(vec![0u8; SMALL_FRAME].into_boxed_slice());
        self.small_lens.push(0);
        (self.small.len() - 1) as u32 | SMALL_BIT
    }

    /// Returns a buffer.
    #[inline]
    pub fn give(&mut self, i: u32) {
        if i & SMALL_BIT != 0 {
            self.free_small.push(i & !SMALL_BIT);
        } else {
            self.free_large.push(i);
        }
    }

    /// The whole of large buffer `i` (from [`Pool::take`]), to write a frame into.
    #[inline]
    pub fn buf_mut(&mut self, i: u32) -> &mut [u8] {
        &mut self.large[i as usize]
    }

    /// Sets the frame length of large buffer `i`; returns the buffer that holds the
    /// frame from now on (a small one if it fits: `i` is then given back).
    #[inline]
    pub fn set_len(&mut self, i: u32, len: usize) -> u32 {
        if len <= SMALL_FRAME {
            let j = self.take_small();
            let k = (j & !SMALL_BIT) as usize;
            self.small[k][..len].copy_from_slice(&self.large[i as usize][..len]);
            self.small_lens[k] = len as u32;
            self.free_large.push(i);
            return j;
        }
        self.large_lens[i as usize] = len as u32;
        i
    }

    /// The frame in buffer `i`.
    #[inline]
    pub fn frame(&self, i: u32) -> &[u8] {
        if i & SMALL_BIT != 0 {
            let k = (i & !SMALL_BIT) as usize;
            &self.small[k][..self.small_lens[k] as usize]
        } else {
            &self.large[i as usize][..self.large_lens[i as usize] as usize]
        }
    }

    /// The frame in buffer `i`, mutably.
    #[inline]
    pub fn frame_mut(&mut self, i: u32) -> &mut [u8] {
        if i & SMALL_BIT != 0 {
            let k = (i & !SMALL_BIT) as usize;
            &mut self.small[k][..self.small_lens[k] as usize]
        } else {
            let len = self.large_lens[i as usize] as usize;
            &mut self.large[i as usize][..len]
        }
    }

    /// Copies frame `i` into a new buffer.
    pub fn duplicate(&mut self, i: u32) -> u32 {
        let copy = self.frame(i).to_vec();
        let j = self.take();
        self.large[j as usize][..copy.len()].copy_from_slice(&copy);
        self.set_len(j, copy.len())
    }

    /// Buffers allocated so far, large and small (the peak of frames in flight).
    pub fn allocated(&self) -> (usize, usize) {
        (self.large.len(), self.small.len())
    }

    /// Bytes of buffers allocated so far.
    pub fn allocated_bytes(&self) -> usize {
        self.large.len() * self.large_size + self.small.len() * SMALL_FRAME
    }
}

/// What an event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Frame `buf` reaches the far end of direction `dir`.
    Arrive {
        /// Direction.
        dir: u32,
        /// Pool buffer.
        buf: u32,
    },
    /// Frame `buf` of direction `dir` was admitted by its busy receiver and is handled
    /// now (per-frame processing cost).
    Process {
        /// Direction.
        dir: u32,
        /// Pool buffer.
        buf: u32,
    },
    /// Node `node`'s timer may be due.
    Timer {
        /// Node.
        node: u32,
    },
    /// Host `node`'s link is free again: it may send its next frame.
    TxReady {
        /// Node.
        node: u32,
    },
}

impl Event {
    fn pack(self) -> u64 {
        match self {
            Event::Arrive { dir, buf } => (u64::from(dir) << 32) | u64::from(buf),
            Event::Process { dir, buf } => (1 << 62) | (u64::from(dir) << 32) | u64::from(buf),
            Event::Timer { node } => (2 << 62) | u64::from(node),
            Event::TxReady { node } => (3 << 62) | u64::from(node),
        }
    }

    fn unpack(v: u64) -> Event {
        let a = ((v >> 32) & 0x3FFF_FFFF) as u32;
        let b = v as u32;
        match v >> 62 {
            0 => Event::Arrive { dir: a, buf: b },
            1 => Event::Process { dir: a, buf: b },
            2 => Event::Timer { node: b },
            _ => Event::TxReady { node: b },
        }
    }
}

/// Events ordered by (time, insertion order): the same inputs replay the same run.
#[derive(Debug, Default)]
pub struct Queue {
    heap: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    seq: u64,
}

impl Queue {
    /// Schedules `ev` at `time`.
    #[inline]
    pub fn push(&mut self, time: Nanos, ev: Event) {
        self.seq += 1;
        self.heap.push(Reverse((time, self.seq, ev.pack())));
    }

    /// The earliest event.
    #[inline]
    pub fn pop(&mut self) -> Option<(Nanos, Event)> {
        self.heap.pop().map(|Reverse((t, _, v))| (t, Event::unpack(v)))
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No event pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(rate_bps: u64, delay: Nanos, queue_frames: usize, spec: Option<&str>) -> Dir {
        Dir::new(DirConfig {
            name: "a -> b".into(),
            to_node: 1,
            to_port: 0,
            rate_bps,
            delay,
            queue_frames,
            wire_overhead: 0,
            impairments: spec.map(|s| s.parse().unwrap()),
            seed: 7,
            intact: false,
        })
    }

    #[test]
    fn frames_are_serialised_back_to_back_then_delayed() {
        let mut d = dir(8_000_000_000, 1000, 100, None);
        let mut f = [0u8; 1000]; // 1 µs at 8 Gb/s
        assert_eq!(d.offer(0, &mut f), Verdict::Deliver(2000, None));
        assert_eq!(d.offer(0, &mut f), Verdict::Deliver(3000, None));
        assert_eq!(d.offer(5000, &mut f), Verdict::Deliver(7000, None));
        assert_eq!(d.stats.busy_ns, 3000);
    }

    #[test]
    fn a_full_queue_drops_the_tail() {
        let mut d = dir(8_000_000_000, 0, 2, None);
        let mut f = [0u8; 1000];
        assert!(matches!(d.offer(0, &mut f), Verdict::Deliver(..)));
        assert!(matches!(d.offer(0, &mut f), Verdict::Deliver(..)));
        assert_eq!(d.offer(0, &mut f), Verdict::Dropped);
        assert_eq!(d.stats.queue_drops, 1);
        // The first frame left at 1 µs: room again.
        assert!(matches!(d.offer(1000, &mut f), Verdict::Deliver(..)));
    }

    #[test]
    fn loss_is_drawn_at_the_configured_rate_and_replays_for_a_seed() {
        let run = || {
            let mut d = dir(100_000_000_000, 0, 1 << 20, Some("loss=5%"));
            let mut f = [0u8; 64];
            (0..20_000).map(|i| d.offer(i * 100, &mut f) == Verdict::Dropped).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        let lost = a.iter().filter(|&&x| x).count();
        assert!((800..1200).contains(&lost), "{lost} of 20000 lost at 5%");
    }

    #[test]
    fn events_pop_in_time_then_insertion_order() {
        let mut q = Queue::default();
        q.push(5, Event::Timer { node: 3 });
        q.push(2, Event::Arrive { dir: 7, buf: 9 });
        q.push(5, Event::Process { dir: 0x3FFF_FFFF, buf: u32::MAX });
        q.push(6, Event::TxReady { node: 12 });
        assert_eq!(q.pop(), Some((2, Event::Arrive { dir: 7, buf: 9 })));
        assert_eq!(q.pop(), Some((5, Event::Timer { node: 3 })));
        assert_eq!(q.pop(), Some((5, Event::Process { dir: 0x3FFF_FFFF, buf: u32::MAX })));
        assert_eq!(q.pop(), Some((6, Event::TxReady { node: 12 })));
        assert!(q.is_empty());
    }

    #[test]
    fn pool_recycles_and_duplicates() {
        let mut p = Pool::default();
        let a = p.take();
        p.buf_mut(a)[..3].copy_from_slice(&[1, 2, 3]);
        let a2 = p.set_len(a, 3);
        assert_ne!(a2, a, "a short frame moves to a small buffer");
        assert_eq!(p.take(), a, "and its large buffer is free again");
        let b = p.duplicate(a2);
        assert_eq!(p.frame(b), &[1, 2, 3]);
        p.give(a2);
        let big = p.take();
        p.buf_mut(big)[..1000].fill(7);
        let big = p.set_len(big, 1000);
        assert_eq!(p.frame(big).len(), 1000);
        assert_eq!(p.allocated(), (2, 2));
    }
}
