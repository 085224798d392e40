//! Typed errors of the host library. Every variant names the thing at fault (rank,
//! address, environment variable, PSN) so a user can act on the message alone.

use std::io;
use std::time::Duration;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by INCCL.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller-supplied argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Configuration (environment variable, interface, address) is unusable.
    #[error("configuration error: {0}")]
    Config(String),
    /// A bounded wait expired; `what` says who or what did not show up.
    #[error("rank {rank}: timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// Rank that was waiting.
        rank: u16,
        /// How long it waited.
        waited: Duration,
        /// What it waited for (names the missing ranks or the peer).
        what: String,
    },
    /// Another rank misbehaved or went away during the bootstrap.
    #[error("rank {rank}: {reason}")]
    Peer {
        /// Rank reporting the problem.
        rank: u16,
        /// What happened, naming the peer.
        reason: String,
    },
    /// Rank 0 aborted the group or communicator setup; the reason is rank 0's error.
    #[error("rank {rank}: rank 0 aborted: {reason}")]
    Aborted {
        /// Rank that received the abort.
        rank: u16,
        /// Rank 0's reason.
        reason: String,
    },
    /// The controller could not be reached or refused a request.
    #[error("controller {addr}: {source}")]
    Controller {
        /// Controller address used.
        addr: String,
        /// Client error.
        #[source]
        source: inc_ctrl_proto::ClientError,
    },
    /// A socket or system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the address or interface involved.
        context: String,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// The data path failed (connection to the switch broken, stall, protocol error).
    #[error("rank {rank}, communicator {comm_id}: {reason}")]
    Collective {
        /// Local rank.
        rank: u16,
        /// Communicator id.
        comm_id: u32,
        /// What failed (names the PSN, switch or peer when known).
        reason: String,
    },
    /// The requested transport is not compiled in or not usable on this host.
    #[error("transport unavailable: {0}")]
    TransportUnavailable(String),
    /// The object was used after a fatal error or after being destroyed.
    #[error("{0} is no longer usable: {1}")]
    Unusable(&'static str, String),
}

impl Error {
    /// Wrap an I/O error with a context message.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }
}
