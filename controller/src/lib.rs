//! INC emulator control plane.
//!
//! - [`topology`]: YAML topology model and validation (re-export of `inc-topology`).
//! - [`compiler`]: pure rule compiler (topology + communicator -> per-switch rules).
//! - [`plan`]: network-namespace plan for the deployment scripts.
//! - [`export`]: container deployments (Docker Compose, containerlab) of a topology.
//! - [`service`]: the TCP controller service.

pub mod compiler;
pub mod export;
pub mod plan;
pub mod service;
pub mod yaml;

pub use compiler::{compile, Allocator, CommunicatorSpec, CompileError, Compiled};
pub use inc_topology as topology;
pub use inc_topology::{Topology, TopologyError, TopologyIssue};
pub use service::{Controller, ServiceConfig, ServiceError};

use inc_ctrl_proto::{RankEndpoint, ROCE_UDP_PORT};

/// Rank endpoints for offline rule printing and tests: rank i on host `ips[i]`, with
/// deterministic placeholder QPNs/PSNs (real hosts register their own).
pub fn demo_ranks(ips: &[std::net::Ipv4Addr]) -> Vec<RankEndpoint> {
    ips.iter()
        .enumerate()
        .map(|(i, ip)| RankEndpoint {
            rank: i as u16,
            ip: *ip,
            mac: None,
            qpn: 0x11 + i as u32,
            start_psn: (0x1000 * (i as u32 + 1)) & 0xff_ffff,
            udp_port: ROCE_UDP_PORT,
        })
        .collect()
}
