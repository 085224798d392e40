//! Closed-form times for the same links: the in-network lower bound a lossless,
//! contention-free run must approach (validation 1), and the ring AllReduce of
//! `--compare ring`.
//!
//! In-network bound (docs/SIMULATION.md, "The formula"): with `N = ceil(S / P)` chunks
//! of payload `P` (the last one `S - (N-1) P`), frames of `F_k = P_k + H` bytes
//! (`H` = 58: Ethernet 14, IPv4 20, UDP 8, BTH 12, ICRC 4, plus the wire overhead),
//! and for a path `p` of link directions `fill(p) = sum_{l in p} (F_0 / B_l + d_l)`:
//!
//! ```text
//! T = max_{s sends} fill(up(s)) + max_{r receives} fill(down(r)) + sum_{k=1}^{N-1} (F_k + A) / B_min
//! ```
//!
//! `up(s)` runs from host `s` to the communicator's root switch, `down(r)` from the root
//! to host `r`, `B_min` is the slowest link on those paths: the first chunk's
//! store-and-forward trip up and down the tree (pipeline fill and per-hop latency),
//! then the rest of the vector streams through the bottleneck (`S / B`). In an
//! AllReduce every link direction that carries results down also carries the RC ACKs
//! of the data going up the same link: `A` = 62 bytes per chunk (0 for Reduce and
//! Broadcast, whose data flows one way). The start message, ACK coalescing and
//! processing are left out: they are what the simulation adds or saves.
//!
//! Ring AllReduce over the hosts in rank order: `2 (n-1)/n · S / B + 2 (n-1) · α`, `B`
//! the slowest link on any path between ring neighbours, `α` the largest propagation
//! delay of such a path (sum of its links' delays).

use serde::Serialize;

use crate::data::Collective;
use crate::net::{Dir, Nanos};
use crate::sim::Sim;

/// Bytes of an Ethernet/IPv4/UDP/BTH/ICRC data frame around its payload.
pub const DATA_FRAME_OVERHEAD: u64 = 14 + 20 + 8 + 12 + 4;
/// Bytes of an RC ACK frame (Ethernet, IPv4, UDP, BTH, AETH, ICRC).
pub const ACK_FRAME: u64 = 14 + 20 + 8 + 12 + 4 + 4;

/// Analytical times for the run's collective, size and links.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Analytic {
    /// The in-network lower bound, ns.
    pub in_network_ns: f64,
    /// Of which the pipeline fill (first chunk up and down), ns.
    pub fill_ns: f64,
    /// Most link hops from a host to the root switch.
    pub max_hops: usize,
    /// Ring AllReduce time, ns.
    pub ring_ns: f64,
    /// The ring's bandwidth term's rate, bits/s.
    pub ring_rate_bps: u64,
    /// The ring's per-step latency α, ns.
    pub ring_alpha_ns: Nanos,
}

fn ser_ns(bytes: u64, dir: &Dir) -> f64 {
    (bytes + u64::from(dir.cfg.wire_overhead)) as f64 * 8e9 / dir.cfg.rate_bps.max(1) as f64
}

impl Sim {
    /// Link directions from host `h` up to switch `top` (inclusive of the host link).
    fn path_up(&self, h: usize, top: usize) -> Vec<usize> {
        let topo = self.topology();
        let host = &topo.hosts[h];
        let hn = topo.switches.len() + h;
        let mut dirs = vec![self.dir_index(hn, 0)];
        let mut s = host.attach.switch;
        while s != top {
            let Some((parent, port, _)) = topo.tree[s].parent else { break };
            dirs.push(self.dir_index(s, port));
            s = parent;
        }
        dirs
    }

    /// Link directions from switch `top` down to host `h`.
    fn path_down(&self, h: usize, top: usize) -> Vec<usize> {
        let topo = self.topology();
        let host = &topo.hosts[h];
        let mut dirs = vec![self.dir_index(host.attach.switch, host.attach.port)];
        let mut s = host.attach.switch;
        while s != top {
            let Some((parent, _, parent_port)) = topo.tree[s].parent else { break };
            dirs.push(self.dir_index(parent, parent_port));
            s = parent;
        }
        dirs.reverse();
        dirs
    }

    /// The analytical times for this run's links (call before [`Sim::run`]).
    pub fn analytic(&self) -> Analytic {
        let topo = self.topology();
        let cfg = self.config();
        let dirs = self.dirs();
        let (mtu, _) = self.mtu_window();
        let p = u64::from(mtu);
        let s = cfg.bytes;
        let n_chunks = s.div_ceil(p);
        let first = p.min(s) + DATA_FRAME_OVERHEAD;
        let root = topo.switch_by_id(self.compiled().root_switch).unwrap_or(topo.root);
        let world = topo.hosts.len();
        let fill = |path: &[usize]| -> f64 {
            path.iter().map(|&d| ser_ns(first, &dirs[d]) + dirs[d].cfg.delay as f64).sum()
        };
        let (mut up_max, mut down_max, mut b_min, mut max_hops) = (0f64, 0f64, u64::MAX, 0);
        for h in 0..world {
            let (sends, receives) = cfg.collective.role(h as u16);
            let up = self.path_up(h, root);
            let down = self.path_down(h, root);
            max_hops = max_hops.max(up.len());
            if sends {
                up_max = up_max.max(fill(&up));
                b_min = up.iter().map(|&d| dirs[d].cfg.rate_bps).fold(b_min, u64::min);
            }
            if receives {
                down_max = down_max.max(fill(&down));
                b_min = down.iter().map(|&d| dirs[d].cfg.rate_bps).fold(b_min, u64::min);
            }
        }
        let last = s - (n_chunks - 1) * p;
        let rest_bytes = n_chunks.saturating_sub(2) * (p + DATA_FRAME_OVERHEAD)
            + if n_chunks >= 2 { last + DATA_FRAME_OVERHEAD } else { 0 };
        let rest_frames = n_chunks.saturating_sub(1);
        let oh = u64::from(dirs.first().map_or(0, |d| d.cfg.wire_overhead));
        // Each result chunk down a link shares it with the ACK of one data chunk up.
        let acks = if matches!(cfg.collective, Collective::AllReduce) { rest_frames } else { 0 };
        let stream = (rest_bytes + rest_frames * oh + acks * (ACK_FRAME + oh)) as f64 * 8e9
            / b_min.max(1) as f64;
        let in_network_ns = up_max + down_max + stream;

        // Ring over ranks in order.
        let (mut ring_rate, mut alpha) = (u64::MAX, 0);
        for a in 0..world {
            let b = (a + 1) % world;
            if a == b {
                continue;
            }
            let path = self.host_to_host(a, b);
            ring_rate = path.iter().map(|&d| dirs[d].cfg.rate_bps).fold(ring_rate, u64::min);
            alpha = alpha.max(path.iter().map(|&d| dirs[d].cfg.delay).sum::<Nanos>());
        }
        let nf = world as f64;
        let ring_ns = if world < 2 || ring_rate == u64::MAX {
            0.0
        } else {
            2.0 * (nf - 1.0) / nf * s as f64 * 8e9 / ring_rate as f64
                + 2.0 * (nf - 1.0) * alpha as f64
        };
        Analytic {
            in_network_ns,
            fill_ns: up_max + down_max,
            max_hops,
            ring_ns,
            ring_rate_bps: if ring_rate == u64::MAX { 0 } else { ring_rate },
            ring_alpha_ns: alpha,
        }
    }

    /// Link directions from host `a` to host `b` through their lowest common switch.
    fn host_to_host(&self, a: usize, b: usize) -> Vec<usize> {
        let topo = self.topology();
        let ancestors = |h: usize| {
            let mut v = vec![topo.hosts[h].attach.switch];
            while let Some((p, _, _)) = topo.tree[*v.last().expect("non-empty")].parent {
                v.push(p);
            }
            v
        };
        let (aa, bb) = (ancestors(a), ancestors(b));
        let lca = aa.iter().copied().find(|s| bb.contains(s)).unwrap_or(topo.root);
        let mut path = self.path_up(a, lca);
        path.extend(self.path_down(b, lca));
        path
    }
}
