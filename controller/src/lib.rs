//! inc-controller
