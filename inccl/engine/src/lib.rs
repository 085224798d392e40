//! inccl-engine
