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
//!   ([`Backend::wait`]); a backend that can say without a system call whether a
//!   frame waits ([`Backend::rx_ready`]) lets the event loop busy-poll a bounded time
//!   before it sleeps.
//!
//! Backends: [`memory`] (in-process, for tests), [`af_packet`] (TPACKET_V2 receive ring
//! by default, V3 on request, `sendmmsg` transmit), [`libpcap`] (libpcap live handles),
//! [`af_xdp`] (XSK sockets with an XDP redirect program) and, with cargo feature `dpdk`,
//! the `dpdk` module (DPDK ethdevs over the system libdpdk); all but `memory` are Linux
//! only. All `unsafe` of the switch lives in this crate, in the backend modules.
//!
//! [`link_emu`] wraps any backend to emulate lossy, slow or misbehaving links;
//! [`in_process`] wraps any backend to carry links between two of its own ports in
//! memory. [`alloc`] gives memory freed in bulk back to the system.

pub mod alloc;
pub mod backend;
pub mod in_process;
pub mod link_emu;
pub mod memory;

#[cfg(target_os = "linux")]
pub mod af_packet;
#[cfg(target_os = "linux")]
pub mod af_xdp;
#[cfg(target_os = "linux")]
pub mod libpcap;
#[cfg(target_os = "linux")]
mod sys;
#[cfg(target_os = "linux")]
pub mod xdp_prog;
#[cfg(target_os = "linux")]
mod xsk_ring;

#[cfg(all(target_os = "linux", feature = "dpdk"))]
pub mod dpdk;
#[cfg(all(target_os = "linux", feature = "dpdk"))]
mod dpdk_ffi;

pub use backend::{Backend, IoError, PortCounters, PortDesc, PortSpec, Wake, Waker};
