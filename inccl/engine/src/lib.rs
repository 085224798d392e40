//! The sans-IO INCCL host engine, in two layers:
//!
//! 1. [`HostCollective`]: the message-level collective state machine (control message,
//!    chunking, sliding window, completion, errors). It knows nothing of PSNs or ACKs,
//!    so the ibverbs transport (RC done by the NIC) drives it directly.
//! 2. [`HostEngine`]: `HostCollective` plus a software RC QP from `inc-protocol`,
//!    consuming and producing complete RoCEv2 Ethernet frames, for the userspace
//!    transport.
//!
//! See `docs/PROTOCOL.md` for the protocol.

mod collective;
mod engine;

use std::net::Ipv4Addr;
use std::time::Duration;

pub use collective::{
    CallBuffers, CollectiveConfig, CollectiveCounters, Delivery, HostCollective, OutMessage,
    MAX_IN_FLIGHT,
};
pub use engine::{HostCounters, HostEngine, HostOptions};
pub use inc_protocol::Time;
pub use inc_wire::{DataType, EthernetAddress, Operator};

/// Everything a host QP needs to talk to its leaf switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostQpConfig {
    /// This rank.
    pub rank: u16,
    /// Ranks in the communicator.
    pub world_size: u16,
    /// Communicator id (for logs).
    pub comm_id: u32,
    /// Host MAC (Ethernet source of our frames).
    pub local_mac: EthernetAddress,
    /// Host IP.
    pub local_ip: Ipv4Addr,
    /// Host QPN.
    pub local_qpn: u32,
    /// UDP source port of our frames (and the port we receive on).
    pub local_udp_port: u16,
    /// First PSN we send.
    pub local_start_psn: u32,
    /// Switch port MAC.
    pub switch_mac: EthernetAddress,
    /// Switch port IP.
    pub switch_ip: Ipv4Addr,
    /// Switch-side QPN.
    pub switch_qpn: u32,
    /// UDP source port of the switch's frames (informational: we always send to 4791).
    pub switch_udp_port: u16,
    /// First PSN the switch sends.
    pub switch_start_psn: u32,
    /// Payload bytes per packet (256..=4096).
    pub mtu: u16,
    /// W: chunks kept outstanding.
    pub window: u32,
}

impl Default for HostQpConfig {
    fn default() -> Self {
        HostQpConfig {
            rank: 0,
            world_size: 1,
            comm_id: 0,
            local_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            local_ip: Ipv4Addr::UNSPECIFIED,
            local_qpn: 0x11,
            local_udp_port: inc_wire::ROCEV2_PORT,
            local_start_psn: 0,
            switch_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
            switch_ip: Ipv4Addr::UNSPECIFIED,
            switch_qpn: 0x12,
            switch_udp_port: inc_wire::ROCEV2_PORT,
            switch_start_psn: 0,
            mtu: 1024,
            window: 64,
        }
    }
}

impl HostQpConfig {
    /// The configuration for `ep` as answered by the controller, for a host with the
    /// given addresses and QP (`ep.host_qpn`, `ep.host_start_psn`, `ep.host_udp_port`).
    pub fn from_endpoint(
        ep: &inc_ctrl_proto::HostEndpoint,
        world_size: u16,
        local_mac: EthernetAddress,
        local_ip: Ipv4Addr,
    ) -> Self {
        HostQpConfig {
            rank: ep.rank,
            world_size,
            comm_id: ep.comm_id,
            local_mac,
            local_ip,
            local_qpn: ep.host_qpn,
            local_udp_port: ep.host_udp_port,
            local_start_psn: ep.host_start_psn,
            switch_mac: EthernetAddress(ep.switch_mac.0),
            switch_ip: ep.switch_ip,
            switch_qpn: ep.switch_qpn,
            switch_udp_port: ep.switch_udp_port,
            switch_start_psn: ep.switch_start_psn,
            mtu: ep.mtu,
            window: ep.window,
        }
    }
}

/// Which collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// Every rank gets the reduction.
    AllReduce,
    /// Only `root` gets the reduction; the others complete when it is delivered.
    Reduce {
        /// Receiving rank.
        root: u16,
    },
    /// `root`'s vector is copied to every rank.
    Broadcast {
        /// Sending rank.
        root: u16,
    },
    /// Synchronisation, no data (`op`, `dtype`, `count` ignored).
    Barrier,
    /// Every rank contributes `world_size` blocks of `count` elements; rank `r` gets the
    /// reduction of block `r`. Run as `world_size` parts, part `i` a Reduce rooted at
    /// rank `i` over block `i`, so the switches aggregate every block and deliver it
    /// only toward its owner.
    ReduceScatter,
    /// Every rank contributes one block of `count` elements and gets all `world_size`
    /// blocks, block `r` from rank `r`. Run as `world_size` parts, part `i` a Broadcast
    /// rooted at rank `i` over block `i`, so each rank sends its block once and the
    /// switches replicate it.
    AllGather,
}

impl CollectiveKind {
    /// Whether `count` is the elements of one of `world_size` blocks (`ReduceScatter`,
    /// `AllGather`).
    pub fn is_blockwise(&self) -> bool {
        matches!(self, CollectiveKind::ReduceScatter | CollectiveKind::AllGather)
    }
}

/// One collective call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveSpec {
    /// Which collective.
    pub kind: CollectiveKind,
    /// Reduction operator (Sum, Max, Min).
    pub op: Operator,
    /// Element type.
    pub dtype: DataType,
    /// Elements per rank (u64: vectors beyond 4 GiB); for `ReduceScatter` and
    /// `AllGather` the elements of one block (`recvcount`, `sendcount`).
    pub count: u64,
}

/// User buffers in native byte order; the engine converts to/from network order per packet.
///
/// For `ReduceScatter`, `Separate` is `world_size` blocks in and one block out, and
/// `InPlace` is `world_size` blocks whose own block receives the result. For
/// `AllGather`, `InPlace` is `world_size` blocks whose own block holds the input, and
/// `Separate` is one block in and `world_size` blocks out, of which the engine fills
/// all but the rank's own (the caller copies that one: the network never sends a rank
/// its own block).
#[derive(Debug)]
pub enum OpBuffers<'a> {
    /// Input and output apart.
    Separate {
        /// Input.
        src: &'a [u8],
        /// Output.
        dst: &'a mut [u8],
    },
    /// Input overwritten by the output.
    InPlace(&'a mut [u8]),
    /// Only input (Reduce non-root, Broadcast root).
    SendOnly(&'a [u8]),
    /// Only output (Broadcast receivers).
    RecvOnly(&'a mut [u8]),
    /// No data (Barrier, or between collectives).
    None,
}

/// Errors of the host engine. Each names what is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// `start` while collective `seq` runs.
    #[error("collective {seq} is still running")]
    Busy {
        /// The running collective.
        seq: u32,
    },
    /// The spec cannot be run.
    #[error("invalid collective: {0}")]
    InvalidSpec(String),
    /// A user buffer is too small.
    #[error("{what} holds {have} bytes, the collective needs {need}")]
    Buffer {
        /// Which buffer.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes given.
        have: u64,
    },
    /// Ranks disagree on the collective.
    #[error("collective {seq}: rank {rank_a} and rank {rank_b} disagree on {fields}")]
    Mismatch {
        /// Collective sequence number.
        seq: u32,
        /// The fields that differ.
        fields: String,
        /// One rank.
        rank_a: u16,
        /// A rank that disagrees with it.
        rank_b: u16,
    },
    /// The switches report a failure elsewhere in the tree.
    #[error("collective {seq} failed in the network: {reason}")]
    Remote {
        /// Collective sequence number.
        seq: u32,
        /// What was reported.
        reason: String,
    },
    /// Our RC connection to the switch failed.
    #[error("RC connection to the switch failed at PSN {psn}: {reason}")]
    ConnectionFailed {
        /// The stalled PSN.
        psn: u32,
        /// Why.
        reason: String,
    },
    /// Nothing progressed for the configured time.
    #[error("collective {seq} made no progress for {waited:?}, stalled at PSN {psn} (waiting for {detail})")]
    Timeout {
        /// Collective sequence number.
        seq: u32,
        /// How long nothing happened.
        waited: Duration,
        /// The stalled PSN (oldest unacknowledged send, else the next expected receive).
        psn: u32,
        /// What we wait for.
        detail: String,
    },
    /// The switch sent something that breaks the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
}
