//! What a communicator may allocate in one switch, as the controller accounts it
//! against the switch's `max_slot_memory` and `max_host_memory` before it accepts the
//! communicator (and as it accounts communicators a restarted controller adopts).
//!
//! The count is of the most the switch can hold for the communicator, whatever the
//! traffic: the slot pool (allocated when installed, touched as chunks arrive), and per
//! connection a send queue of `2 x window + 16` frames of `mtu` payload plus headers
//! (the switch's `Comm::new`: two windows of data and a reserve for control
//! messages), which fills with traffic. The switch engine's tests hold its own count
//! of what it allocates to this bound (`switch/src/memory_tests.rs`).

/// Send-queue entries per connection beyond two windows of data (the switch's
/// control reserve).
pub const SEND_QUEUE_RESERVE: u64 = 16;

/// Bytes accounted per queued frame beyond its payload: the RoCEv2 headers (at most
/// 68 bytes), the allocator's and the queue's bookkeeping, rounded up.
pub const FRAME_ALLOWANCE: u64 = 256;

/// Bytes accounted per slot beyond its buffer: its state and its place in the queue
/// of complete slots.
pub const SLOT_ALLOWANCE: u64 = 64;

/// Bytes accounted per connection for its state beyond its send queue, and per
/// communicator for its own.
pub const CONNECTION_ALLOWANCE: u64 = 4096;

/// How many bytes of an accumulator a slot holds per payload byte: fp16 and bf16
/// accumulate in fp32.
pub const SLOT_BYTES_PER_PAYLOAD_BYTE: u64 = 2;

/// What one part of a communicator (its rules on one switch) may allocate there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommMemory {
    /// The slot pool: `slots x (2 x mtu + SLOT_ALLOWANCE)` plus one chunk of scratch.
    pub slots: u64,
    /// Every connection's send queue at its fullest, plus per-connection state.
    pub send_queues: u64,
}

impl CommMemory {
    /// The most a communicator with `slots` slots, `connections` connections, payload
    /// size `mtu` and window `window` allocates on one switch.
    pub fn new(mtu: u16, window: u32, slots: u64, connections: usize) -> CommMemory {
        let mtu = u64::from(mtu);
        let frame = mtu + FRAME_ALLOWANCE;
        let per_queue = (2 * u64::from(window) + SEND_QUEUE_RESERVE) * frame;
        CommMemory {
            slots: slots * (SLOT_BYTES_PER_PAYLOAD_BYTE * mtu + SLOT_ALLOWANCE)
                + mtu
                + CONNECTION_ALLOWANCE,
            send_queues: connections as u64 * (per_queue + CONNECTION_ALLOWANCE),
        }
    }

    /// Of the rules one switch holds for a communicator.
    pub fn of_rules(rules: &inc_ctrl_proto::SwitchRules) -> CommMemory {
        CommMemory::new(rules.mtu, rules.window, u64::from(rules.slots), rules.connections.len())
    }

    /// Everything together.
    pub fn total(&self) -> u64 {
        self.slots + self.send_queues
    }
}

impl std::fmt::Display for CommMemory {
    /// `N bytes (slots S + send queues Q)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes of switch memory (slot pool {} + send queues {})",
            self.total(),
            self.slots,
            self.send_queues
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The case of issue [19]: window 16384, mtu 4096 on a leaf of 1-2-4 (3
    /// connections). The old count (slots x mtu x fan-in) was 256 MiB and accepted.
    #[test]
    fn a_big_window_counts_its_send_queues() {
        let m = CommMemory::new(4096, 16384, 2 * 16384, 3);
        assert_eq!(m.slots, 32768 * (8192 + 64) + 4096 + 4096);
        assert_eq!(m.send_queues, 3 * ((32768 + 16) * (4096 + 256) + 4096));
        assert!(m.total() > 1 << 28, "{m}");
        // The defaults (window 64) on a 16-host leaf: about 11 MiB.
        assert!(CommMemory::new(4096, 64, 128, 17).total() < 12 << 20);
    }
}
