//! A whole run: topology YAML in, the controller's compiled rules installed in real
//! [`SwitchEngine`]s, one real [`HostEngine`] per host, the collective driven over the
//! [`net`](crate::net) model until every rank completed, every result checked.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Instant;

use inc_controller::{compile, Allocator, CommunicatorSpec, CompileError, Compiled};
use inc_ctrl_proto::{RankEndpoint, ROCE_UDP_PORT};
use inc_link_spec::{Impairments, DEFAULT_LIMIT};
use inc_protocol::Time;
use inc_switch_engine::{EngineError, PortConfig, SwitchEngine, SwitchEngineConfig, SwitchEvent};
use inc_topology::{Topology, TopologyError};
use inc_wire::{
    ArpOperation, ArpPacket, ArpRepr, DataType, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, Operator,
};
use inccl_engine::{CollectiveKind, CollectiveSpec, HostEngine, HostQpConfig, OpBuffers};
use serde::Serialize;

use crate::data::{combine_into, first_mismatch, mix, Collective, InputSpec, POISON};
use crate::net::{Dir, DirConfig, DirStats, Event, Nanos, Pool, Queue, Verdict};

/// Everything a run needs besides the topology.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator.
    pub op: Operator,
    /// Bytes per rank (a whole number of elements).
    pub bytes: u64,
    /// Seeds inputs, PSNs and link faults.
    pub seed: u64,
    /// Rate of links whose YAML emulation gives none.
    pub link_rate_bps: u64,
    /// Propagation delay of links whose YAML emulation gives none.
    pub link_delay: Nanos,
    /// Output queue per link direction, in frames (a YAML `limit=` overrides it).
    pub queue_frames: usize,
    /// Time a switch spends on each frame it receives.
    pub switch_frame_cost: Nanos,
    /// Time a host spends on each frame it receives.
    pub host_frame_cost: Nanos,
    /// Frames a host's NIC takes from its engine ahead of its link
    /// ([`HOST_TX_BATCH`] for a NIC; [`HOST_TX_ALL`] hands the link everything, as the
    /// emulator's hosts do with `INCCL_NIC_PACING=off`).
    pub host_tx_ahead: usize,
    /// Extra bytes per frame on the wire (0: frame bytes only, like the emulator).
    pub wire_overhead: u32,
    /// Payload size override (else the YAML's `defaults.mtu`).
    pub mtu: Option<u16>,
    /// Window override (else the YAML's `defaults.window`).
    pub window: Option<u32>,
    /// Give up at this simulated time.
    pub max_time: Nanos,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            collective: Collective::AllReduce,
            dtype: DataType::Int32,
            op: Operator::Sum,
            bytes: 1 << 20,
            seed: 1,
            link_rate_bps: 100_000_000_000,
            link_delay: 1_000,
            queue_frames: DEFAULT_LIMIT,
            switch_frame_cost: 0,
            host_frame_cost: 0,
            host_tx_ahead: HOST_TX_BATCH,
            wire_overhead: 0,
            mtu: None,
            window: None,
            max_time: 600_000_000_000,
        }
    }
}

/// Why a run failed. Each variant names what is at fault.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The topology file does not load.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A size that is not a whole number of elements, or zero.
    #[error(
        "size {bytes} bytes is not a positive multiple of the {dtype} element size ({size} bytes)"
    )]
    BadSize {
        /// Bytes asked.
        bytes: u64,
        /// Element type.
        dtype: DataType,
        /// Its size.
        size: usize,
    },
    /// A ReduceScatter or AllGather vector too short for one element per rank.
    #[error(
        "size {bytes} bytes holds less than one {dtype} element per rank ({world} hosts in \
         {file}); the size of reducescatter and allgather is the whole vector of one block per \
         rank"
    )]
    NoWholeBlock {
        /// Bytes asked.
        bytes: u64,
        /// Element type.
        dtype: DataType,
        /// Ranks.
        world: usize,
        /// Topology file.
        file: String,
    },
    /// The operator does not apply to the type.
    #[error("operator {op} does not apply to {dtype}")]
    BadOp {
        /// Operator.
        op: Operator,
        /// Element type.
        dtype: DataType,
    },
    /// A root outside the communicator.
    #[error("root rank {root} but the topology {file} has {world} hosts")]
    BadRoot {
        /// Root asked.
        root: u16,
        /// Ranks.
        world: usize,
        /// Topology file.
        file: String,
    },
    /// More hosts than a communicator holds.
    #[error("topology {file} has {hosts} hosts; a communicator holds at most 65535")]
    TooManyHosts {
        /// Topology file.
        file: String,
        /// Hosts.
        hosts: usize,
    },
    /// The controller's compiler refused the communicator.
    #[error("compiling the communicator of all {hosts} hosts of {file}: {error}")]
    Compile {
        /// Topology file.
        file: String,
        /// Hosts.
        hosts: usize,
        /// Why.
        error: CompileError,
    },
    /// A switch engine refused its rules.
    #[error("switch {switch}: installing the rules: {error}")]
    Install {
        /// Switch name.
        switch: String,
        /// Why.
        error: EngineError,
    },
    /// A host engine refused to start the collective.
    #[error("rank {rank} (host {host}): starting the collective: {reason}")]
    Start {
        /// Rank.
        rank: u16,
        /// Host name.
        host: String,
        /// Why.
        reason: String,
    },
    /// A node sent on a port without a link.
    #[error("{node} sent a frame on port {port}, which has no link")]
    UnlinkedPort {
        /// Node name.
        node: String,
        /// Port index.
        port: usize,
    },
    /// A node emitted a frame of an impossible length.
    #[error("{node} emitted a frame of {len} bytes")]
    BadFrame {
        /// Node name.
        node: String,
        /// Length.
        len: usize,
    },
    /// A rank's collective failed.
    #[error("rank {rank} (host {host}): the collective failed at t={at}ns: {reason}")]
    Failed {
        /// Rank.
        rank: u16,
        /// Host name.
        host: String,
        /// Simulated time.
        at: Nanos,
        /// The engine's error.
        reason: String,
    },
    /// Nothing left to do but ranks are not done.
    #[error("deadlock at t={at}ns: no frame in flight and no timer armed; {waiting}")]
    Deadlock {
        /// Simulated time.
        at: Nanos,
        /// The ranks still waiting.
        waiting: String,
    },
    /// The simulated time limit passed.
    #[error("time limit: not done at t={at}ns; {waiting}")]
    TimeLimit {
        /// Simulated time.
        at: Nanos,
        /// The ranks still waiting.
        waiting: String,
    },
    /// A node's timer stays due.
    #[error("{node}: timer still due after {spins} timeouts at t={at}ns")]
    TimerSpin {
        /// Node name.
        node: String,
        /// Simulated time.
        at: Nanos,
        /// Calls made.
        spins: u32,
    },
    /// A rank's result is wrong.
    #[error("rank {rank} (host {host}): element {element} is {got}, expected {want}")]
    Mismatch {
        /// Rank.
        rank: u16,
        /// Host name.
        host: String,
        /// Element index.
        element: usize,
        /// Value received (hex bytes, native order).
        got: String,
        /// Value expected.
        want: String,
    },
}

/// A link direction in the results.
#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    /// `from -> to`.
    pub name: String,
    /// Bits per second.
    pub rate_bps: u64,
    /// Serialiser busy time / collective time.
    pub utilisation: f64,
    /// Counters.
    pub stats: DirStats,
}

/// Wall-clock time of each phase.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WallTimes {
    /// Loading, compiling, building engines and links.
    pub setup_s: f64,
    /// Generating inputs and expected results.
    pub inputs_s: f64,
    /// The event loop.
    pub run_s: f64,
    /// Checking results.
    pub verify_s: f64,
}

/// Results of a verified run.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Topology name.
    pub topology: String,
    /// Collective.
    pub collective: &'static str,
    /// Element type.
    pub dtype: String,
    /// Operator.
    pub op: String,
    /// Bytes per rank.
    pub bytes: u64,
    /// Ranks (one per host).
    pub hosts: usize,
    /// Switches.
    pub switches: usize,
    /// Payload bytes per chunk.
    pub mtu: u16,
    /// Window (chunks).
    pub window: u32,
    /// Seed.
    pub seed: u64,
    /// Completion of the last rank (all start at 0).
    pub time_ns: Nanos,
    /// Completion of the first rank.
    pub first_ns: Nanos,
    /// bytes / time, GB/s (1e9 bytes per second).
    pub algbw_gbs: f64,
    /// algbw x the nccl-tests bus factor.
    pub busbw_gbs: f64,
    /// Frames offered to links.
    pub frames: u64,
    /// Bytes put on the wire.
    pub wire_bytes: u64,
    /// Packets retransmitted by hosts and switches.
    pub retransmissions: u64,
    /// Frames dropped by full output queues.
    pub queue_drops: u64,
    /// Frames lost by link emulation.
    pub lost: u64,
    /// Frames corrupted by link emulation.
    pub corrupted: u64,
    /// Duplicated by link emulation.
    pub duplicated: u64,
    /// Reordered by link emulation.
    pub reordered: u64,
    /// Ranks whose every element was checked.
    pub verified_ranks: usize,
    /// Ranks that receive a result.
    pub receiving_ranks: usize,
    /// Busiest link directions, by utilisation.
    pub busiest: Vec<LinkReport>,
    /// Events processed (frame arrivals, processing, timers).
    pub events: u64,
    /// Events per second of the event loop.
    pub events_per_s: f64,
    /// Wall-clock time per phase.
    pub wall: WallTimes,
    /// Most frames in flight at once.
    pub peak_frames_in_flight: usize,
    /// Bytes of frame buffers at the peak.
    pub frame_buffer_bytes: usize,
    /// Switch events (failures), rendered.
    pub switch_events: Vec<String>,
}

/// A switch node.
#[derive(Debug)]
struct SwitchSim {
    name: String,
    engine: SwitchEngine,
    events: Vec<String>,
}

/// A host node: one rank.
#[derive(Debug)]
struct HostSim {
    name: String,
    rank: u16,
    engine: HostEngine,
    sends: bool,
    receives: bool,
    /// Input (senders), overwritten by the result where the rank also receives; empty
    /// for a rank outside the checked sample, which uses [`Shared`] buffers.
    buf: Vec<u8>,
    /// Rank outside the checked sample: its input is shared pattern `pattern`, its
    /// output goes to the shared scratch buffer and is not checked.
    pattern: Option<usize>,
    finished: Option<Nanos>,
    /// `finished` was counted in [`Sim`]'s `done`.
    counted: bool,
    error: Option<(Nanos, String)>,
    ip: Ipv4Addr,
    mac: EthernetAddress,
    arp_out: VecDeque<[u8; ARP_FRAME_LEN]>,
}

const ARP_FRAME_LEN: usize = 60;

impl HostSim {
    fn handle_frame(&mut self, now: Nanos, frame: &[u8], shared: &mut Shared) {
        if frame.get(12..14) == Some(&[0x08, 0x06]) {
            self.handle_arp(frame);
            return;
        }
        let t = Time::from_nanos(now);
        let mut bufs = op_buffers(&mut self.buf, self.pattern, shared, self.sends, self.receives);
        self.engine.handle_frame(t, frame, &mut bufs);
        self.check(now);
    }

    fn handle_timeout(&mut self, now: Nanos) {
        self.engine.handle_timeout(Time::from_nanos(now));
        self.check(now);
    }

    fn check(&mut self, now: Nanos) {
        match self.engine.poll_completion() {
            None => {}
            Some(Ok(())) => self.finished = Some(now),
            Some(Err(e)) => self.error = Some((now, e.to_string())),
        }
    }

    fn poll_transmit(&mut self, now: Nanos, out: &mut [u8], shared: &mut Shared) -> Option<usize> {
        if let Some(arp) = self.arp_out.pop_front() {
            out[..ARP_FRAME_LEN].copy_from_slice(&arp);
            return Some(ARP_FRAME_LEN);
        }
        let t = Time::from_nanos(now);
        let bufs = op_buffers(&mut self.buf, self.pattern, shared, self.sends, self.receives);
        self.engine.poll_transmit(t, out, &bufs)
    }

    /// Answers an ARP request for our address (switches resolve `mac: learn` hosts).
    fn handle_arp(&mut self, frame: &[u8]) {
        let Some(pkt) = frame.get(14..).and_then(|p| ArpPacket::new_checked(p).ok()) else {
            return;
        };
        let Ok(arp) = ArpRepr::parse(&pkt) else { return };
        if arp.operation != ArpOperation::Request || arp.target_protocol_addr != self.ip {
            return;
        }
        let mut out = [0u8; ARP_FRAME_LEN];
        let eth = EthernetRepr {
            src_addr: self.mac,
            dst_addr: arp.source_hardware_addr,
            ethertype: EtherType::Arp,
        };
        eth.emit(&mut EthernetFrame::new_unchecked(&mut out[..]));
        arp.reply(self.mac).emit(&mut ArpPacket::new_unchecked(&mut out[14..42]));
        self.arp_out.push_back(out);
    }
}

/// Buffers of the ranks outside the checked sample (above [`SAMPLE_RANKS`] ranks):
/// a few input patterns and one output every such rank writes into.
#[derive(Debug, Default)]
struct Shared {
    patterns: Vec<Vec<u8>>,
    scratch: Vec<u8>,
    /// Bytes of a pattern such a rank sends from (AllGather: one block).
    src_len: usize,
    /// Bytes of the scratch it receives into (ReduceScatter: one block).
    dst_len: usize,
}

/// Up to this many ranks, every rank has its own buffers and every element of every
/// receiving rank is checked; above it, this many ranks (evenly spread, the root
/// included) are, and the others share [`PATTERNS`] inputs and one output buffer.
pub const SAMPLE_RANKS: usize = 1024;
/// Frames a host's NIC takes from its engine ahead of its link (one wake-up per batch).
pub const HOST_TX_BATCH: usize = 4;
/// [`SimConfig::host_tx_ahead`] for a host that hands every frame its engine has to the
/// link at once: its retransmissions and ACKs then queue behind all of them.
pub const HOST_TX_ALL: usize = usize::MAX;

/// Distinct inputs of the ranks outside the sample.
pub const PATTERNS: usize = 16;

/// The engine's view of a rank's buffers: in place where the rank sends and receives.
fn op_buffers<'a>(
    buf: &'a mut [u8],
    pattern: Option<usize>,
    shared: &'a mut Shared,
    sends: bool,
    receives: bool,
) -> OpBuffers<'a> {
    if let Some(p) = pattern {
        let src = &shared.patterns[p][..shared.src_len];
        let dst = &mut shared.scratch[..shared.dst_len];
        return match (sends, receives) {
            (true, true) => OpBuffers::Separate { src, dst },
            (true, false) => OpBuffers::SendOnly(src),
            (false, true) => OpBuffers::RecvOnly(dst),
            (false, false) => OpBuffers::None,
        };
    }
    match (sends, receives) {
        (true, true) => OpBuffers::InPlace(buf),
        (true, false) => OpBuffers::SendOnly(buf),
        (false, true) => OpBuffers::RecvOnly(buf),
        (false, false) => OpBuffers::None,
    }
}

#[derive(Debug)]
enum Node {
    Switch(Box<SwitchSim>),
    Host(Box<HostSim>),
}

impl Node {
    fn name(&self) -> String {
        match self {
            Node::Switch(s) => format!("switch {}", s.name),
            Node::Host(h) => format!("rank {} (host {})", h.rank, h.name),
        }
    }

    fn poll_timeout(&self) -> Option<Nanos> {
        match self {
            Node::Switch(s) => s.engine.poll_timeout().map(Time::as_nanos),
            Node::Host(h) => h.engine.poll_timeout().map(Time::as_nanos),
        }
    }
}

/// A built simulation, ready to run.
#[derive(Debug)]
pub struct Sim {
    cfg: SimConfig,
    topo: Topology,
    compiled: Compiled,
    nodes: Vec<Node>,
    /// `out_dirs[node][port]`: the direction a node's port sends on (`u32::MAX`: none).
    out_dirs: Vec<Vec<u32>>,
    dirs: Vec<Dir>,
    pool: Pool,
    queue: Queue,
    now: Nanos,
    busy: Vec<Nanos>,
    costs: Vec<Nanos>,
    timer_at: Vec<Nanos>,
    /// When a host's `TxReady` is scheduled (`Nanos::MAX`: not scheduled).
    tx_wait: Vec<Nanos>,
    n_switches: usize,
    shared: Shared,
    expected: Vec<u8>,
    done: usize,
    events: u64,
    wall: WallTimes,
    mtu: u16,
    window: u32,
}

/// Seed of a link direction: the run's seed, the spec's and the direction's name.
fn dir_seed(seed: u64, spec_seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed ^ spec_seed.rotate_left(17);
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

impl Sim {
    /// Loads `path` and builds everything (see [`Sim::new`]).
    pub fn load(path: &std::path::Path, cfg: SimConfig) -> Result<Sim, SimError> {
        let topo = Topology::load(path)?;
        Sim::new(topo, cfg)
    }

    /// Compiles a communicator of every host of `topo` (rank i = host i) with the
    /// controller's compiler, builds the engines and the links, generates the inputs.
    pub fn new(topo: Topology, mut cfg: SimConfig) -> Result<Sim, SimError> {
        let t0 = Instant::now();
        let size = cfg.dtype.size();
        if cfg.bytes == 0 || cfg.bytes % size as u64 != 0 {
            return Err(SimError::BadSize { bytes: cfg.bytes, dtype: cfg.dtype, size });
        }
        if !cfg.op.applies_to(cfg.dtype) {
            return Err(SimError::BadOp { op: cfg.op, dtype: cfg.dtype });
        }
        let world = topo.hosts.len();
        if world > 0xFFFF {
            return Err(SimError::TooManyHosts { file: topo.file.clone(), hosts: world });
        }
        if cfg.collective.is_blockwise() {
            let block = cfg.bytes / size as u64 / world.max(1) as u64 * size as u64;
            if block == 0 {
                return Err(SimError::NoWholeBlock {
                    bytes: cfg.bytes,
                    dtype: cfg.dtype,
                    world,
                    file: topo.file.clone(),
                });
            }
            cfg.bytes = block * world as u64;
        }
        if let Collective::Reduce { root } | Collective::Broadcast { root } = cfg.collective {
            if usize::from(root) >= world {
                return Err(SimError::BadRoot { root, world, file: topo.file.clone() });
            }
        }
        let ranks: Vec<RankEndpoint> = topo
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let r = mix(cfg.seed ^ 0xA11C_E000 ^ i as u64);
                RankEndpoint {
                    rank: i as u16,
                    ip: h.addr.ip,
                    mac: None,
                    qpn: 0x100 + (r as u32 & 0xFFFF),
                    start_psn: (r >> 32) as u32 & 0xFF_FFFF,
                    udp_port: ROCE_UDP_PORT,
                }
            })
            .collect();
        let spec = CommunicatorSpec { comm_id: 1, ranks, mtu: cfg.mtu, window: cfg.window };
        let compiled = compile(&topo, &spec, &mut Allocator::new(), mix(cfg.seed))
            .map_err(|error| SimError::Compile { file: topo.file.clone(), hosts: world, error })?;

        let mut nodes = Vec::with_capacity(topo.switches.len() + world);
        for sw in &topo.switches {
            let ports = sw
                .ports
                .iter()
                .map(|p| PortConfig { name: p.name.clone(), ip: p.addr.ip, mac: p.mac })
                .collect();
            let mut engine = SwitchEngine::new(SwitchEngineConfig {
                switch_id: sw.id,
                ports,
                ..SwitchEngineConfig::default()
            });
            for r in compiled.rules.iter().filter(|r| r.switch_id == sw.id) {
                engine
                    .install(r, Time::ZERO)
                    .map_err(|error| SimError::Install { switch: sw.name.clone(), error })?;
            }
            nodes.push(Node::Switch(Box::new(SwitchSim {
                name: sw.name.clone(),
                engine,
                events: Vec::new(),
            })));
        }
        let n_switches = nodes.len();
        let (mut mtu, mut window) = (0, 0);
        for (i, h) in topo.hosts.iter().enumerate() {
            let ep = &compiled.endpoints[i];
            (mtu, window) = (ep.mtu, ep.window);
            let mac = h.mac.unwrap_or(h.if_mac);
            let qp = HostQpConfig::from_endpoint(ep, world as u16, mac, h.addr.ip);
            let (sends, receives) = cfg.collective.role(i as u16);
            nodes.push(Node::Host(Box::new(HostSim {
                name: h.name.clone(),
                rank: i as u16,
                engine: HostEngine::new(qp),
                sends,
                receives,
                buf: Vec::new(),
                pattern: None,
                finished: None,
                counted: false,
                error: None,
                ip: h.addr.ip,
                mac,
                arp_out: VecDeque::new(),
            })));
        }

        // Links: a switch port's `tx` emulation applies to what it sends, its `rx` to
        // what a host sends it.
        let mut out_dirs: Vec<Vec<u32>> = topo
            .switches
            .iter()
            .map(|s| vec![u32::MAX; s.ports.len()])
            .chain((0..world).map(|_| vec![u32::MAX]))
            .collect();
        let mut dirs = Vec::new();
        let mut add_dir = |from: (usize, usize),
                           to: (usize, usize),
                           name: String,
                           imp: Option<&Impairments>,
                           switch_link: bool| {
            let imp = imp.filter(|i| !i.is_noop() || i.limit != DEFAULT_LIMIT);
            let rate_bps = imp.and_then(|i| i.rate_bps).unwrap_or(cfg.link_rate_bps);
            let delay = imp
                .map(|i| i.delay.as_nanos() as Nanos)
                .filter(|&d| d > 0)
                .unwrap_or(cfg.link_delay);
            let queue_frames =
                imp.map(|i| i.limit).filter(|&l| l != DEFAULT_LIMIT).unwrap_or(cfg.queue_frames);
            let corrupts = imp.is_some_and(|i| i.corrupt > 0.0);
            let seed = dir_seed(cfg.seed, imp.map_or(0, |i| i.seed), &name);
            out_dirs[from.0][from.1] = dirs.len() as u32;
            dirs.push(Dir::new(DirConfig {
                name,
                to_node: to.0 as u32,
                to_port: to.1 as u32,
                rate_bps,
                delay,
                queue_frames: queue_frames.max(1),
                wire_overhead: cfg.wire_overhead,
                impairments: imp.cloned(),
                seed,
                intact: switch_link && !corrupts,
            }));
        };
        let port_name = |p: inc_topology::PortRef| {
            format!(
                "{}:{}",
                topo.switches[p.switch].name, topo.switches[p.switch].ports[p.port].name
            )
        };
        for l in &topo.links {
            let (pa, pb) = (
                &topo.switches[l.a.switch].ports[l.a.port],
                &topo.switches[l.b.switch].ports[l.b.port],
            );
            let (a, b) = ((l.a.switch, l.a.port), (l.b.switch, l.b.port));
            let ab = pa.emu.tx.as_ref().or(pb.emu.rx.as_ref());
            let ba = pb.emu.tx.as_ref().or(pa.emu.rx.as_ref());
            add_dir(a, b, format!("{} -> {}", port_name(l.a), port_name(l.b)), ab, true);
            add_dir(b, a, format!("{} -> {}", port_name(l.b), port_name(l.a)), ba, true);
        }
        for (i, h) in topo.hosts.iter().enumerate() {
            let sp = (h.attach.switch, h.attach.port);
            let port = &topo.switches[sp.0].ports[sp.1];
            let hn = (n_switches + i, 0);
            add_dir(
                hn,
                sp,
                format!("{} -> {}", h.name, port_name(h.attach)),
                port.emu.rx.as_ref(),
                false,
            );
            add_dir(
                sp,
                hn,
                format!("{} -> {}", port_name(h.attach), h.name),
                port.emu.tx.as_ref(),
                false,
            );
        }
        let n = nodes.len();
        let costs = (0..n)
            .map(|i| if i < n_switches { cfg.switch_frame_cost } else { cfg.host_frame_cost })
            .collect();
        let setup_s = t0.elapsed().as_secs_f64();
        let mut sim = Sim {
            cfg,
            topo,
            compiled,
            nodes,
            out_dirs,
            dirs,
            pool: Pool::new(usize::from(mtu) + 256),
            queue: Queue::default(),
            now: 0,
            busy: vec![0; n],
            costs,
            timer_at: vec![Nanos::MAX; n],
            tx_wait: vec![Nanos::MAX; n],
            n_switches,
            shared: Shared::default(),
            expected: Vec::new(),
            done: 0,
            events: 0,
            wall: WallTimes { setup_s, ..WallTimes::default() },
            mtu,
            window,
        };
        sim.generate_inputs();
        Ok(sim)
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The compiled communicator.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    /// The link directions (configuration and counters).
    pub fn dirs(&self) -> &[Dir] {
        &self.dirs
    }

    /// Index into [`Sim::dirs`] of the direction node `node` sends on from `port`
    /// (switches are nodes `0..switches`, host `h` is node `switches + h`, port 0).
    ///
    /// # Panics
    /// If the port has no link (the topology validation rules that out for tree ports).
    pub fn dir_index(&self, node: usize, port: usize) -> usize {
        let d = self.out_dirs[node][port];
        assert!(d != u32::MAX, "node {node} port {port} has no link");
        d as usize
    }

    /// Payload bytes per chunk and window of the communicator.
    pub fn mtu_window(&self) -> (u16, u32) {
        (self.mtu, self.window)
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// Bytes of a ReduceScatter's or AllGather's block (one rank's share of the
    /// vector), else of the whole vector.
    pub fn block_bytes(&self) -> usize {
        let bytes = self.cfg.bytes as usize;
        if self.cfg.collective.is_blockwise() {
            bytes / self.topo.hosts.len()
        } else {
            bytes
        }
    }

    fn generate_inputs(&mut self) {
        let t0 = Instant::now();
        let world = self.topo.hosts.len();
        let input = InputSpec {
            dtype: self.cfg.dtype,
            op: self.cfg.op,
            world: world as u16,
            seed: self.cfg.seed,
        };
        let bytes = self.cfg.bytes as usize;
        let collective = self.cfg.collective;
        let root = match collective {
            Collective::Reduce { root } | Collective::Broadcast { root } => Some(root),
            _ => None,
        };
        // ReduceScatter and AllGather: rank r's block is bytes [r * block, (r + 1) * block).
        let block = self.block_bytes();
        let all_gather = collective == Collective::AllGather;
        // Above SAMPLE_RANKS ranks, every `stride`-th rank and the root keep their own
        // buffers; the others share patterns (drawn as ranks world.., never a real rank's).
        let sampled = |rank: u16| {
            world <= SAMPLE_RANKS
                || Some(rank) == root
                || usize::from(rank) % world.div_ceil(SAMPLE_RANKS) == 0
        };
        if world > SAMPLE_RANKS {
            self.shared.patterns = (0..PATTERNS)
                .map(|k| {
                    let mut v = vec![0u8; bytes];
                    input.fill((world + k) as u16, &mut v);
                    v
                })
                .collect();
            self.shared.scratch = vec![POISON; bytes];
        }
        self.shared.src_len = if all_gather { block } else { bytes };
        self.shared.dst_len = if collective == Collective::ReduceScatter { block } else { bytes };
        let mut expected: Option<Vec<u8>> = None;
        let mut pattern_senders = vec![0u64; self.shared.patterns.len()];
        for node in &mut self.nodes {
            let Node::Host(h) = node else { continue };
            if !h.sends && !h.receives {
                continue;
            }
            if !sampled(h.rank) {
                let p = usize::from(h.rank) % PATTERNS;
                h.pattern = Some(p);
                if h.sends {
                    pattern_senders[p] += 1;
                }
                continue;
            }
            h.buf = vec![POISON; bytes];
            if !h.sends {
                continue;
            }
            if all_gather {
                // In place: the rank's own block holds its input, the others stay
                // poisoned until the network fills them.
                let own = usize::from(h.rank) * block;
                input.fill(h.rank, &mut h.buf[own..own + block]);
                expected.get_or_insert_with(|| vec![POISON; bytes])[own..own + block]
                    .copy_from_slice(&h.buf[own..own + block]);
                continue;
            }
            input.fill(h.rank, &mut h.buf);
            match (collective, &mut expected) {
                (Collective::Broadcast { .. }, e) => *e = Some(h.buf.clone()),
                (_, None) => expected = Some(h.buf.clone()),
                (_, Some(acc)) => combine_into(self.cfg.dtype, self.cfg.op, acc, &h.buf),
            }
        }
        if all_gather {
            // Ranks outside the sample send the first block of their pattern.
            let expected = expected.get_or_insert_with(|| vec![POISON; bytes]);
            for node in &self.nodes {
                if let Node::Host(h) = node {
                    if let Some(p) = h.pattern {
                        let own = usize::from(h.rank) * block;
                        expected[own..own + block]
                            .copy_from_slice(&self.shared.patterns[p][..block]);
                    }
                }
            }
            pattern_senders.fill(0);
        }
        // Pattern p sent by c ranks: p op p op ... (c times), by repeated squaring.
        for (p, &c) in pattern_senders.iter().enumerate() {
            if let Some(folded) =
                fold_times(self.cfg.dtype, self.cfg.op, &self.shared.patterns[p], c)
            {
                match &mut expected {
                    None => expected = Some(folded),
                    Some(acc) => combine_into(self.cfg.dtype, self.cfg.op, acc, &folded),
                }
            }
        }
        self.expected = expected.unwrap_or_default();
        self.wall.inputs_s = t0.elapsed().as_secs_f64();
    }

    fn waiting(&self) -> String {
        let mut w: Vec<String> = Vec::new();
        let mut count = 0;
        for n in &self.nodes {
            if let Node::Host(h) = n {
                if h.finished.is_none() {
                    count += 1;
                    if w.len() < 5 {
                        let (done, total) = h.engine.collective().progress().unwrap_or((0, 0));
                        w.push(format!("rank {} (host {}) {done}/{total} chunks", h.rank, h.name));
                    }
                }
            }
        }
        format!("{count} rank(s) not done, e.g. {}", w.join(", "))
    }

    /// Runs the collective to completion and checks every receiving rank's result.
    pub fn run(mut self) -> Result<SimReport, SimError> {
        let t0 = Instant::now();
        let spec = CollectiveSpec {
            kind: match self.cfg.collective {
                Collective::AllReduce => CollectiveKind::AllReduce,
                Collective::Reduce { root } => CollectiveKind::Reduce { root },
                Collective::Broadcast { root } => CollectiveKind::Broadcast { root },
                Collective::ReduceScatter => CollectiveKind::ReduceScatter,
                Collective::AllGather => CollectiveKind::AllGather,
            },
            op: self.cfg.op,
            dtype: self.cfg.dtype,
            // ReduceScatter's and AllGather's count is one block's.
            count: (self.block_bytes() / self.cfg.dtype.size()) as u64,
        };
        for node in &mut self.nodes {
            if let Node::Host(h) = node {
                h.engine.start(Time::ZERO, spec).map_err(|e| SimError::Start {
                    rank: h.rank,
                    host: h.name.clone(),
                    reason: e.to_string(),
                })?;
            }
        }
        for n in 0..self.nodes.len() {
            self.after_node(n)?;
        }
        let world = self.topo.hosts.len();
        // Per node: the instant its timer last fired and how often it fired then.
        let mut spin: Vec<(Nanos, u32)> = vec![(Nanos::MAX, 0); self.nodes.len()];
        while self.done < world {
            let Some((t, ev)) = self.queue.pop() else {
                return Err(SimError::Deadlock { at: self.now, waiting: self.waiting() });
            };
            self.now = t;
            self.events += 1;
            if t > self.cfg.max_time {
                return Err(SimError::TimeLimit { at: t, waiting: self.waiting() });
            }
            match ev {
                Event::Arrive { dir, buf } => {
                    let to = self.dirs[dir as usize].cfg.to_node as usize;
                    let cost = self.costs[to];
                    if cost > 0 {
                        let at = self.busy[to].max(t) + cost;
                        self.busy[to] = at;
                        self.queue.push(at, Event::Process { dir, buf });
                    } else {
                        self.deliver(dir, buf)?;
                    }
                }
                Event::Process { dir, buf } => self.deliver(dir, buf)?,
                Event::TxReady { node } => {
                    self.tx_wait[node as usize] = Nanos::MAX;
                    self.after_node(node as usize)?;
                }
                Event::Timer { node } => {
                    let n = node as usize;
                    if self.timer_at[n] == t {
                        self.timer_at[n] = Nanos::MAX;
                    }
                    if self.nodes[n].poll_timeout().is_some_and(|d| d <= t) {
                        let (spin_at, spins) = &mut spin[n];
                        if *spin_at == t {
                            *spins += 1;
                            if *spins > 1000 {
                                let spins = *spins;
                                let node = self.nodes[n].name();
                                return Err(SimError::TimerSpin { node, at: t, spins });
                            }
                        } else {
                            (*spin_at, *spins) = (t, 1);
                        }
                        match &mut self.nodes[n] {
                            Node::Switch(s) => {
                                s.engine.handle_timeout(Time::from_nanos(t));
                                drain_events(s, t);
                            }
                            Node::Host(h) => h.handle_timeout(t),
                        }
                        self.host_done(n)?;
                    }
                    self.after_node(n)?;
                }
            }
        }
        self.wall.run_s = t0.elapsed().as_secs_f64();
        self.verify()
    }

    /// Hands frame `buf` to the receiver of `dir`, then sends what it answers.
    fn deliver(&mut self, dir: u32, buf: u32) -> Result<(), SimError> {
        let d = &self.dirs[dir as usize].cfg;
        let (to, port, intact) = (d.to_node as usize, d.to_port as usize, d.intact);
        let t = self.now;
        let frame = self.pool.frame(buf);
        match &mut self.nodes[to] {
            Node::Switch(s) => {
                if intact {
                    s.engine.handle_intact_frame(Time::from_nanos(t), port, frame);
                } else {
                    s.engine.handle_frame(Time::from_nanos(t), port, frame);
                }
                drain_events(s, t);
            }
            Node::Host(h) => h.handle_frame(t, frame, &mut self.shared),
        }
        self.pool.give(buf);
        self.host_done(to)?;
        self.after_node(to)
    }

    fn host_done(&mut self, n: usize) -> Result<(), SimError> {
        let Node::Host(h) = &mut self.nodes[n] else { return Ok(()) };
        if let Some((at, reason)) = h.error.take() {
            return Err(SimError::Failed { rank: h.rank, host: h.name.clone(), at, reason });
        }
        if h.finished.is_some() && !h.counted {
            h.counted = true;
            self.done += 1;
        }
        Ok(())
    }

    /// Sends every frame node `n` has, then re-arms its timer.
    ///
    /// A switch hands every frame it has to its ports' output queues at once. A host's
    /// NIC takes frames from the engine only while fewer than
    /// [`SimConfig::host_tx_ahead`] wait for its link (as a NIC fetches work requests
    /// while it transmits), and is woken when they are sent: the engine's send queue
    /// holds the window, no copy of it waits in a NIC queue.
    fn after_node(&mut self, n: usize) -> Result<(), SimError> {
        let t = self.now;
        let host_dir = (n >= self.n_switches).then(|| self.out_dirs[n][0]);
        loop {
            if let Some(d) = host_dir.filter(|&d| d != u32::MAX) {
                let dir = &mut self.dirs[d as usize];
                let free = dir.busy_until();
                if dir.backlog(t) >= self.cfg.host_tx_ahead {
                    if self.tx_wait[n] == Nanos::MAX {
                        self.tx_wait[n] = free;
                        self.queue.push(free, Event::TxReady { node: n as u32 });
                    }
                    break;
                }
            }
            let b = self.pool.take();
            let out = match &mut self.nodes[n] {
                Node::Switch(s) => s
                    .engine
                    .poll_transmit(Time::from_nanos(t), self.pool.buf_mut(b))
                    .map(|x| (x.port, x.len)),
                Node::Host(h) => {
                    h.poll_transmit(t, self.pool.buf_mut(b), &mut self.shared).map(|len| (0, len))
                }
            };
            let Some((port, len)) = out else {
                self.pool.give(b);
                break;
            };
            if len == 0 || len > crate::net::MAX_FRAME {
                return Err(SimError::BadFrame { node: self.nodes[n].name(), len });
            }
            let dir = self.out_dirs[n].get(port).copied().unwrap_or(u32::MAX);
            if dir == u32::MAX {
                return Err(SimError::UnlinkedPort { node: self.nodes[n].name(), port });
            }
            let b = self.pool.set_len(b, len);
            match self.dirs[dir as usize].offer(t, self.pool.frame_mut(b)) {
                Verdict::Dropped => self.pool.give(b),
                Verdict::Deliver(at, dup) => {
                    if let Some(at2) = dup {
                        let c = self.pool.duplicate(b);
                        self.queue.push(at2, Event::Arrive { dir, buf: c });
                    }
                    self.queue.push(at, Event::Arrive { dir, buf: b });
                }
            }
        }
        if let Some(d) = self.nodes[n].poll_timeout() {
            // A host whose deadline stays due wants to send (a retransmission); its NIC
            // cannot before its link is free, so the timer waits for that too.
            let link_free = host_dir
                .filter(|&d| d != u32::MAX)
                .map_or(t, |d| self.dirs[d as usize].busy_until());
            let at = if d <= t { t.max(link_free) } else { d };
            if at < self.timer_at[n] {
                self.timer_at[n] = at;
                self.queue.push(at, Event::Timer { node: n as u32 });
            }
        }
        Ok(())
    }

    fn verify(self) -> Result<SimReport, SimError> {
        let t0 = Instant::now();
        let mut verified = 0;
        let mut receiving = 0;
        let (mut time_ns, mut first_ns) = (0, Nanos::MAX);
        let mut retransmissions = 0;
        let mut switch_events = Vec::new();
        for node in &self.nodes {
            match node {
                Node::Host(h) => {
                    let f = h.finished.unwrap_or(self.now);
                    time_ns = time_ns.max(f);
                    first_ns = first_ns.min(f);
                    retransmissions += h.engine.counters().rc.retransmits;
                    if !h.receives {
                        continue;
                    }
                    receiving += 1;
                    if h.pattern.is_some() {
                        continue;
                    }
                    // ReduceScatter: only the rank's own block is its result.
                    let (from, to) = match self.cfg.collective {
                        Collective::ReduceScatter => {
                            let block = self.block_bytes();
                            (usize::from(h.rank) * block, (usize::from(h.rank) + 1) * block)
                        }
                        _ => (0, h.buf.len()),
                    };
                    if let Some((element, got, want)) =
                        first_mismatch(self.cfg.dtype, &h.buf[from..to], &self.expected[from..to])
                    {
                        return Err(SimError::Mismatch {
                            rank: h.rank,
                            host: h.name.clone(),
                            element: element + from / self.cfg.dtype.size(),
                            got,
                            want,
                        });
                    }
                    verified += 1;
                }
                Node::Switch(s) => {
                    retransmissions += s.engine.counters().retransmits();
                    switch_events.extend(s.events.iter().cloned());
                }
            }
        }
        let mut total = DirStats::default();
        for d in &self.dirs {
            let s = &d.stats;
            total.frames += s.frames;
            total.wire_bytes += s.wire_bytes;
            total.queue_drops += s.queue_drops;
            total.lost += s.lost;
            total.corrupted += s.corrupted;
            total.duplicated += s.duplicated;
            total.reordered += s.reordered;
        }
        let span = time_ns.max(1) as f64;
        let mut busiest: Vec<LinkReport> = self
            .dirs
            .iter()
            .map(|d| LinkReport {
                name: d.cfg.name.clone(),
                rate_bps: d.cfg.rate_bps,
                utilisation: d.stats.busy_ns as f64 / span,
                stats: d.stats,
            })
            .collect();
        busiest.sort_by(|a, b| b.utilisation.total_cmp(&a.utilisation).then(a.name.cmp(&b.name)));
        busiest.truncate(5);
        let algbw = self.cfg.bytes as f64 / span;
        let world = self.topo.hosts.len();
        let mut wall = self.wall;
        wall.verify_s = t0.elapsed().as_secs_f64();
        Ok(SimReport {
            topology: self.topo.name.clone(),
            collective: self.cfg.collective.name(),
            dtype: self.cfg.dtype.to_string(),
            op: self.cfg.op.to_string(),
            bytes: self.cfg.bytes,
            hosts: world,
            switches: self.topo.switches.len(),
            mtu: self.mtu,
            window: self.window,
            seed: self.cfg.seed,
            time_ns,
            first_ns: if first_ns == Nanos::MAX { 0 } else { first_ns },
            algbw_gbs: algbw,
            busbw_gbs: algbw * self.cfg.collective.bus_factor(world),
            frames: total.frames,
            wire_bytes: total.wire_bytes,
            retransmissions,
            queue_drops: total.queue_drops,
            lost: total.lost,
            corrupted: total.corrupted,
            duplicated: total.duplicated,
            reordered: total.reordered,
            verified_ranks: verified,
            receiving_ranks: receiving,
            busiest,
            events: self.events,
            events_per_s: self.events as f64 / wall.run_s.max(1e-9),
            wall,
            peak_frames_in_flight: self.pool.allocated().0 + self.pool.allocated().1,
            frame_buffer_bytes: self.pool.allocated_bytes(),
            switch_events,
        })
    }
}

/// `x op x op ... op x` (`c` times; `None` for 0) by repeated squaring: every operator
/// the switches apply is associative and commutative.
fn fold_times(dtype: DataType, op: Operator, x: &[u8], mut c: u64) -> Option<Vec<u8>> {
    let mut acc: Option<Vec<u8>> = None;
    let mut pow = x.to_vec();
    while c > 0 {
        if c & 1 == 1 {
            match &mut acc {
                None => acc = Some(pow.clone()),
                Some(a) => combine_into(dtype, op, a, &pow),
            }
        }
        c >>= 1;
        if c > 0 {
            let copy = pow.clone();
            combine_into(dtype, op, &mut pow, &copy);
        }
    }
    acc
}

fn drain_events(s: &mut SwitchSim, now: Nanos) {
    while let Some(e) = s.engine.poll_event() {
        if s.events.len() < 100 {
            let text = match e {
                SwitchEvent::ConnectionFailed { port, reason, .. } => {
                    format!("t={now}ns switch {} port {port}: connection failed: {reason}", s.name)
                }
                SwitchEvent::CollectiveFailed { seq, reason, .. } => {
                    format!("t={now}ns switch {}: collective {seq} failed: {reason}", s.name)
                }
            };
            s.events.push(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_a_pattern_c_times_equals_combining_it_c_times() {
        for (dtype, op) in [
            (DataType::Int32, Operator::Sum),
            (DataType::Float32, Operator::Sum),
            (DataType::Uint8, Operator::Max),
            (DataType::Int64, Operator::Bxor),
        ] {
            let spec = InputSpec { dtype, op, world: 100, seed: 5 };
            let mut x = vec![0u8; 64 * dtype.size()];
            spec.fill(7, &mut x);
            for c in [1u64, 2, 3, 7, 8, 13] {
                let mut slow = x.clone();
                for _ in 1..c {
                    combine_into(dtype, op, &mut slow, &x);
                }
                assert_eq!(fold_times(dtype, op, &x, c), Some(slow), "{dtype} {op} x{c}");
            }
            assert_eq!(fold_times(dtype, op, &x, 0), None);
        }
    }
}
