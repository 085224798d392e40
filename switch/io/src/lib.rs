//! inc-switch-io
