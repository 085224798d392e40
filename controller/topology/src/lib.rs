//! The INC emulator's topology model: the YAML schema (see `topologies/README.md`),
//! loading and validation, addressing (`mac: auto`, management addresses) and the
//! spanning tree of switches.
//!
//! Loading collects every semantic error it can find, each naming the file, the
//! line/column and the element, so a person fixes a file in one pass.
//!
//! Used by the controller (rule compiler, namespace plan), the switch (resolving
//! switch names and ports from a topology) and the simulation tests; it depends on
//! no service code.

mod error;
pub mod generate;
mod memory;
mod model;
mod raw;
mod validate;

pub use error::{TopologyError, TopologyIssue};
pub use memory::{
    CommMemory, CONNECTION_ALLOWANCE, FRAME_ALLOWANCE, SEND_QUEUE_RESERVE, SLOT_ALLOWANCE,
    SLOT_BYTES_PER_PAYLOAD_BYTE,
};
pub use model::{
    Defaults, Host, IfAddr, Link, Port, PortPeer, PortRef, Switch, Topology, TreeNode,
};

/// Default L2 MTU of data links: room for a 4096-byte payload plus all headers.
pub const DEFAULT_LINK_MTU: u32 = 9000;
/// Default slot capacity of a switch (across all communicators).
pub const DEFAULT_MAX_SLOTS: u32 = 1 << 20;
/// Default memory budget of a switch for communicators (across all of them; see
/// [`CommMemory`]). A host's share defaults to half of it.
pub const DEFAULT_MAX_SLOT_MEMORY: u64 = 1 << 28;
/// Name of the controller element (namespace `P-ctrl`).
pub const CONTROLLER_NAME: &str = "ctrl";
