//! The data path: chunks from children into the slot pool, chunks from the parent down,
//! and completed chunks out.

use std::collections::VecDeque;

use inc_protocol::coll::{self, CollOp};
use inc_protocol::frame;
use inc_wire::icrc::PayloadCrc;

use super::collective::Collective;
use super::failure::Verdict;
use super::mask::ChildMask;
use super::roles::Roles;
use super::slots::Contribution;
use super::{shared_crc, Comm, Conn, Disposition, FrameCrc};
use crate::SwitchEvent;

impl Comm {
    /// A data chunk from `conn`; `crc_source` when `payload` is the whole payload of
    /// its frame (not a chunk behind a control header).
    pub(super) fn on_data(
        &mut self,
        conn: usize,
        payload: &[u8],
        crc_source: Option<FrameCrc<'_>>,
        events: &mut VecDeque<SwitchEvent>,
    ) -> Disposition {
        let Some(&expected) = self.conns[conn].expected.front() else {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        };
        let Some(coll_idx) =
            self.find_collective(expected.seq).filter(|&i| !self.collectives[i].failed)
        else {
            // Data of a failed collective still in flight: consume it.
            self.next_chunk(conn);
            return Disposition::Accept;
        };
        let (pos, len) = expected.next(&self.conns[conn].ranks, &self.ranks_below, self.mtu);
        if payload.len() != len {
            self.counters.protocol_errors += 1;
            self.next_chunk(conn);
            tracing::warn!(
                comm = self.rules.comm_id,
                connection = conn,
                seq = expected.seq,
                chunk = expected.next_chunk,
                "chunk of {} bytes, expected {len}",
                payload.len()
            );
            let rank = self.conns[conn].first_rank();
            self.fail_collective(expected.seq, Verdict::protocol(rank), events);
            return Disposition::Accept;
        }
        if self.collectives[coll_idx].is_gather() {
            self.on_gather_data(conn, coll_idx, pos, payload, crc_source)
        } else if Some(conn) == self.parent {
            self.on_parent_data(conn, coll_idx, pos, payload, crc_source)
        } else {
            self.on_child_data(conn, coll_idx, pos, payload, crc_source)
        }
    }

    /// Puts `source`'s chunk at `pos` from `conn` into its slot: the slot and who has
    /// arrived there, or what to answer (RNR while the slot holds an older chunk; a
    /// protocol error is consumed).
    pub(super) fn contribute(
        &mut self,
        conn: usize,
        seq: u32,
        pos: u64,
        source: usize,
        op: &CollOp,
        payload: &[u8],
    ) -> Result<(usize, ChildMask), Disposition> {
        match self.slots.contribute(seq, pos, source, op, payload) {
            Contribution::Stored { slot, arrived } => Ok((slot, arrived)),
            Contribution::SlotBusy => {
                self.counters.slot_conflicts += 1;
                Err(Disposition::Rnr)
            }
            Contribution::Rejected => {
                self.counters.protocol_errors += 1;
                self.next_chunk(conn);
                Err(Disposition::Accept)
            }
        }
    }

    /// The chunk at the head of `conn`'s expectation was consumed.
    pub(super) fn next_chunk(&mut self, conn: usize) {
        let expected = &mut self.conns[conn].expected;
        if let Some(e) = expected.front_mut() {
            e.next_chunk += 1;
            if e.next_chunk >= e.chunks {
                expected.pop_front();
            }
        }
    }

    fn on_child_data(
        &mut self,
        conn: usize,
        coll_idx: usize,
        pos: u64,
        payload: &[u8],
        crc_source: Option<FrameCrc<'_>>,
    ) -> Disposition {
        let child = self.conns[conn].child_ordinal.expect("data from a child");
        let coll = &self.collectives[coll_idx];
        let seq = coll.seq;
        let op = coll.claim.expect("data follows the child's Start").op;
        if self.passes_through(coll_idx, pos, child) {
            self.send_result_through(coll_idx, pos, payload, crc_source);
            self.counters.chunks_passed_through += 1;
            self.next_chunk(conn);
            self.chunk_done(coll_idx);
            return Disposition::Accept;
        }
        if let Some(slot) = self.completes_now(coll_idx, seq, pos, child) {
            if self.send_result_direct(coll_idx, slot, &op, payload) {
                self.counters.chunks_combined_into_frame += 1;
                self.next_chunk(conn);
                self.result_sent(coll_idx, slot);
                return Disposition::Accept;
            }
        }
        let (slot, arrived) = match self.contribute(conn, seq, pos, child, &op, payload) {
            Ok(stored) => stored,
            Err(disposition) => return disposition,
        };
        self.next_chunk(conn);
        // Before every Start arrived the contributors are unknown; `make_ready` picks up
        // the slots that filled in the meantime.
        let coll = &self.collectives[coll_idx];
        if coll.ready {
            if !coll.roles.contributors.contains(child) {
                self.counters.protocol_errors += 1;
            } else if arrived == coll.roles.contributors {
                self.slots.mark_complete(slot);
                self.completed_slots.push_back(slot);
                self.send_completed();
            }
        }
        Disposition::Accept
    }

    fn on_parent_data(
        &mut self,
        conn: usize,
        coll_idx: usize,
        pos: u64,
        payload: &[u8],
        crc_source: Option<FrameCrc<'_>>,
    ) -> Disposition {
        let roles = self.roles_at(coll_idx, pos);
        if roles
            .down_to_children
            .iter()
            .any(|child| !self.conns[self.child_conn[child]].data_room())
        {
            self.counters.backpressure_rnr += 1;
            return Disposition::Rnr;
        }
        let crc = shared_crc(payload, roles.down_to_children.len(), crc_source);
        for child in roles.down_to_children.iter() {
            let to = self.child_conn[child];
            let psn = self.conns[to].send_data(payload, crc.as_ref());
            self.note_result_sent(coll_idx, child, to, psn);
        }
        self.counters.chunks_down += 1;
        self.collectives[coll_idx].chunks_from_parent += 1;
        self.next_chunk(conn);
        self.after_chunk_sent(coll_idx);
        Disposition::Accept
    }

    /// Whether `child`'s chunk is the whole result and can go out at once without a
    /// slot: `child` is the only contributor (a Broadcast's owner, a switch with one
    /// contributing branch), the collective is ready, no completed chunk waits before
    /// it and every destination has room.
    fn passes_through(&self, coll_idx: usize, pos: u64, child: usize) -> bool {
        let coll = &self.collectives[coll_idx];
        coll.ready
            && coll.roles.contributors == ChildMask::single(child)
            && self.completed_slots.is_empty()
            && self.result_room(self.roles_at(coll_idx, pos))
    }

    /// The roles of collective `coll_idx` for the chunk at `pos`: a ReduceScatter's
    /// result goes down only towards the rank whose block it is.
    fn roles_at(&self, coll_idx: usize, pos: u64) -> Roles {
        let coll = &self.collectives[coll_idx];
        let mut roles = coll.roles;
        if let Some(claim) = coll.claim.filter(|c| c.op.is_scatter()) {
            let world = self.rules.world_size;
            let (rank, _) = coll::gather_chunk_at(pos.wrapping_sub(claim.start_pos), world);
            let towards = self.conns[self.rank_conn[usize::from(rank)]].child_ordinal;
            let owner = towards.map_or(ChildMask::EMPTY, ChildMask::single);
            roles.up_to_children = roles.up_to_children & owner;
            roles.down_to_children = roles.down_to_children & owner;
        }
        roles
    }

    /// Sends a chunk that is its own result ([`Self::passes_through`]) to every
    /// destination straight from the frame it arrived in. Its CRC is read off that
    /// frame's ICRC when `crc_source` has it, so the payload is neither copied into a
    /// slot nor hashed.
    fn send_result_through(
        &mut self,
        coll_idx: usize,
        pos: u64,
        payload: &[u8],
        crc_source: Option<FrameCrc<'_>>,
    ) {
        let roles = self.roles_at(coll_idx, pos);
        let crc = shared_crc(payload, self.result_fan_out(roles), crc_source);
        let Comm { conns, child_conn, parent, collectives, .. } = self;
        send_result(conns, child_conn, *parent, &mut collectives[coll_idx], roles, payload, crc);
    }

    /// The slot `child`'s chunk at `pos` completes, when its result can go out at once:
    /// the collective is ready, no completed chunk waits before it (results leave in
    /// completion order) and every destination has room.
    fn completes_now(&self, coll_idx: usize, seq: u32, pos: u64, child: usize) -> Option<usize> {
        let coll = &self.collectives[coll_idx];
        if !coll.ready || !self.completed_slots.is_empty() {
            return None;
        }
        // The slot's bookkeeping first: most contributions are not the last, and they
        // need no scan of the destinations' queues.
        let slot = self.slots.completed_by(seq, pos, child, coll.roles.contributors)?;
        self.result_room(self.roles_at(coll_idx, pos)).then_some(slot)
    }

    /// How many connections a result goes to: the parent (if it goes up and there is
    /// one) and the children it goes back down to.
    fn result_fan_out(&self, roles: Roles) -> usize {
        usize::from(roles.up_to_parent && self.parent.is_some()) + roles.up_to_children.len()
    }

    /// Whether every destination of a result has send-queue room.
    fn result_room(&self, roles: Roles) -> bool {
        let parent_room =
            !roles.up_to_parent || self.parent.is_none_or(|p| self.conns[p].data_room());
        parent_room
            && roles
                .up_to_children
                .iter()
                .all(|child| self.conns[self.child_conn[child]].data_room())
    }

    /// Sends the result of `slot` combined with its last contribution `payload` without
    /// putting it into the slot: the combine writes straight into the frame for the
    /// first destination (one pass instead of a combine and a copy), the others copy
    /// from that frame. With several destinations the CRC of the result is taken once,
    /// while it is in cache, for every frame's ICRC. `false` (nothing sent) when no
    /// destination is up; the caller then takes the slot path.
    fn send_result_direct(
        &mut self,
        coll_idx: usize,
        slot: usize,
        op: &CollOp,
        payload: &[u8],
    ) -> bool {
        let roles = self.roles_at(coll_idx, self.slots.meta(slot).pos);
        let to_parent = self.parent.filter(|&p| roles.up_to_parent && !self.conns[p].failed);
        let first_child =
            roles.up_to_children.iter().find(|&c| !self.conns[self.child_conn[c]].failed);
        let Some(first) = to_parent.or(first_child.map(|c| self.child_conn[c])) else {
            return false;
        };
        let len = self.slots.meta(slot).len;
        let fan_out = self.result_fan_out(roles);
        let Comm { conns, slots, .. } = self;
        let mut crc = None;
        let sent = if fan_out > 1 {
            conns[first].rc.send_in_place_with_crc(|out| {
                (slots.finish_into(slot, op, payload, out) == len).then(|| {
                    let c = PayloadCrc::new(&out[..len]);
                    crc = Some(c);
                    (len, c)
                })
            })
        } else {
            conns[first].rc.send_in_place(|out| {
                (slots.finish_into(slot, op, payload, out) == len).then_some((None, len))
            })
        };
        let Ok(Some(psn)) = sent else {
            return false;
        };
        self.conns[first].tx_data += 1;
        if to_parent.is_none() {
            let child = first_child.expect("the first destination is a child");
            self.note_result_sent(coll_idx, child, first, Some(psn));
        }
        if let Some(crc) = crc {
            let frame = self.conns[first].rc.newest_frame().expect("just queued");
            let at = frame::send_payload_offset(None);
            let result = &frame[at..at + len];
            for child in roles.up_to_children.iter() {
                let to = self.child_conn[child];
                if to != first {
                    let psn = self.conns[to].send_data(result, Some(&crc));
                    self.note_result_sent(coll_idx, child, to, psn);
                }
            }
        }
        true
    }

    /// Bookkeeping once the result of `slot` went out: the slot is free again.
    fn result_sent(&mut self, coll_idx: usize, slot: usize) {
        self.slots.free(slot);
        self.chunk_done(coll_idx);
    }

    /// Bookkeeping once a chunk's result went out.
    fn chunk_done(&mut self, coll_idx: usize) {
        self.counters.chunks_aggregated += 1;
        self.collectives[coll_idx].chunks_aggregated += 1;
        self.update_delivered(coll_idx);
        self.after_chunk_sent(coll_idx);
    }

    /// After a chunk went down or its result out: Progress, retirement and, once the
    /// collective has sent everything, the AllGathers waiting behind it.
    fn after_chunk_sent(&mut self, coll_idx: usize) {
        let coll = &self.collectives[coll_idx];
        let (seq, sent_everything) = (coll.seq, coll.sent_everything());
        self.flush_progress(coll_idx, false);
        self.maybe_retire(seq);
        if sent_everything {
            self.send_gathered();
        }
    }

    /// Sends completed chunks on, in completion order, while the send queues have room.
    pub(super) fn send_completed(&mut self) {
        while let Some(&slot) = self.completed_slots.front() {
            let seq = self.slots.meta(slot).seq;
            let Some(coll_idx) = self.find_collective(seq).filter(|&i| !self.collectives[i].failed)
            else {
                self.slots.free(slot);
                self.completed_slots.pop_front();
                continue;
            };
            let roles = self.roles_at(coll_idx, self.slots.meta(slot).pos);
            if !self.result_room(roles) {
                break;
            }
            let op = self.collectives[coll_idx].claim.expect("ready").op;
            let fan_out = self.result_fan_out(roles);
            let Comm { conns, child_conn, parent, collectives, slots, .. } = self;
            let data = slots.aggregate(slot, &op, roles.contributors);
            let crc = shared_crc(data, fan_out, None);
            let coll = &mut collectives[coll_idx];
            send_result(conns, child_conn, *parent, coll, roles, data, crc);
            self.completed_slots.pop_front();
            self.result_sent(coll_idx, slot);
        }
        self.send_gathered();
    }
}

/// Sends a chunk's result `data` to the parent (when it goes up) and to the children it
/// goes back down to, and remembers the PSNs whose ACKs confirm delivery. A function of
/// the fields it uses, so that `data` may borrow the slot pool.
fn send_result(
    conns: &mut [Conn],
    child_conn: &[usize],
    parent: Option<usize>,
    coll: &mut Collective,
    roles: Roles,
    data: &[u8],
    crc: Option<PayloadCrc>,
) {
    if let Some(parent) = parent.filter(|_| roles.up_to_parent) {
        conns[parent].send_data(data, crc.as_ref());
    }
    for child in roles.up_to_children.iter() {
        let to = child_conn[child];
        let psn = conns[to].send_data(data, crc.as_ref());
        coll.note_result_sent(child, to, conns[to].is_host(), psn);
    }
}
