//! inc-tests
