//! Control messages: Start (children announce a collective), Progress (delivery counts)
//! and Error (a collective failed somewhere).

use std::collections::VecDeque;

use inc_protocol::coll::{self, field, CtrlMsg};
use inc_wire::Primitive;

use super::collective::{ExpectedData, Layout, StartClaim, Whose};
use super::failure::Verdict;
use super::roles::{self, View};
use super::{Comm, Disposition};
use crate::SwitchEvent;

impl Comm {
    pub(super) fn on_control(
        &mut self,
        conn: usize,
        imm: u32,
        payload: &[u8],
        events: &mut VecDeque<SwitchEvent>,
    ) -> Disposition {
        let Ok((op, msg, data)) = CtrlMsg::parse_with_data(imm, payload) else {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        };
        // A control message ends whatever data of failed collectives was still expected.
        while let Some(expected) = self.conns[conn].expected.front() {
            match self.find_collective(expected.seq) {
                Some(coll_idx) if !self.collectives[coll_idx].failed => break,
                _ => {
                    self.conns[conn].expected.pop_front();
                }
            }
        }
        let from_parent = Some(conn) == self.parent;
        match msg {
            CtrlMsg::Start { seq, count, start_pos, chunks, rank } if !from_parent => {
                let claim = StartClaim { op, count, start_pos, chunks, rank };
                match data {
                    None => self.on_start(conn, seq, claim, events),
                    Some(chunk) => self.on_start_with_data(conn, seq, claim, chunk, events),
                }
            }
            CtrlMsg::Progress { seq, completed } if from_parent => {
                self.on_parent_progress(seq, completed);
                Disposition::Accept
            }
            CtrlMsg::Progress { seq, completed } => {
                self.on_child_progress(conn, seq, completed);
                Disposition::Accept
            }
            CtrlMsg::Error { seq, code, fields, rank_a, rank_b } => {
                // The Error is the last message of `seq` on this connection.
                self.conns[conn].expected.retain(|e| e.seq != seq);
                let existing =
                    if from_parent { self.find_collective(seq) } else { self.find_or_create(seq) };
                let Some(coll_idx) = existing else {
                    if from_parent {
                        // Still tell the hosts: they may not have started `seq` yet.
                        for child in self.child_conn.clone() {
                            self.send_control(child, &op, msg);
                        }
                    }
                    return Disposition::Accept;
                };
                if let Some(child) = self.conns[conn].child_ordinal {
                    self.collectives[coll_idx].errored.insert(child);
                }
                if !self.collectives[coll_idx].failed {
                    let verdict = Verdict { code, fields, rank_a, rank_b };
                    self.fail_collective(seq, verdict, events);
                } else {
                    self.maybe_retire(seq);
                }
                Disposition::Accept
            }
            _ => {
                self.counters.protocol_errors += 1;
                Disposition::Accept
            }
        }
    }

    /// A Start and the first chunk it announces, in one message. Either both apply or,
    /// with an RNR NAK, neither: the peer resends the whole message.
    fn on_start_with_data(
        &mut self,
        conn: usize,
        seq: u32,
        claim: StartClaim,
        chunk: &[u8],
        events: &mut VecDeque<SwitchEvent>,
    ) -> Disposition {
        if self.slots.is_busy_for(claim.start_pos) {
            self.counters.slot_conflicts += 1;
            return Disposition::Rnr;
        }
        if let Disposition::Rnr = self.on_start(conn, seq, claim, events) {
            return Disposition::Rnr;
        }
        // A Start refused as a protocol error announced nothing: nothing expects the chunk.
        let announced =
            self.conns[conn].expected.front().is_some_and(|e| e.seq == seq && e.next_chunk == 0);
        if !announced {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        }
        self.conns[conn].rx_data += 1;
        // Cannot be an RNR: the slot was free (or held this chunk's position) above,
        // and the Start only ever frees slots.
        self.on_data(conn, chunk, None, events)
    }

    fn on_start(
        &mut self,
        conn: usize,
        seq: u32,
        claim: StartClaim,
        events: &mut VecDeque<SwitchEvent>,
    ) -> Disposition {
        let child = self.conns[conn].child_ordinal.expect("Starts come from children");
        if self.retired.contains(&seq) {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        }
        let Some(coll_idx) = self.find_or_create(seq) else {
            // Too far ahead of the slowest child: let it come back later.
            return Disposition::Rnr;
        };
        if self.collectives[coll_idx].started.contains(child) {
            self.counters.protocol_errors += 1;
            return Disposition::Accept;
        }
        self.collectives[coll_idx].started.insert(child);
        // The data this child will send, by its own account: parseable even on mismatch.
        let world = self.rules.world_size;
        let (sends, chunks, layout) = match claim.op.primitive {
            Primitive::Broadcast => {
                let root_here = self.conns[conn].ranks.binary_search(&claim.op.root).is_ok();
                (root_here, claim.chunks, Layout::Vector)
            }
            // The blocks of the ranks behind the child.
            Primitive::AllGather => {
                let behind = self.conns[conn].ranks.len() as u64;
                let chunks = coll::chunks_of_blocks(claim.chunks, world, behind);
                (true, chunks, Layout::Blocks { world, of: Whose::Behind })
            }
            _ if claim.op.is_scatter() => {
                (true, claim.chunks, Layout::Blocks { world, of: Whose::Everyone })
            }
            _ => (true, claim.chunks, Layout::Vector),
        };
        if sends {
            self.conns[conn].expected.push_back(ExpectedData {
                seq,
                start_pos: claim.start_pos,
                bytes: claim.bytes(),
                next_chunk: 0,
                chunks,
                layout,
            });
        }
        if self.collectives[coll_idx].failed {
            // Repeat the verdict to a child that starts late: its host may have missed it.
            if let Some((op, msg)) = self.collectives[coll_idx].verdict {
                if self.send_control(conn, &op, msg) {
                    self.counters.errors_sent += 1;
                }
            }
            self.maybe_retire(seq);
            return Disposition::Accept;
        }
        if let Some(reason) = claim.inconsistency(self.mtu, self.rules.world_size) {
            tracing::warn!(comm = self.rules.comm_id, seq, "{reason}");
            self.counters.protocol_errors += 1;
            self.fail_collective(seq, Verdict::protocol(claim.rank), events);
            return Disposition::Accept;
        }
        match self.collectives[coll_idx].claim {
            None => self.collectives[coll_idx].claim = Some(claim),
            Some(first) => {
                let fields = first.mismatched_fields(&claim);
                if fields != 0 {
                    self.counters.mismatches += 1;
                    tracing::warn!(
                        comm = self.rules.comm_id,
                        seq,
                        rank_a = first.rank,
                        rank_b = claim.rank,
                        "operation mismatch: {}",
                        field::names(fields)
                    );
                    let verdict = Verdict::mismatch(fields, first.rank, claim.rank);
                    self.fail_collective(seq, verdict, events);
                    return Disposition::Accept;
                }
            }
        }
        if self.collectives[coll_idx].started == self.all_children {
            self.make_ready(seq, events);
        }
        Disposition::Accept
    }

    /// Every child started and agreed: fix the roles, tell the parent, and send on
    /// whatever completed while the Starts were still arriving.
    fn make_ready(&mut self, seq: u32, events: &mut VecDeque<SwitchEvent>) {
        let coll_idx = self.find_collective(seq).expect("exists");
        let claim = self.collectives[coll_idx].claim.expect("every child started");
        let root_conn = if claim.op.rooted() {
            self.child_conn
                .iter()
                .copied()
                .find(|&c| self.conns[c].ranks.binary_search(&claim.op.root).is_ok())
        } else {
            None
        };
        let view = View {
            has_parent: self.parent.is_some(),
            ranks_beyond_parent: self.parent.map_or(0, |p| self.conns[p].ranks.len() as u16),
            world: self.rules.world_size,
            children: self.all_children,
            root_child: root_conn.map(|c| self.conns[c].child_ordinal.expect("child")),
            root_child_is_host: root_conn.is_some_and(|c| self.conns[c].is_host()),
            scatter: claim.op.is_scatter(),
        };
        let roles = match roles::assign(claim.op.primitive, claim.chunks, view) {
            Ok(roles) => roles,
            Err(reason) => {
                self.counters.protocol_errors += 1;
                tracing::warn!(comm = self.rules.comm_id, seq, root = claim.op.root, "{reason}");
                let verdict = Verdict { rank_b: claim.op.root, ..Verdict::protocol(claim.rank) };
                self.fail_collective(seq, verdict, events);
                return;
            }
        };
        let coll = &mut self.collectives[coll_idx];
        coll.roles = roles;
        coll.ready = true;
        if claim.op.primitive == Primitive::AllGather {
            self.init_gather_cursors(coll_idx);
        }
        if let Some(parent) = self.parent {
            let msg = CtrlMsg::Start {
                seq,
                count: claim.count,
                start_pos: claim.start_pos,
                chunks: claim.chunks,
                rank: self.lowest_rank_below,
            };
            self.send_control(parent, &claim.op, msg);
            if roles.chunks_from_parent > 0 {
                // An AllGather's blocks of the ranks beyond the parent, a ReduceScatter's
                // results for the ranks below.
                let world = self.rules.world_size;
                let layout = match claim.op.primitive {
                    Primitive::AllGather => Layout::Blocks { world, of: Whose::Behind },
                    _ if claim.op.is_scatter() => Layout::Blocks { world, of: Whose::Below },
                    _ => Layout::Vector,
                };
                self.conns[parent].expected.push_back(ExpectedData {
                    seq,
                    start_pos: claim.start_pos,
                    bytes: claim.bytes(),
                    next_chunk: 0,
                    chunks: roles.chunks_from_parent,
                    layout,
                });
            }
        }
        // An AllGather's early positions wait in their slots for their turn (below).
        if claim.op.primitive != Primitive::AllGather {
            for slot in self.slots.filled_early(seq, roles.contributors) {
                self.slots.mark_complete(slot);
                self.completed_slots.push_back(slot);
            }
        }
        self.send_completed();
        self.flush_all_progress();
        self.maybe_retire(seq);
    }
}
