//! Control-plane messages.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::{HostEndpoint, PortInfo, RankEndpoint, SwitchRules};

/// Protocol version carried by every envelope; a peer speaking another version gets an
/// error reply.
pub const PROTOCOL_VERSION: u16 = 1;

/// One framed message: the request id is echoed by the reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Protocol version ([`PROTOCOL_VERSION`]).
    pub version: u16,
    /// Request id chosen by the sender of a request; a reply carries the same id.
    pub id: u64,
    /// The message.
    pub body: Message,
}

impl Envelope {
    /// Envelope with the current protocol version.
    pub fn new(id: u64, body: Message) -> Self {
        Envelope { version: PROTOCOL_VERSION, id, body }
    }
}

/// Every message of the protocol. Requests get exactly one reply with the same id:
/// a specific reply, [`Message::Ack`], or [`Message::Error`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Message {
    // ---- generic ----
    /// Authenticate this connection (hosts that do not start with `RegisterGroup`).
    Hello {
        /// Shared token, if the controller requires one.
        token: Option<String>,
    },
    /// Liveness check; answered with `Ack`.
    Ping,
    /// Positive reply without data.
    Ack,
    /// Negative reply.
    Error {
        /// Human-readable reason.
        reason: String,
    },

    // ---- switch <-> controller ----
    /// First message of a switch connection. Re-registering replaces an older
    /// connection of the same switch, and the controller re-pushes all live rules:
    /// a switch should drop rules it held before registering.
    RegisterSwitch {
        /// Topology switch id.
        switch_id: u32,
        /// Shared token, if the controller requires one.
        token: Option<String>,
        /// Data-plane ports as the switch sees them.
        ports: Vec<PortInfo>,
    },
    /// Controller -> switch: install rules for a communicator (replace if present).
    InstallCommunicator(SwitchRules),
    /// Controller -> switch: drop a communicator.
    RemoveCommunicator {
        /// Communicator id.
        comm_id: u32,
    },

    // ---- rank 0 <-> controller ----
    /// Register a group; the group lives until destroyed or until the registering
    /// connection closes.
    RegisterGroup {
        /// Shared token, if the controller requires one.
        token: Option<String>,
        /// Number of ranks.
        world_size: u16,
        /// Host IP of each rank, indexed by rank.
        hosts: Vec<Ipv4Addr>,
    },
    /// Reply to `RegisterGroup`.
    GroupCreated {
        /// Controller-unique group id.
        group_id: u64,
    },
    /// Create a communicator over a group.
    CreateCommunicator {
        /// Group id.
        group_id: u64,
        /// One entry per rank.
        ranks: Vec<RankEndpoint>,
        /// Override of the topology's default payload size.
        mtu: Option<u16>,
        /// Override of the topology's default window.
        window: Option<u32>,
    },
    /// Reply to `CreateCommunicator`, sent after every involved switch acknowledged.
    CommunicatorCreated {
        /// Controller-unique communicator id.
        comm_id: u32,
        /// Connection parameters, indexed by rank.
        endpoints: Vec<HostEndpoint>,
    },
    /// Destroy a communicator (rules are removed from switches).
    DestroyCommunicator {
        /// Communicator id.
        comm_id: u32,
    },
    /// Destroy a group and its communicators.
    DestroyGroup {
        /// Group id.
        group_id: u64,
    },
    /// Ask for the controller's state.
    Status,
    /// Reply to `Status`.
    StatusReport(StatusReport),
}

impl Message {
    /// Short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Ping => "ping",
            Message::Ack => "ack",
            Message::Error { .. } => "error",
            Message::RegisterSwitch { .. } => "register_switch",
            Message::InstallCommunicator(_) => "install_communicator",
            Message::RemoveCommunicator { .. } => "remove_communicator",
            Message::RegisterGroup { .. } => "register_group",
            Message::GroupCreated { .. } => "group_created",
            Message::CreateCommunicator { .. } => "create_communicator",
            Message::CommunicatorCreated { .. } => "communicator_created",
            Message::DestroyCommunicator { .. } => "destroy_communicator",
            Message::DestroyGroup { .. } => "destroy_group",
            Message::Status => "status",
            Message::StatusReport(_) => "status_report",
        }
    }

    /// Error reply.
    pub fn error(reason: impl Into<String>) -> Message {
        Message::Error { reason: reason.into() }
    }
}

/// Controller state as shown by `inc-controller status`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StatusReport {
    /// Topology name.
    pub topology: String,
    /// Every switch of the topology and whether it is connected.
    pub switches: Vec<SwitchStatus>,
    /// Live groups.
    pub groups: Vec<GroupStatus>,
    /// Live communicators.
    pub communicators: Vec<CommunicatorStatus>,
}

/// One switch in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchStatus {
    /// Topology id.
    pub switch_id: u32,
    /// Topology name.
    pub name: String,
    /// Whether a registered connection exists.
    pub connected: bool,
    /// Remote address of the connection.
    pub peer: Option<String>,
    /// Communicators installed on it.
    pub communicators: Vec<u32>,
}

/// One group in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// Group id.
    pub group_id: u64,
    /// World size.
    pub world_size: u16,
    /// Host IPs by rank.
    pub hosts: Vec<Ipv4Addr>,
    /// Communicators of the group.
    pub communicators: Vec<u32>,
}

/// One communicator in a [`StatusReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommunicatorStatus {
    /// Communicator id.
    pub comm_id: u32,
    /// Group id.
    pub group_id: u64,
    /// Involved switch ids.
    pub switches: Vec<u32>,
    /// Root switch of the spanning tree.
    pub root_switch: u32,
    /// Payload bytes per packet.
    pub mtu: u16,
    /// Window.
    pub window: u32,
}
