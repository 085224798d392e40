//! Sans-IO building blocks shared by the INC switch engine and the INCCL host engine.
//!
//! - [`Time`]: the clock engines are driven with.
//! - [`RcConnection`]: one RoCEv2 Reliable Connection endpoint (requester with
//!   go-back-N, adaptive timeout and RNR handling; responder with ePSN/MSN tracking,
//!   coalesced ACKs, one NAK per gap and RNR NAKs).
//! - [`RttEstimator`]: `RTO = SRTT + 4 RTTVAR`, floor, backoff.
//! - [`coll`]: the INC collective control header and chunk arithmetic shared by
//!   switch and host.
//!
//! No sockets, threads or clocks: callers pass bytes and `now`, and get frames and
//! the next deadline back.

pub mod coll;
pub mod frame;
mod rc;
mod time;

pub use frame::{QueuedFrame, RcAddressing};
pub use rc::{
    timers_for_window, Inbound, Outgoing, RcConfig, RcConnection, RcCounters, RcFailure, RcTimers,
    RttEstimator, SendError,
};
pub use time::{earliest, Time};
