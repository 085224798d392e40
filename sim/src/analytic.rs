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
//! T = max_{s sends} fill(up(s)) + max_{r receives} fill(down(r))
//!     + max_{l carries data} sum_{k=1}^{N-1} (F_k + A_l) / B_l
//! ```
//!
//! `up(s)` runs from host `s` to the communicator's root switch, `down(r)` from the root
//! to host `r`: the first chunk's store-and-forward trip up and down the tree (pipeline
//! fill and per-hop latency; replicated data turns at the lowest common switch instead:
//! a Broadcast takes the longest sender-to-receiver path, an AllGather the shortest;
//! a ReduceScatter's last result goes down to the last rank, so its way down is the
//! shortest receiver's),
//! then the rest of the vector streams through the busiest link direction `l` on those
//! paths (`S / B`; for ReduceScatter and AllGather `S` is a block and `l` carries as
//! many blocks as the ranks it serves, see [`Sim::analytic`]). A link direction whose reverse also
//! carries data (every link of an AllReduce; a Reduce's links between its root rank
//! and the root switch, where data goes up and the result comes down) carries the RC
//! ACK of one chunk going the other way with each of its own: `A_l` = 62 bytes per
//! chunk, else 0 (a Broadcast's data flows one way on every link). The start message,
//! ACK coalescing and processing are left out: they are what the simulation adds or
//! saves.
//!
//! Ring AllReduce over the hosts in rank order: `2 (n-1)/n · S / B + 2 (n-1) · α` (a
//! ring ReduceScatter or AllGather of the whole vector `S`: half of it), `B`
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
    /// Ring time, ns: AllReduce, or for ReduceScatter and AllGather their own ring.
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
        // The vector, or one block of a ReduceScatter or AllGather.
        let s = self.block_bytes() as u64;
        let n_chunks = s.div_ceil(p);
        let first = p.min(s) + DATA_FRAME_OVERHEAD;
        let root = topo.switch_by_id(self.compiled().root_switch).unwrap_or(topo.root);
        let world = topo.hosts.len();
        let fill_with = |frame: u64, path: &[usize]| -> f64 {
            path.iter().map(|&d| ser_ns(frame, &dirs[d]) + dirs[d].cfg.delay as f64).sum()
        };
        let fill = |path: &[usize]| fill_with(first, path);
        let reverse = |d: usize| {
            let cfg = &dirs[d].cfg;
            self.dir_index(cfg.to_node as usize, cfg.to_port as usize)
        };
        let (mut up_max, mut down_max, mut max_hops) = (0f64, 0f64, 0);
        // A ReduceScatter's blocks are interleaved: its last result goes to the last
        // rank, which need not be the deepest, and is a block's last chunk, which may be
        // short. Its trip is bounded by the shortest way down and the smaller chunk.
        let last = s - s.saturating_sub(1) / p * p + DATA_FRAME_OVERHEAD;
        let small = first.min(last);
        let (mut up_max_small, mut down_min_small) = (0f64, f64::INFINITY);
        let mut carries_data = vec![false; dirs.len()];
        // Senders whose path up crosses each link direction.
        let mut senders_below = vec![0u64; dirs.len()];
        for h in 0..world {
            let up = self.path_up(h, root);
            max_hops = max_hops.max(up.len());
            if cfg.collective.role(h as u16).0 {
                up_max = up_max.max(fill(&up));
                up_max_small = up_max_small.max(fill_with(small, &up));
                for &d in &up {
                    carries_data[d] = true;
                    senders_below[d] += 1;
                }
            }
        }
        // A Broadcast's switches pass its data down as it goes up: no link carries it
        // back down into the subtree it came from. A reduction exists only at the top.
        // (The reverse of a link direction down is one up, which only the loop above
        // marks.)
        let replicated_on_the_way_up = matches!(cfg.collective, Collective::Broadcast { .. });
        for h in (0..world).filter(|&h| cfg.collective.role(h as u16).1) {
            let down = self.path_down(h, root);
            down_max = down_max.max(fill(&down));
            down_min_small = down_min_small.min(fill_with(small, &down));
            for d in down {
                if !(replicated_on_the_way_up && carries_data[reverse(d)]) {
                    carries_data[d] = true;
                }
            }
        }
        // Parts (blocks) each link direction carries: one, except for the blockwise
        // collectives, whose part i is rooted at rank i. ReduceScatter: every block goes
        // up every path, and block r down only toward rank r. AllGather: block r goes up
        // from rank r and down toward every other rank, never back into its own subtree.
        let world_parts = world as u64;
        let parts = |d: usize| -> u64 {
            if !carries_data[d] {
                return 0;
            }
            let going_up = senders_below[d] > 0;
            match cfg.collective {
                Collective::ReduceScatter if going_up => world_parts,
                Collective::ReduceScatter => senders_below[reverse(d)],
                Collective::AllGather if going_up => senders_below[d],
                Collective::AllGather => world_parts - senders_below[reverse(d)],
                _ => 1,
            }
        };
        let block_bytes = s + n_chunks * DATA_FRAME_OVERHEAD;
        let stream = (0..dirs.len())
            .filter(|&d| parts(d) > 0)
            .map(|d| {
                let cfg = &dirs[d].cfg;
                // All but the first chunk, which the fill counts.
                let frames = parts(d) * n_chunks - 1;
                let bytes = parts(d) * block_bytes - first;
                // The data the other way draws one ACK per chunk on this direction.
                let acks = (parts(reverse(d)) * n_chunks).saturating_sub(1);
                let oh = u64::from(cfg.wire_overhead);
                (bytes + frames * oh + acks * (ACK_FRAME + oh)) as f64 * 8e9
                    / cfg.rate_bps.max(1) as f64
            })
            .fold(0f64, f64::max);
        // Replicated data need not climb to the root: a switch passes it down toward
        // every receiver below it on the way up. A Broadcast's first chunk reaches
        // receiver r over the path from the sender through their lowest common switch;
        // an AllGather's fill is its shortest such turn.
        match cfg.collective {
            Collective::Broadcast { root: sender } => {
                let to = |r: usize| fill(&self.host_to_host(usize::from(sender), r));
                let receivers = (0..world).filter(|&r| r != usize::from(sender));
                (up_max, down_max) = (receivers.map(to).fold(0.0, f64::max), 0.0);
            }
            Collective::AllGather => (up_max, down_max) = (self.shortest_turn(root, first), 0.0),
            Collective::ReduceScatter => (up_max, down_max) = (up_max_small, down_min_small),
            _ => {}
        }
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
            // A ring ReduceScatter or AllGather is one half of a ring AllReduce.
            let phases = if cfg.collective.is_blockwise() { 1.0 } else { 2.0 };
            phases * (nf - 1.0) / nf * cfg.bytes as f64 * 8e9 / ring_rate as f64
                + phases * (nf - 1.0) * alpha as f64
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

    /// The shortest trip of a first chunk (a frame of `first` bytes) from one host up
    /// to a switch and down to another host below it (switches up to `top`): each
    /// switch's quickest way in from a host below plus its quickest way out to one, over
    /// the switches with at least two hosts below. Taking both ends from the same host
    /// can only shorten it, so this stays a lower bound.
    fn shortest_turn(&self, top: usize, first: u64) -> f64 {
        let topo = self.topology();
        let dirs = self.dirs();
        let hop = |d: usize| ser_ns(first, &dirs[d]) + dirs[d].cfg.delay as f64;
        let n = topo.switches.len();
        let (mut best_in, mut best_out, mut below) =
            (vec![f64::INFINITY; n], vec![f64::INFINITY; n], vec![0u32; n]);
        for h in 0..topo.hosts.len() {
            let host = &topo.hosts[h];
            let (mut s, mut d_up) = (host.attach.switch, self.dir_index(n + h, 0));
            let mut d_down = self.dir_index(s, host.attach.port);
            let (mut t_in, mut t_out) = (0.0, 0.0);
            loop {
                t_in += hop(d_up);
                t_out += hop(d_down);
                best_in[s] = best_in[s].min(t_in);
                best_out[s] = best_out[s].min(t_out);
                below[s] += 1;
                if s == top {
                    break;
                }
                let Some((parent, port, parent_port)) = topo.tree[s].parent else { break };
                (d_up, d_down) = (self.dir_index(s, port), self.dir_index(parent, parent_port));
                s = parent;
            }
        }
        let turn = (0..n)
            .filter(|&s| below[s] >= 2)
            .map(|s| best_in[s] + best_out[s])
            .fold(f64::INFINITY, f64::min);
        // One host: nothing travels.
        if turn.is_finite() {
            turn
        } else {
            0.0
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
