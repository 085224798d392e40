//! The state one switch keeps per running collective, and the decisions that depend on
//! that state alone.

use std::collections::VecDeque;

use inc_protocol::coll::{self, field, CollOp, CtrlMsg};
use inc_wire::{Operator, Primitive, Psn};

use super::mask::ChildMask;
use super::roles::Roles;

/// What a child's Start says about the collective. Every child must say the same; the
/// first claim is the one the others are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StartClaim {
    pub(crate) op: CollOp,
    pub(crate) count: u64,
    pub(crate) start_pos: u64,
    pub(crate) chunks: u64,
    /// Lowest rank behind the child (names the culprit in errors).
    pub(crate) rank: u16,
}

impl StartClaim {
    pub(crate) fn bytes(&self) -> u64 {
        self.count.saturating_mul(self.op.datatype.size() as u64)
    }

    /// Why the claim cannot be true on its own, if it cannot.
    pub(crate) fn inconsistency(&self, mtu: usize, world_size: u16) -> Option<String> {
        let s = self;
        let chunks = match s.op.primitive == Primitive::AllGather || s.op.is_scatter() {
            true => coll::gather_chunks(s.count, s.op.datatype.size(), mtu, world_size),
            false => coll::chunk_count(s.count, s.op.datatype.size(), mtu),
        };
        if s.chunks != chunks {
            Some(format!("rank {} announced {} chunks for {} elements", s.rank, s.chunks, s.count))
        } else if s.op.rooted() && s.op.root >= world_size && !s.op.is_scatter() {
            Some(format!(
                "rank {} named root {} outside world size {world_size}",
                s.rank, s.op.root
            ))
        } else if s.op.operator == Operator::Barrier
            && (s.count != 0 || s.op.primitive != Primitive::AllReduce)
        {
            Some(format!("rank {} sent a barrier with data", s.rank))
        } else {
            None
        }
    }

    /// The fields (`coll::field` bits) in which `other` disagrees with this claim.
    pub(crate) fn mismatched_fields(&self, other: &StartClaim) -> u16 {
        let (a, b) = (self, other);
        let mut fields = 0;
        if a.op.primitive != b.op.primitive {
            fields |= field::PRIMITIVE;
        }
        if a.op.operator != b.op.operator {
            fields |= field::OPERATOR;
        }
        if a.op.datatype != b.op.datatype {
            fields |= field::DATATYPE;
        }
        if a.op.rooted() && a.op.root != b.op.root {
            fields |= field::ROOT;
        }
        if a.count != b.count {
            fields |= field::COUNT;
        }
        if a.start_pos != b.start_pos {
            fields |= field::START;
        }
        fields
    }
}

/// Data chunks a connection will still deliver for one collective. Data carries no
/// header: its position follows from arrival order against this expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExpectedData {
    pub(crate) seq: u32,
    pub(crate) start_pos: u64,
    /// Bytes of the vector (a ReduceScatter or AllGather: of one block).
    pub(crate) bytes: u64,
    pub(crate) next_chunk: u64,
    pub(crate) chunks: u64,
    pub(crate) layout: Layout,
}

/// What a connection sends of a collective, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One vector, chunk after chunk.
    Vector,
    /// Of `world` interleaved blocks (`coll::gather_position`) ...
    Blocks { world: u16, of: Whose },
}

/// ... the chunks of the blocks of:
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whose {
    /// every rank (a ReduceScatter's contributions);
    Everyone,
    /// the ranks behind the connection (an AllGather's blocks);
    Behind,
    /// the ranks below this switch (a ReduceScatter's results from the parent).
    Below,
}

impl ExpectedData {
    /// Stream position and payload length of the next chunk, given the ranks behind
    /// the connection it comes from and those below this switch.
    pub(crate) fn next(&self, behind: &[u16], below: &[u16], mtu: usize) -> (u64, usize) {
        let k = self.next_chunk;
        let (rel, chunk) = match self.layout {
            Layout::Vector => (k, k),
            Layout::Blocks { world, of } => {
                let rel = match of {
                    Whose::Everyone => k,
                    Whose::Behind => coll::gather_position(k, behind, world),
                    Whose::Below => coll::gather_position(k, below, world),
                };
                (rel, coll::gather_chunk_at(rel, world).1)
            }
        };
        (self.start_pos.wrapping_add(rel), coll::chunk_range(chunk, self.bytes, mtu).1)
    }
}

#[derive(Debug)]
pub(crate) struct Collective {
    pub(crate) seq: u32,
    /// The first Start claim; later ones must match it.
    pub(crate) claim: Option<StartClaim>,
    /// Children whose Start arrived.
    pub(crate) started: ChildMask,
    /// Children that sent an Error for it.
    pub(crate) errored: ChildMask,
    /// Roles are fixed (every child started, no verdict).
    pub(crate) ready: bool,
    pub(crate) failed: bool,
    /// The Error sent when it failed, repeated to children that start late.
    pub(crate) verdict: Option<(CollOp, CtrlMsg)>,
    pub(crate) roles: Roles,
    /// Chunks aggregated here and sent on.
    pub(crate) chunks_aggregated: u64,
    /// Chunks received from the parent and sent down.
    pub(crate) chunks_from_parent: u64,
    /// An AllGather's positions received ...
    pub(crate) gather_arrived: u64,
    /// ... the next position each connection (rules index) is owed (empty until ready)
    /// ...
    pub(crate) gather_next_to: Vec<u64>,
    /// ... and the positions every destination has (their slots are free).
    pub(crate) gather_free: u64,
    /// Per child ordinal: the completion count it should be told ...
    pub(crate) progress_due: Vec<u64>,
    /// ... and the count it was last told.
    pub(crate) progress_told: Vec<u64>,
    /// Chunks delivered to every receiver beyond this switch (Reduce: the root rank;
    /// Broadcast: all other ranks): the minimum over the delivery sources.
    pub(crate) delivered: u64,
    /// The delivered count last told to the parent.
    pub(crate) delivery_told_parent: u64,
    /// Per connection (rules index): chunks it confirmed delivered.
    pub(crate) confirmed: Vec<u64>,
    /// Per connection: PSNs of results sent to a receiving host whose ACKs confirm
    /// delivery, not yet ACKed.
    pub(crate) unacked_results: Vec<VecDeque<Psn>>,
}

impl Collective {
    pub(crate) fn new(seq: u32, children: usize, connections: usize) -> Collective {
        Collective {
            seq,
            claim: None,
            started: ChildMask::EMPTY,
            errored: ChildMask::EMPTY,
            ready: false,
            failed: false,
            verdict: None,
            roles: Roles::default(),
            chunks_aggregated: 0,
            chunks_from_parent: 0,
            gather_arrived: 0,
            gather_next_to: Vec::new(),
            gather_free: 0,
            progress_due: vec![0; children],
            progress_told: vec![0; children],
            delivered: 0,
            delivery_told_parent: 0,
            confirmed: vec![0; connections],
            unacked_results: vec![VecDeque::new(); connections],
        }
    }

    /// Remembers a result sent to `child` on connection `conn` when that is a receiving
    /// host (`to_host`) whose ACKs measure delivery.
    pub(crate) fn note_result_sent(
        &mut self,
        child: usize,
        conn: usize,
        to_host: bool,
        psn: Option<Psn>,
    ) {
        if to_host && self.roles.delivery_from_children.contains(child) {
            self.unacked_results[conn].extend(psn);
        }
    }

    pub(crate) fn chunks(&self) -> u64 {
        self.claim.map_or(0, |c| c.chunks)
    }

    pub(crate) fn is_gather(&self) -> bool {
        self.claim.is_some_and(|c| c.op.primitive == Primitive::AllGather)
    }

    /// Everything this switch sends for it has been sent (or it failed): a later
    /// collective's unaggregated data may follow without overtaking its results.
    pub(crate) fn sent_everything(&self) -> bool {
        if self.failed {
            return true;
        }
        if !self.ready {
            return false;
        }
        if self.is_gather() {
            return self.gather_arrived >= self.chunks() && self.gather_free >= self.chunks();
        }
        let aggregated_total = if self.roles.contributors.is_empty() { 0 } else { self.chunks() };
        self.chunks_aggregated >= aggregated_total
            && self.chunks_from_parent >= self.roles.chunks_from_parent
    }

    /// Recomputes `delivered` from the confirmations and queues it for the children told
    /// about delivery. `child_conn` maps child ordinals to rules indices.
    pub(crate) fn recompute_delivered(&mut self, child_conn: &[usize], parent: Option<usize>) {
        let roles = self.roles;
        if roles.tell_delivery.is_empty() && !roles.delivery_to_parent {
            return;
        }
        let mut delivered = u64::MAX;
        for child in roles.delivery_from_children.iter() {
            delivered = delivered.min(self.confirmed[child_conn[child]]);
        }
        if roles.delivery_from_parent {
            let parent = parent.expect("delivery from the parent only below the root");
            delivered = delivered.min(self.confirmed[parent]);
        }
        // Nobody beyond this switch receives: what left the slot pool is delivered.
        if delivered == u64::MAX {
            delivered = self.chunks_aggregated;
        }
        self.delivered = self.delivered.max(delivered.min(self.chunks()));
        for child in roles.tell_delivery.iter() {
            self.progress_due[child] = self.progress_due[child].max(self.delivered);
        }
    }

    /// Nothing more will arrive or leave for it: its state can go.
    pub(crate) fn is_finished(&self, all_children: ChildMask) -> bool {
        if self.failed {
            // Every child has either started (and was told the verdict) or errored.
            return (self.started | self.errored) == all_children;
        }
        if !self.ready {
            return false;
        }
        let roles = &self.roles;
        let chunks = self.chunks();
        let told = roles.tell_delivery | roles.forward_parent_progress;
        self.sent_everything()
            && told.iter().all(|child| self.progress_told[child] >= chunks)
            && (!roles.delivery_to_parent || self.delivery_told_parent >= chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inc_wire::{DataType, IncImm};

    fn claim(primitive: Primitive, count: u64, mtu: usize) -> StartClaim {
        StartClaim {
            op: CollOp {
                primitive,
                operator: Operator::Sum,
                datatype: DataType::Int32,
                root: if primitive == Primitive::AllReduce { IncImm::ALL_RANKS } else { 1 },
            },
            count,
            start_pos: 40,
            chunks: coll::chunk_count(count, 4, mtu),
            rank: 3,
        }
    }

    #[test]
    fn claims_checked_on_their_own() {
        let good = claim(Primitive::AllReduce, 1000, 256);
        assert_eq!(good.chunks, 16);
        assert_eq!(good.bytes(), 4000);
        assert_eq!(good.inconsistency(256, 4), None);
        let wrong_chunks = StartClaim { chunks: 15, ..good };
        assert!(wrong_chunks.inconsistency(256, 4).unwrap().contains("15 chunks"));
        let mut bad_root = claim(Primitive::Reduce, 10, 256);
        bad_root.op.root = 4;
        assert!(bad_root.inconsistency(256, 4).unwrap().contains("root 4"));
        let mut barrier = claim(Primitive::AllReduce, 0, 256);
        barrier.op.operator = Operator::Barrier;
        assert_eq!(barrier.inconsistency(256, 4), None);
        let heavy = StartClaim { count: 1, chunks: 1, ..barrier };
        assert!(heavy.inconsistency(256, 4).unwrap().contains("barrier with data"));
    }

    #[test]
    fn mismatches_name_every_differing_field() {
        let a = claim(Primitive::Reduce, 100, 256);
        assert_eq!(a.mismatched_fields(&a), 0);
        let mut b = a;
        b.op.operator = Operator::Max;
        b.count = 101;
        assert_eq!(a.mismatched_fields(&b), field::OPERATOR | field::COUNT);
        let mut c = a;
        c.op.root = 2;
        c.start_pos = 0;
        c.op.datatype = DataType::Float32;
        assert_eq!(a.mismatched_fields(&c), field::ROOT | field::START | field::DATATYPE);
        // The root does not matter to AllReduce.
        let all = claim(Primitive::AllReduce, 100, 256);
        let other_root = StartClaim { op: CollOp { root: 0, ..all.op }, ..all };
        assert_eq!(all.mismatched_fields(&other_root), 0);
        assert_eq!(all.mismatched_fields(&a), field::PRIMITIVE);
        // A ReduceScatter (a Reduce to every rank) against a Reduce to rank 1.
        let scatter = StartClaim { op: CollOp { root: IncImm::ALL_RANKS, ..a.op }, ..a };
        assert_eq!(a.mismatched_fields(&scatter), field::ROOT);
    }

    fn reduce_collective() -> Collective {
        // Three connections: children 0 and 1 are connections 0 and 2, the parent is 1.
        let mut c = Collective::new(9, 2, 3);
        c.claim = Some(claim(Primitive::Reduce, 1000, 256));
        c.ready = true;
        c.roles = Roles {
            contributors: ChildMask::first(2),
            up_to_parent: true,
            chunks_from_parent: 16,
            down_to_children: ChildMask::single(1),
            delivery_from_children: ChildMask::single(1),
            tell_delivery: ChildMask::single(0),
            delivery_to_parent: true,
            ..Roles::default()
        };
        c
    }

    #[test]
    fn delivered_is_the_minimum_confirmation_and_never_goes_back() {
        let child_conn = [0, 2];
        let mut c = reduce_collective();
        c.confirmed[2] = 5;
        c.recompute_delivered(&child_conn, Some(1));
        assert_eq!(c.delivered, 5);
        assert_eq!(c.progress_due, vec![5, 0]);
        c.confirmed[2] = 3;
        c.recompute_delivered(&child_conn, Some(1));
        assert_eq!(c.delivered, 5, "a confirmation never goes backwards");
        c.confirmed[2] = 99;
        c.recompute_delivered(&child_conn, Some(1));
        assert_eq!(c.delivered, 16, "capped at the chunk count");
        // With the parent also a source, the smaller count wins.
        let mut c = reduce_collective();
        c.roles.delivery_from_parent = true;
        c.confirmed[2] = 7;
        c.confirmed[1] = 4;
        c.recompute_delivered(&child_conn, Some(1));
        assert_eq!(c.delivered, 4);
    }

    #[test]
    fn without_receivers_beyond_delivery_follows_aggregation() {
        let mut c = reduce_collective();
        c.roles.delivery_from_children = ChildMask::EMPTY;
        c.chunks_aggregated = 6;
        c.recompute_delivered(&[0, 2], Some(1));
        assert_eq!(c.delivered, 6);
        // Nobody to tell: nothing is computed.
        let mut c = reduce_collective();
        c.roles.tell_delivery = ChildMask::EMPTY;
        c.roles.delivery_to_parent = false;
        c.confirmed[2] = 8;
        c.recompute_delivered(&[0, 2], Some(1));
        assert_eq!(c.delivered, 0);
    }

    #[test]
    fn finished_only_when_every_stream_is_done() {
        let all = ChildMask::first(2);
        let mut c = reduce_collective();
        assert!(!c.is_finished(all));
        c.chunks_aggregated = 16;
        c.chunks_from_parent = 16;
        c.progress_told[0] = 16;
        assert!(!c.is_finished(all), "the parent was not told the delivery yet");
        c.delivery_told_parent = 16;
        assert!(c.is_finished(all));
        let mut waiting = Collective::new(1, 2, 3);
        assert!(!waiting.is_finished(all));
        waiting.failed = true;
        waiting.started = ChildMask::single(0);
        assert!(!waiting.is_finished(all), "child 1 has neither started nor errored");
        waiting.errored = ChildMask::single(1);
        assert!(waiting.is_finished(all));
    }
}
