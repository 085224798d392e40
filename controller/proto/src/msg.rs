//! Control-plane messages.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::{HostEndpoint, PortInfo, RankEndpoint, SwitchRules};

/// Which controller created a communicator, and what its rank 0 proves ownership
/// with. Switches keep it next to the rules and report it when they register again,
/// so a restarted controller can tell its own communicators from those of an earlier
/// controller process (which it adopts) and let rank 0 destroy an adopted one.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Origin {
    /// Incarnation of the controller process that created the communicator (random
    /// per process).
    pub epoch: u64,
    /// SHA-256 (lowercase hex) of the key handed to rank 0 with the communicator
    /// (`communicator_created.key`); `None` for communicators created without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_digest: Option<String>,
}

/// A communicator a switch holds, as it reports it when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldCommunicator {
    /// The rules as installed.
    pub rules: SwitchRules,
    /// Where they came from (`None`: installed by a controller that did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

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
    /// First message of a switch connection. The switch reports the communicators it
    /// holds (`held`, the first of them if `more_held`: the rest follow in
    /// `report_held` messages, so no frame exceeds the request limit). The reply is
    /// [`Message::Registered`], or `ack` when nothing was reported (what switches that
    /// predate held reports expect) or from a controller that predates them (then the
    /// switch drops everything it held and the controller re-pushes what is live).
    RegisterSwitch {
        /// Topology switch id.
        switch_id: u32,
        /// Shared token, if the controller requires one.
        token: Option<String>,
        /// Data-plane ports as the switch sees them.
        ports: Vec<PortInfo>,
        /// Fingerprint of the topology file the switch was started with
        /// (`Topology::fingerprint`); a controller serving another topology refuses
        /// the registration. `None`: the switch has no topology file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        topology: Option<String>,
        /// Communicators the switch holds (all of them, or the first part).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        held: Vec<HeldCommunicator>,
        /// More held communicators follow in `report_held` messages.
        #[serde(default, skip_serializing_if = "is_false")]
        more_held: bool,
    },
    /// Switch -> controller, after `register_switch` with `more_held`: the next part of
    /// the held communicators. Answered with [`Message::Registered`].
    ReportHeld {
        /// Held communicators.
        held: Vec<HeldCommunicator>,
        /// More parts follow.
        more: bool,
    },
    /// Controller -> switch: the verdict on the held communicators of the message it
    /// answers. The switch keeps those in `owned` (a live group owns them) and in
    /// `orphaned` (adopted from an earlier controller: no rank 0 connection owns them,
    /// so the switch frees them when they stay idle for its orphan timeout), and drops
    /// every other communicator of that message at once.
    Registered {
        /// Kept; a rank 0 connection owns them.
        owned: Vec<u32>,
        /// Kept as orphans.
        orphaned: Vec<u32>,
    },
    /// Switch -> controller: orphaned communicators the switch freed because they
    /// stayed idle for its orphan timeout. Answered with `ack`.
    CommunicatorsExpired {
        /// Communicator ids.
        comm_ids: Vec<u32>,
    },
    /// Controller -> switch: install rules for a communicator (replace if present).
    /// Sent by controllers that predate [`Message::Install`]; still accepted.
    InstallCommunicator(SwitchRules),
    /// Controller -> switch: install rules for a communicator, with their origin
    /// (kept by the switch and reported back when it registers again).
    Install {
        /// The rules.
        rules: SwitchRules,
        /// Which controller created the communicator.
        origin: Origin,
    },
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
        /// Secret that lets rank 0 destroy the communicator from another connection
        /// (after the one that created it was lost, e.g. to a controller restart).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
    },
    /// Destroy a communicator (rules are removed from switches). Allowed on the
    /// connection that registered its group, or with its `key` on any authenticated
    /// host connection.
    DestroyCommunicator {
        /// Communicator id.
        comm_id: u32,
        /// The key from `communicator_created`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
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
            Message::ReportHeld { .. } => "report_held",
            Message::Registered { .. } => "registered",
            Message::CommunicatorsExpired { .. } => "communicators_expired",
            Message::InstallCommunicator(_) => "install_communicator",
            Message::Install { .. } => "install",
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
    /// Adopted after a controller restart: no group owns it (`group_id` 0); rank 0
    /// may destroy it with its key, and the switches free it once it stays idle.
    #[serde(default)]
    pub adopted: bool,
}
