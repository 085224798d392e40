//! Delivery tracking and Progress messages.
//!
//! A rank that sends data for a Reduce or Broadcast may only complete once every
//! receiver has the data. Receivers confirm delivery by ACKing result packets (a host) or
//! with Progress messages (a switch below); each switch folds those into a delivered
//! count and passes it on as Progress, coalesced every `progress_every` chunks.

use inc_protocol::coll::CtrlMsg;
use inc_wire::Psn;

use super::Comm;

/// Whether a completion count `due` must be told now to someone last told `told`.
fn progress_due(due: u64, told: u64, every: u64, chunks: u64, force: bool) -> bool {
    due > told && (force || due - told >= every || due == chunks)
}

impl Comm {
    pub(super) fn on_parent_progress(&mut self, seq: u32, completed: u64) {
        let Some(coll_idx) = self.find_collective(seq) else {
            self.counters.protocol_errors += 1;
            return;
        };
        if self.collectives[coll_idx].failed {
            return;
        }
        let coll = &mut self.collectives[coll_idx];
        let completed = completed.min(coll.chunks());
        if coll.roles.delivery_from_parent {
            let parent = self.parent.expect("delivery from the parent only below the root");
            coll.confirmed[parent] = coll.confirmed[parent].max(completed);
            self.update_delivered(coll_idx);
        }
        let coll = &mut self.collectives[coll_idx];
        for child in coll.roles.forward_parent_progress.iter() {
            coll.progress_due[child] = coll.progress_due[child].max(completed);
        }
        self.flush_progress(coll_idx, true);
        self.maybe_retire(seq);
    }

    /// A child switch reports chunks delivered below it.
    pub(super) fn on_child_progress(&mut self, conn: usize, seq: u32, completed: u64) {
        let Some(coll_idx) = self.find_collective(seq) else {
            self.counters.protocol_errors += 1;
            return;
        };
        let child = self.conns[conn].child_ordinal.expect("not the parent");
        let coll = &mut self.collectives[coll_idx];
        // Hosts confirm by ACKs; only child switches send Progress up.
        if coll.failed
            || !coll.roles.delivery_from_children.contains(child)
            || self.conns[conn].is_host()
        {
            self.counters.protocol_errors += 1;
            return;
        }
        coll.confirmed[conn] = coll.confirmed[conn].max(completed.min(coll.chunks()));
        self.update_delivered(coll_idx);
        self.flush_progress(coll_idx, true);
        self.maybe_retire(seq);
    }

    /// Remembers a result sent to a receiving host whose ACKs measure delivery.
    pub(super) fn note_result_sent(
        &mut self,
        coll_idx: usize,
        child: usize,
        conn: usize,
        psn: Option<Psn>,
    ) {
        let to_host = self.conns[conn].is_host();
        self.collectives[coll_idx].note_result_sent(child, conn, to_host, psn);
    }

    pub(super) fn update_delivered(&mut self, coll_idx: usize) {
        self.collectives[coll_idx].recompute_delivered(&self.child_conn, self.parent);
    }

    /// Counts results a receiving host has ACKed (called after an ACK on `conn`).
    pub(super) fn count_acked_results(&mut self, conn: usize) {
        let oldest_unacked = self.conns[conn].rc.oldest_unacked();
        for coll_idx in 0..self.collectives.len() {
            let coll = &mut self.collectives[coll_idx];
            let unacked = &mut coll.unacked_results[conn];
            if coll.failed || unacked.is_empty() {
                continue;
            }
            let before = unacked.len();
            while unacked.front().is_some_and(|p| oldest_unacked.is_none_or(|o| p.is_before(o))) {
                unacked.pop_front();
            }
            let acked = (before - unacked.len()) as u64;
            if acked > 0 {
                coll.confirmed[conn] += acked;
                self.update_delivered(coll_idx);
            }
        }
    }

    pub(super) fn flush_all_progress(&mut self) {
        for coll_idx in 0..self.collectives.len() {
            let forwarding = !self.collectives[coll_idx].roles.forward_parent_progress.is_empty();
            self.flush_progress(coll_idx, forwarding);
        }
        // ACKs can finish a collective (Reduce delivery, progress finally sent).
        let mut coll_idx = 0;
        while coll_idx < self.collectives.len() {
            let (seq, before) = (self.collectives[coll_idx].seq, self.collectives.len());
            self.maybe_retire(seq);
            if self.collectives.len() == before {
                coll_idx += 1;
            }
        }
    }

    /// Sends Progress messages that are due: every `progress_every` chunks, at the end,
    /// or at once when `force`d (forwarded progress was already coalesced upstream).
    pub(super) fn flush_progress(&mut self, coll_idx: usize, force: bool) {
        let coll = &self.collectives[coll_idx];
        if !coll.ready || coll.failed {
            return;
        }
        let roles = coll.roles;
        let chunks = coll.chunks();
        let seq = coll.seq;
        let op = coll.claim.expect("ready").op;
        if roles.delivery_to_parent {
            let (due, told) = (coll.delivered, coll.delivery_told_parent);
            if progress_due(due, told, self.progress_every, chunks, force) {
                let parent = self.parent.expect("delivery goes up only below the root");
                if self.send_control(parent, &op, CtrlMsg::Progress { seq, completed: due }) {
                    self.counters.progress_sent += 1;
                    self.collectives[coll_idx].delivery_told_parent = due;
                }
            }
        }
        for child in (roles.tell_delivery | roles.forward_parent_progress).iter() {
            let coll = &self.collectives[coll_idx];
            let (due, told) = (coll.progress_due[child], coll.progress_told[child]);
            if progress_due(due, told, self.progress_every, chunks, force) {
                let to = self.child_conn[child];
                if self.send_control(to, &op, CtrlMsg::Progress { seq, completed: due }) {
                    self.counters.progress_sent += 1;
                    self.collectives[coll_idx].progress_told[child] = due;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::progress_due;

    #[test]
    fn progress_is_coalesced_but_the_end_is_always_told() {
        // Nothing new: never.
        assert!(!progress_due(4, 4, 2, 10, true));
        // Below the coalescing step: only when forced.
        assert!(!progress_due(5, 4, 2, 10, false));
        assert!(progress_due(5, 4, 2, 10, true));
        // A full step.
        assert!(progress_due(6, 4, 2, 10, false));
        // The last chunk goes out at once.
        assert!(progress_due(10, 9, 4, 10, false));
    }
}
