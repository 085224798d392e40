//! One RoCEv2 Reliable Connection endpoint: requester and responder, sans-IO.
//!
//! Every message is a single-packet SEND (`SEND_ONLY` or `SEND_ONLY_WITH_IMMEDIATE`),
//! so the requester numbers messages and packets alike. The requester keeps each
//! unacknowledged frame (a ring of reused buffers) and retransmits go-back-N on a
//! PSN-sequence-error NAK, after an RNR NAK's delay, and on an adaptive timeout. The
//! responder tracks the expected PSN and MSN, re-ACKs duplicates, NAKs a gap once and
//! lets its owner refuse a packet with an RNR NAK.

mod requester;
mod responder;
mod rtt;
mod types;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use inc_wire::{AethRepr, BthRepr, EthernetAddress, Psn};

use crate::frame::{self, QueuedFrame, RcAddressing};
use crate::time::{earliest, Time};
use requester::Entry;
use responder::Response;
pub use rtt::RttEstimator;
pub use types::{timers_for_window, Inbound, RcConfig, RcCounters, RcFailure, RcTimers, SendError};

/// A frame [`RcConnection::poll_transmit_frame`] has ready.
#[derive(Debug, Clone)]
pub enum Outgoing {
    /// An ACK or NAK of this many bytes, written to the caller's buffer.
    Written(usize),
    /// A request (new or retransmitted) as it sits in the send queue.
    Queued(QueuedFrame),
}

/// What [`RcConnection::poll_next`] found: a response in the buffer, or a queue index.
enum Next {
    Response(usize),
    Request(usize),
}

/// One RC endpoint (requester + responder).
#[derive(Debug)]
pub struct RcConnection {
    cfg: RcConfig,
    // Requester.
    next_psn: Psn,
    queue: VecDeque<Entry>,
    /// Index in `queue` of the next frame to (re)transmit.
    send_idx: usize,
    /// Entries `queue[..sent_hi]` have been transmitted at least once.
    sent_hi: usize,
    /// Unshared frame buffers.
    pool: Vec<Arc<Vec<u8>>>,
    rtt: RttEstimator,
    rto_deadline: Option<Time>,
    rnr_until: Option<Time>,
    retries: u32,
    rnr_retries: u32,
    since_ack_req: u32,
    /// The newest in-flight packet sent with AckReq: the ACK it draws covers
    /// everything before it, so the tail needs no AckReq of its own yet.
    ack_req_psn: Option<Psn>,
    /// When the packets sent after the last AckReq are left without one and nothing
    /// new goes out, re-send the newest with AckReq (a duplicate the peer re-ACKs;
    /// rxe only ACKs on AckReq).
    probe_at: Option<Time>,
    failed: Option<RcFailure>,
    // Responder.
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    pending: Option<Response>,
    unacked: u32,
    ack_due: Option<Time>,
    /// The request returned as `Inbound::Request` and not yet accepted/refused.
    awaiting: Option<(Psn, bool)>,
    counters: RcCounters,
}

impl RcConnection {
    /// A connection in RTS state.
    pub fn new(cfg: RcConfig) -> Self {
        let t = cfg.timers;
        // Frame buffers as traffic needs them (`free_buffer`), then reused: memory
        // grows to what the peer's pace keeps in flight, at most the queue size.
        let pool = Vec::new();
        RcConnection {
            next_psn: cfg.send_start_psn,
            queue: VecDeque::new(),
            send_idx: 0,
            sent_hi: 0,
            pool,
            rtt: RttEstimator::new(t.rto_initial, t.rto_min, t.rto_max),
            rto_deadline: None,
            rnr_until: None,
            retries: 0,
            rnr_retries: 0,
            since_ack_req: 0,
            ack_req_psn: None,
            probe_at: None,
            failed: None,
            epsn: cfg.recv_start_psn,
            msn: 0,
            nak_sent: false,
            pending: None,
            unacked: 0,
            ack_due: None,
            awaiting: None,
            counters: RcCounters::default(),
            cfg,
        }
    }

    /// Addresses of this connection.
    pub fn addressing(&self) -> &RcAddressing {
        &self.cfg.addr
    }

    /// Sets the peer MAC (learned from a frame or ARP); queued frames pick it up when sent.
    pub fn set_peer_mac(&mut self, mac: EthernetAddress) {
        self.cfg.addr.peer_mac = Some(mac);
    }

    /// Counters.
    pub fn counters(&self) -> &RcCounters {
        &self.counters
    }

    /// The failure, once the connection failed.
    pub fn failure(&self) -> Option<RcFailure> {
        self.failed
    }

    /// Next PSN expected from the peer.
    pub fn expected_psn(&self) -> Psn {
        self.epsn
    }

    /// Oldest unacknowledged PSN we sent, if any.
    pub fn oldest_unacked(&self) -> Option<Psn> {
        self.queue.front().map(|e| e.psn)
    }

    /// The request queued last, shared (as [`Self::poll_transmit_frame`] hands it out):
    /// for a caller that sends the same payload on another connection and reads it,
    /// and its CRC, from the frame already built.
    pub fn newest_frame(&self) -> Option<QueuedFrame> {
        self.queue.back().map(|e| e.shared())
    }

    /// Messages queued or in flight (unacknowledged).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Room left in the send queue.
    pub fn send_room(&self) -> usize {
        self.cfg.send_queue.saturating_sub(self.queue.len())
    }

    /// Smoothed RTT, if measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// Bytes of frame buffers this connection holds.
    pub fn memory_bytes(&self) -> usize {
        let per = frame::max_frame_len(self.cfg.max_payload);
        (self.queue.len() + self.pool.len()) * per
    }

    /// Classifies an incoming packet addressed to this connection (the caller checked
    /// QPN, addresses and ICRC). ACK/NAKs are consumed; a new in-order request returns
    /// [`Inbound::Request`].
    pub fn on_packet(&mut self, now: Time, bth: &BthRepr, aeth: Option<&AethRepr>) -> Inbound {
        debug_assert!(self.awaiting.is_none(), "previous request neither accepted nor refused");
        if let Some(f) = self.failed {
            return Inbound::Failed(f);
        }
        match aeth {
            Some(aeth) => self.on_ack(now, bth.psn, aeth),
            None => self.on_request(now, bth.psn, bth.ack_req),
        }
    }

    fn fail(&mut self, f: RcFailure) {
        tracing::warn!(
            peer_qpn = self.cfg.addr.peer_qpn,
            local_qpn = self.cfg.addr.local_qpn,
            "RC connection failed: {f}"
        );
        self.failed = Some(f);
        self.rto_deadline = None;
        self.rnr_until = None;
        while let Some(e) = self.queue.pop_front() {
            self.recycle(e.buf);
        }
        self.rewind();
        self.sent_hi = 0;
    }

    /// Next frame to send (ACK/NAK first, then requests), written to `buf`.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        match self.poll_next(now, buf, buf.len())? {
            Next::Response(len) => Some(len),
            Next::Request(i) => {
                let frame = self.queue[i].bytes();
                buf[..frame.len()].copy_from_slice(frame);
                Some(frame.len())
            }
        }
    }

    /// Like [`poll_transmit`](Self::poll_transmit), but a request is not copied: it
    /// comes back as the send queue's own frame, for a backend that can hand it to the
    /// kernel as it is. ACK/NAKs are written to `buf` (a few dozen bytes).
    pub fn poll_transmit_frame(&mut self, now: Time, buf: &mut [u8]) -> Option<Outgoing> {
        Some(match self.poll_next(now, buf, usize::MAX)? {
            Next::Response(len) => Outgoing::Written(len),
            Next::Request(i) => Outgoing::Queued(self.queue[i].shared()),
        })
    }

    fn poll_next(&mut self, now: Time, buf: &mut [u8], room: usize) -> Option<Next> {
        if self.response_owed(now) {
            return self.emit_response(buf).map(Next::Response);
        }
        if self.failed.is_some() {
            return None;
        }
        let i = self.poll_request(now, room)?;
        // A deferred ACK goes right behind the request it waited for (the next call
        // returns it): the peer finds both in the same batch.
        if self.ack_due.is_some() {
            self.pending = Some(Response::Ack);
        }
        Some(Next::Request(i))
    }

    /// Earliest time [`handle_timeout`](Self::handle_timeout) must run.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.failed.is_some() {
            return None;
        }
        let ack = if self.pending.is_some() { None } else { self.ack_due };
        earliest(earliest(self.rto_deadline, self.rnr_until), earliest(ack, self.probe_at))
    }

    /// True when an ACK or NAK is owed now (not merely a delayed ACK falling due later).
    pub fn ack_owed(&self) -> bool {
        self.pending.is_some()
    }

    /// True when a frame is ready to go now (ACK owed or requests waiting).
    pub fn wants_transmit(&self, now: Time) -> bool {
        self.pending.is_some()
            || self.ack_due.is_some_and(|t| t <= now)
            || (self.failed.is_none()
                && (self.send_idx < self.queue.len() || self.probe_at.is_some_and(|t| t <= now))
                && self.rnr_until.is_none_or(|t| t <= now))
    }

    /// Runs expired timers; returns the failure if the retry limit was hit now.
    pub fn handle_timeout(&mut self, now: Time) -> Option<RcFailure> {
        if self.failed.is_some() {
            return None;
        }
        self.response_owed(now);
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if self.rto_deadline.is_some_and(|t| t <= now) {
            return self.on_rto();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inc_wire::{EthernetAddress, RoceRepr};
    use std::net::Ipv4Addr;

    pub(super) fn cfg(a: u8, b: u8, queue: usize) -> RcConfig {
        RcConfig {
            addr: RcAddressing {
                local_mac: EthernetAddress([2, 0, 0, 0, 0, a]),
                local_ip: Ipv4Addr::new(10, 0, 0, a),
                local_udp_port: 0xC000 + u16::from(a),
                local_qpn: 0x100 + u32::from(a),
                peer_mac: Some(EthernetAddress([2, 0, 0, 0, 0, b])),
                peer_ip: Ipv4Addr::new(10, 0, 0, b),
                peer_udp_port: 4791,
                peer_qpn: 0x100 + u32::from(b),
                psn_ident: false,
            },
            send_start_psn: Psn::new(0xFF_FFF0 + u32::from(a)),
            recv_start_psn: Psn::new(0xFF_FFF0 + u32::from(b)),
            max_payload: 1024,
            send_queue: queue,
            timers: RcTimers::default(),
        }
    }

    /// Delivers frames between two endpoints, dropping those `drop` selects; the
    /// receiver refuses every `rnr_every`-th new request once with an RNR NAK.
    fn run(
        n: u32,
        drop: impl Fn(u64) -> bool,
        rnr_every: u32,
    ) -> (Vec<u32>, RcCounters, RcCounters) {
        let mut a = RcConnection::new(cfg(1, 2, 16));
        let mut b = RcConnection::new(cfg(2, 1, 16));
        let mut now = Time::ZERO;
        let mut next = 0u32;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 2048];
        let mut sent_frames = 0u64;
        let mut refused = std::collections::HashSet::new();
        for _ in 0..200_000 {
            while next < n && a.send_room() > 0 {
                a.send(None, &next.to_be_bytes()).unwrap();
                next += 1;
            }
            let mut idle = true;
            for dir in 0..2 {
                let (tx, rx) = if dir == 0 { (&mut a, &mut b) } else { (&mut b, &mut a) };
                while let Some(len) = tx.poll_transmit(now, &mut buf) {
                    idle = false;
                    sent_frames += 1;
                    if drop(sent_frames) {
                        continue;
                    }
                    let f = RoceRepr::parse(&buf[..len]).unwrap();
                    assert!(f.icrc_ok);
                    match rx.on_packet(now, &f.repr.bth, f.repr.ext.aeth.as_ref()) {
                        Inbound::Request => {
                            let v = u32::from_be_bytes(f.payload.try_into().unwrap());
                            if rnr_every > 0 && v % rnr_every == 0 && refused.insert(v) {
                                rx.reject_rnr();
                            } else {
                                rx.accept(now);
                                got.push(v);
                            }
                        }
                        Inbound::Failed(f) => panic!("{f}"),
                        _ => {}
                    }
                }
            }
            if next == n && a.queued() == 0 && !b.wants_transmit(now) {
                break;
            }
            if idle {
                now = a
                    .poll_timeout()
                    .into_iter()
                    .chain(b.poll_timeout())
                    .min()
                    .unwrap_or(now + Duration::from_micros(10))
                    .max(now);
                a.handle_timeout(now);
                b.handle_timeout(now);
            } else {
                now += Duration::from_micros(5);
            }
        }
        (got, *a.counters(), *b.counters())
    }

    #[test]
    fn lossless_in_order_across_psn_wrap() {
        let (got, a, b) = run(200, |_| false, 0);
        assert_eq!(got, (0..200).collect::<Vec<_>>());
        assert_eq!(a.retransmits, 0);
        assert_eq!(b.rx_duplicates, 0);
        // ACKs are coalesced: far fewer than one per request.
        assert!(b.tx_acks < 100, "{b:?}");
    }

    #[test]
    fn loss_recovers_exactly_once() {
        let (got, a, b) = run(300, |i| i % 7 == 3 || i % 11 == 5, 0);
        assert_eq!(got, (0..300).collect::<Vec<_>>());
        assert!(a.retransmits > 0);
        assert!(b.tx_seq_naks > 0 || a.timeouts > 0);
    }

    #[test]
    fn rnr_is_honoured() {
        let (got, a, b) = run(100, |_| false, 10);
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        assert_eq!(b.tx_rnr_naks, 10);
        assert_eq!(a.rx_rnr_naks, 10);
    }
}
