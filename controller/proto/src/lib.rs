//! inc-ctrl-proto
