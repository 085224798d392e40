//! Shared control-plane types for the INC emulator.
//!
//! - [`SwitchRules`] / [`ConnectionRule`]: what the controller pushes to a switch for a
//!   communicator; [`HostEndpoint`]: what each rank gets back.
//! - [`Envelope`] / [`Message`]: the controller protocol. A frame is a 4-byte
//!   big-endian length followed by a JSON envelope `{version, id, body}`; frames above
//!   [`codec::MAX_FRAME`] are refused before allocation.
//! - [`ControllerClient`] and [`SwitchSession`]: blocking clients (std sockets,
//!   bounded waits) so the switch and INCCL never re-implement framing.

mod client;
pub mod codec;
mod mac;
mod msg;
mod rules;

pub use client::{ClientError, ControllerClient, Push, PushRequest, SwitchSession};
pub use codec::{CodecError, FrameDecoder, MAX_FRAME};
pub use mac::{Mac, ParseMacError};
pub use msg::{
    CommunicatorStatus, Envelope, GroupStatus, Message, StatusReport, SwitchStatus,
    PROTOCOL_VERSION,
};
pub use rules::Peer;
pub use rules::{
    ipv4_gid, udp_port_for_qpn, ConnectionRule, HostEndpoint, PortInfo, RankEndpoint, SwitchRules,
    MAX_24BIT, MAX_WINDOW, ROCE_UDP_PORT, VALID_MTUS,
};
