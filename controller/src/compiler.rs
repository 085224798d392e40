//! Rule compiler: topology + communicator -> per-switch rules and per-rank endpoints.
//!
//! Pure code: no I/O. The [`Allocator`] carries switch resources (QPNs, slots, switch
//! memory, and each host's share of it) across communicators so that several
//! communicators share switches without colliding or exceeding a switch's limits; a
//! communicator's resources are released with [`Allocator::release`].
//!
//! Switch memory is everything a communicator may allocate in a switch, counted by
//! [`CommMemory`]: its slot pool and the send queue of every connection at its fullest.
//! It is charged against the switch's `max_slot_memory` and, for the host of rank 0
//! (the host that asks for the communicator), against that host's share
//! `max_host_memory` of the switch.
//!
//! Switch ports use the MACs their switches reported at registration ([`PortMacs`],
//! given to [`compile_with_macs`]) where known, else the topology's: on a Docker
//! overlay, frames cross nodes only to the MACs Docker gave the interfaces.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use inc_ctrl_proto::{
    ipv4_gid, udp_port_for_qpn, ConnectionRule, EthernetAddress, HostEndpoint, Peer, RankEndpoint,
    SwitchRules, MAX_24BIT, MAX_WINDOW, ROCE_UDP_PORT, VALID_MTUS,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use inc_topology::{CommMemory, Switch, Topology};

/// MACs switches reported for their ports, by switch id and port name. A port not in
/// it has its topology MAC.
pub type PortMacs = HashMap<u32, BTreeMap<String, EthernetAddress>>;

/// The MAC of port `port` of `sw`: the reported one, else the topology's.
pub fn port_mac(macs: &PortMacs, sw: &Switch, port: usize) -> EthernetAddress {
    let p = &sw.ports[port];
    macs.get(&sw.id).and_then(|m| m.get(&p.name)).copied().unwrap_or(p.mac)
}

/// First switch-side QPN tried on a fresh switch (QPN 0 and 1 are special in IB).
const FIRST_QPN: u32 = 0x100;

/// A communicator to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommunicatorSpec {
    /// Controller-unique id.
    pub comm_id: u32,
    /// One entry per rank, any order; ranks must be exactly 0..n.
    pub ranks: Vec<RankEndpoint>,
    /// Payload size override.
    pub mtu: Option<u16>,
    /// Window override.
    pub window: Option<u32>,
}

/// Why a communicator cannot be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// No ranks.
    #[error("communicator has no ranks")]
    Empty,
    /// Too many ranks (0xFFFF is the broadcast rank).
    #[error("communicator has {0} ranks; at most 65535 are supported")]
    TooManyRanks(usize),
    /// Ranks are not exactly 0..n.
    #[error("rank {rank} is missing or duplicated (ranks must be exactly 0..{world_size})")]
    BadRanks {
        /// Offending rank.
        rank: u16,
        /// Number of ranks.
        world_size: usize,
    },
    /// A rank's IP is not a host of the topology.
    #[error("rank {rank}: host IP {ip} is not a host of the topology")]
    UnknownHost {
        /// Rank.
        rank: u16,
        /// IP given.
        ip: Ipv4Addr,
    },
    /// Two ranks on one host.
    #[error("ranks {first} and {second} both use host {ip}; one rank per host is supported")]
    DuplicateHost {
        /// First rank.
        first: u16,
        /// Second rank.
        second: u16,
        /// Host IP.
        ip: Ipv4Addr,
    },
    /// Host QPN or PSN out of range.
    #[error("rank {rank}: {what} {value:#x} is invalid (24-bit, QPN not 0 or 1)")]
    BadHostParam {
        /// Rank.
        rank: u16,
        /// Field.
        what: &'static str,
        /// Value.
        value: u32,
    },
    /// Unsupported payload size.
    #[error("mtu {0} is not one of {VALID_MTUS:?}")]
    BadMtu(u16),
    /// Window out of range.
    #[error("window {0} must be 1..={MAX_WINDOW}")]
    BadWindow(u32),
    /// A communicator with this id already holds resources.
    #[error("communicator {0} already exists")]
    DuplicateComm(u32),
    /// No free QPN on a switch.
    #[error("switch {0}: no free QPN")]
    QpnExhausted(String),
    /// A switch's limit would be exceeded; nothing was allocated.
    #[error("switch {switch}: {asked} exceeds its limit: {limit}")]
    Limit {
        /// Switch name.
        switch: String,
        /// What the communicator needs, e.g. `window 4096`.
        asked: String,
        /// The limit and what is left of it, e.g. `max_window 1024`.
        limit: String,
    },
}

/// Result of compiling one communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// Communicator id.
    pub comm_id: u32,
    /// Topology id of the spanning tree's root switch.
    pub root_switch: u32,
    /// Rules of every involved switch, in tree order (root first, breadth-first).
    pub rules: Vec<SwitchRules>,
    /// Endpoints by rank.
    pub endpoints: Vec<HostEndpoint>,
}

#[derive(Debug, Default, Clone)]
struct SwitchAlloc {
    used: HashSet<u32>,
    next: u32,
    slots: u64,
    slot_memory: u64,
    /// Switch memory charged to each host (topology index) as rank 0.
    by_host: HashMap<usize, u64>,
}

impl SwitchAlloc {
    fn take(&mut self, slots: u64, memory: u64, host: Option<usize>) {
        self.slots += slots;
        self.slot_memory += memory;
        if let Some(h) = host {
            *self.by_host.entry(h).or_default() += memory;
        }
    }

    fn give_back(&mut self, slots: u64, memory: u64, host: Option<usize>) {
        self.slots -= slots;
        self.slot_memory -= memory;
        if let Some(h) = host {
            if let Some(m) = self.by_host.get_mut(&h) {
                *m -= memory;
                if *m == 0 {
                    self.by_host.remove(&h);
                }
            }
        }
    }

    fn host_memory(&self, host: usize) -> u64 {
        self.by_host.get(&host).copied().unwrap_or(0)
    }
}

/// What a communicator holds on one switch.
#[derive(Debug, Clone)]
struct Holding {
    switch_id: u32,
    qpns: Vec<u32>,
    slots: u64,
    slot_memory: u64,
    /// The host charged (rank 0's), if known.
    host: Option<usize>,
}

#[derive(Debug, Clone, Default)]
struct CommAlloc {
    parts: Vec<Holding>,
}

/// One allocation of the compilation in progress.
#[derive(Debug, Clone)]
enum Taken {
    /// A QPN, and the switch's probe position before it.
    Qpn { switch_id: u32, qpn: u32, next: u32 },
    /// Slots and switch memory, charged to a host.
    Slots { switch_id: u32, slots: u64, memory: u64, host: Option<usize> },
}

/// Switch resources held by live communicators.
#[derive(Debug, Default, Clone)]
pub struct Allocator {
    switches: HashMap<u32, SwitchAlloc>,
    comms: HashMap<u32, CommAlloc>,
    /// What the compilation in progress took, given back if it fails (cheaper than
    /// compiling against a copy: that costs every live communicator per compilation).
    journal: Vec<Taken>,
}

impl Allocator {
    /// Empty allocator.
    pub fn new() -> Self {
        Self::default()
    }

    fn alloc_qpn(&mut self, switch_id: u32, name: &str) -> Result<u32, CompileError> {
        let sa = self.switches.entry(switch_id).or_default();
        let before = sa.next;
        if sa.next < 2 {
            sa.next = FIRST_QPN;
        }
        // Live QPNs are few compared to 2^24, so a linear probe ends quickly.
        for _ in 0..=MAX_24BIT {
            let q = sa.next;
            sa.next = if q >= MAX_24BIT { 2 } else { q + 1 };
            if sa.used.insert(q) {
                self.journal.push(Taken::Qpn { switch_id, qpn: q, next: before });
                return Ok(q);
            }
        }
        Err(CompileError::QpnExhausted(name.to_string()))
    }

    /// Check a switch's limits for a communicator with `connections` connections on
    /// it, asked for by `host` (rank 0's, a topology index), then take its slots and
    /// switch memory.
    fn alloc_slots(
        &mut self,
        topo: &Topology,
        sw: &Switch,
        (window, mtu): (u32, u16),
        connections: usize,
        host: usize,
    ) -> Result<(u64, u64), CompileError> {
        let limit = |asked: String, limit: String| CompileError::Limit {
            switch: sw.name.clone(),
            asked,
            limit,
        };
        if window > sw.max_window {
            return Err(limit(format!("window {window}"), format!("max_window {}", sw.max_window)));
        }
        if mtu > sw.max_mtu {
            return Err(limit(format!("mtu {mtu}"), format!("max_mtu {}", sw.max_mtu)));
        }
        let sa = self.switches.entry(sw.id).or_default();
        let slots = 2 * u64::from(window);
        let memory = CommMemory::new(mtu, window, slots, connections);
        let free_slots = u64::from(sw.max_slots).saturating_sub(sa.slots);
        if slots > free_slots {
            return Err(limit(
                format!("{slots} slots (2 x window {window})"),
                format!("{free_slots} of max_slots {} free", sw.max_slots),
            ));
        }
        let asked =
            || format!("{memory} for window {window}, mtu {mtu} and {connections} connection(s)");
        let free_memory = sw.max_slot_memory.saturating_sub(sa.slot_memory);
        if memory.total() > free_memory {
            return Err(limit(
                asked(),
                format!("{free_memory} of max_slot_memory {} free", sw.max_slot_memory),
            ));
        }
        let free_share = sw.max_host_memory.saturating_sub(sa.host_memory(host));
        if memory.total() > free_share {
            return Err(limit(
                asked(),
                format!(
                    "{free_share} of host {}'s share max_host_memory {} free",
                    topo.hosts[host].name, sw.max_host_memory
                ),
            ));
        }
        let memory = memory.total();
        sa.take(slots, memory, Some(host));
        self.journal.push(Taken::Slots { switch_id: sw.id, slots, memory, host: Some(host) });
        Ok((slots, memory))
    }

    /// Give back what the failed compilation took, newest first.
    fn undo(&mut self) {
        while let Some(t) = self.journal.pop() {
            match t {
                Taken::Qpn { switch_id, qpn, next } => {
                    let sa = self.switches.get_mut(&switch_id).expect("allocated");
                    sa.used.remove(&qpn);
                    sa.next = next;
                }
                Taken::Slots { switch_id, slots, memory, host } => {
                    let sa = self.switches.get_mut(&switch_id).expect("allocated");
                    sa.give_back(slots, memory, host);
                }
            }
        }
    }

    /// Release every resource of a communicator (no-op if unknown).
    pub fn release(&mut self, comm_id: u32) {
        let Some(c) = self.comms.remove(&comm_id) else { return };
        for h in c.parts {
            if let Some(sa) = self.switches.get_mut(&h.switch_id) {
                for q in h.qpns {
                    sa.used.remove(&q);
                }
                sa.give_back(h.slots, h.slot_memory, h.host);
            }
        }
    }

    /// Account for what a communicator created by an earlier controller holds on one
    /// switch, from the rules that switch reports: its QPNs, slots and switch memory
    /// ([`CommMemory`], as [`compile`] counts it; charged to rank 0's host when its
    /// connection is on this switch, the only host the rules name for sure: the
    /// share is not checked, what a switch holds is kept). Refused, with nothing taken,
    /// when the rules do not fit the topology (unknown switch or port, another port
    /// address), use a QPN that is taken, exceed the switch's limits, or when this
    /// communicator already holds a part on the switch.
    pub fn adopt(&mut self, topo: &Topology, rules: &SwitchRules) -> Result<(), String> {
        let sw = topo
            .switch_by_id(rules.switch_id)
            .map(|i| &topo.switches[i])
            .ok_or_else(|| format!("switch id {} is not in the topology", rules.switch_id))?;
        if !VALID_MTUS.contains(&rules.mtu) || rules.window == 0 || rules.window > MAX_WINDOW {
            return Err(format!("mtu {} / window {} out of range", rules.mtu, rules.window));
        }
        if self
            .comms
            .get(&rules.comm_id)
            .is_some_and(|c| c.parts.iter().any(|h| h.switch_id == rules.switch_id))
        {
            return Err(format!("already holds a part on switch {}", sw.name));
        }
        let sa = self.switches.entry(sw.id).or_default();
        let mut qpns = Vec::with_capacity(rules.connections.len());
        for c in &rules.connections {
            let Some(port) = sw.ports.iter().find(|p| p.name == c.port) else {
                return Err(format!("switch {} has no port `{}`", sw.name, c.port));
            };
            if port.addr.ip != c.local_ip {
                return Err(format!(
                    "port {} of switch {} has address {}, the rules say {}",
                    c.port, sw.name, port.addr.ip, c.local_ip
                ));
            }
            let q = c.local_qpn;
            if !(2..=MAX_24BIT).contains(&q) || sa.used.contains(&q) || qpns.contains(&q) {
                return Err(format!("QPN {q:#x} on switch {} is taken or invalid", sw.name));
            }
            qpns.push(q);
        }
        let slots = u64::from(rules.slots);
        let memory = CommMemory::of_rules(rules).total();
        if sa.slots + slots > u64::from(sw.max_slots)
            || sa.slot_memory + memory > sw.max_slot_memory
        {
            return Err(format!(
                "{slots} slots / {memory} bytes of switch memory exceed what switch {} has free (max_slots {}, max_slot_memory {})",
                sw.name, sw.max_slots, sw.max_slot_memory
            ));
        }
        let host = rules
            .connections
            .iter()
            .find(|c| matches!(c.peer, Peer::Host { rank: 0 }))
            .and_then(|c| topo.host_by_ip(c.peer_ip));
        sa.used.extend(qpns.iter().copied());
        sa.take(slots, memory, host);
        let part = Holding { switch_id: sw.id, qpns, slots, slot_memory: memory, host };
        self.comms.entry(rules.comm_id).or_default().parts.push(part);
        Ok(())
    }

    /// QPNs in use on a switch.
    pub fn live_qpns(&self, switch_id: u32) -> usize {
        self.switches.get(&switch_id).map_or(0, |s| s.used.len())
    }

    /// Slots in use on a switch.
    pub fn live_slots(&self, switch_id: u32) -> u64 {
        self.switches.get(&switch_id).map_or(0, |s| s.slots)
    }

    /// Switch memory accounted on a switch ([`CommMemory`] of every live part).
    pub fn live_memory(&self, switch_id: u32) -> u64 {
        self.switches.get(&switch_id).map_or(0, |s| s.slot_memory)
    }

    /// Switch memory charged on a switch to a host (topology index) as rank 0.
    pub fn host_memory(&self, switch_id: u32, host: usize) -> u64 {
        self.switches.get(&switch_id).map_or(0, |s| s.host_memory(host))
    }

    /// Whether a communicator holds resources.
    pub fn has_comm(&self, comm_id: u32) -> bool {
        self.comms.contains_key(&comm_id)
    }
}

/// Draw a 24-bit start PSN; one in four lands just below the wrap so that PSN
/// wrap-around is exercised early in every run.
fn draw_psn(rng: &mut ChaCha8Rng, window: u32) -> u32 {
    if rng.gen_ratio(1, 4) {
        MAX_24BIT - rng.gen_range(0..window.saturating_mul(4).clamp(1, 1 << 20))
    } else {
        rng.gen_range(0..=MAX_24BIT)
    }
}

/// Compile one communicator with the topology's MACs. `seed` makes start PSNs
/// deterministic (golden tests); the service passes a per-process random seed.
pub fn compile(
    topo: &Topology,
    spec: &CommunicatorSpec,
    alloc: &mut Allocator,
    seed: u64,
) -> Result<Compiled, CompileError> {
    compile_with_macs(topo, spec, alloc, seed, &PortMacs::new())
}

/// [`compile`], with the MACs switches reported for their ports (`macs`) in place of
/// the topology's: on both ends of every switch link (`local_mac`, `peer_mac`), on
/// host ports and in the hosts' endpoints (`switch_mac`).
pub fn compile_with_macs(
    topo: &Topology,
    spec: &CommunicatorSpec,
    alloc: &mut Allocator,
    seed: u64,
    macs: &PortMacs,
) -> Result<Compiled, CompileError> {
    if alloc.has_comm(spec.comm_id) {
        return Err(CompileError::DuplicateComm(spec.comm_id));
    }
    // Allocations stand only when the whole communicator compiled.
    alloc.journal.clear();
    let out = compile_inner(topo, spec, alloc, seed, macs);
    match out {
        Ok(_) => alloc.journal.clear(),
        Err(_) => alloc.undo(),
    }
    out
}

fn compile_inner(
    topo: &Topology,
    spec: &CommunicatorSpec,
    alloc: &mut Allocator,
    seed: u64,
    macs: &PortMacs,
) -> Result<Compiled, CompileError> {
    let n = spec.ranks.len();
    if n == 0 {
        return Err(CompileError::Empty);
    }
    if n > 0xFFFF {
        return Err(CompileError::TooManyRanks(n));
    }
    let mtu = spec.mtu.unwrap_or(topo.defaults.mtu);
    if !VALID_MTUS.contains(&mtu) {
        return Err(CompileError::BadMtu(mtu));
    }
    let window = spec.window.unwrap_or(topo.defaults.window);
    if window == 0 || window > MAX_WINDOW {
        return Err(CompileError::BadWindow(window));
    }
    // Ranks -> (endpoint, host index).
    let mut by_rank: Vec<Option<&RankEndpoint>> = vec![None; n];
    for r in &spec.ranks {
        let slot = by_rank.get_mut(usize::from(r.rank));
        match slot {
            Some(s @ None) => *s = Some(r),
            _ => return Err(CompileError::BadRanks { rank: r.rank, world_size: n }),
        }
    }
    let mut ranks: Vec<&RankEndpoint> = Vec::with_capacity(n);
    for (i, r) in by_rank.into_iter().enumerate() {
        ranks.push(r.ok_or(CompileError::BadRanks { rank: i as u16, world_size: n })?);
    }
    let mut host_of_rank = Vec::with_capacity(n);
    let mut seen: HashMap<usize, u16> = HashMap::new();
    for r in &ranks {
        let h =
            topo.host_by_ip(r.ip).ok_or(CompileError::UnknownHost { rank: r.rank, ip: r.ip })?;
        if let Some(first) = seen.insert(h, r.rank) {
            return Err(CompileError::DuplicateHost { first, second: r.rank, ip: r.ip });
        }
        if r.qpn < 2 || r.qpn > MAX_24BIT {
            return Err(CompileError::BadHostParam { rank: r.rank, what: "qpn", value: r.qpn });
        }
        if r.start_psn > MAX_24BIT {
            return Err(CompileError::BadHostParam {
                rank: r.rank,
                what: "start_psn",
                value: r.start_psn,
            });
        }
        host_of_rank.push(h);
    }

    // Ranks below each switch (sorted, since ranks are visited in order).
    let ns = topo.switches.len();
    let mut below: Vec<Vec<u16>> = vec![Vec::new(); ns];
    for (rank, &h) in host_of_rank.iter().enumerate() {
        let mut s = topo.hosts[h].attach.switch;
        loop {
            below[s].push(rank as u16);
            match topo.tree[s].parent {
                Some((p, _, _)) => s = p,
                None => break,
            }
        }
    }
    // The spanning tree of exactly these hosts is rooted at their lowest common
    // ancestor: walk down while a single child holds every rank.
    let mut lca = topo.root;
    loop {
        let direct = topo.tree[lca].hosts.iter().any(|h| seen.contains_key(h));
        let busy: Vec<usize> =
            topo.tree[lca].children.iter().map(|c| c.0).filter(|&c| !below[c].is_empty()).collect();
        if !direct && busy.len() == 1 {
            lca = busy[0];
        } else {
            break;
        }
    }

    let mut rng = ChaCha8Rng::seed_from_u64(
        seed ^ u64::from(spec.comm_id).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let mut record = CommAlloc::default();
    // Pre-allocated parent-side connection of each switch, filled when its parent is
    // processed so both ends agree.
    let mut up_conn: HashMap<usize, ConnectionRule> = HashMap::new();
    let mut rules = Vec::new();
    let mut endpoints: Vec<Option<HostEndpoint>> = vec![None; n];
    let mut order = vec![lca];
    let mut i = 0;
    while i < order.len() {
        let s = order[i];
        i += 1;
        let sw = &topo.switches[s];
        let mut qpns = Vec::new();
        let mut conns = Vec::new();
        let parent = if s == lca {
            None
        } else {
            let c = up_conn.remove(&s).expect("parent processed first");
            qpns.push(c.local_qpn);
            conns.push(c);
            Some(0)
        };
        let mut kids: Vec<(usize, usize, usize)> =
            topo.tree[s].children.iter().copied().filter(|c| !below[c.0].is_empty()).collect();
        kids.sort_by_key(|c| topo.switches[c.0].id);
        for (c, lp, cp) in kids {
            let child = &topo.switches[c];
            let (lport, cport) = (&sw.ports[lp], &child.ports[cp]);
            let (lmac, cmac) = (port_mac(macs, sw, lp), port_mac(macs, child, cp));
            let my_qpn = alloc.alloc_qpn(sw.id, &sw.name)?;
            let child_qpn = alloc.alloc_qpn(child.id, &child.name)?;
            let (my_psn, child_psn) = (draw_psn(&mut rng, window), draw_psn(&mut rng, window));
            qpns.push(my_qpn);
            conns.push(ConnectionRule {
                port: lport.name.clone(),
                local_ip: lport.addr.ip,
                local_mac: lmac,
                local_qpn: my_qpn,
                local_udp_port: udp_port_for_qpn(my_qpn),
                local_start_psn: my_psn,
                peer: Peer::Switch { switch_id: child.id },
                peer_ip: cport.addr.ip,
                peer_mac: Some(cmac),
                peer_qpn: child_qpn,
                peer_udp_port: ROCE_UDP_PORT,
                peer_start_psn: child_psn,
                ranks: below[c].clone(),
            });
            let mut above: Vec<u16> =
                (0..n as u16).filter(|r| below[c].binary_search(r).is_err()).collect();
            above.sort_unstable();
            up_conn.insert(
                c,
                ConnectionRule {
                    port: cport.name.clone(),
                    local_ip: cport.addr.ip,
                    local_mac: cmac,
                    local_qpn: child_qpn,
                    local_udp_port: udp_port_for_qpn(child_qpn),
                    local_start_psn: child_psn,
                    peer: Peer::Switch { switch_id: sw.id },
                    peer_ip: lport.addr.ip,
                    peer_mac: Some(lmac),
                    peer_qpn: my_qpn,
                    peer_udp_port: ROCE_UDP_PORT,
                    peer_start_psn: my_psn,
                    ranks: above,
                },
            );
            order.push(c);
        }
        // Hosts attached here, by rank.
        for (rank, &h) in host_of_rank.iter().enumerate() {
            let host = &topo.hosts[h];
            if host.attach.switch != s {
                continue;
            }
            let r = ranks[rank];
            let port = &sw.ports[host.attach.port];
            let pmac = port_mac(macs, sw, host.attach.port);
            let q = alloc.alloc_qpn(sw.id, &sw.name)?;
            let psn = draw_psn(&mut rng, window);
            qpns.push(q);
            conns.push(ConnectionRule {
                port: port.name.clone(),
                local_ip: port.addr.ip,
                local_mac: pmac,
                local_qpn: q,
                local_udp_port: udp_port_for_qpn(q),
                local_start_psn: psn,
                peer: Peer::Host { rank: rank as u16 },
                peer_ip: r.ip,
                peer_mac: r.mac.or(host.mac),
                peer_qpn: r.qpn,
                peer_udp_port: r.udp_port,
                peer_start_psn: r.start_psn,
                ranks: vec![rank as u16],
            });
            endpoints[rank] = Some(HostEndpoint {
                rank: rank as u16,
                comm_id: spec.comm_id,
                switch_id: sw.id,
                switch_port: port.name.clone(),
                switch_ip: port.addr.ip,
                switch_mac: pmac,
                switch_qpn: q,
                switch_udp_port: udp_port_for_qpn(q),
                switch_start_psn: psn,
                host_qpn: r.qpn,
                host_start_psn: r.start_psn,
                host_udp_port: r.udp_port,
                mtu,
                window,
                gid: ipv4_gid(port.addr.ip),
                // What the switch registered, filled in by the service.
                switch_takes_gso: false,
                link_rate_bps: None,
            });
        }
        let asker = host_of_rank[0];
        let (slots, slot_memory) =
            alloc.alloc_slots(topo, sw, (window, mtu), conns.len(), asker)?;
        record.parts.push(Holding {
            switch_id: sw.id,
            qpns,
            slots,
            slot_memory,
            host: Some(asker),
        });
        rules.push(SwitchRules {
            comm_id: spec.comm_id,
            switch_id: sw.id,
            world_size: n as u16,
            mtu,
            window,
            slots: slots as u32,
            parent,
            connections: conns,
        });
    }
    alloc.comms.insert(spec.comm_id, record);
    let endpoints = endpoints.into_iter().map(|e| e.expect("every rank has a host")).collect();
    Ok(Compiled { comm_id: spec.comm_id, root_switch: topo.switches[lca].id, rules, endpoints })
}

/// Human-readable routes of a compiled communicator for a Reduce or Broadcast rooted
/// at `root_rank` (AllReduce uses the tree as compiled): per switch, where data for
/// the root goes (`up`) and where a broadcast from it fans out (`down`).
pub fn describe_routes(c: &Compiled, root_rank: u16) -> String {
    let mut out = String::new();
    let name = |r: &SwitchRules, i: usize| -> String {
        let conn = &r.connections[i];
        match conn.peer {
            Peer::Host { rank } => format!("{}(rank {rank})", conn.port),
            Peer::Switch { switch_id } => format!("{}(switch {switch_id})", conn.port),
        }
    };
    for r in &c.rules {
        let Some(to_root) = r.connection_for_rank(root_rank) else {
            let _ = writeln!(out, "switch {}: rank {root_rank} unreachable", r.switch_id);
            continue;
        };
        let down: Vec<String> =
            (0..r.connections.len()).filter(|&i| i != to_root).map(|i| name(r, i)).collect();
        let _ = writeln!(
            out,
            "switch {}: reduce-to {} <- [{}]; broadcast-from {} -> [{}]",
            r.switch_id,
            name(r, to_root),
            down.join(", "),
            name(r, to_root),
            down.join(", ")
        );
    }
    out
}
