//! Link emulation: what a lossy, slow or misbehaving link does to frames, applied by
//! the switch itself (the kernel here has no netem, and packet sockets see frames
//! before any firewall could drop them).
//!
//! [`LinkEmu`] is the sans-IO model of one direction of one link: seeded, `now` passed
//! in, frames that must wait (delay, rate, reordering, duplicates) held in a queue
//! whose earliest deadline the driver waits for. [`LinkEmuBackend`] wraps any
//! [`Backend`](crate::Backend) and applies a model per port on transmit and,
//! for links whose far end has no emulator of its own (hosts), on receive.
//!
//! Loss is independent per frame, or bursty with the two-state Gilbert–Elliott model:
//! `loss=L,burst=B` stays in a "bad" state (every frame lost) for `B` frames on average
//! and enters it with the probability that makes the long-run loss rate `L`.

mod backend;

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Duration;

use inc_protocol::Time;
use serde::Serialize;

pub use self::backend::{LinkEmuBackend, LinkEmuStats, PortLinkEmuStats};
// The settings and their text form live in their own crate, shared with the topology.
pub use inc_link_spec::{
    Impairments, PortLinkEmu, SpecError, DEFAULT_LIMIT, DEFAULT_REORDER_DELAY,
};

/// What happens to a frame offered to a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it now, as it is (possibly corrupted in place).
    Send,
    /// The link copied it and releases it later (see [`LinkEmu::pop_due`]).
    Held,
    /// Lost.
    Dropped,
}

/// Counters of one direction of one link.
///
/// Invariant: `offered + duplicated == lost + queue_drops + passed + released + held`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LinkEmuCounters {
    /// Frames offered to the link.
    pub offered: u64,
    /// Frames lost (random or burst loss).
    pub lost: u64,
    /// Of `lost`, frames lost in a Gilbert–Elliott burst.
    pub burst_lost: u64,
    /// Loss bursts entered.
    pub bursts: u64,
    /// Frames dropped because the link already held `limit` frames.
    pub queue_drops: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Frames with one bit flipped.
    pub corrupted: u64,
    /// Frames held back so that later ones pass them.
    pub reordered: u64,
    /// Frames sent at once.
    pub passed: u64,
    /// Frames released from the queue after their deadline.
    pub released: u64,
    /// Frames in the queue now.
    pub held: u64,
    /// Most frames ever in the queue.
    pub max_held: u64,
}

/// A frame waiting for its deadline. Ordered by deadline, then arrival.
#[derive(Debug)]
struct Held {
    due: Time,
    seq: u64,
    frame: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

/// SplitMix64: small, fast, seedable; statistical quality is ample for fault injection.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (never draws when `p` is 0, so adding an impairment
    /// with probability 0 does not change the others' random sequence).
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// FNV-1a, to derive per-link seeds from names that are stable across runs.
pub fn seed_for(seed: u64, link: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for b in link.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One direction of one emulated link (sans-IO).
#[derive(Debug)]
pub struct LinkEmu {
    imp: Impairments,
    rng: Rng,
    /// Gilbert–Elliott: probability to enter / leave the bad state per frame.
    enter_bad: f64,
    leave_bad: f64,
    bad: bool,
    /// When the serialiser is free again (rate limit).
    link_free: Time,
    /// Latest deadline of a frame that was not reordered: later frames never overtake it
    /// because of jitter.
    last_due: Time,
    queue: BinaryHeap<Reverse<Held>>,
    seq: u64,
    spare: Vec<Vec<u8>>,
    counters: LinkEmuCounters,
}

impl LinkEmu {
    /// A link with impairments `imp`; `seed` is typically [`seed_for`]`(imp.seed, name)`.
    pub fn new(imp: Impairments, seed: u64) -> Self {
        let (enter_bad, leave_bad) = match imp.burst {
            // Stationary P(bad) = enter / (enter + leave) = loss, mean sojourn 1/leave.
            Some(b) if imp.loss > 0.0 => {
                let leave = 1.0 / b;
                ((imp.loss * leave / (1.0 - imp.loss)).min(1.0), leave)
            }
            _ => (0.0, 1.0),
        };
        LinkEmu {
            imp,
            rng: Rng(seed),
            enter_bad,
            leave_bad,
            bad: false,
            link_free: Time::ZERO,
            last_due: Time::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            spare: Vec::new(),
            counters: LinkEmuCounters::default(),
        }
    }

    /// The impairments.
    pub fn impairments(&self) -> &Impairments {
        &self.imp
    }

    /// Counters.
    pub fn counters(&self) -> LinkEmuCounters {
        LinkEmuCounters { held: self.queue.len() as u64, ..self.counters }
    }

    /// Earliest deadline of a held frame.
    pub fn next_due(&self) -> Option<Time> {
        self.queue.peek().map(|Reverse(h)| h.due)
    }

    fn lose(&mut self) -> bool {
        if self.imp.burst.is_some() && self.imp.loss > 0.0 {
            if self.bad {
                self.bad = !self.rng.chance(self.leave_bad);
            } else if self.rng.chance(self.enter_bad) {
                self.bad = true;
                self.counters.bursts += 1;
            }
            if self.bad {
                self.counters.burst_lost += 1;
            }
            self.bad
        } else {
            self.rng.chance(self.imp.loss)
        }
    }

    fn hold(&mut self, due: Time, frame: &[u8]) {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.seq += 1;
        self.queue.push(Reverse(Held { due, seq: self.seq, frame: buf }));
        self.counters.max_held = self.counters.max_held.max(self.queue.len() as u64);
    }

    /// Offer one frame at `now`. The frame may be corrupted in place; on
    /// [`Verdict::Send`] the caller sends it now, otherwise it must not.
    pub fn offer(&mut self, now: Time, frame: &mut [u8]) -> Verdict {
        self.counters.offered += 1;
        if self.lose() {
            self.counters.lost += 1;
            return Verdict::Dropped;
        }
        let duplicate = self.rng.chance(self.imp.duplicate);
        if !frame.is_empty() && self.rng.chance(self.imp.corrupt) {
            let bit = self.rng.below(frame.len() as u64 * 8);
            frame[(bit / 8) as usize] ^= 1 << (bit % 8);
            self.counters.corrupted += 1;
        }
        if self.queue.len() >= self.imp.limit {
            self.counters.queue_drops += 1;
            return Verdict::Dropped;
        }
        let mut start = now;
        if let Some(bps) = self.imp.rate_bps {
            start = start.max(self.link_free);
            let bits = frame.len() as u128 * 8;
            let nanos = (bits * 1_000_000_000).div_ceil(u128::from(bps));
            self.link_free = start + Duration::from_nanos(nanos as u64);
        }
        let mut due = start + self.imp.delay;
        if !self.imp.jitter.is_zero() {
            let j = self.rng.below(self.imp.jitter.as_nanos() as u64);
            due += Duration::from_nanos(j);
        }
        due = due.max(self.last_due);
        self.last_due = due;
        if self.rng.chance(self.imp.reorder) {
            due += self.imp.reorder_delay;
            self.counters.reordered += 1;
        }
        if duplicate {
            self.counters.duplicated += 1;
        }
        // Send at once only if nothing held is due before it (keeps order).
        let overtakes = self.queue.peek().is_some_and(|Reverse(h)| h.due <= due);
        if due <= now && !overtakes {
            self.counters.passed += 1;
            if duplicate {
                self.hold_copy(due, frame);
            }
            return Verdict::Send;
        }
        self.hold(due, frame);
        if duplicate {
            self.hold_copy(due, frame);
        }
        Verdict::Held
    }

    /// Holds a duplicate unless the queue is full (then it counts as a queue drop).
    fn hold_copy(&mut self, due: Time, frame: &[u8]) {
        if self.queue.len() < self.imp.limit {
            self.hold(due, frame);
        } else {
            self.counters.queue_drops += 1;
        }
    }

    /// Hand held frames whose deadline is at or before `now` to `out`, in deadline
    /// order, while `out` accepts them (returns true). Returns frames handed over.
    pub fn pop_due(&mut self, now: Time, out: &mut dyn FnMut(&[u8]) -> bool) -> usize {
        let mut n = 0;
        while let Some(Reverse(h)) = self.queue.peek() {
            if h.due > now || !out(&h.frame) {
                break;
            }
            let Some(Reverse(h)) = self.queue.pop() else { break };
            self.spare.push(h.frame);
            self.counters.released += 1;
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests;
