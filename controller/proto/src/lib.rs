//! Shared control-plane types for the INC emulator.
//!
//! - [`SwitchRules`] / [`ConnectionRule`]: what the controller pushes to a switch for a
//!   communicator; [`HostEndpoint`]: what each rank gets back.
//! - [`Envelope`] / [`Message`]: the controller protocol. A frame is a 4-byte
//!   big-endian length followed by a JSON envelope `{version, id, body}`; frames above
//!   [`codec::MAX_FRAME`] are refused before allocation; the controller's own replies
//!   may be up to [`codec::MAX_REPLY_FRAME`] (`status` of a large deployment).
//! - [`ControllerClient`] and [`SwitchSession`]: blocking clients (std sockets,
//!   bounded waits) so the switch and INCCL never re-implement framing.

mod client;
pub mod codec;
mod msg;
mod rules;

/// Environment variable holding the credential a client presents to the controller
/// (the switch credential for `inc-switch`, the host credential for INCCL's rank 0
/// and `inc-controller status`).
pub const TOKEN_ENV: &str = "INC_CONTROLLER_TOKEN";

pub use client::{
    ClientError, ControllerClient, CreatedCommunicator, Push, PushRequest, Registration,
    SwitchSession, Verdict, HELD_CHUNK_BYTES, REJECT_REASON_MAX,
};
pub use codec::{CodecError, FrameBuffer, FrameDecoder, MAX_FRAME, MAX_REPLY_FRAME};
pub use inc_wire::{EthernetAddress, ParseEthernetAddressError};
pub use msg::{
    CommunicatorStatus, Envelope, GroupStatus, HeldCommunicator, Message, Origin, StatusReport,
    SwitchStatus, PROTOCOL_VERSION,
};
pub use rules::Peer;
pub use rules::{
    ipv4_gid, udp_port_for_qpn, ConnectionRule, HostEndpoint, PortInfo, RankEndpoint, SwitchRules,
    MAX_24BIT, MAX_WINDOW, ROCE_UDP_PORT, VALID_MTUS,
};
