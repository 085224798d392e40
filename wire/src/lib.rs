//! inc-wire
