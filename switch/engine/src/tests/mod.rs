//! A small in-crate network: switches and `inccl-engine` hosts joined by links with
//! latency and seeded loss, to check the engines end to end before (and besides) the
//! full simulation in `tests/`.

use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::time::Duration;

use inc_ctrl_proto::{udp_port_for_qpn, ConnectionRule, Peer, SwitchRules};
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
    EthernetAddress::from_ipv4(ip)
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
            local_mac: EthernetAddress::from_ipv4(port_ip(s, p)),
            local_qpn: sw_qpn,
            local_udp_port: udp_port_for_qpn(sw_qpn),
            local_start_psn: sw_psn,
            peer: Peer::Host { rank },
            peer_ip: host_ip(rank),
            peer_mac: if r % 2 == 0 {
                Some(EthernetAddress::from_ipv4(host_ip(rank)))
            } else {
                None
            },
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
            local_mac: EthernetAddress::from_ipv4(port_ip(c, pc)),
            local_qpn: qc,
            local_udp_port: udp_port_for_qpn(qc),
            local_start_psn: psn_c,
            peer: Peer::Switch { switch_id: pa as u32 },
            peer_ip: port_ip(pa, pp),
            peer_mac: Some(EthernetAddress::from_ipv4(port_ip(pa, pp))),
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
            local_mac: EthernetAddress::from_ipv4(port_ip(pa, pp)),
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
            let world = self.ranks.len();
            let h = self.host(r);
            let block = s.count as usize * s.dtype.size();
            h.input = input(r as u16);
            if s.kind == CollectiveKind::AllGather {
                // The caller's share of an out-of-place AllGather: its own block.
                h.output = vec![0xEE; block * world];
                h.output[r * block..][..block].copy_from_slice(&h.input);
            } else {
                h.output = vec![0xEE; block];
            }
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

/// Runs an int32 sum `kind` of `count` elements per rank (`input_i32` of `round`).
fn run_int32_sum(net: &mut Net, kind: CollectiveKind, count: u64, round: u32) {
    let spec = |_| CollectiveSpec { kind, op: Operator::Sum, dtype: DataType::Int32, count };
    net.start(spec, |r| i32s(&input_i32(r, count, round)));
    net.run(Duration::from_secs(30));
}

fn allreduce(net: &mut Net, world: u16, count: u64, round: u32) {
    run_int32_sum(net, CollectiveKind::AllReduce, count, round);
    check_allreduce(net, world, count, round);
}

/// An int32 AllGather of `count` elements per rank, checked exact on every rank.
fn allgather(net: &mut Net, world: u16, count: u64, round: u32) {
    run_int32_sum(net, CollectiveKind::AllGather, count, round);
    let expect: Vec<i32> = (0..world).flat_map(|q| input_i32(q, count, round)).collect();
    for r in 0..world as usize {
        let h = net.host(r);
        assert_eq!(h.result, Some(Ok(())), "rank {r}");
        assert_eq!(from_i32s(&h.output), expect, "allgather rank {r} count {count}");
    }
}

mod collectives;
mod datatypes;
mod faults;
mod robustness;
mod throughput;
