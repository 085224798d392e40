//! inc-protocol
