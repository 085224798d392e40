//! One RoCEv2 Reliable Connection endpoint: requester and responder, sans-IO.
//!
//! Every message is a single-packet SEND (`SEND_ONLY` or `SEND_ONLY_WITH_IMMEDIATE`),
//! so the requester numbers messages and packets alike. The requester keeps each
//! unacknowledged frame (a ring of reused buffers) and retransmits go-back-N on a
//! PSN-sequence-error NAK, after an RNR NAK's delay, and on an adaptive timeout. The
//! responder tracks the expected PSN and MSN, re-ACKs duplicates, NAKs a gap once and
//! lets its owner refuse a packet with an RNR NAK.

use std::collections::VecDeque;
use std::time::Duration;

use inc_wire::{AethRepr, AethSyndrome, BthRepr, EthernetAddress, NakCode, Psn};
use serde::Serialize;

use crate::frame::{self, RcAddressing};
use crate::rtt::RttEstimator;
use crate::time::{earliest, Time};

/// Timers and thresholds of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcTimers {
    /// Retransmission timeout before the first RTT sample.
    pub rto_initial: Duration,
    /// Floor of the retransmission timeout.
    pub rto_min: Duration,
    /// Ceiling of the retransmission timeout (after backoff).
    pub rto_max: Duration,
    /// Consecutive timeouts without progress after which the connection fails.
    pub retry_limit: u32,
    /// Consecutive RNR NAKs without progress after which the connection fails
    /// (`None`: retry forever, like `rnr_retry = 7`).
    pub rnr_retry_limit: Option<u32>,
    /// The requester sets AckReq on every `ack_req_every`-th packet (and on the last
    /// queued one).
    pub ack_req_every: u32,
    /// The responder ACKs after this many accepted packets even without AckReq.
    pub ack_coalesce: u32,
    /// ... or this long after the first unacknowledged accepted packet.
    pub ack_delay: Duration,
    /// Timer code the responder puts in RNR NAKs (IBA table; 10 = 0.32 ms).
    pub rnr_timer: u8,
    /// Requests further than this from the expected PSN (ahead or behind) are dropped
    /// silently and counted.
    pub psn_window: u32,
}

impl Default for RcTimers {
    fn default() -> Self {
        RcTimers {
            rto_initial: Duration::from_millis(10),
            rto_min: Duration::from_millis(1),
            rto_max: Duration::from_millis(500),
            retry_limit: 12,
            rnr_retry_limit: None,
            ack_req_every: 8,
            ack_coalesce: 16,
            ack_delay: Duration::from_micros(200),
            rnr_timer: 10,
            psn_window: 1 << 16,
        }
    }
}

/// Configuration of one RC connection.
#[derive(Debug, Clone)]
pub struct RcConfig {
    /// Addresses and QPNs.
    pub addr: RcAddressing,
    /// First PSN we send.
    pub send_start_psn: Psn,
    /// First PSN we expect from the peer.
    pub recv_start_psn: Psn,
    /// Largest message payload.
    pub max_payload: usize,
    /// Most messages kept unacknowledged (queued or in flight).
    pub send_queue: usize,
    /// Timers.
    pub timers: RcTimers,
}

/// Per-connection counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RcCounters {
    /// Request packets sent, first transmissions only.
    pub tx_requests: u64,
    /// Request packets retransmitted.
    pub retransmits: u64,
    /// Request packets accepted from the peer (new, in order).
    pub rx_requests: u64,
    /// Duplicate requests (re-ACKed, not re-processed).
    pub rx_duplicates: u64,
    /// Requests after a gap (answered by one sequence NAK per gap).
    pub rx_out_of_order: u64,
    /// Requests with a PSN far outside the window (dropped).
    pub rx_psn_out_of_window: u64,
    /// ACKs sent.
    pub tx_acks: u64,
    /// PSN-sequence-error NAKs sent.
    pub tx_seq_naks: u64,
    /// RNR NAKs sent.
    pub tx_rnr_naks: u64,
    /// ACKs received.
    pub rx_acks: u64,
    /// Sequence NAKs received.
    pub rx_seq_naks: u64,
    /// RNR NAKs received.
    pub rx_rnr_naks: u64,
    /// Fatal NAKs received (invalid request, remote access/operational error).
    pub rx_fatal_naks: u64,
    /// ACKs for PSNs never sent or already acknowledged (ignored).
    pub rx_stale_acks: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Tail probes: the newest packet re-sent with AckReq when its ACK was not requested.
    pub tail_probes: u64,
}

impl RcCounters {
    /// Field-wise sum.
    pub fn add(&mut self, o: &RcCounters) {
        self.tx_requests += o.tx_requests;
        self.retransmits += o.retransmits;
        self.rx_requests += o.rx_requests;
        self.rx_duplicates += o.rx_duplicates;
        self.rx_out_of_order += o.rx_out_of_order;
        self.rx_psn_out_of_window += o.rx_psn_out_of_window;
        self.tx_acks += o.tx_acks;
        self.tx_seq_naks += o.tx_seq_naks;
        self.tx_rnr_naks += o.tx_rnr_naks;
        self.rx_acks += o.rx_acks;
        self.rx_seq_naks += o.rx_seq_naks;
        self.rx_rnr_naks += o.rx_rnr_naks;
        self.rx_fatal_naks += o.rx_fatal_naks;
        self.rx_stale_acks += o.rx_stale_acks;
        self.timeouts += o.timeouts;
        self.tail_probes += o.tail_probes;
    }
}

/// Why a connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RcFailure {
    /// `retries` consecutive timeouts without an ACK for `psn`.
    #[error(
        "retransmission retries exhausted ({retries} timeouts) waiting for an ACK of PSN {psn}"
    )]
    RetriesExhausted {
        /// The oldest unacknowledged PSN.
        psn: Psn,
        /// Timeouts taken.
        retries: u32,
    },
    /// Too many consecutive RNR NAKs for `psn`.
    #[error("RNR retries exhausted ({retries} RNR NAKs) for PSN {psn}")]
    RnrRetriesExhausted {
        /// The refused PSN.
        psn: Psn,
        /// RNR NAKs received.
        retries: u32,
    },
    /// The peer answered `psn` with a fatal NAK.
    #[error("peer answered PSN {psn} with fatal NAK {code:?}")]
    FatalNak {
        /// The PSN of the NAK.
        psn: Psn,
        /// The NAK code.
        code: NakCode,
    },
}

impl RcFailure {
    /// The stalled PSN.
    pub fn psn(&self) -> Psn {
        match *self {
            RcFailure::RetriesExhausted { psn, .. }
            | RcFailure::RnrRetriesExhausted { psn, .. }
            | RcFailure::FatalNak { psn, .. } => psn,
        }
    }
}

/// What became of an incoming packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// A new request in order: the caller must call [`RcConnection::accept`] or
    /// [`RcConnection::reject_rnr`] before handling the next packet.
    Request,
    /// Consumed by the connection (ACK/NAK, duplicate, gap).
    Handled,
    /// Dropped and counted (PSN far outside the window, not a SEND/ACK).
    Dropped,
    /// The packet made the connection fail (fatal NAK, RNR retries exhausted).
    Failed(RcFailure),
}

/// The single response the responder owes: each later event supersedes earlier ones
/// because every response is cumulative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Response {
    Ack,
    SeqNak,
    Rnr,
}

#[derive(Debug)]
struct Entry {
    psn: Psn,
    buf: Vec<u8>,
    len: usize,
    first_sent: Option<Time>,
    retransmitted: bool,
}

impl Entry {
    /// Copies the stored frame into `buf` with the peer MAC, if learned, as destination.
    /// Returns the frame in `buf`, or `None` if `buf` is too small.
    fn copy_out<'b>(
        &self,
        buf: &'b mut [u8],
        peer_mac: Option<EthernetAddress>,
    ) -> Option<&'b mut [u8]> {
        let out = buf.get_mut(..self.len)?;
        out.copy_from_slice(&self.buf[..self.len]);
        if let Some(mac) = peer_mac {
            frame::set_dst_mac(out, mac);
        }
        Some(out)
    }
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
    pool: Vec<Vec<u8>>,
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
        // Every frame buffer up front: memory is fixed by the queue size, never by the
        // traffic, and the hot path never allocates.
        let cap = frame::max_frame_len(cfg.max_payload);
        let pool = (0..cfg.send_queue).map(|_| vec![0; cap]).collect();
        RcConnection {
            next_psn: cfg.send_start_psn,
            queue: VecDeque::with_capacity(cfg.send_queue),
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

    /// Queues one message (single-packet SEND). Fails with the message handed back
    /// when the send queue is full or the connection failed.
    pub fn send(&mut self, imm: Option<u32>, payload: &[u8]) -> Result<Psn, SendError> {
        if let Some(f) = self.failed {
            return Err(SendError::Failed(f));
        }
        if self.queue.len() >= self.cfg.send_queue {
            return Err(SendError::QueueFull);
        }
        if payload.len() > self.cfg.max_payload {
            return Err(SendError::TooLarge { len: payload.len(), max: self.cfg.max_payload });
        }
        let cap = frame::max_frame_len(self.cfg.max_payload);
        let mut buf = self.pool.pop().unwrap_or_else(|| vec![0; cap]);
        let psn = self.next_psn;
        let len = self
            .cfg
            .addr
            .emit_send(&mut buf, psn, imm, payload)
            .ok_or(SendError::TooLarge { len: payload.len(), max: self.cfg.max_payload })?;
        self.next_psn = psn.next();
        self.queue.push_back(Entry { psn, buf, len, first_sent: None, retransmitted: false });
        Ok(psn)
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
            None => self.on_request(bth.psn, bth.ack_req),
        }
    }

    fn on_request(&mut self, psn: Psn, ack_req: bool) -> Inbound {
        let d = psn.distance(self.epsn);
        let win = self.cfg.timers.psn_window as i32;
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
        if ack_req || self.unacked >= self.cfg.timers.ack_coalesce {
            self.pending = Some(Response::Ack);
        } else if self.pending.is_none() && self.ack_due.is_none() {
            self.ack_due = Some(now + self.cfg.timers.ack_delay);
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

    fn on_ack(&mut self, now: Time, psn: Psn, aeth: &AethRepr) -> Inbound {
        // First PSN not acknowledged by this response.
        let (upto, kind) = match aeth.syndrome {
            AethSyndrome::Ack { .. } => (psn.next(), Response::Ack),
            AethSyndrome::Nak(NakCode::PsnSequenceError) => (psn, Response::SeqNak),
            AethSyndrome::RnrNak { .. } => (psn, Response::Rnr),
            AethSyndrome::Nak(code) => {
                self.counters.rx_fatal_naks += 1;
                let f = RcFailure::FatalNak { psn, code };
                self.fail(f);
                return Inbound::Failed(f);
            }
        };
        // Valid only within [oldest unacked, highest sent + 1].
        let Some(front) = self.queue.front().map(|e| e.psn) else {
            self.counters.rx_stale_acks += 1;
            return Inbound::Handled;
        };
        let n = upto.distance(front);
        if n < 0 || n as usize > self.sent_hi {
            self.counters.rx_stale_acks += 1;
            return Inbound::Handled;
        }
        let n = n as usize;
        let mut sample = None;
        for _ in 0..n {
            let e = self.queue.pop_front().expect("n <= queue length");
            if !e.retransmitted {
                sample = e.first_sent;
            }
            self.pool.push(e.buf);
        }
        self.send_idx = self.send_idx.saturating_sub(n);
        self.sent_hi -= n;
        if self.ack_req_psn.is_some_and(|p| p.is_before(upto)) {
            self.ack_req_psn = None;
            if self.send_idx > 0 {
                self.probe_at = Some(now + self.cfg.timers.ack_delay);
            }
        }
        if self.send_idx == 0 {
            self.probe_at = None;
        }
        if n > 0 {
            self.retries = 0;
            match sample {
                Some(t) => self.rtt.sample(now - t),
                None => self.rtt.reset_backoff(),
            }
        }
        match kind {
            Response::Ack => {
                self.counters.rx_acks += 1;
                self.rnr_retries = 0;
            }
            Response::SeqNak => {
                self.counters.rx_seq_naks += 1;
                self.rnr_retries = 0;
                self.rewind();
            }
            Response::Rnr => {
                self.counters.rx_rnr_naks += 1;
                self.rnr_retries += 1;
                if let Some(limit) = self.cfg.timers.rnr_retry_limit {
                    if self.rnr_retries > limit {
                        let f = RcFailure::RnrRetriesExhausted { psn, retries: self.rnr_retries };
                        self.fail(f);
                        return Inbound::Failed(f);
                    }
                }
                let AethSyndrome::RnrNak { timer } = aeth.syndrome else { unreachable!() };
                self.rnr_until = Some(now + inc_wire::rnr_timer_to_duration(timer));
                self.rewind();
                self.rto_deadline = None;
                return Inbound::Handled;
            }
        }
        self.rto_deadline = if self.send_idx > 0 { Some(now + self.rtt.rto()) } else { None };
        Inbound::Handled
    }

    /// Go back N: resend everything unacknowledged.
    fn rewind(&mut self) {
        self.send_idx = 0;
        self.ack_req_psn = None;
        self.probe_at = None;
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
            self.pool.push(e.buf);
        }
        self.rewind();
        self.sent_hi = 0;
    }

    /// Next frame to send (ACK/NAK first, then requests), written to `buf`.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        if let Some(due) = self.ack_due {
            if due <= now && self.pending.is_none() {
                self.pending = Some(Response::Ack);
            }
        }
        if let Some(resp) = self.pending.take() {
            let (psn, syndrome) = match resp {
                Response::Ack => (self.epsn.wrapping_sub(1), AethSyndrome::ACK),
                Response::SeqNak => (self.epsn, AethSyndrome::Nak(NakCode::PsnSequenceError)),
                Response::Rnr => {
                    (self.epsn, AethSyndrome::RnrNak { timer: self.cfg.timers.rnr_timer })
                }
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
            return len;
        }
        if self.failed.is_some() {
            return None;
        }
        if let Some(t) = self.rnr_until {
            if t > now {
                return None;
            }
            self.rnr_until = None;
        }
        if self.send_idx >= self.queue.len() {
            return self.poll_probe(now, buf);
        }
        let last = self.send_idx + 1 == self.queue.len();
        let e = &mut self.queue[self.send_idx];
        let out = e.copy_out(buf, self.cfg.addr.peer_mac)?;
        self.since_ack_req += 1;
        let ack_req = self.since_ack_req >= self.cfg.timers.ack_req_every
            || (last && self.ack_req_psn.is_none());
        if ack_req {
            self.since_ack_req = 0;
            self.ack_req_psn = Some(e.psn);
            self.probe_at = None;
            frame::set_ack_req(out, true);
        }
        if e.first_sent.is_none() {
            e.first_sent = Some(now);
            self.counters.tx_requests += 1;
        } else {
            e.retransmitted = true;
            self.counters.retransmits += 1;
        }
        self.send_idx += 1;
        self.sent_hi = self.sent_hi.max(self.send_idx);
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        Some(e.len)
    }

    /// The tail probe, when due: the newest sent packet again, with AckReq.
    fn poll_probe(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        if self.probe_at.is_none_or(|t| t > now) || self.send_idx == 0 {
            return None;
        }
        let e = &mut self.queue[self.send_idx - 1];
        let out = e.copy_out(buf, self.cfg.addr.peer_mac)?;
        frame::set_ack_req(out, true);
        // Karn: an ACK may now answer either copy.
        e.retransmitted = true;
        self.probe_at = None;
        self.ack_req_psn = Some(e.psn);
        self.since_ack_req = 0;
        self.counters.tail_probes += 1;
        Some(e.len)
    }

    /// Earliest time [`handle_timeout`](Self::handle_timeout) must run.
    pub fn poll_timeout(&self) -> Option<Time> {
        if self.failed.is_some() {
            return None;
        }
        let ack = if self.pending.is_some() { None } else { self.ack_due };
        earliest(earliest(self.rto_deadline, self.rnr_until), earliest(ack, self.probe_at))
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
        if self.ack_due.is_some_and(|t| t <= now) && self.pending.is_none() {
            self.pending = Some(Response::Ack);
        }
        if self.rnr_until.is_some_and(|t| t <= now) {
            self.rnr_until = None;
        }
        if self.rto_deadline.is_some_and(|t| t <= now) {
            self.rto_deadline = None;
            self.counters.timeouts += 1;
            self.retries += 1;
            let psn = self.queue.front().map_or(self.next_psn, |e| e.psn);
            if self.retries > self.cfg.timers.retry_limit {
                let f = RcFailure::RetriesExhausted { psn, retries: self.retries - 1 };
                self.fail(f);
                return Some(f);
            }
            tracing::debug!(%psn, retries = self.retries, "RC retransmission timeout, going back");
            self.rtt.on_timeout();
            self.rewind();
        }
        None
    }
}

/// Why [`RcConnection::send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The send queue holds `send_queue` unacknowledged messages.
    #[error("send queue full")]
    QueueFull,
    /// Payload larger than the connection's maximum.
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// Maximum.
        max: usize,
    },
    /// The connection failed earlier.
    #[error("connection failed: {0}")]
    Failed(RcFailure),
}

#[cfg(test)]
mod tests {
    use super::*;
    use inc_wire::{EthernetAddress, RoceRepr};
    use std::net::Ipv4Addr;

    fn cfg(a: u8, b: u8, queue: usize) -> RcConfig {
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

    /// A peer that, like rxe, ACKs only packets with AckReq, fed one message at a time
    /// faster than the round trip: no timeouts, and far fewer ACKs than messages.
    #[test]
    fn trickle_to_an_ack_req_only_peer() {
        let mut a = RcConnection::new(cfg(1, 2, 64));
        let mut bc = cfg(2, 1, 64);
        bc.timers.ack_coalesce = u32::MAX;
        bc.timers.ack_delay = Duration::from_secs(3600);
        let mut b = RcConnection::new(bc);
        let rtt = Duration::from_micros(50);
        let mut wire: std::collections::VecDeque<(Time, bool, Vec<u8>)> = Default::default();
        let mut now = Time::ZERO;
        let mut buf = vec![0u8; 2048];
        let mut got = 0u32;
        let n = 300u32;
        let mut next = 0u32;
        while got < n || a.queued() > 0 {
            assert!(now < Time::from_nanos(1_000_000_000), "stuck: {:?}", a.counters());
            if next < n && a.send_room() > 0 {
                a.send(None, &next.to_be_bytes()).unwrap();
                next += 1;
            }
            while let Some(len) = a.poll_transmit(now, &mut buf) {
                wire.push_back((now + rtt / 2, true, buf[..len].to_vec()));
            }
            while let Some(len) = b.poll_transmit(now, &mut buf) {
                wire.push_back((now + rtt / 2, false, buf[..len].to_vec()));
            }
            while wire.front().is_some_and(|(t, _, _)| *t <= now) {
                let (_, to_b, f) = wire.pop_front().unwrap();
                let f = RoceRepr::parse(&f).unwrap();
                let (rx, is_b) = if to_b { (&mut b, true) } else { (&mut a, false) };
                if let Inbound::Request = rx.on_packet(now, &f.repr.bth, f.repr.ext.aeth.as_ref()) {
                    rx.accept(now);
                    if is_b {
                        got += 1;
                    }
                }
            }
            now += Duration::from_micros(5);
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
        let (ca, cb) = (a.counters(), b.counters());
        assert_eq!(ca.timeouts, 0, "{ca:?}");
        assert_eq!(cb.rx_requests, u64::from(n));
        assert!(cb.tx_acks < u64::from(n) / 3, "ACKs {} for {n} messages", cb.tx_acks);
    }

    #[test]
    fn retries_exhaust_and_name_psn() {
        let mut a = RcConnection::new(cfg(1, 2, 4));
        let mut buf = vec![0u8; 2048];
        a.send(None, b"x").unwrap();
        let mut now = Time::ZERO;
        let mut failure = None;
        for _ in 0..100 {
            while a.poll_transmit(now, &mut buf).is_some() {}
            now = a.poll_timeout().unwrap_or(now);
            if let Some(f) = a.handle_timeout(now) {
                failure = Some(f);
                break;
            }
        }
        let f = failure.expect("fails");
        assert_eq!(f.psn(), Psn::new(0xFF_FFF1));
        assert!(matches!(f, RcFailure::RetriesExhausted { retries: 12, .. }));
        assert!(matches!(a.send(None, b"y"), Err(SendError::Failed(_))));
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
