//! Per-switch rules and per-rank connection parameters computed by the controller.
//!
//! These are the contract between the controller, the switch data plane and INCCL.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::EthernetAddress;

/// UDP destination port of RoCEv2.
pub const ROCE_UDP_PORT: u16 = 4791;
/// Payload sizes (bytes per packet) a communicator may use.
pub const VALID_MTUS: [u16; 5] = [256, 512, 1024, 2048, 4096];
/// Largest window (chunks a host keeps outstanding) a communicator may use.
pub const MAX_WINDOW: u32 = 1 << 16;
/// Largest 24-bit value (QPNs and PSNs are 24-bit).
pub const MAX_24BIT: u32 = 0x00ff_ffff;

/// UDP source port a switch uses on a connection with switch-side QPN `qpn`.
///
/// RoCEv2 uses the source port for ECMP entropy; deriving it from the QPN keeps it
/// stable per connection without another allocation.
pub fn udp_port_for_qpn(qpn: u32) -> u16 {
    0xC000 | (qpn & 0x3fff) as u16
}

/// IPv4-mapped GID (`::ffff:a.b.c.d`), the RoCEv2 GID of an IPv4 address.
pub fn ipv4_gid(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// The other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Peer {
    /// A participating host, identified by its rank in the communicator.
    Host {
        /// Rank of the host.
        rank: u16,
    },
    /// A neighbouring switch.
    Switch {
        /// Topology id of the neighbouring switch.
        switch_id: u32,
    },
}

/// One RC connection terminated by a switch for one communicator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionRule {
    /// Data-plane port name on this switch.
    pub port: String,
    /// IP address of that port.
    pub local_ip: Ipv4Addr,
    /// MAC address of that port.
    pub local_mac: EthernetAddress,
    /// Switch-side QPN: 24-bit, never 0 or 1, unique on this switch across live communicators.
    pub local_qpn: u32,
    /// UDP source port the switch uses on this connection.
    pub local_udp_port: u16,
    /// First PSN the switch sends on this connection (24-bit).
    pub local_start_psn: u32,
    /// Who is at the other end.
    pub peer: Peer,
    /// Peer IP address.
    pub peer_ip: Ipv4Addr,
    /// Peer MAC; `None` means learn it (ARP).
    pub peer_mac: Option<EthernetAddress>,
    /// Peer QPN (destination QP of packets the switch sends).
    pub peer_qpn: u32,
    /// UDP destination port to send to (4791 for switches and kernel RoCE hosts).
    pub peer_udp_port: u16,
    /// First PSN expected from the peer (24-bit).
    pub peer_start_psn: u32,
    /// Ranks reachable through this connection, sorted.
    pub ranks: Vec<u16>,
}

/// Everything one switch needs to serve one communicator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchRules {
    /// Controller-unique communicator id.
    pub comm_id: u32,
    /// Topology id of the switch these rules are for.
    pub switch_id: u32,
    /// Number of ranks in the communicator.
    pub world_size: u16,
    /// Payload bytes per packet (one of [`VALID_MTUS`]).
    pub mtu: u16,
    /// W: max chunks a host keeps outstanding.
    pub window: u32,
    /// S: slots for this communicator on this switch (S >= 2W).
    pub slots: u32,
    /// Index into `connections` of the connection towards the parent; `None` at the
    /// root of this communicator's spanning tree.
    pub parent: Option<usize>,
    /// All connections; children are every connection except `parent`.
    pub connections: Vec<ConnectionRule>,
}

impl SwitchRules {
    /// Number of children (fan-in).
    pub fn fan_in(&self) -> usize {
        self.connections.len() - usize::from(self.parent.is_some())
    }

    /// Indices of child connections.
    pub fn children(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.connections.len()).filter(move |i| Some(*i) != self.parent)
    }

    /// True at the root of the communicator's spanning tree.
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }

    /// Index of the connection through which `rank` is reached.
    pub fn connection_for_rank(&self, rank: u16) -> Option<usize> {
        self.connections.iter().position(|c| c.ranks.binary_search(&rank).is_ok())
    }
}

/// What a host registers for its rank when rank 0 creates a communicator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEndpoint {
    /// Rank in the group.
    pub rank: u16,
    /// Host IP; must be a host of the topology and match the group's address for the rank.
    pub ip: Ipv4Addr,
    /// Host MAC if known; overrides the topology's.
    #[serde(default)]
    pub mac: Option<EthernetAddress>,
    /// Host QPN.
    pub qpn: u32,
    /// First PSN the host sends.
    pub start_psn: u32,
    /// UDP port the host receives RoCEv2 on: 4791 (kernel RoCE, RDMA NICs, and the
    /// userspace transport unless another process on the same IP holds 4791).
    pub udp_port: u16,
}

/// What a rank needs to connect its QP to its switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEndpoint {
    /// Rank.
    pub rank: u16,
    /// Communicator id.
    pub comm_id: u32,
    /// Switch the rank is attached to.
    pub switch_id: u32,
    /// Port name on that switch.
    pub switch_port: String,
    /// Switch port IP (the RC destination).
    pub switch_ip: Ipv4Addr,
    /// Switch port MAC.
    pub switch_mac: EthernetAddress,
    /// Switch-side QPN to connect to.
    pub switch_qpn: u32,
    /// UDP source port the switch sends from.
    pub switch_udp_port: u16,
    /// First PSN the switch sends to this host.
    pub switch_start_psn: u32,
    /// Host QPN (echoed).
    pub host_qpn: u32,
    /// First PSN the host sends (echoed).
    pub host_start_psn: u32,
    /// Host UDP port (echoed).
    pub host_udp_port: u16,
    /// Payload bytes per packet.
    pub mtu: u16,
    /// Window in chunks.
    pub window: u32,
    /// Switch GID: IPv4-mapped switch IP.
    pub gid: [u8; 16],
    /// The switch port takes whole UDP GSO frames ([`PortInfo::takes_gso`] of the
    /// port as the switch registered it): a host on a veth with transmit checksum
    /// offload may send runs of datagrams as one GSO frame.
    #[serde(default)]
    pub switch_takes_gso: bool,
    /// Rate of the host's link to its switch in bits per second, where the switch's link
    /// emulation limits it ([`PortInfo::rx_rate_bps`] of the port as the switch
    /// registered it): the host sends no faster, as its NIC would not.
    #[serde(default)]
    pub link_rate_bps: Option<u64>,
}

/// A data-plane port as a switch sees it when registering.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// Port name (as in the topology).
    pub name: String,
    /// IP the switch serves on the port, if it knows it.
    #[serde(default)]
    pub ip: Option<Ipv4Addr>,
    /// MAC of the interface, if known.
    #[serde(default)]
    pub mac: Option<EthernetAddress>,
    /// The switch splits UDP GSO frames that arrive on this port whole, so a host
    /// behind it may send runs of datagrams as one GSO frame without having its
    /// kernel cut them first (see [`HostEndpoint::switch_takes_gso`]).
    #[serde(default)]
    pub takes_gso: bool,
    /// The rate the switch's link emulation allows what arrives on this port, in bits
    /// per second, if it limits it (a host port's `emulate: rate=...`, or
    /// `inc-switch --link-emu`): the host behind it is told to send no faster
    /// ([`HostEndpoint::link_rate_bps`]).
    #[serde(default)]
    pub rx_rate_bps: Option<u64>,
}
