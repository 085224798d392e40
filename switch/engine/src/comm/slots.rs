//! The slot pool: where the chunks of a collective meet.
//!
//! A chunk at stream position `pos` lives in slot `pos % slots`; the pool holds
//! `2 x window` slots, so a child running a whole window ahead of the slowest one still
//! finds its slot free, and one running further is told to come back (RNR) rather than
//! dropped.

use inc_protocol::coll::CollOp;
use inc_wire::{reduce, DataType};

use super::mask::ChildMask;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    Free,
    Filling,
    /// Every contributor arrived; waiting for send-queue room.
    Complete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotMeta {
    pub(crate) state: SlotState,
    /// Collective sequence number of the chunk held.
    pub(crate) seq: u32,
    /// Stream position of the chunk held.
    pub(crate) pos: u64,
    pub(crate) arrived: ChildMask,
    /// Payload bytes of the chunk.
    pub(crate) len: usize,
}

const FREE: SlotMeta =
    SlotMeta { state: SlotState::Free, seq: 0, pos: 0, arrived: ChildMask::EMPTY, len: 0 };

/// What became of one child's contribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contribution {
    /// Combined into `slot`; `arrived` now includes the child.
    Stored { slot: usize, arrived: ChildMask },
    /// The slot still holds an older chunk: refuse with RNR, the child retries.
    SlotBusy,
    /// A duplicate, a chunk older than what the slot holds, or one for a completed slot:
    /// the protocol was broken; consume it without effect.
    Rejected,
}

/// Bytes of a slot's accumulator per wire byte, the most any type needs: fp16 and
/// bf16 accumulate in fp32.
fn acc_ratio() -> usize {
    DataType::ALL.iter().map(|d| d.acc_size() / d.size()).max().unwrap_or(1)
}

/// Slot layout. A slot holds the first contribution as it arrived (wire bytes), so a
/// chunk with one contributor (Broadcast, Reduce below one child) leaves exactly as it
/// came. Further contributions combine into it; for types a switch accumulates in
/// fp32 (fp16, bf16: `DataType::accumulates_in_f32`) the second one first widens the
/// slot into an fp32 accumulator (`acc_ratio` x the wire bytes, hence the stride) and
/// the result is rounded to the wire type once, when it leaves: one rounding per hop.
#[derive(Debug)]
pub(crate) struct SlotPool {
    meta: Vec<SlotMeta>,
    /// `slots x stride` bytes.
    bytes: Vec<u8>,
    mtu: usize,
    /// `mtu x acc_ratio`, or in deterministic mode `mtu x fan-in` (every child keeps
    /// its own sub-buffer so that floats can be combined in a fixed order whatever the
    /// arrival order) plus `mtu x acc_ratio` for the accumulator.
    stride: usize,
    /// Where the accumulator starts in a slot: 0, or `mtu x fan-in` in deterministic
    /// mode.
    acc_at: usize,
    /// One chunk of wire bytes: a widened slot's first contribution on its way into
    /// the accumulator, and a rounded result on its way out.
    scratch: Vec<u8>,
    deterministic: bool,
}

impl SlotPool {
    pub(crate) fn new(slots: usize, mtu: usize, fan_in: usize, deterministic: bool) -> SlotPool {
        let acc = mtu * acc_ratio();
        let acc_at = if deterministic { mtu * fan_in.max(1) } else { 0 };
        SlotPool {
            meta: vec![FREE; slots],
            bytes: vec![0; slots * (acc_at + acc)],
            mtu,
            stride: acc_at + acc,
            acc_at,
            scratch: vec![0; mtu],
            deterministic,
        }
    }

    /// Slots in the pool.
    pub(crate) fn len(&self) -> usize {
        self.meta.len()
    }

    pub(crate) fn slot_of(&self, pos: u64) -> usize {
        (pos % self.meta.len() as u64) as usize
    }

    pub(crate) fn meta(&self, slot: usize) -> SlotMeta {
        self.meta[slot]
    }

    /// Adds `child`'s chunk at `pos` of collective `seq`: copied in first, combined with
    /// `op` after (or parked in the child's sub-buffer in deterministic mode).
    pub(crate) fn contribute(
        &mut self,
        seq: u32,
        pos: u64,
        child: usize,
        op: &CollOp,
        payload: &[u8],
    ) -> Contribution {
        let slot = self.slot_of(pos);
        let held = self.meta[slot];
        match held.state {
            SlotState::Free => {
                self.meta[slot] = SlotMeta {
                    state: SlotState::Filling,
                    seq,
                    pos,
                    arrived: ChildMask::EMPTY,
                    len: payload.len(),
                };
            }
            _ if held.pos == pos && held.seq == seq => {}
            // Back-pressure, never drop: the slowest child still owes the older chunk.
            _ if held.pos < pos => return Contribution::SlotBusy,
            _ => return Contribution::Rejected,
        }
        let meta = &mut self.meta[slot];
        if meta.arrived.contains(child) || meta.state == SlotState::Complete {
            return Contribution::Rejected;
        }
        let base = slot * self.stride;
        let dtype = op.datatype;
        if self.deterministic {
            let at = base + child * self.mtu;
            self.bytes[at..at + payload.len()].copy_from_slice(payload);
        } else if meta.arrived.is_empty() {
            self.bytes[base..base + payload.len()].copy_from_slice(payload);
        } else if !dtype.accumulates_in_f32() {
            reduce::combine_be(
                op.operator,
                dtype,
                &mut self.bytes[base..base + payload.len()],
                payload,
            );
        } else {
            let n = payload.len() / dtype.size();
            let acc = &mut self.bytes[base..base + n * dtype.acc_size()];
            if meta.arrived.len() == 1 {
                // The second contribution: widen the first into the accumulator.
                self.scratch[..payload.len()].copy_from_slice(&acc[..payload.len()]);
                reduce::widen_be(dtype, acc, &self.scratch[..payload.len()]);
            }
            reduce::accumulate_be(op.operator, dtype, acc, payload);
        }
        meta.arrived.insert(child);
        Contribution::Stored { slot, arrived: meta.arrived }
    }

    /// The slot `child`'s chunk at `pos` of `seq` would complete, if it is the last of
    /// `contributors` and not the first (the others wait combined in the slot), outside
    /// deterministic mode: then [`Self::finish_into`] can write the result where it
    /// goes instead of combining into the slot and copying the slot out.
    pub(crate) fn completed_by(
        &self,
        seq: u32,
        pos: u64,
        child: usize,
        contributors: ChildMask,
    ) -> Option<usize> {
        let slot = self.slot_of(pos);
        let m = self.meta[slot];
        let last = m.state == SlotState::Filling
            && m.seq == seq
            && m.pos == pos
            && !m.arrived.is_empty()
            && !m.arrived.contains(child)
            && (m.arrived | ChildMask::single(child)) == contributors;
        (last && !self.deterministic).then_some(slot)
    }

    /// `out = slot op payload` for a slot [`Self::completed_by`] named; the caller
    /// frees the slot. Returns the bytes written (the chunk's length, or less if `out`
    /// or `payload` is shorter).
    pub(crate) fn finish_into(
        &self,
        slot: usize,
        op: &CollOp,
        payload: &[u8],
        out: &mut [u8],
    ) -> usize {
        let m = self.meta[slot];
        let len = m.len.min(payload.len()).min(out.len());
        let base = slot * self.stride;
        let dtype = op.datatype;
        let n = if dtype.accumulates_in_f32() && m.arrived.len() > 1 {
            let acc = &self.bytes[base..base + len / dtype.size() * dtype.acc_size()];
            reduce::accumulate_narrow_be(op.operator, dtype, &mut out[..len], acc, payload)
        } else {
            // Two contributions of a half type: combining them is one fp32 operation
            // and one rounding, as the accumulator would do.
            let held = &self.bytes[base..base + len];
            reduce::combine_be_into(op.operator, dtype, &mut out[..len], held, payload)
        };
        n * dtype.size()
    }

    /// Whether a chunk at `pos` would be refused as [`Contribution::SlotBusy`] now.
    pub(crate) fn is_busy_for(&self, pos: u64) -> bool {
        let held = self.meta[self.slot_of(pos)];
        held.state != SlotState::Free && held.pos < pos
    }

    pub(crate) fn mark_complete(&mut self, slot: usize) {
        self.meta[slot].state = SlotState::Complete;
    }

    /// The aggregated chunk of a complete slot. In deterministic mode this folds the
    /// contributors' sub-buffers in ascending child order first. Types accumulated in
    /// fp32 are rounded to the wire type here, once.
    pub(crate) fn aggregate(&mut self, slot: usize, op: &CollOp, contributors: ChildMask) -> &[u8] {
        let m = self.meta[slot];
        let len = m.len;
        let base = slot * self.stride;
        let dtype = op.datatype;
        let acc_len = len / dtype.size() * dtype.acc_size();
        if self.deterministic {
            let mut children = contributors.iter();
            let first = children.next().unwrap_or(0);
            let sub = |child: usize| base + child * self.mtu;
            if contributors.len() <= 1 {
                let from = sub(first);
                self.bytes.copy_within(from..from + len, base);
                return &self.bytes[base..base + len];
            }
            let (subs, rest) = self.bytes[base..base + self.stride].split_at_mut(self.acc_at);
            let acc = &mut rest[..acc_len];
            reduce::widen_be(dtype, acc, &subs[first * self.mtu..first * self.mtu + len]);
            for child in children {
                let from = &subs[child * self.mtu..child * self.mtu + len];
                reduce::accumulate_be(op.operator, dtype, acc, from);
            }
            let acc = base + self.acc_at;
            if dtype.accumulates_in_f32() {
                reduce::narrow_be(dtype, &mut self.scratch[..len], &self.bytes[acc..acc + acc_len]);
                return &self.scratch[..len];
            }
            return &self.bytes[acc..acc + len];
        }
        if dtype.accumulates_in_f32() && m.arrived.len() > 1 {
            reduce::narrow_be(dtype, &mut self.scratch[..len], &self.bytes[base..base + acc_len]);
            return &self.scratch[..len];
        }
        &self.bytes[base..base + len]
    }

    pub(crate) fn free(&mut self, slot: usize) {
        self.meta[slot] = FREE;
    }

    /// Frees every slot of collective `seq` (it failed).
    pub(crate) fn free_collective(&mut self, seq: u32) {
        for meta in &mut self.meta {
            if meta.state != SlotState::Free && meta.seq == seq {
                *meta = FREE;
            }
        }
    }

    /// Slots of `seq` whose `contributors` all arrived before the collective's roles were
    /// known, in stream order.
    pub(crate) fn filled_early(&self, seq: u32, contributors: ChildMask) -> Vec<usize> {
        let mut filled: Vec<(u64, usize)> = self
            .meta
            .iter()
            .enumerate()
            .filter(|(_, m)| {
                m.state == SlotState::Filling && m.seq == seq && m.arrived == contributors
            })
            .map(|(slot, m)| (m.pos, slot))
            .collect();
        filled.sort_unstable();
        filled.into_iter().map(|(_, slot)| slot).collect()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.bytes.len() + self.scratch.len() + self.meta.len() * std::mem::size_of::<SlotMeta>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inc_wire::{DataType, IncImm, Operator, Primitive};

    fn op(operator: Operator, datatype: DataType) -> CollOp {
        CollOp { primitive: Primitive::AllReduce, operator, datatype, root: IncImm::ALL_RANKS }
    }

    fn be(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    #[test]
    fn contributions_combine_and_complete() {
        let sum = op(Operator::Sum, DataType::Int32);
        let mut pool = SlotPool::new(4, 16, 2, false);
        let first = pool.contribute(1, 6, 0, &sum, &be(&[1, 2]));
        assert_eq!(first, Contribution::Stored { slot: 2, arrived: ChildMask::single(0) });
        let both = pool.contribute(1, 6, 1, &sum, &be(&[10, -20]));
        assert_eq!(both, Contribution::Stored { slot: 2, arrived: ChildMask::first(2) });
        pool.mark_complete(2);
        assert_eq!(pool.aggregate(2, &sum, ChildMask::first(2)), be(&[11, -18]).as_slice());
        pool.free(2);
        assert_eq!(pool.meta(2).state, SlotState::Free);
    }

    #[test]
    fn duplicates_newer_and_older_chunks() {
        let sum = op(Operator::Sum, DataType::Int32);
        let mut pool = SlotPool::new(4, 16, 2, false);
        pool.contribute(1, 2, 0, &sum, &be(&[1]));
        // The same child again: broken protocol, no effect.
        assert_eq!(pool.contribute(1, 2, 0, &sum, &be(&[1])), Contribution::Rejected);
        // Position 6 maps to the same slot while 2 is unfinished: back-pressure.
        assert_eq!(pool.contribute(1, 6, 1, &sum, &be(&[5])), Contribution::SlotBusy);
        pool.contribute(1, 2, 1, &sum, &be(&[7]));
        pool.mark_complete(2);
        // A late contribution to a complete slot is refused too.
        assert_eq!(pool.contribute(1, 2, 1, &sum, &be(&[7])), Contribution::Rejected);
        assert_eq!(pool.aggregate(2, &sum, ChildMask::first(2)), be(&[8]).as_slice());
        pool.free(2);
        pool.contribute(1, 6, 0, &sum, &be(&[3]));
        // An older position than the slot holds cannot be placed.
        assert_eq!(pool.contribute(1, 2, 1, &sum, &be(&[3])), Contribution::Rejected);
    }

    #[test]
    fn deterministic_fold_ignores_arrival_order() {
        let fsum = op(Operator::Sum, DataType::Float32);
        let values = [1.0e8f32, -1.0e8, 0.5, 3.25];
        let chunk = |v: f32| v.to_bits().to_be_bytes().to_vec();
        let run = |order: &[usize]| {
            let mut pool = SlotPool::new(2, 8, 4, true);
            for &child in order {
                pool.contribute(3, 1, child, &fsum, &chunk(values[child]));
            }
            pool.mark_complete(1);
            let out = pool.aggregate(1, &fsum, ChildMask::first(4)).to_vec();
            f32::from_bits(u32::from_be_bytes(out.try_into().unwrap()))
        };
        let forward = run(&[0, 1, 2, 3]);
        assert_eq!(forward, ((1.0e8f32 + -1.0e8) + 0.5) + 3.25);
        assert_eq!(run(&[3, 1, 2, 0]).to_bits(), forward.to_bits());
        assert_eq!(run(&[2, 3, 0, 1]).to_bits(), forward.to_bits());
    }

    #[test]
    fn deterministic_single_contributor_not_first_child() {
        let fsum = op(Operator::Sum, DataType::Float32);
        let mut pool = SlotPool::new(2, 8, 3, true);
        pool.contribute(0, 0, 2, &fsum, &7.5f32.to_bits().to_be_bytes());
        assert_eq!(
            pool.aggregate(0, &fsum, ChildMask::single(2)),
            7.5f32.to_bits().to_be_bytes().as_slice()
        );
    }

    #[test]
    fn early_fills_in_stream_order_and_failure_frees() {
        let max = op(Operator::Max, DataType::Int32);
        let mut pool = SlotPool::new(8, 8, 1, false);
        for pos in [13, 10, 12] {
            pool.contribute(4, pos, 0, &max, &be(&[pos as i32]));
        }
        pool.contribute(5, 9, 0, &max, &be(&[0]));
        assert_eq!(pool.filled_early(4, ChildMask::single(0)), vec![2, 4, 5]);
        assert!(pool.filled_early(4, ChildMask::first(2)).is_empty());
        pool.free_collective(4);
        assert!(pool.filled_early(4, ChildMask::single(0)).is_empty());
        assert_eq!(pool.meta(1).seq, 5, "other collectives keep their slots");
        // Slots of 2 x mtu (room for an fp32 accumulator of fp16/bf16) and one chunk
        // of scratch.
        assert_eq!(pool.memory_bytes(), 8 * 16 + 8 + 8 * std::mem::size_of::<SlotMeta>());
    }
}
