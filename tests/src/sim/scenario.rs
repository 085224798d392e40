//! A whole simulated run: topology + communicators + collectives + link faults in,
//! verified results and counters out.

use std::fmt::Write as _;

use inc_controller::Compiled;
use inc_ctrl_proto::{Peer, SwitchRules, VALID_MTUS};
use inc_switch_engine::SwitchCounters;
use inc_wire::{DataType, Operator};
use inccl_engine::HostCounters;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::cases::{gen_collective, gen_inputs, CaseShape, CollectiveCase, FloatInputs};
use super::fabric::{
    Endpoint, Fabric, FaultConfig, LinkConfig, LinkStats, Nanos, RunLimits, SimError, MICROS,
};
use super::harness::{HostNode, Job, SimNode, SwitchNode};
use super::plan::{compile_comms, load_topology, random_hosts, CommPlan};
use super::reference::{
    blocks, check_bound, expected, first_mismatch, order_dependent, Kind, Tree,
};

/// The collectives one communicator runs, back to back on every rank.
#[derive(Debug, Clone)]
pub struct CommWorkload {
    /// Topology host index of every rank, in rank order.
    pub hosts: Vec<usize>,
    /// Payload size override.
    pub mtu: Option<u16>,
    /// Window override.
    pub window: Option<u32>,
    /// The collectives, in order.
    pub jobs: Vec<CollectiveCase>,
    /// Created only once communicator `after` (an index into `Scenario::comms`) finished
    /// and was destroyed (rules removed from the switches, resources released).
    pub after: Option<usize>,
}

/// Everything that defines a run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Seeds inputs, QPNs/PSNs and faults.
    pub seed: u64,
    /// Topology file name under `topologies/` (without `.yaml`).
    pub topology: String,
    /// Communicators, all running at once.
    pub comms: Vec<CommWorkload>,
    /// Host-to-switch links.
    pub host_link: LinkConfig,
    /// Switch-to-switch links.
    pub switch_link: LinkConfig,
    /// Bounds of the run.
    pub limits: RunLimits,
    /// Switches combine floats in a fixed child order; every result is then compared bit
    /// for bit with the reference folded the same way (else float SUM, PROD and AVG
    /// over wide-range inputs are checked within a bound).
    pub deterministic_float: bool,
    /// Each rank waits a random time in `[0, think_time]` before each collective.
    pub think_time: Nanos,
    /// Every link gets its own latency (0.5-50 µs) and rate (1-100 Gb/s), drawn from
    /// the seed, instead of `host_link`/`switch_link`'s.
    pub heterogeneous: bool,
    /// One link (drawn from the seed) gets these faults instead.
    pub hot_link: Option<FaultConfig>,
    /// One rank runs a different last collective than the others: every rank of that
    /// communicator must then fail it with an error (never hang or produce a result).
    /// Without one, the first collective of a pair the tables refuse (see [`refused`])
    /// must fail on every rank of its communicator instead.
    pub mismatch: Option<Mismatch>,
    /// Fixed start delays `(communicator, rank, collective, delay)`, overriding
    /// `think_time` for those collectives.
    pub delays: Vec<(usize, u16, usize, Nanos)>,
    /// At this time one link (drawn from the seed, the `hot_link` if any) goes dead:
    /// every frame on it is lost from then on. Ranks may then fail, but with an error,
    /// within bounded time, and whatever completed must still be correct.
    pub cut_link: Option<Nanos>,
}

/// See [`Scenario::mismatch`].
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Communicator index.
    pub comm: usize,
    /// The rank that disagrees.
    pub rank: u16,
    /// What that rank runs as the communicator's last collective.
    pub case: CollectiveCase,
}

/// Counters and measurements of a verified run.
#[derive(Debug, Clone)]
pub struct Report {
    /// Simulated time at the end.
    pub sim_time: Nanos,
    /// Events processed.
    pub events: u64,
    /// Link counters summed over all links and directions.
    pub links: LinkStats,
    /// Counters per switch (topology name).
    pub switches: Vec<(String, SwitchCounters)>,
    /// Counters per host QP: (host name, communicator index, rank).
    pub hosts: Vec<(String, usize, u16, HostCounters)>,
    /// Per host QP (same order as `hosts`): (collective index, start, finish) of every
    /// collective it completed, in completion order.
    pub completions: Vec<Vec<(usize, Nanos, Nanos)>>,
    /// Collectives verified (per communicator, not per rank).
    pub collectives: usize,
    /// Input bytes of one rank, summed over all verified collectives.
    pub bytes: u64,
    /// Frames delivered to a host with no QP of that number.
    pub unknown_qp: u64,
    /// ARP requests hosts answered.
    pub host_arp_replies: u64,
    /// Frames hosts dropped because they were for a QP of a destroyed communicator.
    pub host_stale: u64,
    /// Corrupted frames handed to a receiver.
    pub corrupted_delivered: u64,
    /// Peak `memory_bytes` per switch (same order as `switches`).
    pub peak_memory: Vec<u64>,
    /// Length-independent memory bound per switch, from its rules (same order).
    pub memory_bound: Vec<u64>,
    /// Events switches reported (failures), rendered.
    pub switch_events: Vec<String>,
    /// Errors of failed host QPs (only in scenarios that expect failures).
    pub host_errors: Vec<String>,
    /// One line per QP and switch at the end of the run, for failure messages.
    pub state: String,
    /// Measured errors of the results checked within a bound (in collective order).
    pub float_errors: Vec<FloatErrors>,
}

/// The error of one order-dependent float result (the first rank that received it)
/// against the f64 reference, per element, relative to its scale (see
/// [`check_bound`]: `sum |x_i|`, or `|prod x_i|` for PROD).
#[derive(Debug, Clone)]
pub struct FloatErrors {
    /// Element type.
    pub dtype: DataType,
    /// Operator.
    pub op: Operator,
    /// The communicator's aggregation tree.
    pub tree: Tree,
    /// `|got - exact| / scale` of every element.
    pub relative: Vec<f64>,
}

struct CommRun {
    world: usize,
    tree: Tree,
    cases: Vec<CollectiveCase>,
    /// Inputs per collective, per rank (only kept for results checked within a bound).
    inputs: Vec<Option<Vec<Vec<u8>>>>,
    expected: Vec<Vec<Option<Vec<u8>>>>,
}

/// Builds the fabric for `s`, runs every collective and checks every rank's result.
pub fn run(s: &Scenario) -> Result<Report, String> {
    let topo = load_topology(&s.topology)?;
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
    let plans: Vec<CommPlan> = s
        .comms
        .iter()
        .enumerate()
        .map(|(i, c)| CommPlan {
            comm_id: i as u32 + 1,
            hosts: c.hosts.clone(),
            mtu: c.mtu,
            window: c.window,
            after: c.after,
        })
        .collect();
    for (i, c) in s.comms.iter().enumerate() {
        if c.after.is_some_and(|j| j >= i) {
            return Err(format!("communicator {i} waits for a later communicator"));
        }
    }
    let comms = compile_comms(&mut rng, &topo, &plans)?;

    let mut fabric: Fabric<SimNode> = Fabric::new(rng.gen());
    let switch_nodes: Vec<usize> = (0..topo.switches.len())
        .map(|i| {
            let mut node = SwitchNode::new(&topo, i, s.deterministic_float);
            for c in comms.iter().filter(|c| c.plan.after.is_none()) {
                for r in c.compiled.rules.iter().filter(|r| r.switch_id == topo.switches[i].id) {
                    node.engine.install(r, inc_protocol::Time::ZERO).map_err(|e| {
                        format!("switch {}: installing comm {}: {e}", node.name, r.comm_id)
                    })?;
                }
            }
            Ok(fabric.add_node(SimNode::Switch(Box::new(node))))
        })
        .collect::<Result<_, String>>()?;

    // Inputs, expected results and each rank's jobs.
    let mut runs = Vec::new();
    let mut host_jobs: Vec<Vec<(usize, u16, Vec<Job>)>> =
        (0..topo.hosts.len()).map(|_| Vec::new()).collect();
    for (ci, w) in s.comms.iter().enumerate() {
        let world = w.hosts.len();
        let mut per_rank: Vec<Vec<Job>> = (0..world).map(|_| Vec::new()).collect();
        let tree = tree_of(&comms[ci].compiled);
        let mut run = CommRun {
            world,
            tree,
            cases: w.jobs.clone(),
            inputs: Vec::new(),
            expected: Vec::new(),
        };
        for (ji, case) in w.jobs.iter().enumerate() {
            let inputs = gen_inputs(&mut rng, case, world as u16);
            run.expected.push(if refused(case) {
                vec![None; world]
            } else {
                expected(case.kind, case.op, case.dtype, &run.tree, &inputs)
            });
            let keep = !s.deterministic_float && bound_checked(case);
            run.inputs.push(keep.then(|| inputs.clone()));
            let odd = s.mismatch.as_ref().filter(|m| m.comm == ci && ji + 1 == w.jobs.len());
            for (rank, mut input) in inputs.into_iter().enumerate() {
                let mut delay = if s.think_time > 0 { rng.gen_range(0..=s.think_time) } else { 0 };
                let fixed =
                    s.delays.iter().find(|d| (d.0, usize::from(d.1), d.2) == (ci, rank, ji));
                if let Some(d) = fixed {
                    delay = d.3;
                }
                let mut case = case.clone();
                if let Some(m) = odd.filter(|m| usize::from(m.rank) == rank) {
                    case = m.case.clone();
                    input.resize(case.input_len(world as u16) * case.dtype.size(), 0);
                }
                per_rank[rank].push(Job::new(ji, case, rank as u16, world as u16, input, delay));
            }
        }
        for (rank, jobs) in per_rank.into_iter().enumerate() {
            host_jobs[w.hosts[rank]].push((ci, rank as u16, jobs));
        }
        runs.push(run);
    }
    let mut host_nodes = Vec::new();
    for (h, jobs) in host_jobs.into_iter().enumerate() {
        let mut node = HostNode::new(&topo, h);
        for (ci, rank, jobs) in jobs {
            node.add_qp(&topo, h, ci, &comms[ci], rank, jobs);
        }
        host_nodes.push(fabric.add_node(SimNode::Host(Box::new(node))));
    }
    let mut link_rng = ChaCha8Rng::seed_from_u64(rng.gen());
    let mut link = |base: LinkConfig| {
        if !s.heterogeneous {
            return base;
        }
        LinkConfig {
            latency: link_rng.gen_range(500..=50 * MICROS),
            bandwidth_bps: *[1, 10, 25, 100].choose(&mut link_rng).expect("non-empty")
                * 1_000_000_000,
            ..base
        }
    };
    for l in &topo.links {
        fabric.connect(
            Endpoint { node: switch_nodes[l.a.switch], port: l.a.port },
            Endpoint { node: switch_nodes[l.b.switch], port: l.b.port },
            // All switches run in one process, as `scripts/demo` and `inc-bench` run them.
            LinkConfig { in_memory: true, ..link(s.switch_link) },
        );
    }
    for (h, host) in topo.hosts.iter().enumerate() {
        fabric.connect(
            Endpoint { node: host_nodes[h], port: 0 },
            Endpoint { node: switch_nodes[host.attach.switch], port: host.attach.port },
            link(s.host_link),
        );
    }
    let hot = link_rng.gen_range(0..fabric.link_count());
    if let Some(f) = s.hot_link {
        fabric.set_faults(hot, f);
    }
    let mut cut_pending = s.cut_link;
    // Communicators live in phases: run those that exist until they all finish, then
    // destroy them and create those waiting for them.
    let mut live: Vec<usize> =
        (0..comms.len()).filter(|&c| comms[c].plan.after.is_none()).collect();
    let mut pending: Vec<usize> =
        (0..comms.len()).filter(|&c| comms[c].plan.after.is_some()).collect();
    loop {
        let now = fabric.now();
        for n in fabric.nodes_mut() {
            if let SimNode::Host(h) = n {
                for &c in &live {
                    h.start(now, c);
                }
            }
        }
        let limits = match cut_pending {
            Some(t) => RunLimits { max_time: t, ..s.limits },
            None => s.limits,
        };
        let result = fabric.run_until(&limits, |nodes| {
            nodes.iter().all(|n| match n {
                SimNode::Host(h) => live.iter().all(|&c| h.finished(c)),
                SimNode::Switch(_) => true,
            })
        });
        match result {
            Err(SimError::TimeLimit { .. }) if cut_pending.is_some() => {
                fabric.set_faults(hot, FaultConfig { drop: 1.0, ..FaultConfig::NONE });
                cut_pending = None;
                continue;
            }
            Err(e) => return Err(format!("{e}\n{}", dump(&fabric, &runs))),
            Ok(()) => {}
        }
        let next: Vec<usize> = pending
            .iter()
            .copied()
            .filter(|&c| comms[c].plan.after.is_some_and(|j| live.contains(&j)))
            .collect();
        if next.is_empty() {
            break;
        }
        let now = inc_protocol::Time::from_nanos(fabric.now());
        for n in fabric.nodes_mut() {
            if let SimNode::Host(h) = n {
                for &c in &next {
                    h.destroy(comms[c].plan.after.expect("waits"));
                }
            }
            let SimNode::Switch(sw) = n else { continue };
            let id = sw.engine.config().switch_id;
            for &c in &next {
                let j = comms[c].plan.after.expect("waits");
                if comms[j].compiled.rules.iter().any(|r| r.switch_id == id) {
                    sw.engine
                        .remove(comms[j].compiled.comm_id)
                        .map_err(|e| format!("switch {}: removing comm {j}: {e}", sw.name))?;
                }
            }
            for &c in &next {
                for r in comms[c].compiled.rules.iter().filter(|r| r.switch_id == id) {
                    sw.engine
                        .install(r, now)
                        .map_err(|e| format!("switch {}: installing comm {c}: {e}", sw.name))?;
                }
            }
        }
        live.retain(|&c| !next.iter().any(|&n| comms[n].plan.after == Some(c)));
        pending.retain(|c| !next.contains(c));
        live.extend(next);
    }
    let failing =
        s.mismatch.as_ref().map(|m| (m.comm, s.comms[m.comm].jobs.len() - 1)).or_else(|| {
            s.comms
                .iter()
                .enumerate()
                .find_map(|(ci, c)| Some((ci, c.jobs.iter().position(refused)?)))
        });
    let cut = s.cut_link.is_some();
    let float_errors = verify(&fabric, &runs, failing, cut)
        .map_err(|e| format!("{e}\n{}", dump(&fabric, &runs)))?;

    let mut report = Report {
        sim_time: fabric.now(),
        events: fabric.events(),
        links: fabric.total_stats(),
        switches: Vec::new(),
        hosts: Vec::new(),
        completions: Vec::new(),
        collectives: runs.iter().map(|r| r.cases.len()).sum(),
        bytes: runs
            .iter()
            .flat_map(|r| r.cases.iter().map(|c| c.input_len(r.world as u16) * c.dtype.size()))
            .map(|b| b as u64)
            .sum(),
        unknown_qp: 0,
        host_arp_replies: 0,
        host_stale: 0,
        corrupted_delivered: fabric.corrupted_delivered(),
        peak_memory: Vec::new(),
        memory_bound: Vec::new(),
        switch_events: Vec::new(),
        host_errors: Vec::new(),
        state: dump(&fabric, &runs),
        float_errors,
    };
    for n in fabric.nodes_mut() {
        match n {
            SimNode::Switch(sw) => {
                sw.sample_memory();
                let id = sw.engine.config().switch_id;
                let rules =
                    comms.iter().flat_map(|c| &c.compiled.rules).filter(|r| r.switch_id == id);
                report
                    .memory_bound
                    .push(rules.map(|r| memory_bound(r, s.deterministic_float)).sum());
                report.peak_memory.push(sw.peak_memory);
                report.switches.push((sw.name.clone(), sw.engine.counters()));
                report.switch_events.extend(
                    sw.events.iter().map(|(t, e)| format!("switch {} t={t}ns: {e:?}", sw.name)),
                );
            }
            SimNode::Host(h) => {
                report.unknown_qp += h.unknown_qp;
                report.host_arp_replies += h.arp_replies;
                report.host_stale += h.stale;
                for q in &h.qps {
                    report.host_errors.extend(q.error.iter().cloned());
                    report.hosts.push((h.name.clone(), q.comm, q.rank, q.engine.counters()));
                    report.completions.push(
                        q.outcomes.iter().map(|o| (o.index, o.started, o.finished)).collect(),
                    );
                }
            }
        }
    }
    Ok(report)
}

/// The aggregation tree of a compiled communicator: at each switch its children in
/// connection order, which is the ordinal order switches fold them in (`children()`
/// of the rules).
pub fn tree_of(c: &Compiled) -> Tree {
    fn node(c: &Compiled, sw: u32) -> Tree {
        let rules = c.rules.iter().find(|r| r.switch_id == sw).expect("switch of the tree");
        let children = rules.children().map(|i| match rules.connections[i].peer {
            Peer::Host { rank } => Tree::Rank(rank),
            Peer::Switch { switch_id } => node(c, switch_id),
        });
        Tree::Switch(children.collect())
    }
    node(c, c.root_switch)
}

/// Upper bound on a switch's memory for one communicator, from its rules alone (never
/// from the vector length): the slot pool (2 x mtu per slot for the fp32 accumulator of
/// fp16/bf16, plus mtu times the fan-in in deterministic mode) and one chunk of scratch,
/// slot metadata, and two send queues' worth of frames per connection.
pub fn memory_bound(r: &SwitchRules, deterministic_float: bool) -> u64 {
    let mtu = u64::from(r.mtu);
    let slots = u64::from(r.slots);
    let sub_buffers = if deterministic_float { mtu * r.fan_in().max(1) as u64 } else { 0 };
    let stride = 2 * mtu + sub_buffers;
    let per_conn = 2 * (2 * u64::from(r.window) + 16) * (mtu + 128);
    slots * stride + mtu + slots * 64 + r.connections.len() as u64 * per_conn
}

/// Packets a switch retransmitted.
pub fn switch_retransmits(c: &SwitchCounters) -> u64 {
    c.retransmits()
}

/// Packets a host QP retransmitted.
pub fn host_retransmits(c: &HostCounters) -> u64 {
    c.rc.retransmits
}

/// Checks the counters against what the scenario implies:
/// - no switch reported a failure, no collective failed or timed out, no mismatch or
///   protocol error, no frame for an unknown QP;
/// - every corrupted frame delivered was dropped by its receiver (bad ICRC or
///   malformed), and nothing else was;
/// - lossless links: zero retransmissions, timeouts, sequence NAKs, slot conflicts,
///   RNR NAKs and back-pressure, on every switch and host;
/// - switch memory stayed below a bound derived from the rules alone.
pub fn check_counters(s: &Scenario, r: &Report) -> Result<(), String> {
    let destroyed = s.comms.iter().any(|c| c.after.is_some());
    if let Some(e) = r.switch_events.first() {
        return Err(format!("switch event: {e}"));
    }
    let mut detected = 0;
    for (name, c) in &r.switches {
        let d = &c.drops;
        detected += d.bad_icrc + d.malformed;
        // Frames still in flight when a communicator is destroyed arrive for a QPN that is
        // gone or reused: dropped, and only then acceptable.
        let stale = if destroyed { d.unknown_qpn + d.wrong_peer } else { 0 };
        let other = d.not_roce + d.unknown_qpn + d.wrong_peer + d.unsupported_opcode + d.bad_port;
        if other > stale {
            return Err(format!("switch {name}: unexpected drops {d:?}"));
        }
        for cc in &c.comms {
            if cc.collectives_failed + cc.mismatches + cc.protocol_errors + cc.control_send_failures
                > 0
            {
                return Err(format!("switch {name} comm {}: failures in {cc:?}", cc.comm_id));
            }
            if let Some(conn) = cc.connections.iter().find(|c| c.failed) {
                return Err(format!(
                    "switch {name} comm {}: connection {} failed",
                    cc.comm_id, conn.port
                ));
            }
        }
    }
    for (host, comm, rank, c) in &r.hosts {
        detected += c.rx_bad_icrc + c.rx_malformed;
        let at = || format!("host {host} comm {comm} rank {rank}");
        if c.collective.failed + c.progress_timeouts > 0 {
            return Err(format!("{}: failed collectives in {c:?}", at()));
        }
        if c.rx_unsupported > 0 || c.collective.rx_unexpected > 0 {
            return Err(format!("{}: unexpected frames in {c:?}", at()));
        }
    }
    // A corrupted frame may also land on a QP other than its own (corrupted QPN), or on
    // the QP of a destroyed communicator, which drops it unexamined.
    let wrong_qp: u64 = r.hosts.iter().map(|h| h.3.rx_wrong_qp).sum();
    if detected + wrong_qp + r.host_stale < r.corrupted_delivered
        || detected > r.corrupted_delivered
    {
        return Err(format!(
            "{} corrupted frames delivered, but receivers dropped {detected} as bad ICRC/malformed, \
             {wrong_qp} as for another QP and {} as for a destroyed QP",
            r.corrupted_delivered, r.host_stale
        ));
    }
    if !destroyed && r.host_stale > 0 {
        return Err(format!(
            "{} frames for destroyed QPs without destroyed communicators",
            r.host_stale
        ));
    }
    if r.corrupted_delivered == 0 && (wrong_qp > 0 || r.unknown_qp > 0) {
        return Err(format!("{wrong_qp} frames for a wrong QP without corruption"));
    }
    let lossless = s.host_link.faults.is_lossless()
        && s.switch_link.faults.is_lossless()
        && s.hot_link.is_none_or(|f| f.is_lossless());
    if lossless {
        for (name, c) in &r.switches {
            for cc in &c.comms {
                if cc.slot_conflicts + cc.backpressure_rnr > 0 {
                    return Err(format!(
                        "switch {name} comm {}: lossless run with {} slot conflicts, {} back-pressure RNRs",
                        cc.comm_id, cc.slot_conflicts, cc.backpressure_rnr
                    ));
                }
                for conn in &cc.connections {
                    let rc = &conn.rc;
                    if rc.retransmits
                        + rc.timeouts
                        + rc.tx_seq_naks
                        + rc.tx_rnr_naks
                        + rc.rx_rnr_naks
                        > 0
                    {
                        return Err(format!(
                            "switch {name} comm {} connection {}: lossless run with {:?}",
                            cc.comm_id, conn.port, rc
                        ));
                    }
                }
            }
        }
        for (host, comm, rank, c) in &r.hosts {
            let rc = &c.rc;
            if rc.retransmits + rc.timeouts + rc.tx_seq_naks + rc.tx_rnr_naks + rc.rx_rnr_naks > 0
                || c.collective.not_ready > 0
            {
                return Err(format!(
                    "host {host} comm {comm} rank {rank}: lossless run with {c:?}"
                ));
            }
        }
    }
    for (i, (name, _)) in r.switches.iter().enumerate() {
        if r.peak_memory[i] > r.memory_bound[i] {
            return Err(format!(
                "switch {name}: peak memory {} bytes above the bound {} from its rules",
                r.peak_memory[i], r.memory_bound[i]
            ));
        }
    }
    Ok(())
}

/// Float SUM, PROD and AVG over wide-range or normal inputs depend on the order switches
/// combine contributions in: outside deterministic float mode they are checked within a
/// bound.
pub fn bound_checked(case: &CollectiveCase) -> bool {
    matches!(case.kind, Kind::AllReduce | Kind::Reduce { .. } | Kind::ReduceScatter)
        && matches!(case.floats, FloatInputs::Wide | FloatInputs::Normal)
        && order_dependent(case.op, case.dtype)
}

/// A pair the tables refuse (a bitwise operator on a float type): every rank's host
/// engine must refuse to start it.
pub fn refused(case: &CollectiveCase) -> bool {
    case.kind != Kind::Barrier && !case.op.applies_to(case.dtype)
}

/// Checks every rank's results; `failing` = (communicator, collective) that must fail on
/// every rank of that communicator instead (and end its sequence); with `cut`, any rank
/// may end its sequence with an error (a link died), but what completed must be right.
/// Returns the measured errors of the results checked within a bound.
fn verify(
    fabric: &Fabric<SimNode>,
    runs: &[CommRun],
    failing: Option<(usize, usize)>,
    cut: bool,
) -> Result<Vec<FloatErrors>, String> {
    let mut float_errors = Vec::new();
    // outputs[comm][job][rank]
    let mut outputs: Vec<Vec<Vec<Option<&[u8]>>>> =
        runs.iter().map(|r| vec![vec![None; r.world]; r.cases.len()]).collect();
    // times[comm][job] = (rank, start, finish) of every rank that completed it
    let mut times: Vec<Vec<Vec<(u16, Nanos, Nanos)>>> =
        runs.iter().map(|r| vec![Vec::new(); r.cases.len()]).collect();
    for n in fabric.nodes() {
        let SimNode::Host(h) = n else { continue };
        for q in &h.qps {
            // Ranks of a collective with disagreeing ranks must end it: with an error, or
            // (if the data they need flowed before the disagreement was detected, as in
            // a Broadcast) with a correct result, checked below.
            let must_end = failing.filter(|f| f.0 == q.comm).map(|f| f.1);
            let want = match (&q.error, must_end) {
                (Some(_), None) if cut => q.outcomes.len(),
                (Some(e), None) => return Err(format!("host {}: {e}", h.name)),
                (Some(e), Some(ji)) if !e.contains(&format!("collective #{ji} ")) => {
                    return Err(format!("host {}: wrong collective failed: {e}", h.name))
                }
                (Some(_), Some(ji)) => ji,
                (None, _) => runs[q.comm].cases.len(),
            };
            if q.outcomes.len() != want {
                return Err(format!(
                    "host {} comm {} rank {}: {} of {want} collectives completed",
                    h.name,
                    q.comm,
                    q.rank,
                    q.outcomes.len()
                ));
            }
            for o in &q.outcomes {
                outputs[q.comm][o.index][usize::from(q.rank)] = o.output.as_deref();
                times[q.comm][o.index].push((q.rank, o.started, o.finished));
            }
        }
    }
    // Completion is end to end (DESIGN 8): a rank may only complete once every rank its
    // completion depends on has started. A Broadcast receiver needs the root; everything
    // else (results, Progress, delivery to every receiver) needs every rank.
    for (ci, per_job) in times.iter().enumerate() {
        for (ji, finishes) in per_job.iter().enumerate() {
            if failing == Some((ci, ji)) {
                continue;
            }
            let start = |r: u16| finishes.iter().find(|f| f.0 == r).map_or(0, |f| f.1);
            let last_start = finishes.iter().map(|f| f.1).max().unwrap_or(0);
            let case = &runs[ci].cases[ji];
            for &(rank, _, finished) in finishes {
                let (needed, who) = match case.kind {
                    Kind::Broadcast { root } if root != rank => {
                        (start(root), format!("root {root}"))
                    }
                    _ => (last_start, "the last rank".to_string()),
                };
                if finished < needed {
                    return Err(format!(
                        "comm {ci} collective #{ji} ({}): rank {rank} completed at t={finished}ns, \
                         before {who} started it at t={needed}ns",
                        case.describe()
                    ));
                }
            }
        }
    }
    for (ci, run) in runs.iter().enumerate() {
        for (ji, case) in run.cases.iter().enumerate() {
            let may_lack_output = cut || failing == Some((ci, ji));
            let at = |rank: usize| {
                format!("comm {ci} collective #{ji} ({}) rank {rank}", case.describe())
            };
            let mut first: Option<(usize, &[u8])> = None;
            for (rank, (want, &got)) in run.expected[ji].iter().zip(&outputs[ci][ji]).enumerate() {
                let (want, got) = match (want, got) {
                    (None, _) => continue,
                    (Some(_), None) if may_lack_output => continue,
                    (Some(_), None) => return Err(format!("{}: no output", at(rank))),
                    (Some(w), Some(g)) => (w, g),
                };
                // Every rank that receives the same result must get it bit for bit (so
                // the first one's is the one checked within a bound).
                if let Some((r0, g0)) = first {
                    if case.kind == Kind::AllReduce {
                        if let Some((i, g, w)) = first_mismatch(case.dtype, got, g0) {
                            return Err(format!(
                                "{}: element {i} = {g} differs from rank {r0}'s {w}",
                                at(rank)
                            ));
                        }
                    }
                } else {
                    first = Some((rank, got));
                }
                if let Some(inputs) = &run.inputs[ji] {
                    // A ReduceScatter rank's result is its own block reduced, checked on
                    // every rank; other results are the first rank's (the same on all).
                    let refs: Vec<&[u8]> = match case.kind {
                        Kind::ReduceScatter => blocks(inputs, rank),
                        _ if first.is_some_and(|f| f.0 != rank) => continue,
                        _ => inputs.iter().map(Vec::as_slice).collect(),
                    };
                    if got.len() != want.len() {
                        let (g, w) = (got.len(), want.len());
                        return Err(format!("{}: {g} bytes, expected {w}", at(rank)));
                    }
                    let relative = check_bound(case.op, case.dtype, &run.tree, got, &refs)
                        .map_err(|e| {
                            format!(
                                "{}: element {} = {:e}, exact {:e}, error bound {:e}",
                                at(rank),
                                e.index,
                                e.got,
                                e.exact,
                                e.bound
                            )
                        })?;
                    let (dtype, op, tree) = (case.dtype, case.op, run.tree.clone());
                    float_errors.push(FloatErrors { dtype, op, tree, relative });
                } else if let Some((i, g, w)) = first_mismatch(case.dtype, got, want) {
                    return Err(format!("{}: element {i} = {g}, expected {w}", at(rank)));
                }
            }
        }
    }
    Ok(float_errors)
}

/// State of every QP and switch, for failure messages: one line each, full counters
/// with `INC_SIM_VERBOSE=1`.
fn dump(fabric: &Fabric<SimNode>, runs: &[CommRun]) -> String {
    let verbose = std::env::var_os("INC_SIM_VERBOSE").is_some();
    let mut out = format!(
        "t={}ns events={} in_flight={} links={:?}\n",
        fabric.now(),
        fabric.events(),
        fabric.in_flight(),
        fabric.total_stats()
    );
    for l in 0..fabric.link_count() {
        let (a, b, c) = fabric.link(l);
        let [ab, ba] = fabric.link_stats(l);
        let _ = writeln!(
            out,
            "  link {}:{} <-> {}:{}: {} ns, {} Gb/s, drop/dup/reorder/corrupt {}/{}/{}/{}, frames {}/{}",
            fabric.nodes()[a.node].name(),
            a.port,
            fabric.nodes()[b.node].name(),
            b.port,
            c.latency,
            c.bandwidth_bps / 1_000_000_000,
            c.faults.drop,
            c.faults.duplicate,
            c.faults.reorder,
            c.faults.corrupt,
            ab.frames_sent,
            ba.frames_sent
        );
    }
    for (ci, r) in runs.iter().enumerate() {
        let list: Vec<String> =
            r.cases.iter().enumerate().map(|(i, c)| format!("#{i} {}", c.describe())).collect();
        let _ = writeln!(out, "  comm {ci}: {}", list.join("; "));
    }
    for n in fabric.nodes() {
        match n {
            SimNode::Host(h) => {
                for q in &h.qps {
                    let cur = q.current.front().map(|(j, t)| {
                        let (done, total) = q.engine.collective().progress().unwrap_or((0, 0));
                        format!(
                            "running #{} ({}) since t={t}ns, {done}/{total} chunks",
                            j.index,
                            j.case.describe()
                        )
                    });
                    let c = q.engine.counters();
                    let _ = write!(
                        out,
                        "  host {} comm {} rank {}: {}/{} done, {}{}; retx {} timeouts {} naks rx/tx {}/{} rnr rx/tx {}/{}",
                        h.name,
                        q.comm,
                        q.rank,
                        q.outcomes.len(),
                        runs[q.comm].cases.len(),
                        cur.unwrap_or_else(|| "idle".into()),
                        q.error.as_deref().map(|e| format!(", error: {e}")).unwrap_or_default(),
                        c.rc.retransmits,
                        c.rc.timeouts,
                        c.rc.rx_seq_naks,
                        c.rc.tx_seq_naks,
                        c.rc.rx_rnr_naks,
                        c.rc.tx_rnr_naks,
                    );
                    if verbose {
                        let _ = write!(out, "\n    {c:?}");
                    }
                    out.push('\n');
                }
            }
            SimNode::Switch(sw) => {
                let c = sw.engine.counters();
                let _ = write!(
                    out,
                    "  switch {}: memory {} retx {} slot conflicts {} drops {:?}",
                    sw.name,
                    c.memory_bytes(),
                    c.retransmits(),
                    c.slot_conflicts(),
                    c.drops
                );
                for cc in &c.comms {
                    let _ = write!(
                        out,
                        "; comm {} started {} completed {} failed {} rnr {} protocol errors {}",
                        cc.comm_id,
                        cc.collectives_started,
                        cc.collectives_completed,
                        cc.collectives_failed,
                        cc.backpressure_rnr,
                        cc.protocol_errors
                    );
                }
                for (t, e) in &sw.events {
                    let _ = write!(out, "\n    event t={t}ns: {e:?}");
                }
                if verbose {
                    let _ = write!(out, "\n    {c:?}");
                }
                out.push('\n');
            }
        }
    }
    out
}

/// Knobs for [`random_scenario`].
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// Collectives per communicator, drawn uniformly from this range.
    pub jobs: std::ops::RangeInclusive<usize>,
    /// Shape of each collective.
    pub case: CaseShape,
    /// Also run a second communicator over a random subset (≥ 2) of the hosts.
    pub second_comm: bool,
    /// Draw payload size and window per communicator instead of the topology defaults.
    pub vary_mtu_window: bool,
    /// Faults on every link.
    pub faults: FaultConfig,
    /// Switches in deterministic float mode.
    pub deterministic_float: bool,
    /// See [`Scenario::think_time`].
    pub think_time: Nanos,
    /// See [`Scenario::heterogeneous`].
    pub heterogeneous: bool,
    /// See [`Scenario::hot_link`].
    pub hot_link: Option<FaultConfig>,
    /// Jitter on lossy links (reorders frames whose gap is smaller).
    pub jitter: Nanos,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            jobs: 4..=10,
            case: CaseShape::default(),
            second_comm: false,
            vary_mtu_window: false,
            faults: FaultConfig::NONE,
            deterministic_float: false,
            think_time: 0,
            heterogeneous: false,
            hot_link: None,
            jitter: 500,
        }
    }
}

/// A seeded random scenario on a shipped topology: the first communicator spans every
/// host in a random rank order.
pub fn random_scenario(seed: u64, topology: &str, shape: &Shape) -> Result<Scenario, String> {
    let topo = load_topology(topology)?;
    // A separate stream from the one `run` uses, so shapes do not shift inputs.
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EED_0F5C_E7A2_1000);
    let comm = |hosts: Vec<usize>, rng: &mut ChaCha8Rng| {
        let (mtu, window) = if shape.vary_mtu_window {
            (
                Some(*VALID_MTUS.choose(rng).expect("non-empty")),
                Some(*[1u32, 2, 3, 4, 8, 16, 64].choose(rng).expect("non-empty")),
            )
        } else {
            (super::repro::mtu_override(), None)
        };
        let n = rng.gen_range(shape.jobs.clone());
        let jobs = (0..n).map(|_| gen_collective(rng, hosts.len() as u16, &shape.case)).collect();
        CommWorkload { hosts, mtu, window, jobs, after: None }
    };
    let all = random_hosts(&mut rng, &topo, topo.hosts.len());
    let mut comms = vec![comm(all, &mut rng)];
    if shape.second_comm {
        let sub = random_hosts(&mut rng, &topo, 2);
        comms.push(comm(sub, &mut rng));
    }
    let lossless = shape.faults.is_lossless();
    let link = LinkConfig {
        // Real links are FIFO; jitter (which reorders) only comes with the faults.
        jitter: if lossless { 0 } else { shape.jitter },
        faults: shape.faults,
        ..LinkConfig::default()
    };
    Ok(Scenario {
        seed,
        topology: topology.to_string(),
        comms,
        host_link: link,
        switch_link: LinkConfig { latency: MICROS, ..link },
        limits: RunLimits::default(),
        deterministic_float: shape.deterministic_float,
        think_time: shape.think_time,
        heterogeneous: shape.heterogeneous,
        hot_link: shape.hot_link,
        mismatch: None,
        delays: Vec::new(),
        cut_link: None,
    })
}
