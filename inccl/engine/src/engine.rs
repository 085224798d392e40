//! [`HostEngine`]: [`HostCollective`] over a software RC QP, frames in and out.

use std::time::Duration;

use inc_protocol::{
    earliest, frame, Inbound, RcAddressing, RcConfig, RcConnection, RcCounters, RcTimers, Time,
};
use inc_wire::{Opcode, Psn};

use crate::collective::{
    CallBuffers, CollectiveConfig, CollectiveCounters, Delivery, HostCollective, MAX_IN_FLIGHT,
};
use crate::{CollectiveSpec, HostError, HostQpConfig};

/// Tunables of a [`HostEngine`] beyond [`HostQpConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostOptions {
    /// RC timers.
    pub timers: RcTimers,
    /// A running collective fails with [`HostError::Timeout`] after this long without
    /// progress (no ACK advancing, no message accepted).
    pub progress_timeout: Duration,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions { timers: RcTimers::default(), progress_timeout: Duration::from_secs(10) }
    }
}

/// Consecutive retransmission timeouts (backing off from `rto_min` to `rto_max`) that
/// take at least `span`. A host's RC connection gives up no sooner than its collective's
/// progress timeout would: with hundreds of emulated hosts on a few CPUs the switch may
/// not answer for seconds, and a count of timeouts meant for a real fabric (about 3 s
/// by default) failed 256-host runs that were only slow.
fn timeouts_spanning(timers: &RcTimers, span: Duration) -> u32 {
    let (mut rto, mut total, mut n) =
        (timers.rto_min.max(Duration::from_micros(1)), Duration::ZERO, 0);
    while total < span && n < 1_000 {
        total += rto;
        rto = (rto * 2).min(timers.rto_max.max(rto));
        n += 1;
    }
    n
}

/// Host counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostCounters {
    /// The RC QP.
    pub rc: RcCounters,
    /// The collective layer.
    pub collective: CollectiveCounters,
    /// Frames handed in.
    pub rx_frames: u64,
    /// Frames handed out.
    pub tx_frames: u64,
    /// Frames that are not RoCEv2 or are malformed (dropped).
    pub rx_malformed: u64,
    /// Frames with a bad ICRC (dropped).
    pub rx_bad_icrc: u64,
    /// Frames for another QP or from another peer (dropped).
    pub rx_wrong_qp: u64,
    /// RC opcodes other than SEND_ONLY[_WITH_IMM] and ACK (dropped).
    pub rx_unsupported: u64,
    /// Collectives failed by the progress timeout.
    pub progress_timeouts: u64,
}

/// The sans-IO host: one RC QP to the leaf switch for one (communicator, rank).
#[derive(Debug)]
pub struct HostEngine {
    cfg: HostQpConfig,
    opts: HostOptions,
    coll: HostCollective,
    rc: RcConnection,
    last_progress: Time,
    counters: HostCounters,
}

impl HostEngine {
    /// A host QP in RTS state with default options.
    pub fn new(config: HostQpConfig) -> Self {
        Self::with_options(config, HostOptions::default())
    }

    /// A host QP with explicit options.
    pub fn with_options(config: HostQpConfig, opts: HostOptions) -> Self {
        let mtu = usize::from(config.mtu).clamp(256, 4096) & !3;
        let window = config.window.max(1);
        let addr = RcAddressing {
            local_mac: config.local_mac,
            local_ip: config.local_ip,
            local_udp_port: config.local_udp_port,
            local_qpn: config.local_qpn,
            peer_mac: Some(config.switch_mac),
            peer_ip: config.switch_ip,
            // Switches listen on the RoCEv2 port; `switch_udp_port` is their source port.
            peer_udp_port: inc_wire::ROCEV2_PORT,
            peer_qpn: config.switch_qpn,
            psn_ident: false,
        };
        let rc = RcConnection::new(RcConfig {
            addr,
            send_start_psn: Psn::new(config.local_start_psn),
            recv_start_psn: Psn::new(config.switch_start_psn),
            max_payload: mtu.max(inc_protocol::coll::HEADER_LEN),
            // W data chunks plus the Start of every collective in flight.
            send_queue: window as usize + 2 + MAX_IN_FLIGHT,
            timers: inc_protocol::timers_for_window(
                RcTimers {
                    retry_limit: opts
                        .timers
                        .retry_limit
                        .max(timeouts_spanning(&opts.timers, opts.progress_timeout)),
                    ..opts.timers
                },
                window as usize,
            ),
        });
        let coll = HostCollective::new(CollectiveConfig {
            rank: config.rank,
            world_size: config.world_size,
            mtu,
            window,
        });
        HostEngine {
            cfg: config,
            opts,
            coll,
            rc,
            last_progress: Time::ZERO,
            counters: HostCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HostQpConfig {
        &self.cfg
    }

    /// The message-level state machine (read-only).
    pub fn collective(&self) -> &HostCollective {
        &self.coll
    }

    /// Starts a collective, the only call; drive it with the other methods until
    /// [`poll_completion`](Self::poll_completion) yields.
    pub fn start(&mut self, now: Time, spec: CollectiveSpec) -> Result<(), HostError> {
        self.check_connection()?;
        self.coll.start(spec)?;
        self.last_progress = now;
        Ok(())
    }

    /// Starts a collective behind the calls already held (at most
    /// [`MAX_IN_FLIGHT`](crate::MAX_IN_FLIGHT), see [`HostCollective::enqueue`]): the
    /// buffers passed to the other methods are then the held calls', oldest first.
    pub fn enqueue(&mut self, now: Time, spec: CollectiveSpec) -> Result<(), HostError> {
        self.check_connection()?;
        if !self.coll.is_active() {
            self.last_progress = now;
        }
        self.coll.enqueue(spec)
    }

    fn check_connection(&self) -> Result<(), HostError> {
        match self.rc.failure() {
            Some(f) => {
                Err(HostError::ConnectionFailed { psn: f.psn().value(), reason: f.to_string() })
            }
            None => Ok(()),
        }
    }

    /// Handles one received Ethernet frame.
    pub fn handle_frame<'a, B: CallBuffers<'a> + ?Sized>(
        &mut self,
        now: Time,
        frame: &[u8],
        bufs: &mut B,
    ) {
        self.counters.rx_frames += 1;
        let parsed = match frame::parse_any_port(frame) {
            Ok(p) => p,
            Err(_) => {
                self.counters.rx_malformed += 1;
                return;
            }
        };
        if !parsed.icrc_ok {
            self.counters.rx_bad_icrc += 1;
            return;
        }
        let r = &parsed.repr;
        if r.bth.dest_qp != self.cfg.local_qpn || r.ip_src != self.cfg.switch_ip {
            self.counters.rx_wrong_qp += 1;
            return;
        }
        match r.bth.opcode {
            Opcode::RcAcknowledge | Opcode::RcSendOnly | Opcode::RcSendOnlyWithImmediate => {}
            _ => {
                self.counters.rx_unsupported += 1;
                return;
            }
        }
        let before = self.rc.oldest_unacked();
        match self.rc.on_packet(now, &r.bth, r.ext.aeth.as_ref()) {
            Inbound::Request => match self.coll.handle_message(r.ext.imm, parsed.payload, bufs) {
                d @ (Delivery::Accepted | Delivery::AcceptedAwaited) => {
                    self.rc.accept(now);
                    if d == Delivery::AcceptedAwaited {
                        self.rc.ack_now();
                    }
                    self.last_progress = now;
                }
                Delivery::NotReady => self.rc.reject_rnr(),
            },
            Inbound::Failed(f) => {
                self.coll.fail(HostError::ConnectionFailed {
                    psn: f.psn().value(),
                    reason: f.to_string(),
                });
            }
            Inbound::Handled | Inbound::Dropped => {}
        }
        if self.rc.oldest_unacked() != before {
            self.last_progress = now;
        }
    }

    /// Writes the next frame to send into `buf` (at least `mtu + 70` bytes).
    pub fn poll_transmit<'a, B: CallBuffers<'a> + ?Sized>(
        &mut self,
        now: Time,
        buf: &mut [u8],
        bufs: &B,
    ) -> Option<usize> {
        if let Some(len) = self.rc.poll_transmit(now, buf) {
            self.counters.tx_frames += 1;
            return Some(len);
        }
        while self.rc.send_room() > 0 && self.coll.has_send() {
            let coll = &mut self.coll;
            match self.rc.send_in_place(|out| coll.poll_send(bufs, out).map(|m| (m.imm, m.len))) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    let psn = self.rc.oldest_unacked().unwrap_or(self.rc.expected_psn()).value();
                    self.coll.fail(HostError::ConnectionFailed { psn, reason: e.to_string() });
                    break;
                }
            }
        }
        let len = self.rc.poll_transmit(now, buf)?;
        self.counters.tx_frames += 1;
        Some(len)
    }

    /// True when an ACK is owed now: after the last chunk of a result whose senders
    /// wait for its delivery ([`Delivery::AcceptedAwaited`]), which a transport sends
    /// before it returns the collective to its caller.
    ///
    /// [`Delivery::AcceptedAwaited`]: crate::Delivery::AcceptedAwaited
    pub fn owes_ack(&self) -> bool {
        self.rc.ack_owed()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must run next.
    pub fn poll_timeout(&self) -> Option<Time> {
        let progress =
            self.coll.is_active().then(|| self.last_progress + self.opts.progress_timeout);
        earliest(self.rc.poll_timeout(), progress)
    }

    /// Runs expired timers.
    pub fn handle_timeout(&mut self, now: Time) {
        if let Some(f) = self.rc.handle_timeout(now) {
            self.coll
                .fail(HostError::ConnectionFailed { psn: f.psn().value(), reason: f.to_string() });
            return;
        }
        if self.coll.is_active() && now >= self.last_progress + self.opts.progress_timeout {
            let (psn, waiting_for) = match self.rc.oldest_unacked() {
                Some(p) => (p, "an ACK from the switch"),
                None => (self.rc.expected_psn(), "a packet from the switch"),
            };
            let (done, total) = self.coll.progress().unwrap_or((0, 0));
            self.counters.progress_timeouts += 1;
            self.coll.fail(HostError::Timeout {
                seq: self.coll.seq(),
                waited: now - self.last_progress,
                psn: psn.value(),
                detail: format!("{waiting_for}; {done} of {total} chunks complete"),
            });
        }
    }

    /// The outcome of the last collective, once.
    pub fn poll_completion(&mut self) -> Option<Result<(), HostError>> {
        self.coll.poll_completion()
    }

    /// Counters.
    pub fn counters(&self) -> HostCounters {
        HostCounters { rc: *self.rc.counters(), collective: *self.coll.counters(), ..self.counters }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CollectiveKind, DataType, OpBuffers, Operator};

    /// The RC give-up spans the progress timeout: 1, 2, 4 ... 256 ms (511 ms in 9
    /// timeouts), then 500 ms each up to 10 s.
    #[test]
    fn rc_retries_span_the_progress_timeout() {
        let t = RcTimers::default();
        assert_eq!(timeouts_spanning(&t, Duration::from_secs(10)), 9 + 19);
        assert_eq!(timeouts_spanning(&t, Duration::ZERO), 0);
        assert_eq!(timeouts_spanning(&t, Duration::from_millis(1)), 1);
    }

    /// A silent switch: the wait is bounded and the error names the stalled PSN.
    #[test]
    fn silent_switch_times_out_naming_the_psn() {
        let cfg = HostQpConfig { local_start_psn: 0xFF_FFFE, ..HostQpConfig::default() };
        let opts =
            HostOptions { progress_timeout: Duration::from_millis(50), ..HostOptions::default() };
        let mut h = HostEngine::with_options(cfg, opts);
        let spec = CollectiveSpec {
            kind: CollectiveKind::AllReduce,
            op: Operator::Sum,
            dtype: DataType::Int32,
            count: 10,
        };
        let src = vec![1u8; 40];
        let mut dst = vec![0u8; 40];
        h.start(Time::ZERO, spec).unwrap();
        let mut buf = vec![0u8; 2048];
        let mut now = Time::ZERO;
        let mut sent = 0;
        loop {
            let bufs = OpBuffers::Separate { src: &src, dst: &mut dst };
            while h.poll_transmit(now, &mut buf, &bufs).is_some() {
                sent += 1;
            }
            now = h.poll_timeout().expect("a deadline while running");
            h.handle_timeout(now);
            if let Some(r) = h.poll_completion() {
                match r {
                    Err(HostError::Timeout { psn, seq: 0, .. }) => assert_eq!(psn, 0xFF_FFFE),
                    other => panic!("{other:?}"),
                }
                break;
            }
        }
        assert!(sent >= 2, "Start and data went out");
        assert!(h.counters().rc.retransmits > 0);
        assert!(
            now >= Time::from_nanos(50_000_000) && now < Time::from_nanos(60_000_000),
            "{now:?}"
        );
    }
}
