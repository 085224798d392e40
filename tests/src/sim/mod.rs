//! Deterministic network simulation of the INC protocol.
//!
//! The real switch and host engines (`inc-switch-engine`, `inccl-engine`) run on an
//! in-memory fabric with simulated time, wired by the real control plane
//! (`inc-controller` compiles the YAML topologies into rules and endpoints). One event
//! queue ordered by (time, sequence number) and one seeded ChaCha RNG: the same seed
//! replays the same run, frame for frame. Links have latency, serialisation at a rate,
//! jitter, and per-frame loss, duplication, reordering and corruption.
//!
//! Running (`tests/tests/sim.rs`):
//! - `cargo test -p inc-tests --test sim` — the suite (seconds);
//! - a failure prints `reproduce: INC_SIM_SEED=N cargo test -p inc-tests --test sim -- NAME --exact`;
//! - `INC_SIM_CASES=K` runs K seeds per test (soak); `INC_SIM_VERBOSE=1` adds full
//!   counters to failure dumps; `INC_SIM_MTU=M` runs every communicator with payload
//!   size `M` instead of the topology's default;
//! - `cargo test -p inc-tests --test sim -- --ignored goodput --nocapture` prints simulated
//!   goodput and retransmissions at 0%, 1% and 5% loss.
//!
//! - [`fabric`]: nodes, links with latency/bandwidth/jitter, seeded faults, the driver
//!   loop over simulated time.
//! - [`reference`]: expected results computed directly in native types.
//! - [`cases`]: seeded generation of collectives and inputs.
//! - [`plan`]: topologies and communicators compiled by the real control plane.
//! - [`harness`]: switch and host engines as fabric nodes, collectives run back to back.
//! - [`scenario`]: a whole run (build, run, verify results and counters) and random
//!   scenarios.
//! - [`repro`]: seed selection (`INC_SIM_SEED`, `INC_SIM_CASES`, `INC_SIM_MTU`) and the reproduction line.

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
