//! The engines on the fabric: switch nodes running `SwitchEngine` with the compiled
//! rules, host nodes running one `HostEngine` per communicator they belong to, each with
//! a queue of collectives started back to back.

use std::collections::VecDeque;

use inc_controller::Topology;
use inc_protocol::Time;
use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig, SwitchEvent};
use std::net::Ipv4Addr;

use inc_wire::reduce::finalize_native;
use inc_wire::{
    icrc, ArpOperation, ArpPacket, ArpRepr, BthPacket, EtherType, EthernetAddress, EthernetFrame,
    EthernetRepr, Ipv4Packet, Operator,
};
use inccl_engine::{CollectiveSpec, HostEngine, HostQpConfig, OpBuffers};

use super::cases::CollectiveCase;
use super::fabric::{Nanos, Node};
use super::plan::{host_mac, CompiledComm};
use super::reference::Kind;

/// Offset of the BTH destination QP in an Ethernet/IPv4/UDP frame.
const DEST_QP_OFFSET: usize = 14 + 20 + 8 + 5;

fn time(now: Nanos) -> Time {
    Time::from_nanos(now)
}

/// Maps a generated collective to the engine's spec.
pub fn engine_spec(case: &CollectiveCase) -> CollectiveSpec {
    let op = if case.kind == Kind::Barrier { Operator::Barrier } else { case.op };
    CollectiveSpec { kind: case.kind, op, dtype: case.dtype, count: case.count as u64 }
}

/// A switch on the fabric; fabric port `i` is the topology port `i`.
#[derive(Debug)]
pub struct SwitchNode {
    /// Topology name.
    pub name: String,
    /// The engine.
    pub engine: SwitchEngine,
    /// Events the engine reported (connection or collective failures), with their time.
    pub events: Vec<(Nanos, SwitchEvent)>,
    /// Largest `memory_bytes` seen (sampled every few frames).
    pub peak_memory: u64,
    frames: u64,
}

impl SwitchNode {
    /// A switch engine with the ports of topology switch `index`; `deterministic_float`
    /// selects the fixed float combination order.
    pub fn new(topo: &Topology, index: usize, deterministic_float: bool) -> Self {
        let sw = &topo.switches[index];
        let ports = sw
            .ports
            .iter()
            .map(|p| PortConfig { name: p.name.clone(), ip: p.addr.ip, mac: p.mac })
            .collect();
        let config = SwitchEngineConfig {
            switch_id: sw.id,
            ports,
            deterministic_float,
            ..SwitchEngineConfig::default()
        };
        SwitchNode {
            name: sw.name.clone(),
            engine: SwitchEngine::new(config),
            events: Vec::new(),
            peak_memory: 0,
            frames: 0,
        }
    }
}

impl SwitchNode {
    /// Updates [`SwitchNode::peak_memory`] now.
    pub fn sample_memory(&mut self) {
        self.peak_memory = self.peak_memory.max(self.engine.counters().memory_bytes());
    }

    fn drain_events(&mut self, now: Nanos) {
        while let Some(e) = self.engine.poll_event() {
            self.events.push((now, e));
        }
    }
}

impl SwitchNode {
    fn after_frame(&mut self, now: Nanos) {
        self.drain_events(now);
        self.frames += 1;
        // `counters()` allocates; sampling keeps the cost down while still seeing any
        // growth that scales with the vector length.
        if self.frames % 32 == 0 {
            self.sample_memory();
        }
    }
}

impl Node for SwitchNode {
    fn handle_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
        self.engine.handle_frame(time(now), port, frame);
        self.after_frame(now);
    }
    fn handle_intact_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
        self.engine.handle_intact_frame(time(now), port, frame);
        self.after_frame(now);
    }
    fn handle_timeout(&mut self, now: Nanos) {
        self.engine.handle_timeout(time(now));
        self.drain_events(now);
    }
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(usize, usize)> {
        self.engine.poll_transmit(time(now), buf).map(|t| (t.port, t.len))
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        self.engine.poll_timeout().map(Time::as_nanos)
    }
}

/// One collective of a rank: its input and output buffers.
#[derive(Debug)]
pub struct Job {
    /// Position in the communicator's sequence.
    pub index: usize,
    /// What to run.
    pub case: CollectiveCase,
    /// This rank's input (native byte order).
    pub input: Vec<u8>,
    /// Output buffer (poisoned before the run; the input itself when in place).
    pub output: Vec<u8>,
    /// How long the rank "computes" before starting this collective (after the
    /// previous one completed, or after t=0): skews ranks against each other.
    pub delay: Nanos,
}

/// How a finished collective ended on one rank.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Position in the communicator's sequence.
    pub index: usize,
    /// The output buffer, for ranks that receive data.
    pub output: Option<Vec<u8>>,
    /// Simulated start and completion time on this rank.
    pub started: Nanos,
    /// Completion time.
    pub finished: Nanos,
}

/// What this rank's role in `case` is: does it send, does it receive?
fn role(case: &CollectiveCase, rank: u16) -> (bool, bool) {
    match case.kind {
        Kind::AllReduce | Kind::ReduceScatter | Kind::AllGather => (true, true),
        Kind::Reduce { root } => (true, rank == root),
        Kind::Broadcast { root } => (rank == root, rank != root),
        Kind::Barrier => (false, false),
    }
}

/// Byte the output buffers are filled with before a collective, so unwritten elements
/// show up as mismatches.
pub const POISON: u8 = 0xEE;

impl Job {
    /// A job for `rank` of `world` ranks with its input, buffers laid out as a library
    /// lays out the caller's: ReduceScatter writes one block out of place or over the
    /// rank's own block of its input in place; AllGather's output holds `world` blocks,
    /// the rank's own one being its input in place, or a copy of it out of place (the
    /// library copies it: the network never sends a rank its own block).
    pub fn new(
        index: usize,
        case: CollectiveCase,
        rank: u16,
        world: u16,
        input: Vec<u8>,
        delay: Nanos,
    ) -> Self {
        let (_, receives) = role(&case, rank);
        let block = case.count * case.dtype.size();
        let output = match (case.kind, receives, case.in_place) {
            (Kind::AllGather, _, _) => {
                let mut out = vec![POISON; block * usize::from(world)];
                out[usize::from(rank) * block..][..block].copy_from_slice(&input);
                out
            }
            (Kind::ReduceScatter, _, false) => vec![POISON; block],
            (_, true, true) => input.clone(),
            (_, true, false) => vec![POISON; input.len()],
            (_, false, _) => Vec::new(),
        };
        Job { index, case, input, output, delay }
    }

    /// The result the caller reads from the output buffer after a successful run: for an
    /// in-place ReduceScatter its own block, once the other blocks are checked to still
    /// hold the input (the engine must write nowhere else).
    fn result(&mut self, rank: u16, world: u16) -> Result<Vec<u8>, String> {
        let mut out = std::mem::take(&mut self.output);
        if self.case.kind == Kind::ReduceScatter && self.case.in_place {
            let block = self.case.count * self.case.dtype.size();
            let own = usize::from(rank) * block..(usize::from(rank) + 1) * block;
            let (before, after) = (..own.start, own.end..);
            if out[before] != self.input[before] || out[after.clone()] != self.input[after] {
                return Err("the in-place output changed outside the rank's own block".into());
            }
            out = out[own].to_vec();
        }
        // AVG's division by the world size is the library's last step on a result
        // (INCCL calls the same function), not the engine's.
        if matches!(self.case.kind, Kind::AllReduce | Kind::Reduce { .. } | Kind::ReduceScatter) {
            finalize_native(self.case.op, self.case.dtype, &mut out, world);
        }
        Ok(out)
    }

    fn bufs(&mut self, rank: u16) -> OpBuffers<'_> {
        match role(&self.case, rank) {
            (false, false) => OpBuffers::None,
            (true, false) => OpBuffers::SendOnly(&self.input),
            (false, true) => OpBuffers::RecvOnly(&mut self.output),
            (true, true) if self.case.in_place => OpBuffers::InPlace(&mut self.output),
            (true, true) => OpBuffers::Separate { src: &self.input, dst: &mut self.output },
        }
    }
}

/// One rank of one communicator on a host.
#[derive(Debug)]
pub struct HostQp {
    /// Index of the communicator in the scenario.
    pub comm: usize,
    /// Rank in it.
    pub rank: u16,
    /// Host QPN (frames are demultiplexed by destination QP).
    pub qpn: u32,
    /// The engine.
    pub engine: HostEngine,
    /// Collectives not started yet.
    pub pending: VecDeque<Job>,
    /// The running collectives, oldest first, with their start times: jobs without a
    /// delay go on behind the running ones (as non-blocking calls do), up to what the
    /// engine holds; a job with a delay waits for them all, then computes.
    pub current: VecDeque<(Job, Nanos)>,
    /// Finished collectives, in order.
    pub outcomes: Vec<Outcome>,
    /// First error (a failed start or completion), with the collective index.
    pub error: Option<String>,
    /// When the next collective starts (its [`Job::delay`] is running).
    pub start_at: Option<Nanos>,
    /// The engine refused the next collective while others ran: it is tried again
    /// when they finished.
    pub retry_when_idle: bool,
    /// The communicator exists: its rules are installed and its collectives may start.
    pub active: bool,
    /// The communicator was destroyed: the engine is no longer driven (its QP is gone,
    /// frames for it are dropped as for an unknown QP).
    pub destroyed: bool,
}

impl HostQp {
    /// Starts the next collective(s) and collects completions until the engine is busy.
    fn service(&mut self, now: Nanos) {
        loop {
            if self.error.is_some() || !self.active {
                return;
            }
            while let Some(done) = self.engine.poll_completion() {
                let Some((mut job, started)) = self.current.pop_front() else {
                    self.error = Some(format!(
                        "comm {} rank {}: an outcome with no collective running",
                        self.comm, self.rank
                    ));
                    return;
                };
                match done {
                    Err(e) => {
                        self.error = Some(format!(
                            "comm {} rank {}: collective #{} ({}) failed at t={now}ns: {e}",
                            self.comm,
                            self.rank,
                            job.index,
                            job.case.describe()
                        ));
                        return;
                    }
                    Ok(()) => {
                        let (_, receives) = role(&job.case, self.rank);
                        let world = self.engine.config().world_size;
                        let output = match receives.then(|| job.result(self.rank, world)) {
                            None => None,
                            Some(Ok(out)) => Some(out),
                            Some(Err(e)) => {
                                self.error = Some(format!(
                                    "comm {} rank {}: collective #{} ({}) completed at t={now}ns, \
                                     but {e}",
                                    self.comm,
                                    self.rank,
                                    job.index,
                                    job.case.describe()
                                ));
                                return;
                            }
                        };
                        let index = job.index;
                        self.outcomes.push(Outcome { index, output, started, finished: now });
                    }
                }
            }
            let Some(next) = self.pending.front() else { return };
            if !self.engine.collective().has_room() {
                return;
            }
            if next.delay > 0 || self.retry_when_idle {
                if !self.current.is_empty() {
                    return;
                }
                match self.start_at {
                    None => {
                        self.start_at = Some(now + next.delay);
                        return;
                    }
                    Some(t) if now < t => return,
                    _ => self.start_at = None,
                }
            }
            let job = self.pending.pop_front().expect("front exists");
            if let Err(e) = self.engine.enqueue(time(now), engine_spec(&job.case)) {
                if !self.current.is_empty() {
                    // A refused start changes nothing: try again once the running ones
                    // finished, so the rank ends like a blocking caller would.
                    self.pending.push_front(job);
                    self.retry_when_idle = true;
                    return;
                }
                self.error = Some(format!(
                    "comm {} rank {}: starting collective #{} ({}) failed: {e}",
                    self.comm,
                    self.rank,
                    job.index,
                    job.case.describe()
                ));
                return;
            }
            self.retry_when_idle = false;
            self.current.push_back((job, now));
        }
    }

    /// True when every collective finished or one failed.
    pub fn finished(&self) -> bool {
        self.error.is_some() || (self.current.is_empty() && self.pending.is_empty())
    }
}

/// A host machine on the fabric (port 0), with one QP per communicator it belongs to.
#[derive(Debug)]
pub struct HostNode {
    /// Topology name.
    pub name: String,
    /// Its QPs.
    pub qps: Vec<HostQp>,
    /// Round-robin start for `poll_transmit`, so no QP starves the others.
    next_tx: usize,
    /// Frames whose destination QP matched no QP here.
    pub unknown_qp: u64,
    /// Frames for a QP of a destroyed communicator (dropped).
    pub stale: u64,
    /// The host's IP and MAC, for answering ARP as its kernel would.
    addr: (Ipv4Addr, EthernetAddress),
    /// ARP replies to send.
    arp_out: VecDeque<[u8; ARP_FRAME_LEN]>,
    /// ARP requests for this host answered.
    pub arp_replies: u64,
}

/// Ethernet + ARP, padded to the Ethernet minimum.
const ARP_FRAME_LEN: usize = 60;

impl HostNode {
    /// Topology host `host`, without QPs yet.
    pub fn new(topo: &Topology, host: usize) -> Self {
        HostNode {
            name: topo.hosts[host].name.clone(),
            qps: Vec::new(),
            next_tx: 0,
            unknown_qp: 0,
            stale: 0,
            addr: (topo.hosts[host].addr.ip, host_mac(topo, host)),
            arp_out: VecDeque::new(),
            arp_replies: 0,
        }
    }

    /// Answers an ARP request for our address (switches with `mac: learn` peers ask).
    fn handle_arp(&mut self, frame: &[u8]) {
        let Some(pkt) = frame.get(14..).and_then(|p| ArpPacket::new_checked(p).ok()) else {
            return;
        };
        let Ok(arp) = ArpRepr::parse(&pkt) else { return };
        if arp.operation != ArpOperation::Request || arp.target_protocol_addr != self.addr.0 {
            return;
        }
        let mut out = [0u8; ARP_FRAME_LEN];
        let eth = EthernetRepr {
            src_addr: self.addr.1,
            dst_addr: arp.source_hardware_addr,
            ethertype: EtherType::Arp,
        };
        eth.emit(&mut EthernetFrame::new_unchecked(&mut out[..]));
        arp.reply(self.addr.1).emit(&mut ArpPacket::new_unchecked(&mut out[14..42]));
        self.arp_replies += 1;
        self.arp_out.push_back(out);
    }

    /// Adds rank `rank` of compiled communicator `comm` (index `comm_index`) on topology
    /// host `host`, with its collectives.
    pub fn add_qp(
        &mut self,
        topo: &Topology,
        host: usize,
        comm_index: usize,
        comm: &CompiledComm,
        rank: u16,
        jobs: Vec<Job>,
    ) {
        let reg = &comm.ranks[usize::from(rank)];
        let ep = &comm.compiled.endpoints[usize::from(rank)];
        let world = comm.ranks.len() as u16;
        let config = HostQpConfig::from_endpoint(ep, world, host_mac(topo, host), reg.ip);
        self.qps.push(HostQp {
            comm: comm_index,
            rank,
            qpn: reg.qpn,
            engine: HostEngine::new(config),
            pending: jobs.into(),
            current: VecDeque::new(),
            outcomes: Vec::new(),
            error: None,
            start_at: None,
            retry_when_idle: false,
            active: false,
            destroyed: false,
        });
    }

    /// Activates the QPs of communicator `comm` and starts their first collective.
    pub fn start(&mut self, now: Nanos, comm: usize) {
        for qp in self.qps.iter_mut().filter(|q| q.comm == comm) {
            qp.active = true;
            qp.service(now);
        }
    }

    /// Destroys the QPs of communicator `comm` (after it finished).
    pub fn destroy(&mut self, comm: usize) {
        for qp in self.qps.iter_mut().filter(|q| q.comm == comm) {
            qp.destroyed = true;
        }
    }

    /// True when every QP of communicator `comm` here finished.
    pub fn finished(&self, comm: usize) -> bool {
        self.qps.iter().filter(|q| q.comm == comm).all(HostQp::finished)
    }
}

impl Node for HostNode {
    fn handle_frame(&mut self, now: Nanos, _port: usize, frame: &[u8]) {
        if frame.get(12..14) == Some(&[0x08, 0x06]) {
            self.handle_arp(frame);
            return;
        }
        let qpn = frame
            .get(DEST_QP_OFFSET..DEST_QP_OFFSET + 3)
            .map(|b| u32::from_be_bytes([0, b[0], b[1], b[2]]));
        // A frame for no QP here (e.g. a corrupted QPN) goes to the first QP, whose
        // engine must reject and count it like a NIC would.
        let live = |q: &HostQp| !q.destroyed;
        let i = match self.qps.iter().position(|q| Some(q.qpn) == qpn) {
            Some(i) if live(&self.qps[i]) => i,
            Some(_) => {
                self.stale += 1;
                return;
            }
            None => {
                self.unknown_qp += 1;
                match self.qps.iter().position(live) {
                    Some(i) => i,
                    None => return,
                }
            }
        };
        let Some(qp) = self.qps.get_mut(i) else { return };
        let rank = qp.rank;
        let mut bufs: Vec<OpBuffers<'_>> =
            qp.current.iter_mut().map(|(job, _)| job.bufs(rank)).collect();
        qp.engine.handle_frame(time(now), frame, &mut bufs[..]);
        qp.service(now);
    }

    fn handle_timeout(&mut self, now: Nanos) {
        for qp in self.qps.iter_mut().filter(|q| !q.destroyed) {
            if qp.engine.poll_timeout().is_some_and(|t| t.as_nanos() <= now) {
                qp.engine.handle_timeout(time(now));
                qp.service(now);
            }
            if qp.start_at.is_some_and(|t| t <= now) {
                qp.service(now);
            }
        }
    }

    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(usize, usize)> {
        if let Some(arp) = self.arp_out.pop_front() {
            buf[..ARP_FRAME_LEN].copy_from_slice(&arp);
            return Some((0, ARP_FRAME_LEN));
        }
        let n = self.qps.len();
        for k in 0..n {
            let i = (self.next_tx + k) % n;
            let qp = &mut self.qps[i];
            if qp.destroyed {
                continue;
            }
            let rank = qp.rank;
            let bufs: Vec<OpBuffers<'_>> =
                qp.current.iter_mut().map(|(job, _)| job.bufs(rank)).collect();
            let sent = qp.engine.poll_transmit(time(now), buf, &bufs[..]);
            if let Some(len) = sent {
                self.next_tx = (i + 1) % n;
                return Some((0, len));
            }
        }
        None
    }

    fn poll_timeout(&self) -> Option<Nanos> {
        let live = self.qps.iter().filter(|q| !q.destroyed);
        let engines = live.filter_map(|q| q.engine.poll_timeout()).map(Time::as_nanos);
        engines.chain(self.qps.iter().filter_map(|q| q.start_at)).min()
    }

    fn progress(&self) -> u64 {
        // Changes whenever a chunk completes end to end or a collective finishes.
        self.qps
            .iter()
            .map(|q| {
                let chunks = q.engine.collective().progress().map_or(0, |p| p.0);
                ((q.outcomes.len() as u64) << 40) + chunks
            })
            .sum()
    }
}

/// Checks what every engine frame must be (DESIGN "wire protocol"): ARP, or IPv4 with a
/// valid header checksum, DF, TTL 64, TOS 0, UDP, a correct ICRC, and as IPv4 ID the
/// PSN's low 16 bits from a switch (`from_switch`), 0 from a host.
pub fn check_emitted(frame: &[u8], from_switch: bool) -> Result<(), String> {
    const ETH: usize = 14;
    match frame.get(12..14) {
        Some([0x08, 0x06]) => return Ok(()),
        Some([0x08, 0x00]) => {}
        _ => return Err("neither IPv4 nor ARP".into()),
    }
    let ip = Ipv4Packet::new_checked(&frame[ETH..]).map_err(|e| format!("IPv4: {e}"))?;
    let bad = |what: &str| Err(format!("IPv4 {what}"));
    if !ip.verify_checksum() {
        return bad("header checksum wrong");
    }
    if !ip.dont_frag() || ip.ttl() != 64 || ip.tos() != 0 {
        return bad("DF/TTL/TOS differ from DF/64/0");
    }
    if ip.protocol() != 17 {
        return bad("protocol is not UDP");
    }
    let bth = frame
        .get(ETH + 28..)
        .and_then(|b| BthPacket::new_checked(b).ok())
        .ok_or("no BTH behind the UDP header")?;
    let ident = if from_switch { inc_protocol::frame::psn_ident(bth.psn()) } else { 0 };
    if ip.ident() != ident {
        return Err(format!("IPv4 ID {} where {ident} belongs (PSN {})", ip.ident(), bth.psn()));
    }
    let total = usize::from(ip.total_len());
    if ETH + total != frame.len() {
        return Err(format!("frame of {} bytes, IPv4 total length {total}", frame.len()));
    }
    if !icrc::verify(&frame[ETH..]) {
        return Err("ICRC wrong".into());
    }
    Ok(())
}

/// Either kind of node.
#[derive(Debug)]
pub enum SimNode {
    /// A switch.
    Switch(Box<SwitchNode>),
    /// A host machine.
    Host(Box<HostNode>),
}

impl SimNode {
    /// Topology name of the switch or host.
    pub fn name(&self) -> &str {
        match self {
            SimNode::Switch(s) => &s.name,
            SimNode::Host(h) => &h.name,
        }
    }

    fn node(&mut self) -> &mut dyn Node {
        match self {
            SimNode::Switch(s) => s.as_mut(),
            SimNode::Host(h) => h.as_mut(),
        }
    }
    fn node_ref(&self) -> &dyn Node {
        match self {
            SimNode::Switch(s) => s.as_ref(),
            SimNode::Host(h) => h.as_ref(),
        }
    }
}

impl Node for SimNode {
    fn handle_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
        self.node().handle_frame(now, port, frame);
    }
    fn handle_intact_frame(&mut self, now: Nanos, port: usize, frame: &[u8]) {
        self.node().handle_intact_frame(now, port, frame);
    }
    fn handle_timeout(&mut self, now: Nanos) {
        self.node().handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<(usize, usize)> {
        let (port, len) = self.node().poll_transmit(now, buf)?;
        if let Err(e) = check_emitted(&buf[..len], matches!(self, SimNode::Switch(_))) {
            let who = match self {
                SimNode::Switch(s) => format!("switch {} port {port}", s.name),
                SimNode::Host(h) => format!("host {}", h.name),
            };
            panic!("{who} emitted an invalid frame at t={now}ns: {e}");
        }
        Some((port, len))
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        self.node_ref().poll_timeout()
    }
    fn progress(&self) -> u64 {
        self.node_ref().progress()
    }
}

#[cfg(test)]
mod tests {
    use super::super::cases::FloatInputs;
    use super::super::plan::load_topology;
    use super::*;
    use inc_wire::DataType;

    /// Rank 1 of 3, blocks of two INT32: an out-of-place AllGather output holds the
    /// rank's own block (the library's copy) and poison elsewhere; an out-of-place
    /// ReduceScatter output is one block; an in-place ReduceScatter's result is its own
    /// block, and a write outside it is an error.
    #[test]
    fn blockwise_buffers_are_laid_out_as_a_library_lays_them_out() {
        let c = |kind, in_place| CollectiveCase {
            kind,
            op: Operator::Sum,
            dtype: DataType::Int32,
            count: 2,
            in_place,
            floats: FloatInputs::Exact,
        };
        let input: Vec<u8> = (0..24).collect();
        let ag = Job::new(0, c(Kind::AllGather, false), 1, 3, input[..8].to_vec(), 0);
        assert_eq!(ag.output[8..16], input[..8]);
        assert!(ag.output[..8].iter().chain(&ag.output[16..]).all(|&b| b == POISON));
        assert_eq!(ag.output.len(), 24);
        let rs = Job::new(0, c(Kind::ReduceScatter, false), 1, 3, input.clone(), 0);
        assert_eq!(rs.output, vec![POISON; 8]);
        let mut rs = Job::new(0, c(Kind::ReduceScatter, true), 1, 3, input.clone(), 0);
        assert_eq!(rs.result(1, 3), Ok(input[8..16].to_vec()));
        let mut rs = Job::new(0, c(Kind::ReduceScatter, true), 1, 3, input, 0);
        rs.output[23] ^= 1;
        assert!(rs.result(1, 3).is_err());
    }

    #[test]
    fn hosts_answer_arp_for_their_address_only() {
        let topo = load_topology("1-4").unwrap();
        let mut host = HostNode::new(&topo, 1);
        let switch_mac = EthernetAddress([2, 0, 10, 1, 1, 2]);
        let request = |target: Ipv4Addr| {
            let mut f = [0u8; ARP_FRAME_LEN];
            let eth = EthernetRepr {
                src_addr: switch_mac,
                dst_addr: EthernetAddress::BROADCAST,
                ethertype: EtherType::Arp,
            };
            eth.emit(&mut EthernetFrame::new_unchecked(&mut f[..]));
            let arp = ArpRepr {
                operation: ArpOperation::Request,
                source_hardware_addr: switch_mac,
                source_protocol_addr: Ipv4Addr::new(10, 1, 1, 2),
                target_hardware_addr: EthernetAddress([0; 6]),
                target_protocol_addr: target,
            };
            arp.emit(&mut ArpPacket::new_unchecked(&mut f[14..42]));
            f
        };
        let mut buf = [0u8; 128];
        host.handle_frame(0, 0, &request(Ipv4Addr::new(10, 1, 1, 99)));
        assert_eq!(host.poll_transmit(0, &mut buf), None);
        host.handle_frame(0, 0, &request(topo.hosts[1].addr.ip));
        assert_eq!(host.poll_transmit(0, &mut buf), Some((0, ARP_FRAME_LEN)));
        let reply = ArpRepr::parse(&ArpPacket::new_checked(&buf[14..42]).unwrap()).unwrap();
        assert_eq!(reply.operation, ArpOperation::Reply);
        assert_eq!(reply.source_hardware_addr, host_mac(&topo, 1));
        assert_eq!(reply.target_hardware_addr, switch_mac);
        assert!(check_emitted(&buf[..ARP_FRAME_LEN], true).is_ok());
    }
}
