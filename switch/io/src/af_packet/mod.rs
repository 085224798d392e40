//! AF_PACKET backend: a TPACKET_V2 receive ring per port (the default: per-frame
//! hand-over, lowest latency) or, on request, a TPACKET_V3 one (per-block hand-over),
//! batched `sendmmsg` transmit, `PACKET_QDISC_BYPASS`, `PACKET_IGNORE_OUTGOING`,
//! promiscuous membership, and one epoll over every ring plus an eventfd waker.
//!
//! Ports may live in other network namespaces: each socket is created inside its
//! namespace on a helper thread (see [`crate::sys`]) and stays bound to it, so one
//! process can serve all switches of a topology.
//!
//! Latency note: TPACKET_V3 hands a block to user space when it is full or when its
//! retire timer (whole milliseconds) fires. Small blocks keep the delay short under
//! moderate load; the timer bounds it when the link is nearly idle. TPACKET_V2
//! ([`RxRing::V2`]) hands over every frame at once (one wakeup per frame when idle),
//! which removes that delay from every hop.
//!
//! The module is split by concern: `ring` (TPACKET geometry and the mapped ring),
//! `port` (opening one port's socket), `rx` (the receive path), `tx` (the `sendmmsg`
//! send path), `gso` (UDP GSO frames: runs, headers, split; byte work only) and
//! `backend_impl` (the [`Backend`](crate::Backend) trait).

mod backend_impl;
mod gso;
mod port;
mod ring;
mod rx;
mod tx;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use tracing::debug;

use crate::backend::{IoError, PortCounters, PortDesc, PortSpec, RxRotation, TxStaging};
use crate::sys::{self, Epoll, EventFd};
use port::PortSock;

/// Receive ring layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxRing {
    /// TPACKET_V3: variable-size frames packed in blocks, handed over per block.
    V3,
    /// TPACKET_V2: fixed frame slots sized for the interface MTU, handed over per frame.
    V2,
}

/// Ring and batch geometry.
#[derive(Debug, Clone)]
pub struct AfPacketConfig {
    /// Receive ring layout.
    pub ring: RxRing,
    /// V3: receive block size in bytes (multiple of the page size); frames larger than
    /// a block are dropped and counted. V2: ignored (slots fit the interface MTU).
    pub block_size: u32,
    /// V3: receive blocks per port. V2: a quarter of the frame slots per port (frames
    /// arrive one per slot, so V2 needs more of them for the same burst), on ports
    /// whose slots hold one frame of the interface MTU.
    pub block_count: u32,
    /// V2: frame slots per port on ports whose slots hold a whole UDP GSO frame (64
    /// KiB each; [`Self::gso_links`], [`Self::host_ports`]). Each usually holds several
    /// frames, and a host keeps at most a window of them in flight per communicator.
    pub gso_slots: u32,
    /// Block retire timeout in milliseconds (>= 1).
    pub block_timeout_ms: u32,
    /// Frames per transmit batch.
    pub tx_batch: usize,
    /// Largest frame transmitted (bytes, Ethernet header to end of ICRC).
    pub max_frame: usize,
    /// Put the interfaces in promiscuous mode (membership, undone on close).
    pub promiscuous: bool,
    /// Ports whose link peer is another port of this process on this backend (two
    /// switches of one `inc-switch`): runs of frames between them travel as UDP GSO
    /// frames, which their receive rings take whole (V2 slots of 64 KiB and more)
    /// and split. Any other peer (another process, another backend) would get frames
    /// it cannot read, so only ports listed here send GSO frames towards switches.
    pub gso_links: Vec<PortSpec>,
    /// Ports that face hosts (from the topology). On a veth their receive rings take
    /// whole UDP GSO frames (like [`Self::gso_links`]) and the port says so
    /// ([`Backend::takes_gso_frames`](crate::Backend::takes_gso_frames)), so that a
    /// host whose own kernel would otherwise cut its GSO sends into datagrams can hand
    /// them over whole.
    pub host_ports: Vec<PortSpec>,
    /// Ports the switch never sends on through this backend: both ends of a link
    /// between two switches of one worker, which in-process links
    /// ([`crate::in_process`]) carry in memory. Their V2 rings get a few slots (what the
    /// kernel sends on its own) instead of a ring sized for traffic.
    pub quiet_ports: Vec<PortSpec>,
}

impl Default for AfPacketConfig {
    fn default() -> Self {
        AfPacketConfig {
            ring: RxRing::V2,
            block_size: 16 * 1024,
            block_count: 128,
            gso_slots: 64,
            block_timeout_ms: 1,
            tx_batch: 64,
            max_frame: 9216,
            promiscuous: true,
            gso_links: Vec::new(),
            host_ports: Vec::new(),
            quiet_ports: Vec::new(),
        }
    }
}

/// The AF_PACKET backend.
#[derive(Debug)]
pub struct AfPacketBackend {
    config: AfPacketConfig,
    ports: Vec<PortDesc>,
    socks: Vec<PortSock>,
    counters: Vec<PortCounters>,
    epoll: Epoll,
    wake: Arc<EventFd>,
    /// Frames written and committed since the last flush.
    tx: TxStaging,
    /// Port to start the next receive round at (fairness).
    rx_rotation: RxRotation,
}

impl AfPacketBackend {
    /// Open every port (entering namespaces as needed). Port index = position in `ports`.
    pub fn open(ports: &[PortSpec], config: AfPacketConfig) -> Result<Self, IoError> {
        let page = 4096u32;
        if config.block_size == 0
            || config.block_size % page != 0
            || config.block_count == 0
            || config.gso_slots == 0
            || config.tx_batch == 0
            || config.max_frame < 64
        {
            return Err(IoError::Config(format!(
                "bad AF_PACKET geometry: block size {} must be a positive multiple of {page}; \
                 block count, GSO slots and tx batch must be positive; max frame at least 64 \
                 bytes",
                config.block_size
            )));
        }
        let epoll = Epoll::new()?;
        let wake = Arc::new(EventFd::new()?);
        epoll
            .add(wake.fd(), u64::MAX)
            .map_err(|source| IoError::Sys { op: "epoll add", source })?;
        let mut socks = Vec::with_capacity(ports.len());
        let mut descs = Vec::with_capacity(ports.len());
        for (i, spec) in ports.iter().enumerate() {
            let (s, c) = (spec.clone(), config.clone());
            let (sock, desc) =
                sys::in_netns(spec.netns.as_deref(), move || port::open_port(&s, &c))?;
            epoll.add(&sock.fd, i as u64).map_err(|source| IoError::Interface {
                op: "epoll add",
                iface: spec.label(),
                source,
            })?;
            debug!(port = i, iface = %spec, mac = ?desc.mac, "AF_PACKET port open");
            socks.push(sock);
            descs.push(desc);
        }
        Ok(AfPacketBackend {
            tx: TxStaging::new(config.tx_batch, config.max_frame),
            counters: vec![PortCounters::default(); ports.len()],
            ports: descs,
            socks,
            epoll,
            wake,
            rx_rotation: RxRotation::default(),
            config,
        })
    }
}
