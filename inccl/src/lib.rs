//! inccl
