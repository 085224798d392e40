//! The requester half of an RC connection: the queue of unacknowledged frames,
//! go-back-N on sequence NAKs, RNR waits and timeouts, AckReq pacing and tail probes.

use std::sync::Arc;

use inc_wire::icrc::PayloadCrc;
use inc_wire::{AethRepr, AethSyndrome, EthernetAddress, NakCode, Psn};

use super::responder::Response;
use super::{Inbound, RcConnection, RcFailure, SendError};
use crate::frame::{self, QueuedFrame};
use crate::time::Time;

/// One unacknowledged frame.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) psn: Psn,
    /// Shared with a backend between a transmission and its flush
    /// ([`RcConnection::poll_transmit_frame`]); unique otherwise.
    pub(super) buf: Arc<Vec<u8>>,
    pub(super) len: usize,
    pub(super) first_sent: Option<Time>,
    retransmitted: bool,
}

impl Entry {
    /// Readies the stored frame for a transmission: the peer MAC, if learned, as
    /// destination, AckReq set or cleared. Writes only what differs, on a copy if a
    /// backend still holds the frame's previous transmission.
    fn prepare(&mut self, peer_mac: Option<EthernetAddress>, ack_req: bool) {
        let stored = &self.buf[..self.len];
        let mac = peer_mac.filter(|m| stored[..6] != m.0);
        let flip_ack_req = frame::ack_req(stored) != ack_req;
        if mac.is_none() && !flip_ack_req {
            return;
        }
        let out = &mut Arc::make_mut(&mut self.buf)[..self.len];
        if let Some(mac) = mac {
            frame::set_dst_mac(out, mac);
        }
        if flip_ack_req {
            frame::set_ack_req(out, ack_req);
        }
    }

    /// The stored frame, shared.
    pub(super) fn shared(&self) -> QueuedFrame {
        QueuedFrame::new(Arc::clone(&self.buf), self.len)
    }

    /// The stored frame.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl RcConnection {
    /// Queues one message (single-packet SEND). Fails with the message handed back
    /// when the send queue is full or the connection failed.
    pub fn send(&mut self, imm: Option<u32>, payload: &[u8]) -> Result<Psn, SendError> {
        self.enqueue(imm, payload, None)
    }

    /// Like [`Self::send`] for a payload that goes out on several connections:
    /// `payload_crc` (its [`PayloadCrc::new`], computed once) saves the pass
    /// over the payload that computing each frame's ICRC would take.
    pub fn send_shared(
        &mut self,
        imm: Option<u32>,
        payload: &[u8],
        payload_crc: &PayloadCrc,
    ) -> Result<Psn, SendError> {
        self.enqueue(imm, payload, Some(payload_crc))
    }

    /// Queues one message written in place, without a staging copy: `write` gets the
    /// payload area of a free send-queue buffer (`max_payload` bytes) and returns the
    /// message's immediate and payload length, or `None` to queue nothing (`Ok(None)`).
    /// A message with an immediate is moved 4 bytes up to make room for the ImmDt
    /// header, so write large messages without one.
    pub fn send_in_place(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> Option<(Option<u32>, usize)>,
    ) -> Result<Option<Psn>, SendError> {
        self.write_in_place(|area| write(area).map(|(imm, len)| (imm, len, None)))
    }

    /// [`Self::send_in_place`] for a message without immediate whose writer also hands
    /// back the CRC of what it wrote ([`PayloadCrc::new`], e.g. computed while the
    /// bytes are in cache, to send them on other connections too): the frame's ICRC is
    /// derived from it instead of a pass over the payload.
    pub fn send_in_place_with_crc(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> Option<(usize, PayloadCrc)>,
    ) -> Result<Option<Psn>, SendError> {
        self.write_in_place(|area| write(area).map(|(len, crc)| (None, len, Some(crc))))
    }

    fn write_in_place(
        &mut self,
        write: impl FnOnce(&mut [u8]) -> Option<(Option<u32>, usize, Option<PayloadCrc>)>,
    ) -> Result<Option<Psn>, SendError> {
        self.check_queue_room()?;
        let max = self.cfg.max_payload;
        let mut shared = self.free_buffer();
        let buf = Arc::get_mut(&mut shared).expect("free buffers are unshared");
        let at = frame::send_payload_offset(None);
        let Some((imm, len, crc)) = write(&mut buf[at..at + max]) else {
            self.pool.push(shared);
            return Ok(None);
        };
        if len > max {
            self.pool.push(shared);
            return Err(SendError::TooLarge { len, max });
        }
        if let Some(crc_len) = crc.map(|c| c.payload_len()).filter(|&n| n != len) {
            self.pool.push(shared);
            return Err(SendError::PayloadCrcMismatch { len, crc_len });
        }
        let to = frame::send_payload_offset(imm);
        if to != at {
            buf.copy_within(at..at + len, to);
        }
        let frame_len = self
            .cfg
            .addr
            .emit_send_in_place(buf, self.next_psn, imm, len, crc.as_ref())
            .expect("the buffer holds the largest frame, and the CRC's length was checked");
        Ok(Some(self.push_new(shared, frame_len)))
    }

    fn enqueue(
        &mut self,
        imm: Option<u32>,
        payload: &[u8],
        payload_crc: Option<&PayloadCrc>,
    ) -> Result<Psn, SendError> {
        self.check_queue_room()?;
        if payload.len() > self.cfg.max_payload {
            return Err(SendError::TooLarge { len: payload.len(), max: self.cfg.max_payload });
        }
        let mut shared = self.free_buffer();
        let buf = Arc::get_mut(&mut shared).expect("free buffers are unshared");
        let psn = self.next_psn;
        let Some(len) = self.cfg.addr.emit_send(buf, psn, imm, payload, payload_crc) else {
            self.pool.push(shared);
            // `buf` holds the largest frame, so only the CRC's length can be wrong.
            let crc_len = payload_crc.map_or(0, PayloadCrc::payload_len);
            return Err(SendError::PayloadCrcMismatch { len: payload.len(), crc_len });
        };
        Ok(self.push_new(shared, len))
    }

    /// Whether one more message may be queued.
    fn check_queue_room(&self) -> Result<(), SendError> {
        if let Some(f) = self.failed {
            return Err(SendError::Failed(f));
        }
        if self.queue.len() >= self.cfg.send_queue {
            return Err(SendError::QueueFull);
        }
        Ok(())
    }

    /// An unshared send-queue buffer large enough for the largest frame.
    fn free_buffer(&mut self) -> Arc<Vec<u8>> {
        let cap = frame::max_frame_len(self.cfg.max_payload);
        self.pool.pop().unwrap_or_else(|| Arc::new(vec![0; cap]))
    }

    /// Returns the buffer of an acknowledged (or dropped) frame to the pool, unless a
    /// backend still holds it: then it is freed when the backend lets go.
    pub(super) fn recycle(&mut self, mut buf: Arc<Vec<u8>>) {
        if Arc::get_mut(&mut buf).is_some() {
            self.pool.push(buf);
        }
    }

    /// Queues the frame just built in `buf` (`len` bytes) under the next PSN.
    fn push_new(&mut self, buf: Arc<Vec<u8>>, len: usize) -> Psn {
        let psn = self.next_psn;
        self.next_psn = psn.next();
        self.queue.push_back(Entry { psn, buf, len, first_sent: None, retransmitted: false });
        psn
    }

    pub(super) fn on_ack(&mut self, now: Time, psn: Psn, aeth: &AethRepr) -> Inbound {
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
            self.recycle(e.buf);
        }
        self.send_idx = self.send_idx.saturating_sub(n);
        self.sent_hi -= n;
        if n > 0 {
            self.retries = 0;
            if let Some(t) = sample {
                self.rtt.sample(now - t);
            }
        }
        if self.ack_req_psn.is_some_and(|p| p.is_before(upto)) {
            self.ack_req_psn = None;
            if self.send_idx > 0 {
                // Not before twice the smoothed RTT (RFC 8985's probe timeout): on a slow
                // link the packets still unacknowledged queue behind each other for longer
                // than `ack_delay`, and a probe then only repeats a full packet on it
                // (inc-sim, 1 MiB AllReduce at 100 Mb/s: 8 % above the bound, 0.01 % with this).
                let wait = self.cfg.timers.ack_delay.max(self.rtt.srtt().unwrap_or_default() * 2);
                self.probe_at = Some(now + wait);
            }
        }
        if self.send_idx == 0 {
            self.probe_at = None;
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
    pub(super) fn rewind(&mut self) {
        self.send_idx = 0;
        self.ack_req_psn = None;
        self.probe_at = None;
    }

    /// The next request frame (new or retransmitted) or the tail probe, readied in the
    /// send queue: its index there. `None` when nothing is due, or when the frame is
    /// longer than `room` (the caller's buffer; nothing changes then).
    pub(super) fn poll_request(&mut self, now: Time, room: usize) -> Option<usize> {
        if let Some(t) = self.rnr_until {
            if t > now {
                return None;
            }
            self.rnr_until = None;
        }
        if self.send_idx >= self.queue.len() {
            return self.poll_probe(now, room);
        }
        let i = self.send_idx;
        if self.queue[i].len > room {
            return None;
        }
        let last = i + 1 == self.queue.len();
        self.since_ack_req += 1;
        let ack_req = self.since_ack_req >= self.cfg.timers.ack_req_every
            || (last && self.ack_req_psn.is_none());
        let e = &mut self.queue[i];
        e.prepare(self.cfg.addr.peer_mac, ack_req);
        if ack_req {
            self.since_ack_req = 0;
            self.ack_req_psn = Some(e.psn);
            self.probe_at = None;
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
        Some(i)
    }

    /// The tail probe, when due: the newest sent packet again, with AckReq.
    fn poll_probe(&mut self, now: Time, room: usize) -> Option<usize> {
        if self.probe_at.is_none_or(|t| t > now) || self.send_idx == 0 {
            return None;
        }
        let i = self.send_idx - 1;
        let e = &mut self.queue[i];
        if e.len > room {
            return None;
        }
        e.prepare(self.cfg.addr.peer_mac, true);
        // Karn: an ACK may now answer either copy.
        e.retransmitted = true;
        self.probe_at = None;
        self.ack_req_psn = Some(e.psn);
        self.since_ack_req = 0;
        self.counters.tail_probes += 1;
        Some(i)
    }

    /// A request of the peer arrived. Our ACKs come back behind the peer's own requests
    /// (one FIFO path per direction), so on a slow link a window of them delays an ACK
    /// by its serialisation: 64 frames of 4 KiB take 2.2 ms at 1 Gb/s, while the RTT
    /// measured when that direction was idle is tens of microseconds. While they keep
    /// arriving, a missing ACK is no sign of loss: the timer runs from the last one.
    /// (Bounded: the peer's requests are limited by its window, and a lost request of
    /// ours still draws a sequence NAK from the next one behind it.)
    pub(super) fn on_peer_request(&mut self, now: Time) {
        if let Some(deadline) = self.rto_deadline {
            self.rto_deadline = Some(deadline.max(now + self.rtt.rto()));
        }
    }

    /// The retransmission timer expired: go back, or fail once the retries are spent.
    pub(super) fn on_rto(&mut self) -> Option<RcFailure> {
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
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use inc_wire::RoceRepr;

    use super::super::tests::cfg;
    use super::super::Outgoing;
    use super::*;

    /// Messages written in place are the frames `send` and `send_shared` make of the
    /// same message, with and without an immediate; `None` queues nothing.
    #[test]
    fn in_place_and_shared_sends_make_the_frames_send_makes() {
        let payload: Vec<u8> = (0..1021u32).map(|i| (i * 13) as u8).collect();
        let mut frames = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for imm in [None, Some(0xdead_beef)] {
            for len in [0, 1, 4, 1021, 1024] {
                let payload = &payload[..len.min(payload.len())];
                let mut conns: Vec<RcConnection> =
                    (0..4).map(|_| RcConnection::new(cfg(1, 2, 8))).collect();
                conns[0].send(imm, payload).unwrap();
                conns[1].send_shared(imm, payload, &PayloadCrc::new(payload)).unwrap();
                assert_eq!(conns[2].send_in_place(|_| None), Ok(None));
                let psn = conns[2]
                    .send_in_place(|area| {
                        area[..payload.len()].copy_from_slice(payload);
                        Some((imm, payload.len()))
                    })
                    .unwrap();
                assert_eq!(psn, Some(conns[0].oldest_unacked().unwrap()));
                if imm.is_none() {
                    conns[3]
                        .send_in_place_with_crc(|area| {
                            area[..payload.len()].copy_from_slice(payload);
                            Some((payload.len(), PayloadCrc::new(payload)))
                        })
                        .unwrap();
                } else {
                    conns.pop();
                }
                for (c, f) in conns.iter_mut().zip(&mut frames) {
                    let mut buf = vec![0u8; 2048];
                    let n = c.poll_transmit(Time::ZERO, &mut buf).unwrap();
                    *f = buf[..n].to_vec();
                }
                assert_eq!(frames[0], frames[1], "send_shared, imm {imm:?}, {len} bytes");
                assert_eq!(frames[0], frames[2], "send_in_place, imm {imm:?}, {len} bytes");
                if imm.is_none() {
                    assert_eq!(frames[0], frames[3], "send_in_place_with_crc, {len} bytes");
                }
                let parsed = RoceRepr::parse(&frames[2]).unwrap();
                assert!(parsed.icrc_ok);
                assert_eq!((parsed.payload, parsed.repr.ext.imm), (payload, imm));
            }
        }
        let mut c = RcConnection::new(cfg(1, 2, 8));
        assert_eq!(
            c.send_in_place(|_| Some((None, 1025))),
            Err(SendError::TooLarge { len: 1025, max: 1024 })
        );
        assert_eq!(
            c.send_shared(None, b"abcd", &PayloadCrc::new(b"abc")),
            Err(SendError::PayloadCrcMismatch { len: 4, crc_len: 3 })
        );
        assert_eq!(
            c.send_in_place_with_crc(|_| Some((4, PayloadCrc::new(b"abc")))),
            Err(SendError::PayloadCrcMismatch { len: 4, crc_len: 3 })
        );
        assert_eq!(c.queued(), 0);
    }

    /// Frames handed out as they sit in the send queue are the frames `poll_transmit`
    /// copies; one a backend still holds never changes under it (a retransmission
    /// with another AckReq works on a copy), and its buffer is not reused while held.
    #[test]
    fn queued_frames_stay_as_handed_out_while_held() {
        let mut c = cfg(1, 2, 8);
        c.addr.psn_ident = true;
        c.timers.ack_req_every = 2;
        let (mut shared, mut copied) = (RcConnection::new(c.clone()), RcConnection::new(c));
        for k in 0..3u8 {
            shared.send(None, &[k; 100]).unwrap();
            copied.send(None, &[k; 100]).unwrap();
        }
        let mut buf = vec![0u8; 2048];
        let mut held = Vec::new();
        while let Some(out) = shared.poll_transmit_frame(Time::ZERO, &mut buf) {
            let Outgoing::Queued(frame) = out else { panic!("a request, not {out:?}") };
            let n = copied.poll_transmit(Time::ZERO, &mut buf).unwrap();
            assert_eq!(&frame[..], &buf[..n]);
            let parsed = RoceRepr::parse(&frame).unwrap();
            assert!(parsed.icrc_ok);
            assert_eq!(parsed.repr.ip_ident, frame::psn_ident(parsed.repr.bth.psn));
            held.push((frame.to_vec(), frame));
        }
        let ack_reqs =
            |frames: &[&[u8]]| frames.iter().map(|f| frame::ack_req(f)).collect::<Vec<_>>();
        assert_eq!(ack_reqs(&[&held[0].0, &held[1].0, &held[2].0]), [false, true, false]);
        // Go back: the first two again, now with AckReq flipped both ways (on copies).
        shared.rewind();
        let mut retransmitted = Vec::new();
        for _ in 0..2 {
            let Some(Outgoing::Queued(f)) = shared.poll_transmit_frame(Time::ZERO, &mut buf) else {
                panic!("retransmission")
            };
            assert!(RoceRepr::parse(&f).unwrap().icrc_ok);
            retransmitted.push(f);
        }
        assert_eq!(ack_reqs(&[&retransmitted[0], &retransmitted[1]]), [true, false]);
        // The peer acknowledges everything while the frames are still held, then more
        // messages are queued: none may land in a held buffer.
        let psn = held[2].1.as_ref();
        let bth = RoceRepr::parse(psn).unwrap().repr.bth;
        let ack = AethRepr { syndrome: AethSyndrome::Ack { credits: 31 }, msn: 3 };
        shared.on_ack(Time::ZERO, bth.psn, &ack);
        assert_eq!(shared.queued(), 0);
        for k in 0..8u8 {
            shared.send(None, &[0xf0 | k; 100]).unwrap();
        }
        while shared.poll_transmit_frame(Time::ZERO, &mut buf).is_some() {}
        for (k, (bytes, frame)) in held.iter().enumerate() {
            assert_eq!(&frame[..], &bytes[..], "held frame {k} changed");
        }
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

    /// Karn: ACKs of packets sent more than once keep the backed-off timeout (on a
    /// path slower than the RTO, dropping it resends the window again and again); the
    /// first ACK of a packet sent once ends the backoff.
    #[test]
    fn only_a_fresh_sample_ends_the_backoff() {
        let mut a = RcConnection::new(cfg(1, 2, 8));
        let mut buf = vec![0u8; 2048];
        let ack = AethRepr { syndrome: AethSyndrome::Ack { credits: 31 }, msn: 1 };
        let mut now = Time::ZERO;
        let mut sent = Vec::new();
        for k in 0..3u8 {
            a.send(None, &[k; 100]).unwrap();
            let n = a.poll_transmit(now, &mut buf).expect("sent");
            sent.push(RoceRepr::parse(&buf[..n]).unwrap().repr.bth.psn);
        }
        let base = a.poll_timeout().unwrap() - now;
        now += base;
        assert_eq!(a.handle_timeout(now), None);
        while a.poll_transmit(now, &mut buf).is_some() {}
        let backed_off = a.poll_timeout().unwrap() - now;
        assert_eq!(backed_off, base * 2);
        // The first retransmitted packet is acknowledged: progress, but no sample.
        now += Duration::from_micros(100);
        a.on_ack(now, sent[0], &ack);
        assert_eq!(a.poll_timeout().unwrap() - now, backed_off);
        // A packet sent once is acknowledged: its RTT is a sample, the backoff ends.
        a.send(None, &[9; 100]).unwrap();
        while a.poll_transmit(now, &mut buf).is_some() {}
        let fresh = sent[2].next();
        now += Duration::from_micros(100);
        a.on_ack(now, fresh, &ack);
        assert_eq!(a.queued(), 0);
        a.send(None, &[10; 100]).unwrap();
        a.poll_transmit(now, &mut buf).expect("sent");
        assert!(a.poll_timeout().unwrap() - now < backed_off);
    }

    /// The tail probe waits `ack_delay` after the ACK of the last AckReq'd packet on a
    /// fast path, and twice the smoothed RTT on a slow one, where the packets after it
    /// are still on their way.
    #[test]
    fn tail_probe_waits_for_twice_the_smoothed_rtt() {
        for (rtt_us, probe_after_us) in [(50, 200), (5_000, 10_000)] {
            let mut a = RcConnection::new(cfg(1, 2, 64));
            let mut buf = vec![0u8; 2048];
            let mut sent = Vec::new();
            for k in 0..10u8 {
                a.send(None, &[k; 100]).unwrap();
            }
            let mut now = Time::ZERO;
            while let Some(n) = a.poll_transmit(now, &mut buf) {
                sent.push(RoceRepr::parse(&buf[..n]).unwrap().repr.bth.psn);
            }
            assert_eq!(sent.len(), 10);
            // The 8th packet carried AckReq; its ACK leaves the last two unacknowledged.
            now += Duration::from_micros(rtt_us);
            let ack = AethRepr { syndrome: AethSyndrome::Ack { credits: 31 }, msn: 8 };
            a.on_ack(now, sent[7], &ack);
            assert_eq!(a.queued(), 2);
            let due = now + Duration::from_micros(probe_after_us);
            let early = now + Duration::from_micros(probe_after_us - 1);
            a.handle_timeout(early);
            assert_eq!(a.poll_transmit(early, &mut buf), None, "probe before {due:?}");
            assert_eq!(a.counters().tail_probes, 0);
            a.handle_timeout(due);
            let n = a.poll_transmit(due, &mut buf).expect("the tail probe");
            let probe = RoceRepr::parse(&buf[..n]).unwrap().repr.bth;
            assert_eq!((probe.psn, probe.ack_req), (sent[9], true));
            assert_eq!(a.counters().tail_probes, 1);
        }
    }

    /// Our ACK is stuck behind a stream of the peer's requests on a slow way back: no
    /// timeout while they arrive, one RTO after the last.
    #[test]
    fn peer_requests_ahead_of_the_ack_hold_the_timer() {
        let mut a = RcConnection::new(cfg(1, 2, 4));
        let mut buf = vec![0u8; 2048];
        a.send(None, b"x").unwrap();
        let start = Time::ZERO;
        assert!(a.poll_transmit(start, &mut buf).is_some());
        let rto = a.poll_timeout().expect("timer armed") - start;
        let mut psn = Psn::new(0xFF_FFF2);
        let mut now = start;
        // The peer's requests arrive every RTO/4 for 3 RTOs.
        for _ in 0..12 {
            now += rto / 4;
            assert_eq!(a.handle_timeout(now), None);
            let bth = inc_wire::BthRepr::new(inc_wire::Opcode::RcSendOnly, 0x101, psn);
            assert_eq!(a.on_packet(now, &bth, None), Inbound::Request);
            a.accept(now);
            psn = psn.next();
        }
        assert_eq!(a.counters().timeouts, 0);
        let last = now;
        a.handle_timeout(last + (rto - Duration::from_nanos(1)));
        assert_eq!(a.counters().timeouts, 0);
        a.handle_timeout(last + rto);
        assert_eq!(a.counters().timeouts, 1, "the timer still fires once they stop");
    }
}
