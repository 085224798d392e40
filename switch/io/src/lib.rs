//! Packet I/O backends of the INC switch.
//!
//! One batched, blocking-with-timeout [`Backend`] trait covers every port of every
//! logical switch a process runs:
//!
//! - receive a batch of frames as borrowed slices with their port index
//!   ([`Backend::recv_batch`]); the backend releases them when the callback returns;
//! - transmit a batch: the caller writes a frame straight into a backend-owned buffer
//!   ([`Backend::tx_buffer`]), names the port once it knows it ([`Backend::commit_tx`]),
//!   and [`Backend::flush`] hands the batch to the system;
//! - wait for receive readiness across all ports, a [`Waker`] or a timeout
//!   ([`Backend::wait`]); nothing busy-polls.
//!
//! [`link_emu`] wraps any backend to emulate lossy, slow or misbehaving links.
//!
//! Backends: [`memory`] (in-process, for tests) and [`af_packet`] (TPACKET_V3 receive
//! ring, `sendmmsg` transmit, Linux only). All `unsafe` of the switch lives in this crate,
//! in the backend modules.

pub mod backend;
pub mod link_emu;
pub mod memory;

#[cfg(target_os = "linux")]
pub mod af_packet;
#[cfg(target_os = "linux")]
mod sys;

pub use backend::{Backend, IoError, PortCounters, PortDesc, PortSpec, Wake, Waker};
