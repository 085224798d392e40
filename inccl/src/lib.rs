//! INCCL: the host collective library of the INC emulator.
//!
//! Ranks form a [`Group`] (bootstrap over TCP through rank 0, which registers the
//! group with the controller), then create [`Communicator`]s: each rank gets one RC QP
//! to its leaf switch, and AllReduce / Reduce / Broadcast / Barrier are computed by the
//! switches. INT32 and FLOAT32; SUM, MAX, MIN; any length.
//!
//! ```no_run
//! use inccl::{CommConfig, Group, ReduceOp};
//! # fn main() -> Result<(), inccl::Error> {
//! let group = Group::new(4, 1, "10.0.0.1")?; // world size, rank, master address
//! let mut comm = group.communicator(CommConfig::from_env(1 << 20)?)?;
//! let src: Vec<i32> = (0..1024).collect();
//! let mut dst = vec![0i32; 1024];
//! comm.allreduce(&src, &mut dst, ReduceOp::Sum)?;
//! comm.destroy()?;
//! group.destroy()?;
//! # Ok(()) }
//! ```
//!
//! Transports: userspace RoCEv2 over UDP sockets (default) and ibverbs (feature
//! `verbs`). The C ABI is in [`ffi`] and `include/inccl.h`.

mod bootstrap;
pub mod config;
mod error;
pub mod ffi;
mod group;
pub mod iface;
mod request;
mod transport;
mod types;

pub use config::{CommConfig, GroupConfig, TransportKind};
pub use error::{Error, Result};
pub use group::{Communicator, Group, Request, Scope};
pub use iface::DataPlane;
pub use request::{UnscopedRequest, MAX_PENDING};
pub use types::{DataType, Element, ReduceOp};

/// Building blocks exposed for the point-to-point transport benchmark
/// (`hosts/src/bin/inccl-p2p-bench.rs`); not a stable API.
#[doc(hidden)]
pub mod bench {
    pub use crate::transport::udp::{IdentRule, RoceSocket, UdpStats};
}
