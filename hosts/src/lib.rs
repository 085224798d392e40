//! inccl-hosts
