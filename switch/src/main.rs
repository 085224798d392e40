//! `inc-switch`: runs one or more logical INC switches of a topology over a packet I/O
//! backend, driven by the controller.
//!
//! ```text
//! inc-switch run --controller 10.99.0.1:7000 --backend af_packet|pcap|af_xdp --workers 2 \
//!     --switch 1:root --port root:p0=inc-root/p0,ip=10.0.0.1 ... \
//!     --stats-listen 127.0.0.1:7101 --capture root.pcap
//! inc-switch stats 127.0.0.1:7101
//! ```

mod capture;
mod control;
mod event_loop;
mod link_emu;
mod spec;
mod stats;
mod workers;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use inc_switch_io::af_packet::{AfPacketBackend, AfPacketConfig, RxRing};
use inc_switch_io::af_xdp::{AfXdpBackend, AfXdpConfig};
use inc_switch_io::in_process::InProcessLinks;
use inc_switch_io::libpcap::{PcapBackend, PcapConfig};
use inc_switch_io::link_emu::LinkEmuBackend;
use inc_switch_io::memory::MemoryBackend;
use inc_switch_io::{Backend, PortSpec};
use inc_topology::Topology;
use tracing::info;

use crate::spec::{PortArg, SwitchArg, SwitchPlan};

#[derive(Debug, Parser)]
#[command(
    name = "inc-switch",
    version,
    about = "In-network computing switch (RoCEv2 RC termination and aggregation)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run switches until SIGINT/SIGTERM; print counters on exit.
    Run(Box<RunArgs>),
    /// Print the counters of a running switch (its --stats-listen address) as JSON.
    Stats {
        /// Address given to --stats-listen.
        addr: String,
        /// One line for scripts instead: `uptime_s=.. rx_frames=.. tx_frames=.. rx_gso_frames=..`
        /// (all switches; the last: UDP GSO frames received whole and split into rx_frames).
        #[arg(long)]
        summary: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// AF_PACKET with TPACKET_V2 (or V3) receive rings and sendmmsg transmit.
    #[value(name = "af_packet", alias = "af-packet")]
    AfPacket,
    /// libpcap live handles (immediate mode, BPF filter, pcap_sendpacket).
    Pcap,
    /// AF_XDP sockets with an XDP redirect program (native mode, else generic).
    #[value(name = "af_xdp", alias = "af-xdp")]
    AfXdp,
    /// In-process queues (no interfaces; for tests of the control path).
    Memory,
    /// DPDK ethdevs (needs an inc-switch built with `--features dpdk`): kernel
    /// interfaces get an af_packet (or --dpdk-vdev af_xdp) vdev each, opened in their
    /// namespace; names of devices EAL probed (PCI addresses, vdevs) use their PMD.
    Dpdk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RingKind {
    /// TPACKET_V3.
    V3,
    /// TPACKET_V2.
    V2,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Controller address (host:port); default: the topology's.
    #[arg(long)]
    controller: Option<String>,
    /// Topology YAML: resolves switch names to ids and fills port addresses, MACs and
    /// (for a switch given without --port) the port list.
    #[arg(long)]
    topology: Option<PathBuf>,
    /// Switch credential (`inc-controller token --role switch`).
    #[arg(long, env = inc_ctrl_proto::TOKEN_ENV)]
    token: Option<String>,
    /// Packet I/O backend.
    #[arg(long, value_enum, default_value = "af_packet")]
    backend: BackendKind,
    /// A logical switch to run: ID[:NAME][@NETNS], or NAME[@NETNS] with --topology
    /// (repeatable: one process can run every switch of a topology). @NETNS is where the
    /// interfaces of ports taken from the topology live.
    #[arg(long = "switch", required = true)]
    switches: Vec<SwitchArg>,
    /// A port: SWITCH:PORT=[NETNS/]IFNAME[,ip=A.B.C.D][,mac=MAC] (SWITCH is an id or
    /// name; repeatable; ip and mac default to the topology's, mac then to the interface's).
    #[arg(long = "port")]
    ports: Vec<PortArg>,
    /// Serve JSON counters on this TCP address (read with `inc-switch stats ADDR`).
    #[arg(long)]
    stats_listen: Option<String>,
    /// Write every frame received and sent to this pcap file.
    #[arg(long)]
    capture: Option<PathBuf>,
    /// AF_PACKET receive ring: v2 (per-frame hand-over: lowest latency; measured as
    /// fast or faster for bulk here) or v3 (blocks; a lone frame waits up to
    /// --rx-block-timeout-ms).
    #[arg(long, value_enum, default_value = "v2")]
    rx_ring: RingKind,
    /// AF_PACKET receive block size in bytes (v3).
    #[arg(long, default_value_t = 16384)]
    rx_block_size: u32,
    /// AF_PACKET receive blocks per port (v3); v2 uses four times as many frame slots.
    #[arg(long, default_value_t = 128)]
    rx_blocks: u32,
    /// AF_PACKET v2 frame slots per port on ports that take whole UDP GSO frames (host
    /// ports on a veth, in-process links over the wire): 64 KiB each, packed 15 to a
    /// 1 MiB block.
    #[arg(long, default_value_t = 64)]
    rx_gso_slots: u32,
    /// AF_PACKET block retire timeout (ms): the longest a lone frame waits in the ring.
    #[arg(long, default_value_t = 1)]
    rx_block_timeout_ms: u32,
    /// Frames per transmit batch.
    #[arg(long, default_value_t = 64)]
    tx_batch: usize,
    /// Do not put the interfaces in promiscuous mode.
    #[arg(long)]
    no_promisc: bool,
    /// How a link between two switches of this process (per --topology) carries
    /// frames: memory (moved from one port's transmit to the other's receive inside the
    /// process: no system call, skb or wake-up per frame) or wire (over the interfaces
    /// as between processes, so `tcpdump` on the link sees them). Links between
    /// switches on different --workers always use the wire.
    #[arg(long, value_enum, default_value = "memory")]
    internal_links: InternalLinks,
    /// Data-plane threads; the logical switches are split over them (an engine is
    /// driven by one thread). 0: one per logical switch, at most one per CPU. Default 1:
    /// measured faster than 2 on a 2-core machine that also runs the hosts
    /// (switch/README.md).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Before a worker sleeps, it polls its ports this many microseconds (fewer if a
    /// timer falls due sooner), yielding the CPU between polls (af_packet and af_xdp
    /// read their rings, pcap asks its epoll set with a zero timeout).
    /// Where hosts share the switch's cores, sleeping costs a wake-up per frame on both
    /// sides; polling took the 1-element AllReduce p50 on 1-2-4 from about 115 to 35 us
    /// here, together with the hosts' INCCL_BUSY_POLL_US (switch/README.md). 0: always
    /// sleep. DPDK yields instead of its idle back-off sleeps for as long after a frame.
    #[arg(long, default_value_t = 200)]
    busy_poll_us: u64,
    /// pcap/af_xdp: also take UDP frames to this destination port (besides 4791 and
    /// ARP; repeatable).
    #[arg(long = "filter-udp-port")]
    filter_udp_ports: Vec<u16>,
    /// pcap: kernel buffer per port in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pcap_buffer: i32,
    /// pcap: snap length in bytes (longer frames are counted and dropped).
    #[arg(long, default_value_t = 9216)]
    pcap_snaplen: i32,
    /// af_xdp: UMEM chunks per port for receive and for transmit (each; power of two).
    #[arg(long, default_value_t = 2048)]
    xdp_frames: u32,
    /// af_xdp: attach the XDP program in generic mode even where native works.
    #[arg(long)]
    xdp_generic: bool,
    /// DPDK EAL arguments, split at whitespace (default `--no-huge --no-pci`; -l, -m,
    /// --in-memory, --no-telemetry and --log-level are added unless given).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    #[cfg_attr(not(feature = "dpdk"), allow(dead_code))]
    dpdk_args: String,
    /// DPDK: vdev driver for ports that are kernel interfaces.
    #[arg(long, value_enum, default_value = "af_packet")]
    #[cfg_attr(not(feature = "dpdk"), allow(dead_code))]
    dpdk_vdev: DpdkVdev,
    /// DPDK: longest idle sleep between empty receive polls, in microseconds (bounds
    /// the extra latency of the first frame after a quiet spell).
    #[arg(long, default_value_t = 500)]
    #[cfg_attr(not(feature = "dpdk"), allow(dead_code))]
    dpdk_idle_max_us: u64,
    /// Seconds an orphaned communicator may stay idle (no frame on any of its
    /// connections) before the switch frees it. A communicator is an orphan while the
    /// controller connection is lost, and after a restarted controller adopted it
    /// without an owner; the freed ones are counted in `inc-switch stats`
    /// (`orphans.expired`) and reported to the controller when connected.
    #[arg(long, default_value_t = 120.0, value_name = "SECS")]
    orphan_idle_timeout: f64,
    /// Emulate link faults: [SWITCH:PORT=]KEY=VALUE,... with keys loss, burst, dup,
    /// reorder, reorder-delay, corrupt, delay, jitter, rate, limit, seed and
    /// dir=link|tx|rx|both (repeatable; later ones refine earlier ones; without a
    /// SWITCH:PORT every port). Example: `loss=1%,burst=4,seed=7`. Replaces the
    /// topology's `emulate:` settings on the ports it applies to.
    #[arg(long = "link-emu")]
    link_emu: Vec<link_emu::LinkEmuArg>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum InternalLinks {
    /// In memory.
    Memory,
    /// Over the interfaces.
    Wire,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[cfg_attr(not(feature = "dpdk"), allow(dead_code))]
enum DpdkVdev {
    /// net_af_packet.
    #[value(name = "af_packet", alias = "af-packet")]
    AfPacket,
    /// net_af_xdp.
    #[value(name = "af_xdp", alias = "af-xdp")]
    AfXdp,
}

fn main() -> anyhow::Result<()> {
    inc_log::init("RUST_LOG", "info");
    match Cli::parse().cmd {
        Cmd::Run(args) => run(*args),
        Cmd::Stats { addr, summary } => {
            let v = stats::fetch(&addr)?;
            if summary {
                let l = &v["loop"];
                let ports = v["switches"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|s| s["ports"].as_array().into_iter().flatten());
                let gso: u64 = ports.filter_map(|p| p["io"]["rx_gso_frames"].as_u64()).sum();
                println!(
                    "uptime_s={} rx_frames={} tx_frames={} rx_gso_frames={gso}",
                    v["uptime_s"], l["rx_frames"], l["tx_frames"]
                );
            } else {
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            Ok(())
        }
    }
}

fn run(mut args: RunArgs) -> anyhow::Result<()> {
    let topology = match &args.topology {
        Some(path) => Some(Topology::load(path).map_err(|e| anyhow::anyhow!("{e}"))?),
        None => None,
    };
    let plans = spec::resolve(&args.switches, &args.ports, topology.as_ref())?;
    if args.controller.is_none() {
        args.controller = topology.as_ref().map(|t| t.controller.to_string());
    }
    let Some(controller) = args.controller.clone() else {
        bail!("no controller address: give --controller or --topology");
    };
    let shared = workers::Shared {
        controller,
        token: args.token.clone(),
        stats_listen: args.stats_listen.clone(),
        capture: args.capture.clone(),
        link_emu: link_emu::resolve(&args.link_emu, &plans, topology.as_ref())?,
        in_process_links: match args.internal_links {
            InternalLinks::Memory => spec::internal_link_pairs(&plans, topology.as_ref()),
            InternalLinks::Wire => Vec::new(),
        },
        busy_poll: Duration::from_micros(args.busy_poll_us),
        topology: topology.as_ref().map(Topology::fingerprint),
        orphan_timeout: orphan_timeout(args.orphan_idle_timeout)?,
    };
    let mut n_workers = match args.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()).min(plans.len()),
        n => n,
    };
    if shared.capture.is_some() && n_workers > 1 {
        info!("--capture writes one file in order: running one worker");
        n_workers = 1;
    }
    let groups = workers::split(&plans, n_workers);
    match args.backend {
        BackendKind::AfPacket => {
            let cfg = AfPacketConfig {
                ring: match args.rx_ring {
                    RingKind::V3 => RxRing::V3,
                    RingKind::V2 => RxRing::V2,
                },
                block_size: args.rx_block_size,
                block_count: args.rx_blocks,
                gso_slots: args.rx_gso_slots,
                block_timeout_ms: args.rx_block_timeout_ms,
                tx_batch: args.tx_batch,
                promiscuous: !args.no_promisc,
                gso_links: wire_links_in_process(&plans, topology.as_ref(), &groups, &shared),
                quiet_ports: memory_links_in_process(&plans, &groups, &shared),
                host_ports: spec::host_facing_ports(&plans, topology.as_ref()),
                ..AfPacketConfig::default()
            };
            let open = |s: &[PortSpec]| AfPacketBackend::open(s, cfg.clone());
            run_sharded(open, "AF_PACKET", &groups, &plans, &shared)
        }
        BackendKind::Pcap => {
            let cfg = PcapConfig {
                buffer_size: args.pcap_buffer,
                snaplen: args.pcap_snaplen,
                udp_ports: args.filter_udp_ports.clone(),
                tx_batch: args.tx_batch,
                promiscuous: !args.no_promisc,
                ..PcapConfig::default()
            };
            let open = |s: &[PortSpec]| PcapBackend::open(s, cfg.clone());
            run_sharded(open, "pcap", &groups, &plans, &shared)
        }
        BackendKind::AfXdp => {
            let cfg = AfXdpConfig {
                rx_frames: args.xdp_frames,
                tx_frames: args.xdp_frames,
                udp_ports: args.filter_udp_ports.clone(),
                tx_batch: args.tx_batch,
                force_generic: args.xdp_generic,
            };
            let open = |s: &[PortSpec]| AfXdpBackend::open(s, cfg.clone());
            run_sharded(open, "AF_XDP", &groups, &plans, &shared)
        }
        BackendKind::Memory => {
            let specs = workers::group_specs(&plans, &(0..plans.len()).collect::<Vec<_>>());
            let (backend, _net) = MemoryBackend::new(specs, 4096);
            run_with(backend, &plans, &shared)
        }
        BackendKind::Dpdk => run_dpdk(&groups, &plans, &shared, &args),
    }
}

#[cfg(feature = "dpdk")]
fn run_dpdk(
    groups: &[Vec<usize>],
    plans: &[SwitchPlan],
    shared: &workers::Shared,
    args: &RunArgs,
) -> anyhow::Result<()> {
    use inc_switch_io::dpdk::{DpdkBackend, DpdkConfig, VdevDriver};
    let cfg = DpdkConfig {
        eal_args: args.dpdk_args.split_whitespace().map(str::to_string).collect(),
        vdev: match args.dpdk_vdev {
            DpdkVdev::AfPacket => VdevDriver::AfPacket,
            DpdkVdev::AfXdp => VdevDriver::AfXdp,
        },
        tx_batch: args.tx_batch,
        idle_sleep_max: std::time::Duration::from_micros(args.dpdk_idle_max_us),
        busy_poll: shared.busy_poll,
        promiscuous: !args.no_promisc,
        // EAL is initialised once, by the first worker's backend, for every port.
        process_ports: plans.iter().map(|p| p.ports.len()).sum(),
        ..DpdkConfig::default()
    };
    let open = |s: &[PortSpec]| DpdkBackend::open(s, cfg.clone());
    run_sharded(open, "DPDK", groups, plans, shared)
}

#[cfg(not(feature = "dpdk"))]
fn run_dpdk(
    _: &[Vec<usize>],
    _: &[SwitchPlan],
    _: &workers::Shared,
    _: &RunArgs,
) -> anyhow::Result<()> {
    bail!(
        "this inc-switch was built without DPDK support; build it with \
         `cargo build --release -p inc-switch --features dpdk` (needs libdpdk-dev: \
         sudo scripts/setup --dpdk)"
    )
}

/// `--orphan-idle-timeout` as a duration.
fn orphan_timeout(secs: f64) -> anyhow::Result<Duration> {
    if !(secs.is_finite() && secs > 0.0) {
        bail!("--orphan-idle-timeout must be a positive number of seconds, not {secs}");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Open one backend per worker group (`open` gets the group's interfaces) and run.
fn run_sharded<B, E, F>(
    open: F,
    what: &str,
    groups: &[Vec<usize>],
    plans: &[SwitchPlan],
    shared: &workers::Shared,
) -> anyhow::Result<()>
where
    B: Backend + 'static,
    E: std::error::Error + Send + Sync + 'static,
    F: Fn(&[PortSpec]) -> Result<B, E>,
{
    let mut backends = Vec::with_capacity(groups.len());
    for g in groups {
        let specs = workers::group_specs(plans, g);
        let backend = open(&specs).with_context(|| format!("opening {what} ports"))?;
        let index = |p: &PortSpec| specs.iter().position(|s| s == p);
        let links: Vec<(usize, usize)> = shared
            .in_process_links
            .iter()
            .filter_map(|(a, b)| Some((index(a)?, index(b)?)))
            .collect();
        let backend = InProcessLinks::new(backend, &links).context("in-process links")?;
        backends.push(with_link_emu(backend, g, shared)?);
    }
    let final_stats = workers::run(backends, groups, plans, shared)?;
    println!("{}", serde_json::to_string_pretty(&final_stats)?);
    Ok(())
}

/// Run every switch of `plans` on one worker over `backend` (whose ports are all the
/// plans' ports, in order).
fn run_with<B: Backend + 'static>(
    backend: B,
    plans: &[SwitchPlan],
    shared: &workers::Shared,
) -> anyhow::Result<()> {
    let all: Vec<usize> = (0..plans.len()).collect();
    let backend = with_link_emu(backend, &all, shared)?;
    let final_stats = workers::run(vec![backend], &[all], plans, shared)?;
    println!("{}", serde_json::to_string_pretty(&final_stats)?);
    Ok(())
}

/// Whether ports `a` and `b` belong to switches one worker serves.
fn same_worker(plans: &[SwitchPlan], groups: &[Vec<usize>], a: &PortSpec, b: &PortSpec) -> bool {
    groups.iter().any(|g| {
        let specs = workers::group_specs(plans, g);
        specs.contains(a) && specs.contains(b)
    })
}

/// The interfaces of the links between two switches of this process that use the
/// wire: all of them with `--internal-links wire`, else those whose ends are served by
/// different workers.
fn wire_links_in_process(
    plans: &[SwitchPlan],
    topology: Option<&Topology>,
    groups: &[Vec<usize>],
    shared: &workers::Shared,
) -> Vec<PortSpec> {
    let same_worker = |a: &PortSpec, b: &PortSpec| same_worker(plans, groups, a, b);
    spec::internal_link_pairs(plans, topology)
        .into_iter()
        .filter(|(a, b)| {
            !(shared.in_process_links.contains(&(a.clone(), b.clone())) && same_worker(a, b))
        })
        .flat_map(|(a, b)| [a, b])
        .collect()
}

/// The interfaces of the links between two switches of one worker that in-process
/// links carry in memory (`--internal-links memory`): the switch never sends on them
/// through the backend.
fn memory_links_in_process(
    plans: &[SwitchPlan],
    groups: &[Vec<usize>],
    shared: &workers::Shared,
) -> Vec<PortSpec> {
    let same_worker = |a: &PortSpec, b: &PortSpec| same_worker(plans, groups, a, b);
    shared
        .in_process_links
        .iter()
        .filter(|(a, b)| same_worker(a, b))
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect()
}

/// `backend` (serving the switches `group`) behind the `--link-emu` of its ports.
fn with_link_emu<B: Backend>(
    backend: B,
    group: &[usize],
    shared: &workers::Shared,
) -> anyhow::Result<LinkEmuBackend<B>> {
    let config = group.iter().flat_map(|&i| shared.link_emu[i].iter().cloned()).collect();
    LinkEmuBackend::new(backend, config).context("link emulation")
}
