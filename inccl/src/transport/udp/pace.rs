//! Sending no faster than the host's link: what a RoCE NIC does by itself.
//!
//! A NIC serialises frames at its line rate and fetches work requests only a few
//! frames ahead of the wire, so after a NAK it resends from the lost PSN at once, and
//! its ACKs do not wait behind a window of data. Where the topology rate-limits a
//! host's link (`emulate: rate=...`), the switch emulates that link on its receive
//! side; a host that handed it its whole window at once made the emulated link queue
//! all of it (94-324 frames were seen at 64 hosts), with every go-back-N copy and every
//! ACK behind. [`NicPacer`] keeps at most [`NIC_AHEAD`] frames on the host's link and
//! wakes the sender while [`NIC_WAKE_AT`] still are, so that a late wake-up on a busy
//! machine does not leave the link idle (with 4 and 1, a 16 MiB AllReduce on 9 hosts at
//! 200 Mb/s took 5 % longer than with these). inc-sim's host NIC does the same with no
//! wake-up latency to cover (`inc_sim::HOST_TX_BATCH`). Sans-IO: `now` is passed in.

use std::collections::VecDeque;
use std::time::Duration;

use inc_protocol::Time;

/// Most frames a host has on its link (serialising or waiting to).
pub(super) const NIC_AHEAD: usize = 8;
/// Frames still on the link when a sender it turned away is woken.
pub(super) const NIC_WAKE_AT: usize = 4;

/// Paces one QP's frames to its link's rate.
#[derive(Debug)]
pub(super) struct NicPacer {
    rate_bps: u64,
    /// When each frame still on the link finishes serialising, oldest first.
    finishes: VecDeque<Time>,
    /// The last [`NicPacer::has_room`] said no: a sender is waiting for the link.
    blocked: bool,
}

impl NicPacer {
    /// A link of `rate_bps` bits per second (frame bytes, as the switch's link
    /// emulation counts them). `rate_bps` must be positive.
    pub(super) fn new(rate_bps: u64) -> NicPacer {
        assert!(rate_bps > 0, "a link rate must be positive");
        NicPacer { rate_bps, finishes: VecDeque::with_capacity(NIC_AHEAD), blocked: false }
    }

    /// May a frame go on the link now?
    pub(super) fn has_room(&mut self, now: Time) -> bool {
        while self.finishes.front().is_some_and(|&t| t <= now) {
            self.finishes.pop_front();
        }
        self.blocked = self.finishes.len() >= NIC_AHEAD;
        !self.blocked
    }

    /// A frame of `len` bytes went on the link at `now` (after [`NicPacer::has_room`]).
    pub(super) fn sent(&mut self, now: Time, len: usize) {
        let start = self.finishes.back().map_or(now, |&t| t.max(now));
        let nanos = (len as u128 * 8 * 1_000_000_000).div_ceil(self.rate_bps as u128);
        self.finishes.push_back(start + Duration::from_nanos(nanos as u64));
    }

    /// When a sender the link turned away is to try again (`None`: nobody waits): once
    /// only [`NIC_WAKE_AT`] frames are left on the link.
    pub(super) fn release(&self) -> Option<Time> {
        if !self.blocked {
            return None;
        }
        self.finishes.get(self.finishes.len().saturating_sub(NIC_WAKE_AT + 1)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn keeps_at_most_nic_ahead_frames_on_the_link() {
        // 1,000 bytes at 8 Mb/s: 1 ms each.
        let mut p = NicPacer::new(8_000_000);
        let t0 = Time::from_nanos(5 * MS);
        for _ in 0..NIC_AHEAD {
            assert!(p.has_room(t0));
            p.sent(t0, 1000);
        }
        assert_eq!(p.release(), None, "nobody was turned away yet");
        assert!(!p.has_room(t0));
        // Frames 6..10 ms: woken when the fourth finishes, with four left.
        assert_eq!(NIC_AHEAD, 8);
        assert_eq!(NIC_WAKE_AT, 4);
        assert_eq!(p.release(), Some(Time::from_nanos(9 * MS)));
        assert!(!p.has_room(Time::from_nanos(6 * MS - 1)));
        assert!(p.has_room(Time::from_nanos(6 * MS)), "the first frame is through");
        assert_eq!(p.release(), None);
        // Frames queue behind the link, not behind `now`.
        p.sent(Time::from_nanos(6 * MS), 1000);
        assert_eq!(p.finishes.back(), Some(&Time::from_nanos(14 * MS)));
    }

    #[test]
    fn an_idle_link_starts_a_frame_at_once_and_rounds_up() {
        let mut p = NicPacer::new(3);
        assert!(p.has_room(Time::from_nanos(MS)));
        p.sent(Time::from_nanos(MS), 1);
        // 8 bits at 3 b/s: 2.666... s, rounded up to the nanosecond.
        assert_eq!(p.finishes.front(), Some(&Time::from_nanos(MS + 2_666_666_667)));
    }
}
