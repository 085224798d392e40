//! inc-switch-engine
