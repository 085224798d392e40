//! Deterministic network simulation of the INC protocol.
//!
//! - [`fabric`]: nodes, links with latency/bandwidth/jitter, seeded faults, the driver
//!   loop over simulated time.

pub mod fabric;

pub use fabric::{
    Endpoint, Fabric, FaultConfig, LinkConfig, LinkStats, Nanos, Node, NodeId, RunLimits, SimError,
    MICROS, MILLIS, SECONDS,
};
