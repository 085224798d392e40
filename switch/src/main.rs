//! `inc-switch`: runs one or more logical INC switches of a topology over a packet I/O
//! backend, driven by the controller.
//!
//! ```text
//! inc-switch run --controller 10.99.0.1:7000 --backend af_packet \
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

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use inc_controller::Topology;
use inc_ctrl_proto::{Mac, PortInfo};
use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig};
use inc_switch_io::af_packet::{AfPacketBackend, AfPacketConfig, RxRing};
use inc_switch_io::link_emu::LinkEmuBackend;
use inc_switch_io::memory::MemoryBackend;
use inc_switch_io::{Backend, PortSpec};
use inc_wire::EthernetAddress;
use tracing::info;

use crate::capture::Capture;
use crate::event_loop::{EventLoop, LogicalSwitch};
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
    Run(RunArgs),
    /// Print the counters of a running switch (its --stats-listen address) as JSON.
    Stats {
        /// Address given to --stats-listen.
        addr: String,
        /// One line for scripts instead: `uptime_s=.. rx_frames=.. tx_frames=..` (all switches).
        #[arg(long)]
        summary: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// AF_PACKET with TPACKET_V3 (or V2) receive rings and sendmmsg transmit.
    #[value(name = "af_packet", alias = "af-packet")]
    AfPacket,
    /// In-process queues (no interfaces; for tests of the control path).
    Memory,
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
    /// Shared token expected by the controller.
    #[arg(long, env = "INC_TOKEN")]
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
    /// AF_PACKET block retire timeout (ms): the longest a lone frame waits in the ring.
    #[arg(long, default_value_t = 1)]
    rx_block_timeout_ms: u32,
    /// Frames per transmit batch.
    #[arg(long, default_value_t = 64)]
    tx_batch: usize,
    /// Do not put the interfaces in promiscuous mode.
    #[arg(long)]
    no_promisc: bool,
    /// Emulate link faults: [SWITCH:PORT=]KEY=VALUE,... with keys loss, burst, dup,
    /// reorder, reorder-delay, corrupt, delay, jitter, rate, limit, seed and
    /// dir=link|tx|rx|both (repeatable; later ones refine earlier ones; without a
    /// SWITCH:PORT every port). Example: `loss=1%,burst=4,seed=7`.
    #[arg(long = "link-emu")]
    link_emu: Vec<link_emu::LinkEmuArg>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match Cli::parse().cmd {
        Cmd::Run(args) => run(args),
        Cmd::Stats { addr, summary } => {
            let v = stats::fetch(&addr)?;
            if summary {
                let l = &v["loop"];
                println!(
                    "uptime_s={} rx_frames={} tx_frames={}",
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
    let specs: Vec<PortSpec> =
        plans.iter().flat_map(|p| p.ports.iter().map(|q| q.iface.clone())).collect();
    match args.backend {
        BackendKind::AfPacket => {
            let cfg = AfPacketConfig {
                ring: match args.rx_ring {
                    RingKind::V3 => RxRing::V3,
                    RingKind::V2 => RxRing::V2,
                },
                block_size: args.rx_block_size,
                block_count: args.rx_blocks,
                block_timeout_ms: args.rx_block_timeout_ms,
                tx_batch: args.tx_batch,
                promiscuous: !args.no_promisc,
                ..AfPacketConfig::default()
            };
            let backend = AfPacketBackend::open(&specs, cfg).context("opening AF_PACKET ports")?;
            run_with(backend, &plans, &controller, &args)
        }
        BackendKind::Memory => {
            let (backend, _net) = MemoryBackend::new(specs, 4096);
            run_with(backend, &plans, &controller, &args)
        }
    }
}

/// Build the engines over `backend`, start the side threads, run the loop.
fn run_with<B: Backend>(
    backend: B,
    plans: &[SwitchPlan],
    controller: &str,
    args: &RunArgs,
) -> anyhow::Result<()> {
    let emu = link_emu::resolve(&args.link_emu, plans, args.topology.as_deref())?;
    let backend = LinkEmuBackend::new(backend, emu).context("link emulation")?;
    let shutdown = Arc::new(AtomicBool::new(false));
    let waker = backend.waker();
    let (tx, rx) = crossbeam_channel::unbounded();

    let mut switches = Vec::new();
    let mut sessions = Vec::new();
    let mut base = 0;
    for (si, plan) in plans.iter().enumerate() {
        let mut ports = Vec::new();
        let mut infos = Vec::new();
        for (lp, p) in plan.ports.iter().enumerate() {
            let desc = &backend.ports()[base + lp];
            let mac = p.mac.unwrap_or(Mac(desc.mac));
            let Some(ip) = p.ip else { bail!("port {}:{} has no address", plan.name, p.port) };
            ports.push(PortConfig { name: p.port.clone(), ip, mac: EthernetAddress(mac.0) });
            infos.push(PortInfo { name: p.port.clone(), ip: Some(ip), mac: Some(mac) });
            info!(switch = %plan.name, port = %p.port, iface = %p.iface, %ip, %mac, "port");
        }
        let engine = SwitchEngine::new(SwitchEngineConfig {
            switch_id: plan.id,
            ports,
            ..SwitchEngineConfig::default()
        });
        switches.push(LogicalSwitch {
            id: plan.id,
            name: plan.name.clone(),
            engine,
            port_base: base,
            port_names: plan.ports.iter().map(|p| p.port.clone()).collect(),
            communicators: BTreeSet::new(),
        });
        sessions.push(control::SessionConfig {
            controller: controller.to_string(),
            token: args.token.clone(),
            switch: si,
            switch_id: plan.id,
            name: plan.name.clone(),
            ports: infos,
        });
        base += plan.ports.len();
    }

    // SIGINT/SIGTERM: set the flag and wake the loop, which then prints the counters.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    {
        let (flag, waker) = (shutdown.clone(), waker.clone());
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            for sig in signals.forever() {
                info!(signal = sig, "shutting down");
                flag.store(true, Ordering::Relaxed);
                waker.wake();
            }
        })?;
    }

    let capture = args.capture.as_deref().map(Capture::create).transpose()?;
    if let Some(addr) = &args.stats_listen {
        let local = stats::serve(addr, tx.clone(), waker.clone())?;
        info!(addr = %local, "stats endpoint");
    }
    for s in sessions {
        control::spawn(s, tx.clone(), waker.clone(), shutdown.clone())?;
    }
    drop(tx);
    info!(backend = backend.name(), switches = plans.len(), "switch running");
    let final_stats = EventLoop::new(backend, switches, rx, capture, shutdown).run()?;
    println!("{}", serde_json::to_string_pretty(&final_stats)?);
    Ok(())
}
