//! AllGather: every rank's block to every other rank, the blocks interleaved on the
//! stream (`coll::gather_position`).
//!
//! A position comes from the one neighbour behind which its block's rank sits and goes
//! to every other neighbour (the parent only when ranks lie beyond it). A link must
//! carry its positions in stream order, since data carries no header, but only its own:
//! each destination has a cursor at the next position it is owed. A position goes to a
//! destination straight from the frame it arrived in when that cursor is at it, and
//! otherwise waits in its slot until the cursor gets there; the slot is freed once
//! every destination's cursor has passed it. No position waits for one that does not
//! go the same way, so the blocks flow at once, as many as the window holds.

use inc_protocol::coll;

use super::mask::ChildMask;
use super::slots::SlotState;
use super::{shared_crc, Comm, Conn, Disposition, FrameCrc};

impl Comm {
    /// An AllGather chunk at stream position `pos` from `conn`.
    pub(super) fn on_gather_data(
        &mut self,
        conn: usize,
        coll_idx: usize,
        pos: u64,
        payload: &[u8],
        crc_source: Option<FrameCrc<'_>>,
    ) -> Disposition {
        let coll = &self.collectives[coll_idx];
        let claim = coll.claim.expect("data follows a Start");
        let (seq, free) = (coll.seq, coll.gather_free);
        let rel = pos.wrapping_sub(claim.start_pos);
        let may_send = self.gather_may_send(coll_idx);
        let all_now = may_send
            && receivers_of(self, conn)
                .all(|d| coll.gather_next_to[d] == rel && self.conns[d].data_room());
        let crc = shared_crc(payload, receivers_of(self, conn).count(), crc_source);
        if !all_now {
            // Held for the destinations not at it yet, in the slot of its position, which
            // no position before it may still hold: a pool's worth ahead, it comes later.
            if rel.saturating_sub(free) >= self.slots.len() as u64 {
                self.counters.slot_conflicts += 1;
                return Disposition::Rnr;
            }
            let source = self.conns[conn].child_ordinal.unwrap_or(0);
            match self.contribute(conn, seq, pos, source, &claim.op, payload) {
                Ok((slot, _)) => {
                    self.held_crc[slot] = crc;
                    self.counters.gather_chunks_held += 1;
                }
                Err(disposition) => return disposition,
            }
        } else if self.conns[conn].child_ordinal.is_some() {
            self.counters.chunks_passed_through += 1;
        }
        self.next_chunk(conn);
        self.collectives[coll_idx].gather_arrived += 1;
        if may_send {
            // Straight from the frame to every destination whose cursor is at it.
            let up = receiving_parent(&self.conns, self.parent);
            let Comm { conns, child_conn, collectives, rank_conn, rules, .. } = self;
            let next_to = &mut collectives[coll_idx].gather_next_to;
            for d in receivers(child_conn, up, conn) {
                if next_to[d] == rel && conns[d].data_room() {
                    conns[d].send_data(payload, crc.as_ref());
                    next_to[d] = next_owed(rank_conn, rules.world_size, claim.chunks, d, rel + 1);
                }
            }
        }
        self.send_gathered();
        Disposition::Accept
    }

    /// The cursors of an AllGather that just became ready: each receiving connection
    /// is owed its first position, the others nothing.
    pub(super) fn init_gather_cursors(&mut self, coll_idx: usize) {
        let chunks = self.collectives[coll_idx].chunks();
        let up = receiving_parent(&self.conns, self.parent);
        let cursors = (0..self.conns.len())
            .map(|d| {
                let receives = Some(d) != self.parent || up.is_some();
                match receives {
                    true => next_owed(&self.rank_conn, self.rules.world_size, chunks, d, 0),
                    false => chunks,
                }
            })
            .collect();
        self.collectives[coll_idx].gather_next_to = cursors;
    }

    /// Whether AllGather `coll_idx` may send now: it is ready, and no earlier
    /// collective still has results to send (they must not be overtaken).
    fn gather_may_send(&self, coll_idx: usize) -> bool {
        self.collectives[coll_idx].ready
            && self.completed_slots.is_empty()
            && self.collectives.iter().take(coll_idx).all(|c| c.sent_everything())
    }

    /// Sends the AllGather positions held in slots that destinations' cursors have
    /// reached, collective by collective in stream order, while the destinations have
    /// room; frees what every destination has; retires the AllGathers that are done.
    pub(super) fn send_gathered(&mut self) {
        let mut finished = Vec::new();
        for coll_idx in 0..self.collectives.len() {
            let coll = &self.collectives[coll_idx];
            if coll.failed || !coll.is_gather() {
                if coll.sent_everything() {
                    continue;
                }
                break;
            }
            if !self.gather_may_send(coll_idx) {
                break;
            }
            for d in 0..self.conns.len() {
                self.send_held_to(coll_idx, d);
            }
            self.free_passed(coll_idx);
            let coll = &self.collectives[coll_idx];
            if !coll.sent_everything() {
                break;
            }
            finished.push(coll.seq);
        }
        for seq in finished {
            self.maybe_retire(seq);
        }
    }

    /// Sends connection `d` the held positions its cursor reaches, while it has room.
    fn send_held_to(&mut self, coll_idx: usize, d: usize) {
        let coll = &self.collectives[coll_idx];
        let claim = coll.claim.expect("ready");
        let (seq, chunks) = (coll.seq, claim.chunks);
        loop {
            let rel = self.collectives[coll_idx].gather_next_to[d];
            if rel >= chunks || !self.conns[d].data_room() {
                return;
            }
            let pos = claim.start_pos.wrapping_add(rel);
            let slot = self.slots.slot_of(pos);
            let held = self.slots.meta(slot);
            if held.state == SlotState::Free || held.seq != seq || held.pos != pos {
                return;
            }
            let from = self.gather_source(rel);
            let source = ChildMask::single(self.conns[from].child_ordinal.unwrap_or(0));
            let Comm { conns, slots, held_crc, collectives, rank_conn, rules, .. } = self;
            let data = slots.aggregate(slot, &claim.op, source);
            conns[d].send_data(data, held_crc[slot].as_ref());
            collectives[coll_idx].gather_next_to[d] =
                next_owed(rank_conn, rules.world_size, chunks, d, rel + 1);
        }
    }

    /// Moves the free cursor over the positions every destination has, freeing their
    /// slots.
    fn free_passed(&mut self, coll_idx: usize) {
        let (seq, start, chunks) = {
            let c = &self.collectives[coll_idx];
            (c.seq, c.claim.expect("ready").start_pos, c.chunks())
        };
        loop {
            let f = self.collectives[coll_idx].gather_free;
            if f >= chunks {
                return;
            }
            let from = self.gather_source(f);
            let next_to = &self.collectives[coll_idx].gather_next_to;
            if receivers_of(self, from).any(|d| next_to[d] <= f) {
                return;
            }
            let slot = self.slots.slot_of(start.wrapping_add(f));
            let held = self.slots.meta(slot);
            if held.state != SlotState::Free && held.seq == seq && held.pos == start + f {
                self.slots.free(slot);
                self.held_crc[slot] = None;
            }
            if Some(from) == self.parent {
                self.counters.chunks_down += 1;
            } else {
                self.counters.chunks_aggregated += 1;
            }
            self.collectives[coll_idx].gather_free += 1;
        }
    }

    /// The connection an AllGather position (relative to its start) comes from: the
    /// one behind which its block's rank sits.
    fn gather_source(&self, rel: u64) -> usize {
        let (rank, _) = coll::gather_chunk_at(rel, self.rules.world_size);
        self.rank_conn[usize::from(rank)]
    }
}

/// The parent, when ranks lie beyond it: it is sent the positions that come from
/// children.
fn receiving_parent(conns: &[Conn], parent: Option<usize>) -> Option<usize> {
    parent.filter(|&p| !conns[p].ranks.is_empty())
}

/// The connections a position from `from` goes to: every child but `from`, and the
/// receiving parent `up` unless the position came from it.
fn receivers(
    child_conn: &[usize],
    up: Option<usize>,
    from: usize,
) -> impl Iterator<Item = usize> + '_ {
    child_conn.iter().copied().filter(move |&c| c != from).chain(up.filter(|&p| p != from))
}

fn receivers_of(comm: &Comm, from: usize) -> impl Iterator<Item = usize> + '_ {
    receivers(&comm.child_conn, receiving_parent(&comm.conns, comm.parent), from)
}

/// The first position at or after `rel` that connection `d` is owed: one that does not
/// come from `d` (`rank_conn`: the connection behind which each rank sits), or `chunks`.
fn next_owed(rank_conn: &[usize], world: u16, chunks: u64, d: usize, mut rel: u64) -> u64 {
    let world = u64::from(world.max(1));
    while rel < chunks && rank_conn[(rel % world) as usize] == d {
        rel += 1;
    }
    rel.min(chunks)
}

#[cfg(test)]
mod tests {
    use super::next_owed;

    #[test]
    fn a_cursor_skips_the_positions_its_connection_sends() {
        // Ranks 0 and 1 behind connection 0, ranks 2 and 3 behind connection 1.
        let rank_conn = [0, 0, 1, 1];
        assert_eq!(next_owed(&rank_conn, 4, 12, 0, 0), 2);
        assert_eq!(next_owed(&rank_conn, 4, 12, 0, 3), 3);
        assert_eq!(next_owed(&rank_conn, 4, 12, 0, 4), 6);
        assert_eq!(next_owed(&rank_conn, 4, 12, 1, 2), 4);
        assert_eq!(next_owed(&rank_conn, 4, 12, 1, 10), 12, "nothing more: the end");
        assert_eq!(next_owed(&rank_conn, 4, 12, 2, 5), 5, "a connection that sends nothing");
    }
}
