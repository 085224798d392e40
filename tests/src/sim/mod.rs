//! Deterministic network simulation of the INC protocol.
//!
//! - [`fabric`]: nodes, links with latency/bandwidth/jitter, seeded faults, the driver
//!   loop over simulated time.
//! - [`reference`]: expected results computed directly in native types.
//! - [`cases`]: seeded generation of collectives and inputs.
//! - [`plan`]: topologies and communicators compiled by the real control plane.
//! - [`harness`]: switch and host engines as fabric nodes, collectives run back to back.
//! - [`scenario`]: a whole run (build, run, verify results and counters) and random
//!   scenarios.
//! - [`repro`]: seed selection (`INC_SIM_SEED`, `INC_SIM_CASES`) and the reproduction line.

pub mod cases;
pub mod fabric;
pub mod harness;
pub mod plan;
pub mod reference;
pub mod repro;
pub mod scenario;

pub use fabric::{
    Endpoint, Fabric, FaultConfig, LinkConfig, LinkStats, Nanos, Node, NodeId, RunLimits, SimError,
    MICROS, MILLIS, SECONDS,
};
