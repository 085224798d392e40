//! A small in-crate network: switches and `inccl-engine` hosts joined by links with
//! latency and seeded loss, to check the engines end to end before (and besides) the
//! full simulation in `tests/`.

use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::time::Duration;

use inc_ctrl_proto::{udp_port_for_qpn, ConnectionRule, Mac, Peer, SwitchRules};
use inc_protocol::Time;
use inc_wire::{DataType, EthernetAddress, Operator};
use inccl_engine::{
    CollectiveKind, CollectiveSpec, HostEngine, HostError, HostQpConfig, OpBuffers,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

fn host_ip(rank: u16) -> Ipv4Addr {
    Ipv4Addr::new(10, 100, 0, rank as u8 + 1)
}
fn port_ip(sw: usize, port: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, sw as u8 + 1, port as u8, 1)
}
fn mac_of(ip: Ipv4Addr) -> EthernetAddress {
    EthernetAddress(Mac::from_ipv4(ip).0)
}

struct HostNode {
    engine: HostEngine,
    input: Vec<u8>,
    output: Vec<u8>,
    spec: Option<CollectiveSpec>,
    result: Option<Result<(), HostError>>,
}

enum Node {
    Switch(Box<SwitchEngine>),
    Host(Box<HostNode>),
}

#[derive(PartialEq, Eq)]
struct Pending {
    at: u64,
    seq: u64,
    node: usize,
    port: usize,
    frame: Vec<u8>,
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

struct Net {
    nodes: Vec<Node>,
    /// (node, port) -> (node, port)
    links: std::collections::HashMap<(usize, usize), (usize, usize)>,
    queue: BinaryHeap<Pending>,
    seq: u64,
    now: u64,
    rng: ChaCha8Rng,
    loss: f64,
    /// Probability that a delivered frame arrives twice.
    dup: f64,
    latency: u64,
    ranks: Vec<usize>,
    /// Last delivery time per directed link: links are FIFO.
    last: std::collections::HashMap<(usize, usize), u64>,
    /// ACKs sent by this node vanish.
    drop_acks_from: Option<usize>,
    /// Frames sent out of these (node, port) pairs vanish.
    cut: std::collections::HashSet<(usize, usize)>,
}

struct TreeSpec {
    /// Parent switch of each switch (`None` for the root, which must be switch 0).
    parents: Vec<Option<usize>>,
    /// Switch each rank attaches to.
    hosts: Vec<usize>,
    mtu: u16,
    window: u32,
}

fn build(t: &TreeSpec, cfg: SwitchEngineConfig, loss: f64, seed: u64) -> Net {
    let n_sw = t.parents.len();
    let world = t.hosts.len() as u16;
    // Ranks below each switch.
    let mut below: Vec<Vec<u16>> = vec![Vec::new(); n_sw];
    for (r, &s) in t.hosts.iter().enumerate() {
        let mut x = Some(s);
        while let Some(sw) = x {
            below[sw].push(r as u16);
            x = t.parents[sw];
        }
    }
    let mut rules: Vec<SwitchRules> = (0..n_sw)
        .map(|s| SwitchRules {
            comm_id: 7,
            switch_id: s as u32,
            world_size: world,
            mtu: t.mtu,
            window: t.window,
            slots: 2 * t.window,
            parent: None,
            connections: Vec::new(),
        })
        .collect();
    let mut ports: Vec<Vec<PortConfig>> = vec![Vec::new(); n_sw];
    let mut links = std::collections::HashMap::new();
    let mut qpn = 0x100u32;
    let add_port = |ports: &mut Vec<Vec<PortConfig>>, s: usize| {
        let p = ports[s].len();
        let ip = port_ip(s, p);
        ports[s].push(PortConfig { name: format!("p{p}"), ip, mac: mac_of(ip) });
        p
    };
    let host_node = |r: usize| n_sw + r;
    let mut host_cfgs = Vec::new();
    for (r, &s) in t.hosts.iter().enumerate() {
        let rank = r as u16;
        let p = add_port(&mut ports, s);
        qpn += 1;
        let sw_qpn = qpn;
        let host_qpn = 0x11 + r as u32;
        // Odd ranks are userspace hosts on their own UDP port, even ranks use 4791.
        let host_port = if r % 2 == 1 { 20_000 + r as u16 } else { 4791 };
        let (sw_psn, host_psn) = ((0xFF_FF00 + r as u32 * 7) & 0xFF_FFFF, 0xFF_FFF0 - r as u32);
        rules[s].connections.push(ConnectionRule {
            port: format!("p{p}"),
            local_ip: port_ip(s, p),
            local_mac: Mac::from_ipv4(port_ip(s, p)),
            local_qpn: sw_qpn,
            local_udp_port: udp_port_for_qpn(sw_qpn),
            local_start_psn: sw_psn,
            peer: Peer::Host { rank },
            peer_ip: host_ip(rank),
            peer_mac: if r % 2 == 0 { Some(Mac::from_ipv4(host_ip(rank))) } else { None },
            peer_qpn: host_qpn,
            peer_udp_port: host_port,
            peer_start_psn: host_psn,
            ranks: vec![rank],
        });
        host_cfgs.push(HostQpConfig {
            rank,
            world_size: world,
            comm_id: 7,
            local_mac: mac_of(host_ip(rank)),
            local_ip: host_ip(rank),
            local_qpn: host_qpn,
            local_udp_port: host_port,
            local_start_psn: host_psn,
            switch_mac: mac_of(port_ip(s, p)),
            switch_ip: port_ip(s, p),
            switch_qpn: sw_qpn,
            switch_udp_port: udp_port_for_qpn(sw_qpn),
            switch_start_psn: sw_psn,
            mtu: t.mtu,
            window: t.window,
        });
        links.insert((s, p), (host_node(r), 0));
        links.insert((host_node(r), 0), (s, p));
    }
    for c in 0..n_sw {
        let Some(pa) = t.parents[c] else { continue };
        let pc = add_port(&mut ports, c);
        let pp = add_port(&mut ports, pa);
        qpn += 2;
        let (qc, qp) = (qpn - 1, qpn);
        let (psn_c, psn_p) = (0xFF_FFFE, 17 * c as u32);
        let outside: Vec<u16> = (0..world).filter(|r| !below[c].contains(r)).collect();
        rules[c].parent = Some(rules[c].connections.len());
        rules[c].connections.push(ConnectionRule {
            port: format!("p{pc}"),
            local_ip: port_ip(c, pc),
            local_mac: Mac::from_ipv4(port_ip(c, pc)),
            local_qpn: qc,
            local_udp_port: udp_port_for_qpn(qc),
            local_start_psn: psn_c,
            peer: Peer::Switch { switch_id: pa as u32 },
            peer_ip: port_ip(pa, pp),
            peer_mac: Some(Mac::from_ipv4(port_ip(pa, pp))),
            peer_qpn: qp,
            peer_udp_port: 4791,
            peer_start_psn: psn_p,
            ranks: outside,
        });
        let mut sub = below[c].clone();
        sub.sort_unstable();
        rules[pa].connections.push(ConnectionRule {
            port: format!("p{pp}"),
            local_ip: port_ip(pa, pp),
            local_mac: Mac::from_ipv4(port_ip(pa, pp)),
            local_qpn: qp,
            local_udp_port: udp_port_for_qpn(qp),
            local_start_psn: psn_p,
            peer: Peer::Switch { switch_id: c as u32 },
            peer_ip: port_ip(c, pc),
            peer_mac: None,
            peer_qpn: qc,
            peer_udp_port: 4791,
            peer_start_psn: psn_c,
            ranks: sub,
        });
        links.insert((c, pc), (pa, pp));
        links.insert((pa, pp), (c, pc));
    }
    let mut nodes = Vec::new();
    for s in 0..n_sw {
        let mut e = SwitchEngine::new(SwitchEngineConfig {
            switch_id: s as u32,
            ports: ports[s].clone(),
            ..cfg.clone()
        });
        e.install(&rules[s], Time::ZERO).unwrap();
        nodes.push(Node::Switch(Box::new(e)));
    }
    for c in host_cfgs {
        nodes.push(Node::Host(Box::new(HostNode {
            engine: HostEngine::new(c),
            input: Vec::new(),
            output: Vec::new(),
            spec: None,
            result: None,
        })));
    }
    Net {
        nodes,
        links,
        queue: BinaryHeap::new(),
        seq: 0,
        now: 0,
        rng: ChaCha8Rng::seed_from_u64(seed),
        loss,
        dup: 0.0,
        latency: 5_000,
        ranks: (0..t.hosts.len()).map(host_node).collect(),
        cut: Default::default(),
        last: Default::default(),
        drop_acks_from: None,
    }
}

impl Net {
    fn host(&mut self, rank: usize) -> &mut HostNode {
        match &mut self.nodes[self.ranks[rank]] {
            Node::Host(h) => h,
            Node::Switch(_) => unreachable!(),
        }
    }

    fn switch(&self, s: usize) -> &SwitchEngine {
        match &self.nodes[s] {
            Node::Switch(e) => e,
            Node::Host(_) => unreachable!(),
        }
    }

    fn flush(&mut self) {
        let mut buf = vec![0u8; 9000];
        let now = Time::from_nanos(self.now);
        for n in 0..self.nodes.len() {
            loop {
                let out = match &mut self.nodes[n] {
                    Node::Switch(e) => e.poll_transmit(now, &mut buf).map(|t| (t.port, t.len)),
                    Node::Host(h) => {
                        let HostNode { engine, input, output, .. } = &mut **h;
                        engine
                            .poll_transmit(
                                now,
                                &mut buf,
                                &OpBuffers::Separate { src: input, dst: output },
                            )
                            .map(|l| (0, l))
                    }
                };
                let Some((port, len)) = out else { break };
                let is_ack = len > 42 && buf[42] == 0x11;
                if self.rng.gen_bool(self.loss)
                    || self.cut.contains(&(n, port))
                    || (is_ack && self.drop_acks_from == Some(n))
                {
                    continue;
                }
                let (node, port) = self.links[&(n, port)];
                self.seq += 1;
                let jitter = self.rng.gen_range(0..1_000);
                let last = self.last.entry((n, port)).or_default();
                let at = (*last + 100).max(self.now + self.latency + jitter);
                *last = at;
                self.queue.push(Pending {
                    at,
                    seq: self.seq,
                    node,
                    port,
                    frame: buf[..len].to_vec(),
                });
            }
        }
    }

    /// Runs until every host has a result or `limit` of simulated time passed.
    fn run(&mut self, limit: Duration) {
        let end = self.now + limit.as_nanos() as u64;
        // An engine whose deadline stays in the past without producing anything would
        // make a real driver spin; catch it here.
        let mut idle_spins = 0u32;
        let mut last = None;
        loop {
            self.flush();
            let state = Some((self.now, self.seq, self.queue.len()));
            if state == last {
                idle_spins += 1;
                assert!(
                    idle_spins < 1000,
                    "an engine keeps a past deadline at t={} ns without doing anything",
                    self.now
                );
            } else {
                idle_spins = 0;
            }
            last = state;
            let all_done = (0..self.ranks.len()).all(|r| {
                let n = self.ranks[r];
                matches!(&self.nodes[n], Node::Host(h) if h.result.is_some())
            });
            if all_done {
                return;
            }
            let t_timer = self
                .nodes
                .iter()
                .filter_map(|n| match n {
                    Node::Switch(e) => e.poll_timeout(),
                    Node::Host(h) => h.engine.poll_timeout(),
                })
                .min()
                .map(Time::as_nanos);
            let t_frame = self.queue.peek().map(|p| p.at);
            let Some(next) = [t_timer, t_frame].into_iter().flatten().min() else { return };
            self.now = self.now.max(next);
            if self.now > end {
                return;
            }
            let now = Time::from_nanos(self.now);
            while self.queue.peek().is_some_and(|p| p.at <= self.now) {
                let p = self.queue.pop().unwrap();
                match &mut self.nodes[p.node] {
                    Node::Switch(e) => e.handle_frame(now, p.port, &p.frame),
                    Node::Host(h) => {
                        let HostNode { engine, input, output, result, .. } = &mut **h;
                        engine.handle_frame(
                            now,
                            &p.frame,
                            &mut OpBuffers::Separate { src: input, dst: output },
                        );
                        if let Some(r) = engine.poll_completion() {
                            *result = Some(r);
                        }
                    }
                }
            }
            for n in &mut self.nodes {
                match n {
                    Node::Switch(e) => {
                        if e.poll_timeout().is_some_and(|t| t <= now) {
                            e.handle_timeout(now);
                        }
                    }
                    Node::Host(h) => {
                        if h.engine.poll_timeout().is_some_and(|t| t <= now) {
                            h.engine.handle_timeout(now);
                            if let Some(r) = h.engine.poll_completion() {
                                h.result = Some(r);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Lets ACKs and timers play out with no collective running.
    fn settle(&mut self) {
        let saved: Vec<_> = (0..self.ranks.len()).map(|r| self.host(r).result.take()).collect();
        self.run(Duration::from_millis(500));
        for (r, v) in saved.into_iter().enumerate() {
            self.host(r).result = v;
        }
    }

    /// Starts `spec` on every rank with inputs from `input(rank)`.
    fn start(&mut self, spec: impl Fn(u16) -> CollectiveSpec, input: impl Fn(u16) -> Vec<u8>) {
        let now = Time::from_nanos(self.now);
        for r in 0..self.ranks.len() {
            let s = spec(r as u16);
            let h = self.host(r);
            h.input = input(r as u16);
            h.output = vec![0xEE; (s.count * 4) as usize];
            h.result = None;
            h.spec = Some(s);
            h.engine.start(now, s).unwrap();
        }
    }
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}
fn from_i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
}

fn input_i32(rank: u16, count: u64, round: u32) -> Vec<i32> {
    (0..count)
        .map(|i| {
            (i as i32).wrapping_mul(31).wrapping_add(rank as i32 * 1000 + round as i32)
                ^ (i as i32) << 20
        })
        .collect()
}

fn tree_1_2_4() -> TreeSpec {
    TreeSpec { parents: vec![None, Some(0), Some(0)], hosts: vec![1, 1, 2, 2], mtu: 256, window: 8 }
}

fn check_allreduce(net: &mut Net, world: u16, count: u64, round: u32) {
    let expect: Vec<i32> = (0..count as usize)
        .map(|i| (0..world).fold(0i32, |a, r| a.wrapping_add(input_i32(r, count, round)[i])))
        .collect();
    for r in 0..world as usize {
        if net.host(r).result != Some(Ok(())) {
            for s in 0..net.ranks[0] {
                eprintln!("switch {s}: {:#?}", net.switch(s).counters().comms[0]);
            }
            for q in 0..world as usize {
                eprintln!("rank {q}: {:?}", net.host(q).engine.counters());
            }
        }
        let h = net.host(r);
        assert_eq!(h.result, Some(Ok(())), "rank {r}");
        assert_eq!(from_i32s(&h.output), expect, "rank {r} round {round}");
    }
}

fn allreduce(net: &mut Net, world: u16, count: u64, round: u32) {
    let spec = |_| CollectiveSpec {
        kind: CollectiveKind::AllReduce,
        op: Operator::Sum,
        dtype: DataType::Int32,
        count,
    };
    net.start(spec, |r| i32s(&input_i32(r, count, round)));
    net.run(Duration::from_secs(30));
    check_allreduce(net, world, count, round);
}

#[test]
fn allreduce_single_switch_lossless() {
    let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
    let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
    // Not a multiple of the chunk size, several windows long.
    allreduce(&mut net, 2, 1000, 0);
    let c = net.switch(0).counters();
    assert_eq!(c.slot_conflicts(), 0);
    assert_eq!(c.retransmits(), 0);
    assert_eq!(c.comms[0].collectives_completed, 1);
}

#[test]
fn allreduce_1_2_4_back_to_back_with_loss() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.03, 7);
    for round in 0..3 {
        allreduce(&mut net, 4, 700 + u64::from(round) * 333, round);
    }
    let c: Vec<_> = (0..3).map(|s| net.switch(s).counters()).collect();
    assert!(
        c.iter().map(|c| c.retransmits()).sum::<u64>() > 0,
        "loss must have caused retransmissions"
    );
    for s in &c {
        assert_eq!(s.comms[0].collectives_completed, 3, "{s:?}");
        assert!(s.memory_bytes() < 200_000, "memory {}", s.memory_bytes());
    }
}

#[test]
fn lossless_1_2_4_has_no_slot_conflicts() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.0, 3);
    allreduce(&mut net, 4, 5000, 0);
    for s in 0..3 {
        let c = net.switch(s).counters();
        assert_eq!(c.slot_conflicts(), 0);
        assert_eq!(c.retransmits(), 0);
        assert_eq!(c.comms[0].backpressure_rnr, 0);
    }
}

#[test]
fn reduce_broadcast_barrier_then_allreduce_stay_aligned() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.02, 11);
    let count = 900u64;
    // Reduce to rank 2.
    net.start(
        |_| CollectiveSpec {
            kind: CollectiveKind::Reduce { root: 2 },
            op: Operator::Max,
            dtype: DataType::Int32,
            count,
        },
        |r| i32s(&input_i32(r, count, 1)),
    );
    net.run(Duration::from_secs(30));
    let expect: Vec<i32> = (0..count as usize)
        .map(|i| (0..4).map(|r| input_i32(r, count, 1)[i]).max().unwrap())
        .collect();
    for r in 0..4 {
        assert_eq!(net.host(r).result, Some(Ok(())), "rank {r}");
    }
    assert_eq!(from_i32s(&net.host(2).output), expect);
    assert!(net.host(0).output.iter().all(|&b| b == 0xEE), "non-root output untouched");
    // Broadcast from rank 1 (count differs from the Reduce: a new chunk stream segment).
    let count = 1234u64;
    net.start(
        |_| CollectiveSpec {
            kind: CollectiveKind::Broadcast { root: 1 },
            op: Operator::Sum,
            dtype: DataType::Int32,
            count,
        },
        |r| i32s(&input_i32(r, count, 2)),
    );
    net.run(Duration::from_secs(30));
    for r in 0..4 {
        assert_eq!(net.host(r).result, Some(Ok(())), "rank {r}");
        if r != 1 {
            assert_eq!(from_i32s(&net.host(r).output), input_i32(1, count, 2), "rank {r}");
        }
    }
    // Barrier.
    net.start(
        |_| CollectiveSpec {
            kind: CollectiveKind::Barrier,
            op: Operator::Sum,
            dtype: DataType::Int32,
            count: 0,
        },
        |_| Vec::new(),
    );
    net.run(Duration::from_secs(30));
    for r in 0..4 {
        assert_eq!(net.host(r).result, Some(Ok(())), "barrier rank {r}");
    }
    // And an AllReduce still lines up.
    allreduce(&mut net, 4, 777, 5);
}

#[test]
fn float_sum_is_deterministic_and_identical_on_all_ranks() {
    let run = |seed| {
        let cfg = SwitchEngineConfig { deterministic_float: true, ..SwitchEngineConfig::default() };
        let mut net = build(&tree_1_2_4(), cfg, 0.02, seed);
        let count = 640u64;
        let input = |r: u16| -> Vec<u8> {
            (0..count)
                .flat_map(|i| {
                    ((i as f32 + 0.1) * 1.37f32.powi(r as i32 * 7) - r as f32 * 1e3).to_ne_bytes()
                })
                .collect()
        };
        net.start(
            |_| CollectiveSpec {
                kind: CollectiveKind::AllReduce,
                op: Operator::Sum,
                dtype: DataType::Float32,
                count,
            },
            input,
        );
        net.run(Duration::from_secs(30));
        let out0 = net.host(0).output.clone();
        for r in 0..4 {
            assert_eq!(net.host(r).result, Some(Ok(())));
            assert_eq!(net.host(r).output, out0, "rank {r} differs");
        }
        out0
    };
    assert_eq!(run(1), run(2), "same result whatever the arrival order");
}

#[test]
fn operation_mismatch_fails_every_rank_with_names() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.0, 5);
    let count = 300u64;
    net.start(
        |r| CollectiveSpec {
            kind: CollectiveKind::AllReduce,
            op: if r == 3 { Operator::Max } else { Operator::Sum },
            dtype: DataType::Int32,
            count,
        },
        |r| i32s(&input_i32(r, count, 0)),
    );
    net.run(Duration::from_secs(30));
    for r in 0..4 {
        match &net.host(r).result {
            Some(Err(HostError::Mismatch { fields, rank_a, rank_b, .. })) => {
                assert_eq!(fields, "operator");
                assert!(*rank_a == 3 || *rank_b == 3, "{rank_a} {rank_b}");
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    // Same count, so the stream stays aligned: the next collective works.
    allreduce(&mut net, 4, 300, 1);
}

#[test]
fn dead_link_is_reported_and_hosts_fail_bounded() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.0, 9);
    // Cut the link between leaf 2 and the root in both directions.
    let cut: Vec<_> = net
        .links
        .iter()
        .filter(|(a, b)| (a.0 == 2 && b.0 == 0) || (a.0 == 0 && b.0 == 2))
        .map(|(a, _)| *a)
        .collect();
    net.cut.extend(cut);
    let count = 100;
    net.start(
        |_| CollectiveSpec {
            kind: CollectiveKind::AllReduce,
            op: Operator::Sum,
            dtype: DataType::Int32,
            count,
        },
        |r| i32s(&input_i32(r, count, 0)),
    );
    net.run(Duration::from_secs(60));
    let mut failed = false;
    if let Node::Switch(e) = &mut net.nodes[2] {
        while let Some(ev) = e.poll_event() {
            if let SwitchEvent::ConnectionFailed { port, psn, .. } = ev {
                assert!(port.starts_with('p'));
                let _ = psn;
                failed = true;
            }
        }
    }
    assert!(failed, "leaf 2 reports its dead uplink");
    for r in 0..4 {
        assert!(matches!(net.host(r).result, Some(Err(_))), "rank {r}: {:?}", net.host(r).result);
    }
}

#[test]
fn arp_for_port_ip_is_answered() {
    let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
    let net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
    let Node::Switch(e) = net.nodes.into_iter().next().unwrap() else { unreachable!() };
    let mut e = *e;
    let mut frame = [0u8; 42];
    let req = ArpRepr {
        operation: ArpOperation::Request,
        source_hardware_addr: mac_of(host_ip(1)),
        source_protocol_addr: host_ip(1),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: port_ip(0, 1),
    };
    EthernetRepr {
        src_addr: mac_of(host_ip(1)),
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: EtherType::Arp,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut frame[..]));
    req.emit(&mut ArpPacket::new_unchecked(&mut frame[14..]));
    e.handle_frame(Time::ZERO, 1, &frame);
    let mut buf = [0u8; 128];
    let t = e.poll_transmit(Time::ZERO, &mut buf).unwrap();
    assert_eq!(t.port, 1);
    let reply = ArpRepr::parse(&ArpPacket::new_checked(&buf[14..42]).unwrap()).unwrap();
    assert_eq!(reply.operation, ArpOperation::Reply);
    assert_eq!(reply.source_hardware_addr, mac_of(port_ip(0, 1)));
    // Garbage is counted, never a panic.
    e.handle_frame(Time::ZERO, 0, &[0u8; 10]);
    e.handle_frame(Time::ZERO, 5, &frame);
    let c = e.counters();
    assert_eq!(c.drops.malformed, 1);
    assert_eq!(c.drops.bad_port, 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn handle_frame_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), port in 0usize..3) {
        let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
        let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
        if let Node::Switch(e) = &mut net.nodes[0] {
            e.handle_frame(Time::ZERO, port, &bytes);
            let mut buf = [0u8; 512];
            while e.poll_transmit(Time::ZERO, &mut buf).is_some() {}
        }
    }
}

#[test]
fn reject_bad_rules() {
    let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
    let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
    let Node::Switch(e) = &mut net.nodes[0] else { unreachable!() };
    let rules = SwitchRules {
        comm_id: 9,
        switch_id: 0,
        world_size: 1,
        mtu: 256,
        window: 4,
        slots: 8,
        parent: None,
        connections: vec![],
    };
    let mut bad = rules.clone();
    bad.slots = 7;
    assert!(matches!(e.install(&bad, Time::ZERO), Err(EngineError::InvalidRules { .. })));
    let mut bad = rules.clone();
    bad.switch_id = 3;
    assert!(matches!(e.install(&bad, Time::ZERO), Err(EngineError::WrongSwitch { .. })));
    assert!(matches!(e.remove(42), Err(EngineError::UnknownComm(42))));
}

/// Every collective kind back to back under heavy loss, over several seeds and window
/// sizes: results exact, every rank completes, memory stays bounded.
#[test]
fn heavy_loss_mixed_collectives_many_seeds() {
    let seeds: u64 = std::env::var("INC_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let loss: f64 = std::env::var("INC_LOSS").ok().and_then(|s| s.parse().ok()).unwrap_or(0.10);
    for seed in 0..seeds {
        let mut t = tree_1_2_4();
        t.window = [2, 4, 8, 16][seed as usize % 4];
        t.mtu = [256, 512, 1024][seed as usize % 3];
        let mut net = build(&t, SwitchEngineConfig::default(), loss, 100 + seed);
        let rounds: u32 =
            std::env::var("INC_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(12);
        for round in 0..rounds {
            let count = 50 + (seed * 997 + u64::from(round) * 331) % 3000;
            let root = ((seed + u64::from(round)) % 4) as u16;
            let kind = match (seed + u64::from(round)) % 4 {
                0 => CollectiveKind::AllReduce,
                1 => CollectiveKind::Reduce { root },
                2 => CollectiveKind::Broadcast { root },
                _ => CollectiveKind::Barrier,
            };
            let op = [Operator::Sum, Operator::Max, Operator::Min][round as usize % 3];
            let count = if kind == CollectiveKind::Barrier { 0 } else { count };
            net.start(
                |_| CollectiveSpec { kind, op, dtype: DataType::Int32, count },
                |r| i32s(&input_i32(r, count, round)),
            );
            net.run(Duration::from_secs(120));
            let fold = |i: usize| {
                let v = (0..4).map(|r| input_i32(r, count, round)[i]);
                match op {
                    Operator::Sum => v.fold(0i32, |a, b| a.wrapping_add(b)),
                    Operator::Max => v.max().unwrap(),
                    _ => v.min().unwrap(),
                }
            };
            let reduced: Vec<i32> = (0..count as usize).map(fold).collect();
            for r in 0..4u16 {
                if net.host(r as usize).result != Some(Ok(())) {
                    for sw in 0..3 {
                        let c = net.switch(sw).counters();
                        eprintln!(
                            "switch {sw}: started {} completed {} failed {}",
                            c.comms[0].collectives_started,
                            c.comms[0].collectives_completed,
                            c.comms[0].collectives_failed
                        );
                    }
                }
                let h = net.host(r as usize);
                assert_eq!(h.result, Some(Ok(())), "seed {seed} round {round} {kind:?} rank {r}");
                let out = from_i32s(&h.output);
                match kind {
                    CollectiveKind::AllReduce => {
                        assert_eq!(out, reduced, "seed {seed} round {round}")
                    }
                    CollectiveKind::Reduce { root } if root == r => {
                        assert_eq!(out, reduced, "seed {seed} round {round}")
                    }
                    CollectiveKind::Broadcast { root } if root != r => {
                        assert_eq!(
                            out,
                            input_i32(root, count, round),
                            "seed {seed} round {round} rank {r}"
                        )
                    }
                    _ => {}
                }
            }
        }
        net.settle();
        for s in 0..3 {
            let c = net.switch(s).counters();
            assert_eq!(c.comms[0].protocol_errors, 0, "seed {seed} switch {s}: {c:?}");
            assert_eq!(c.comms[0].collectives_failed, 0);
            // Every collective's state was released.
            assert_eq!(
                c.comms[0].collectives_completed, c.comms[0].collectives_started,
                "seed {seed} switch {s}"
            );
        }
    }
}

/// Engine cost, not a correctness test: `cargo test -p inc-switch-engine --release --
/// --ignored throughput --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let t = TreeSpec {
        parents: vec![None, Some(0), Some(0)],
        hosts: vec![1, 1, 2, 2],
        mtu: 1024,
        window: 64,
    };
    let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
    net.latency = 20_000;
    let count = 4u64 << 20; // 16 MiB per rank
    let input: Vec<Vec<u8>> = (0..4).map(|r| i32s(&input_i32(r, count, 0))).collect();
    let start = std::time::Instant::now();
    net.start(
        |_| CollectiveSpec {
            kind: CollectiveKind::AllReduce,
            op: Operator::Sum,
            dtype: DataType::Int32,
            count,
        },
        |r| input[r as usize].clone(),
    );
    net.run(Duration::from_secs(600));
    let wall = start.elapsed();
    for r in 0..4 {
        assert_eq!(net.host(r).result, Some(Ok(())));
    }
    let frames: u64 = (0..3).map(|s| net.switch(s).counters().rx_frames).sum();
    let sim = Duration::from_nanos(net.now);
    eprintln!(
        "16 MiB x 4 ranks AllReduce: {frames} switch rx frames in {wall:?} wall ({:.0} frames/s across switches+hosts+harness), simulated {sim:?} ({:.2} Gbit/s algbw at 20 us links)",
        frames as f64 / wall.as_secs_f64(),
        (count * 4 * 8) as f64 / sim.as_secs_f64() / 1e9
    );
}

/// Three levels, uneven fan-out, a host on an inner switch, a leaf with a single host,
/// and a one-rank communicator.
#[test]
fn deep_uneven_trees_and_single_rank() {
    let trees = [
        TreeSpec {
            parents: vec![None, Some(0), Some(0), Some(1), Some(1), Some(2)],
            hosts: vec![3, 3, 4, 1, 5, 2, 5],
            mtu: 512,
            window: 4,
        },
        TreeSpec { parents: vec![None, Some(0), Some(1)], hosts: vec![2, 0], mtu: 256, window: 8 },
        TreeSpec { parents: vec![None], hosts: vec![0], mtu: 256, window: 2 },
        // Fan-in above 64: masks span several words.
        TreeSpec {
            parents: vec![None, Some(0)],
            hosts: [vec![0; 70], vec![1; 3]].concat(),
            mtu: 256,
            window: 4,
        },
    ];
    for (ti, t) in trees.iter().enumerate() {
        let world = t.hosts.len() as u16;
        let mut net = build(t, SwitchEngineConfig::default(), 0.05, 40 + ti as u64);
        for round in 0..2 * u32::from(world).min(4) {
            let count = 100 + u64::from(round) * 77;
            let root = (round % u32::from(world)) as u16;
            let kind = match round % 3 {
                0 => CollectiveKind::AllReduce,
                1 => CollectiveKind::Reduce { root },
                _ => CollectiveKind::Broadcast { root },
            };
            net.start(
                |_| CollectiveSpec { kind, op: Operator::Sum, dtype: DataType::Int32, count },
                |r| i32s(&input_i32(r, count, round)),
            );
            net.run(Duration::from_secs(120));
            let sum: Vec<i32> = (0..count as usize)
                .map(|i| {
                    (0..world).fold(0i32, |a, r| a.wrapping_add(input_i32(r, count, round)[i]))
                })
                .collect();
            for r in 0..world {
                let h = net.host(r as usize);
                assert_eq!(h.result, Some(Ok(())), "tree {ti} round {round} {kind:?} rank {r}");
                let out = from_i32s(&h.output);
                match kind {
                    CollectiveKind::AllReduce => assert_eq!(out, sum),
                    CollectiveKind::Reduce { root } if root == r => assert_eq!(out, sum),
                    CollectiveKind::Broadcast { root } if root != r => {
                        assert_eq!(out, input_i32(root, count, round))
                    }
                    _ => {}
                }
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    /// Aggregation under arbitrary loss, duplication, window, MTU, operator and type:
    /// every rank gets the reference result (INT32 exact; FLOAT32 bit-identical on all
    /// ranks and within rounding of the reference).
    #[test]
    fn aggregation_matches_reference(
        seed in 0u64..1_000_000,
        loss in 0.0f64..0.2,
        dup in 0.0f64..0.1,
        window in 1u32..12,
        mtu_i in 0usize..3,
        count in 0u64..2_000,
        op_i in 0usize..3,
        float in proptest::prelude::any::<bool>(),
    ) {
        let mut t = tree_1_2_4();
        t.window = window;
        t.mtu = [256, 512, 1024][mtu_i];
        let mut net = build(&t, SwitchEngineConfig::default(), loss, seed);
        net.dup = dup;
        let op = [Operator::Sum, Operator::Max, Operator::Min][op_i];
        let dtype = if float { DataType::Float32 } else { DataType::Int32 };
        let value = |r: u16, i: u64| -> u32 {
            let x = input_i32(r, count, seed as u32)[i as usize];
            if float { ((x % 100_000) as f32 / 7.0).to_bits() } else { x as u32 }
        };
        let input = |r: u16| -> Vec<u8> { (0..count).flat_map(|i| value(r, i).to_ne_bytes()).collect() };
        net.start(|_| CollectiveSpec { kind: CollectiveKind::AllReduce, op, dtype, count }, input);
        net.run(Duration::from_secs(300));
        let out0 = net.host(0).output.clone();
        for r in 0..4 {
            proptest::prop_assert_eq!(&net.host(r).result, &Some(Ok(())));
            proptest::prop_assert_eq!(&net.host(r).output, &out0);
        }
        for i in 0..count {
            let got = u32::from_ne_bytes(out0[i as usize * 4..i as usize * 4 + 4].try_into().unwrap());
            if float {
                let vals: Vec<f32> = (0..4).map(|r| f32::from_bits(value(r, i))).collect();
                let want = match op {
                    Operator::Sum => vals.iter().sum::<f32>(),
                    Operator::Max => vals.iter().copied().fold(f32::MIN, f32::max),
                    _ => vals.iter().copied().fold(f32::MAX, f32::min),
                };
                let got = f32::from_bits(got);
                proptest::prop_assert!((got - want).abs() <= 1e-3 * want.abs().max(1.0), "elem {} got {} want {}", i, got, want);
            } else {
                let vals = (0..4).map(|r| value(r, i) as i32);
                let want = match op {
                    Operator::Sum => vals.fold(0i32, |a, b| a.wrapping_add(b)),
                    Operator::Max => vals.max().unwrap(),
                    _ => vals.min().unwrap(),
                };
                proptest::prop_assert_eq!(got as i32, want, "elem {}", i);
            }
        }
    }
}

/// Reduce non-roots complete only once the root rank has the result: when the root host
/// never acknowledges its results, they must not report success.
#[test]
fn reduce_completion_is_end_to_end() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.0, 21);
    let count = 600u64;
    let spec = |_| CollectiveSpec {
        kind: CollectiveKind::Reduce { root: 2 },
        op: Operator::Sum,
        dtype: DataType::Int32,
        count,
    };
    net.start(spec, |r| i32s(&input_i32(r, count, 0)));
    net.run(Duration::from_secs(30));
    for r in 0..4 {
        assert_eq!(net.host(r).result, Some(Ok(())), "healthy run, rank {r}");
    }
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.0, 21);
    net.drop_acks_from = Some(net.ranks[2]);
    net.start(spec, |r| i32s(&input_i32(r, count, 0)));
    net.run(Duration::from_secs(30));
    for r in [0, 1, 3] {
        assert!(matches!(net.host(r).result, Some(Err(_))), "rank {r}: {:?}", net.host(r).result);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// A peer on a valid RC connection sending arbitrary messages (valid PSNs, random
    /// immediates, control headers with random fields, random payload sizes): the
    /// switch never panics and keeps answering.
    #[test]
    fn arbitrary_messages_on_a_valid_connection_never_panic(
        msgs in proptest::collection::vec(
            (proptest::prelude::any::<Option<u32>>(), 0u8..4, proptest::prelude::any::<[u64; 3]>(), 0usize..300),
            1..40,
        ),
    ) {
        let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
        let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
        // Host 0's side of its connection, as rules and endpoint say.
        let Node::Host(h) = &net.nodes[1] else { unreachable!() };
        let c = h.engine.config().clone();
        let Node::Switch(sw) = &mut net.nodes[0] else { unreachable!() };
        let addr = inc_protocol::RcAddressing {
            local_mac: c.local_mac,
            local_ip: c.local_ip,
            local_udp_port: c.local_udp_port,
            local_qpn: c.local_qpn,
            peer_mac: Some(c.switch_mac),
            peer_ip: c.switch_ip,
            peer_udp_port: 4791,
            peer_qpn: c.switch_qpn,
        };
        let mut psn = inc_wire::Psn::new(c.local_start_psn);
        let mut frame = vec![0u8; 2048];
        let mut out = vec![0u8; 2048];
        let op = inc_protocol::coll::CollOp { primitive: inc_wire::Primitive::AllReduce, operator: Operator::Sum, datatype: DataType::Int32, root: 0xFFFF };
        for (i, (imm, kind, f, len)) in msgs.into_iter().enumerate() {
            let mut payload = vec![0x5Au8; len];
            let imm = match (imm, kind) {
                (Some(x), 0) => Some(x),
                (_, 1) => {
                    let m = inc_protocol::coll::CtrlMsg::Start { seq: (f[0] % 3) as u32, count: f[1] % 1000, start_pos: f[2] % 50, chunks: f[1] % 7, rank: 0 };
                    payload = m.to_bytes().to_vec();
                    Some(op.imm(m.kind()))
                }
                (_, 2) => {
                    let m = inc_protocol::coll::CtrlMsg::Progress { seq: (f[0] % 3) as u32, completed: f[1] };
                    payload = m.to_bytes().to_vec();
                    Some(op.imm(m.kind()))
                }
                _ => None,
            };
            let n = addr.emit_send(&mut frame, psn, imm, &payload).unwrap();
            psn = psn.next();
            let now = Time::from_nanos(i as u64 * 1000);
            sw.handle_frame(now, 0, &frame[..n]);
            sw.handle_timeout(now);
            while sw.poll_transmit(now, &mut out).is_some() {}
        }
    }
}
