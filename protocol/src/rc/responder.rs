//! The responder half of an RC connection: expected PSN and MSN, one NAK per gap,
//! re-ACKed duplicates, coalesced and deferred ACKs and RNR NAKs.

use inc_wire::{AethRepr, AethSyndrome, NakCode, Psn};

use super::{Inbound, RcConnection};
use crate::time::Time;

/// The single response the responder owes: each later event supersedes earlier ones
/// because every response is cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Response {
    Ack,
    SeqNak,
    Rnr,
}

impl RcConnection {
    pub(super) fn on_request(&mut self, now: Time, psn: Psn, ack_req: bool) -> Inbound {
        let d = psn.distance(self.epsn);
        let win = self.cfg.timers.psn_window as i32;
        if d.abs() <= win {
            self.on_peer_request(now);
        }
        if d == 0 {
            self.awaiting = Some((psn, ack_req));
            return Inbound::Request;
        }
        if d.abs() > win {
            self.counters.rx_psn_out_of_window += 1;
            return Inbound::Dropped;
        }
        if d < 0 {
            // C9-105: re-ACK duplicates with the latest state, do not re-process.
            self.counters.rx_duplicates += 1;
            // An owed NAK already implies this ACK; keep it.
            if self.pending.is_none() {
                self.pending = Some(Response::Ack);
            }
        } else {
            self.counters.rx_out_of_order += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                self.pending = Some(Response::SeqNak);
            }
        }
        Inbound::Handled
    }

    /// Accepts the request returned by [`on_packet`](Self::on_packet).
    pub fn accept(&mut self, now: Time) {
        let Some((_, ack_req)) = self.awaiting.take() else { return };
        self.epsn = self.epsn.next();
        self.msn = (self.msn + 1) & Psn::MASK;
        self.nak_sent = false;
        self.counters.rx_requests += 1;
        self.unacked += 1;
        let t = &self.cfg.timers;
        if self.unacked >= t.ack_coalesce || (ack_req && t.ack_req_delay.is_zero()) {
            self.pending = Some(Response::Ack);
        } else if self.pending.is_none() {
            let due = now + if ack_req { t.ack_req_delay } else { t.ack_delay };
            self.ack_due = Some(self.ack_due.map_or(due, |d| d.min(due)));
        }
    }

    /// Owes the ACK of every accepted request at once instead of after `ack_delay` or
    /// `ack_coalesce`: for the last packet of a message whose sender waits for it to be
    /// delivered (its completion would otherwise wait out the delay).
    pub fn ack_now(&mut self) {
        if self.unacked > 0 && self.pending.is_none() {
            self.pending = Some(Response::Ack);
        }
    }

    /// Refuses the request returned by [`on_packet`](Self::on_packet) with an RNR NAK;
    /// the peer resends it after the RNR timer.
    pub fn reject_rnr(&mut self) {
        if self.awaiting.take().is_some() {
            self.pending = Some(Response::Rnr);
            // The packets behind the refused one are a gap the RNR NAK already reports.
            self.nak_sent = true;
        }
    }

    /// Whether an ACK/NAK is owed now (a delayed ACK falls due here).
    pub(super) fn response_owed(&mut self, now: Time) -> bool {
        if self.ack_due.is_some_and(|due| due <= now) && self.pending.is_none() {
            self.pending = Some(Response::Ack);
        }
        self.pending.is_some()
    }

    /// Writes the owed ACK/NAK to `buf`; `None` (and still owed) if `buf` is too small.
    pub(super) fn emit_response(&mut self, buf: &mut [u8]) -> Option<usize> {
        let resp = self.pending.take()?;
        let (psn, syndrome) = match resp {
            Response::Ack => (self.epsn.wrapping_sub(1), AethSyndrome::ACK),
            Response::SeqNak => (self.epsn, AethSyndrome::Nak(NakCode::PsnSequenceError)),
            Response::Rnr => (self.epsn, AethSyndrome::RnrNak { timer: self.cfg.timers.rnr_timer }),
        };
        let len = self.cfg.addr.emit_ack(buf, psn, AethRepr { syndrome, msn: self.msn });
        if len.is_none() {
            self.pending = Some(resp);
            return None;
        }
        match resp {
            Response::Ack => self.counters.tx_acks += 1,
            Response::SeqNak => self.counters.tx_seq_naks += 1,
            Response::Rnr => self.counters.tx_rnr_naks += 1,
        }
        self.unacked = 0;
        self.ack_due = None;
        len
    }
}

#[cfg(test)]
mod tests {
    use inc_wire::{BthRepr, RoceRepr};

    use super::super::tests::cfg;
    use super::*;

    fn ack_psns(c: &mut RcConnection, now: Time) -> Vec<(bool, Psn)> {
        let mut buf = vec![0u8; 2048];
        let mut out = Vec::new();
        while let Some(len) = c.poll_transmit(now, &mut buf) {
            let f = RoceRepr::parse(&buf[..len]).unwrap();
            out.push((f.repr.ext.aeth.is_some(), f.repr.bth.psn));
        }
        out
    }

    /// A requested ACK waits for a request of ours and then travels right behind it,
    /// or goes alone when `ack_req_delay` has passed.
    #[test]
    fn requested_ack_is_deferred_then_follows_a_request_or_falls_due() {
        let mut b = RcConnection::new(cfg(2, 1, 8));
        let t0 = Time::ZERO;
        let psn = Psn::new(0xFF_FFF1);
        let mut bth = BthRepr::new(inc_wire::Opcode::RcSendOnly, 0x102, psn);
        bth.ack_req = true;
        assert_eq!(b.on_packet(t0, &bth, None), Inbound::Request);
        b.accept(t0);
        let due = t0 + b.cfg.timers.ack_req_delay;
        assert!(!b.wants_transmit(t0));
        assert_eq!(b.poll_timeout(), Some(due));
        // A request of ours first, the ACK right behind it.
        b.send(None, b"result").unwrap();
        let sent = ack_psns(&mut b, t0);
        assert_eq!(sent, vec![(false, b.cfg.send_start_psn), (true, psn)]);
        // Nothing to send: the ACK goes when due, not before.
        bth.psn = psn + 1;
        assert_eq!(b.on_packet(t0, &bth, None), Inbound::Request);
        b.accept(t0);
        assert_eq!(ack_psns(&mut b, t0), vec![]);
        assert_eq!(ack_psns(&mut b, due), vec![(true, psn + 1)]);
        // With no delay configured, AckReq is answered at once.
        let mut c = cfg(2, 1, 8);
        c.timers.ack_req_delay = std::time::Duration::ZERO;
        let mut b = RcConnection::new(c);
        bth.psn = psn;
        assert_eq!(b.on_packet(t0, &bth, None), Inbound::Request);
        b.accept(t0);
        assert_eq!(ack_psns(&mut b, t0), vec![(true, psn)]);
    }

    /// `ack_now` answers what was accepted at once, without AckReq and before any
    /// delay or coalescing count, and owes nothing when everything is ACKed.
    #[test]
    fn ack_now_answers_at_once() {
        let mut b = RcConnection::new(cfg(2, 1, 8));
        let t0 = Time::ZERO;
        let psn = Psn::new(0xFF_FFF1);
        b.ack_now();
        assert_eq!(ack_psns(&mut b, t0), vec![], "nothing accepted, nothing owed");
        for i in 0..3 {
            let bth = BthRepr::new(inc_wire::Opcode::RcSendOnly, 0x102, psn + i);
            assert_eq!(b.on_packet(t0, &bth, None), Inbound::Request);
            b.accept(t0);
        }
        assert_eq!(ack_psns(&mut b, t0), vec![], "coalesced and delayed");
        b.ack_now();
        assert_eq!(ack_psns(&mut b, t0), vec![(true, psn + 2)]);
        b.ack_now();
        assert_eq!(ack_psns(&mut b, t0), vec![]);
        assert_eq!(b.poll_timeout(), None, "the delayed ACK is gone with it");
    }

    /// Coalescing never covers more than half the peer's window, so a deferred ACK
    /// cannot hold a requester with nothing coming back.
    #[test]
    fn coalescing_is_capped_at_half_the_window() {
        let t = crate::RcTimers::default();
        assert_eq!(crate::timers_for_window(t, 64).ack_coalesce, t.ack_coalesce.min(32));
        assert_eq!(crate::timers_for_window(t, 8).ack_coalesce, 4);
        assert_eq!(crate::timers_for_window(t, 1).ack_coalesce, 1);
        let mut c = cfg(2, 1, 8);
        c.timers = crate::timers_for_window(c.timers, 4);
        let mut b = RcConnection::new(c);
        let psn = Psn::new(0xFF_FFF1);
        let t0 = Time::ZERO;
        for i in 0..2 {
            let bth = BthRepr::new(inc_wire::Opcode::RcSendOnly, 0x102, psn + i);
            assert_eq!(b.on_packet(t0, &bth, None), Inbound::Request);
            b.accept(t0);
        }
        assert_eq!(ack_psns(&mut b, t0), vec![(true, psn + 1)]);
    }

    #[test]
    fn duplicate_reacked_and_far_psn_dropped() {
        let mut b = RcConnection::new(cfg(2, 1, 4));
        let now = Time::ZERO;
        let start = Psn::new(0xFF_FFF1);
        let bth = |psn: Psn| BthRepr::new(inc_wire::Opcode::RcSendOnly, 0x102, psn);
        assert_eq!(b.on_packet(now, &bth(start), None), Inbound::Request);
        b.accept(now);
        assert_eq!(b.on_packet(now, &bth(start), None), Inbound::Handled);
        assert_eq!(b.counters().rx_duplicates, 1);
        assert_eq!(b.on_packet(now, &bth(start + 1_000_000), None), Inbound::Dropped);
        // Gap: one NAK only.
        assert_eq!(b.on_packet(now, &bth(start + 3), None), Inbound::Handled);
        assert_eq!(b.on_packet(now, &bth(start + 4), None), Inbound::Handled);
        let mut buf = vec![0u8; 256];
        let mut naks = 0;
        while let Some(len) = b.poll_transmit(now, &mut buf) {
            let f = RoceRepr::parse(&buf[..len]).unwrap();
            let aeth = f.repr.ext.aeth.unwrap();
            if aeth.syndrome == AethSyndrome::Nak(NakCode::PsnSequenceError) {
                naks += 1;
                assert_eq!(f.repr.bth.psn, start + 1);
                assert_eq!(aeth.msn, 1);
            }
        }
        assert_eq!(naks, 1);
    }
}
