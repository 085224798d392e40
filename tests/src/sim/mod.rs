//! Deterministic network simulation of the INC protocol.
//!
//! - [`fabric`]: nodes, links with latency/bandwidth/jitter, seeded faults, the driver
//!   loop over simulated time.
//! - [`reference`]: expected results computed directly in native types.
//! - [`cases`]: seeded generation of collectives and inputs.
//! - [`plan`]: topologies and communicators compiled by the real control plane.
//! - [`repro`]: seed selection (`INC_SIM_SEED`, `INC_SIM_CASES`) and the reproduction line.

pub mod cases;
pub mod fabric;
pub mod plan;
pub mod reference;
pub mod repro;

pub use fabric::{
    Endpoint, Fabric, FaultConfig, LinkConfig, LinkStats, Nanos, Node, NodeId, RunLimits, SimError,
    MICROS, MILLIS, SECONDS,
};
