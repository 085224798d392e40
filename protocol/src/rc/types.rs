//! Configuration, counters and outcomes of an RC connection.

use std::time::Duration;

use inc_wire::{NakCode, Psn};
use serde::Serialize;

use crate::frame::RcAddressing;

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
    /// How long an ACK the peer asked for (AckReq) may wait for a request of ours to
    /// travel with: sent right behind that request, in the same batch, the peer reads
    /// both after one wake-up instead of two. Zero ACKs at once. Keep it well under
    /// the peer's RTO floor, and `ack_coalesce` under half the peer's window so a
    /// requester with nothing coming back never waits on it for window space.
    pub ack_req_delay: Duration,
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
            ack_req_delay: Duration::from_micros(200),
            rnr_timer: 10,
            psn_window: 1 << 16,
        }
    }
}

/// `timers` for a connection whose peer keeps `window` requests in flight: ACKs
/// coalesce over at most half of it, so a deferred ACK never holds the peer's window
/// shut.
pub fn timers_for_window(timers: RcTimers, window: usize) -> RcTimers {
    let half = u32::try_from(window / 2).unwrap_or(u32::MAX).max(1);
    RcTimers { ack_coalesce: timers.ack_coalesce.min(half), ..timers }
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
    /// A new request in order: the caller must call [`RcConnection::accept`](super::RcConnection::accept) or
    /// [`RcConnection::reject_rnr`](super::RcConnection::reject_rnr) before handling the next packet.
    Request,
    /// Consumed by the connection (ACK/NAK, duplicate, gap).
    Handled,
    /// Dropped and counted (PSN far outside the window, not a SEND/ACK).
    Dropped,
    /// The packet made the connection fail (fatal NAK, RNR retries exhausted).
    Failed(RcFailure),
}

/// Why [`RcConnection::send`](super::RcConnection::send) refused a message.
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
    /// The payload CRC handed to `send_shared` was computed over another payload length.
    #[error("payload CRC computed over {crc_len} bytes, the payload has {len}")]
    PayloadCrcMismatch {
        /// Payload length.
        len: usize,
        /// Payload length the CRC was computed over.
        crc_len: usize,
    },
    /// The connection failed earlier.
    #[error("connection failed: {0}")]
    Failed(RcFailure),
}
