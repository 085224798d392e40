//! Failures: a connection that exhausted its retries fails every running collective of
//! the communicator; a failed collective is reported to every neighbour.

use std::collections::VecDeque;

use inc_protocol::coll::{field, CollOp, CtrlMsg, ErrorCode};
use inc_protocol::RcFailure;
use inc_wire::{DataType, IncImm, Operator, Primitive};

use super::Comm;
use crate::SwitchEvent;

/// Why a collective failed, as the Error message carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Verdict {
    pub(super) code: ErrorCode,
    /// `coll::field` bits of a mismatch.
    pub(super) fields: u16,
    pub(super) rank_a: u16,
    pub(super) rank_b: u16,
}

impl Verdict {
    pub(super) fn protocol(rank: u16) -> Verdict {
        Verdict { code: ErrorCode::Protocol, fields: 0, rank_a: rank, rank_b: rank }
    }

    pub(super) fn connection_failed(rank: u16) -> Verdict {
        Verdict { code: ErrorCode::ConnectionFailed, ..Verdict::protocol(rank) }
    }

    pub(super) fn mismatch(fields: u16, rank_a: u16, rank_b: u16) -> Verdict {
        Verdict { code: ErrorCode::Mismatch, fields, rank_a, rank_b }
    }

    fn reason(&self) -> String {
        let Verdict { code, fields, rank_a, rank_b } = *self;
        match code {
            ErrorCode::Mismatch => {
                format!("ranks {rank_a} and {rank_b} disagree on {}", field::names(fields))
            }
            ErrorCode::ConnectionFailed => format!("connection towards rank {rank_a} failed"),
            ErrorCode::Protocol => format!("protocol error near rank {rank_a}"),
        }
    }

    fn message(&self, seq: u32) -> CtrlMsg {
        let Verdict { code, fields, rank_a, rank_b } = *self;
        CtrlMsg::Error { seq, code, fields, rank_a, rank_b }
    }
}

/// The immediate of an Error for a collective that failed before any Start was valid:
/// hosts match Errors by sequence number, not by operation.
const UNKNOWN_OP: CollOp = CollOp {
    primitive: Primitive::AllReduce,
    operator: Operator::Barrier,
    datatype: DataType::Int32,
    root: IncImm::ALL_RANKS,
};

impl Comm {
    pub(super) fn connection_failed(
        &mut self,
        conn: usize,
        failure: RcFailure,
        events: &mut VecDeque<SwitchEvent>,
    ) {
        let c = &mut self.conns[conn];
        if c.failed {
            return;
        }
        c.failed = true;
        let rank = c.first_rank();
        let rule = &self.rules.connections[conn];
        tracing::warn!(comm = self.rules.comm_id, connection = conn, port = %rule.port, peer = ?rule.peer, "connection failed: {failure}");
        events.push_back(SwitchEvent::ConnectionFailed {
            comm_id: self.rules.comm_id,
            connection: conn,
            port: rule.port.clone(),
            peer: rule.peer,
            local_qpn: rule.local_qpn,
            psn: failure.psn().value(),
            reason: failure.to_string(),
        });
        let running: Vec<u32> =
            self.collectives.iter().filter(|c| !c.failed).map(|c| c.seq).collect();
        for seq in running {
            self.fail_collective(seq, Verdict::connection_failed(rank), events);
        }
    }

    /// Fails collective `seq`: frees its slots, reports it, and sends the Error to every
    /// neighbour.
    pub(super) fn fail_collective(
        &mut self,
        seq: u32,
        verdict: Verdict,
        events: &mut VecDeque<SwitchEvent>,
    ) {
        let Some(coll_idx) = self.find_collective(seq) else { return };
        let coll = &mut self.collectives[coll_idx];
        if coll.failed {
            return;
        }
        coll.failed = true;
        self.counters.collectives_failed += 1;
        let op = coll.claim.map_or(UNKNOWN_OP, |c| c.op);
        let msg = verdict.message(seq);
        coll.verdict = Some((op, msg));
        self.slots.free_collective(seq);
        events.push_back(SwitchEvent::CollectiveFailed {
            comm_id: self.rules.comm_id,
            seq,
            reason: verdict.reason(),
        });
        for conn in 0..self.conns.len() {
            // Also back to where the error came from: on each connection the Error is
            // the delimiter after which no data of `seq` follows.
            if self.send_control(conn, &op, msg) {
                self.counters.errors_sent += 1;
            }
        }
        self.maybe_retire(seq);
        // An AllGather behind it need not wait for it any more.
        self.send_gathered();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_name_the_ranks_and_fields() {
        let v = Verdict::mismatch(field::OPERATOR | field::COUNT, 1, 3);
        let reason = v.reason();
        assert!(reason.starts_with("ranks 1 and 3 disagree on "), "{reason}");
        assert!(reason.contains("operator") && reason.contains("count"), "{reason}");
        assert_eq!(
            v.message(7),
            CtrlMsg::Error {
                seq: 7,
                code: ErrorCode::Mismatch,
                fields: field::OPERATOR | field::COUNT,
                rank_a: 1,
                rank_b: 3
            }
        );
        assert_eq!(Verdict::connection_failed(2).reason(), "connection towards rank 2 failed");
        let p = Verdict::protocol(5);
        assert_eq!(p.reason(), "protocol error near rank 5");
        assert_eq!((p.rank_a, p.rank_b, p.fields), (5, 5, 0));
    }
}
