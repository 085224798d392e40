//! inc-tests: the deterministic network simulation of the INC protocol ([`sim`]) and
//! end-to-end tests across processes.

pub mod netns;
pub mod sim;
