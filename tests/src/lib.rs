//! inc-tests: the deterministic network simulation of the INC protocol ([`sim`]) and
//! end-to-end tests across processes.

pub mod cases;
pub mod deploy;
pub mod engine_input;
pub mod inject;
pub mod netns;
pub mod process;
pub mod sim;
