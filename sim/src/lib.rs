//! `inc-sim`: the real INC switch and host engines at thousands of hosts.
//!
//! A discrete-event simulation: every switch runs `inc_switch_engine::SwitchEngine`
//! with the rules the controller's compiler produces for the topology YAML, every host
//! runs `inccl_engine::HostEngine`; between them a network model ([`net`]) gives each
//! link direction a rate (serialisation), a propagation delay, a finite drop-tail
//! output queue and the YAML's link emulation (loss, bursts, duplication, reordering,
//! corruption, jitter), seeded. [`sim::Sim`] builds and runs one collective and checks
//! every element of every receiving rank; [`analytic`] gives the in-network bound and
//! the ring AllReduce time for the same links. See `docs/SIMULATION.md`.

pub mod analytic;
pub mod data;
pub mod net;
pub mod sim;

pub use data::Collective;
pub use sim::{Sim, SimConfig, SimError, SimReport, HOST_TX_ALL, HOST_TX_BATCH};
