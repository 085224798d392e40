//! Property tests of the rule compiler on random trees.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use inc_controller::{compile, demo_ranks, Allocator, CommunicatorSpec, Topology};
use inc_ctrl_proto::{Peer, SwitchRules, MAX_24BIT};
use proptest::prelude::*;

/// YAML for a random tree: switch i > 0 hangs below `parents[i-1]`; host j on
/// switch `hosts[j]`. Going through YAML exercises the loader as well.
fn tree_yaml(parents: &[usize], hosts: &[usize]) -> String {
    let n = parents.len() + 1;
    let mut ports: Vec<Vec<String>> = vec![Vec::new(); n];
    let mut links = String::new();
    for (i, &p) in parents.iter().enumerate() {
        let c = i + 1;
        let p = p % c;
        ports[p].push(format!("{{ name: d{c}, ip: 172.16.{c}.1/30 }}"));
        ports[c].push(format!("{{ name: up, ip: 172.16.{c}.2/30 }}"));
        writeln!(links, "  - {{ a: \"s{p}:d{c}\", b: \"s{c}:up\" }}").unwrap();
    }
    let mut hs = String::new();
    for (j, &s) in hosts.iter().enumerate() {
        let s = s % n;
        ports[s].push(format!("{{ name: h{j}, ip: 10.{}.{j}.1/24 }}", s + 1));
        writeln!(hs, "  - {{ name: h{j}, ip: 10.{}.{j}.2/24, attach: \"s{s}:h{j}\" }}", s + 1)
            .unwrap();
    }
    let mut y = String::from(
        "name: random\ncontroller: { address: \"192.168.0.1:7000\" }\nroot: s0\nswitches:\n",
    );
    for (i, p) in ports.iter().enumerate() {
        writeln!(y, "  - id: {}\n    name: s{i}\n    ports:", 100 + i).unwrap();
        if p.is_empty() {
            // A switch with no host and no children still needs a port (its uplink
            // always exists except for a lone root).
            writeln!(y, "      - {{ name: spare, ip: 10.250.{i}.1/24 }}").unwrap();
        }
        for port in p {
            writeln!(y, "      - {port}").unwrap();
        }
    }
    y.push_str("links:\n");
    y.push_str(&links);
    y.push_str("hosts:\n");
    y.push_str(&hs);
    y
}

fn check_tree(t: &Topology, rules: &[SwitchRules], ips: &[Ipv4Addr]) {
    let n = ips.len() as u16;
    let by_id: HashMap<u32, &SwitchRules> = rules.iter().map(|r| (r.switch_id, r)).collect();
    assert_eq!(by_id.len(), rules.len(), "one rule set per switch");
    let roots: Vec<_> = rules.iter().filter(|r| r.is_root()).collect();
    assert_eq!(roots.len(), 1, "exactly one root");
    for r in rules {
        // Every rank is reachable through exactly one connection of every switch.
        for rank in 0..n {
            let hits = r.connections.iter().filter(|c| c.ranks.contains(&rank)).count();
            assert_eq!(hits, 1, "switch {} rank {rank}", r.switch_id);
        }
        assert_eq!(r.fan_in(), r.connections.len() - usize::from(r.parent.is_some()));
        assert!(r.fan_in() >= 1);
        assert!(r.slots >= 2 * r.window);
        for c in &r.connections {
            assert!(c.local_qpn >= 2 && c.local_qpn <= MAX_24BIT);
            assert!(c.local_start_psn <= MAX_24BIT && c.peer_start_psn <= MAX_24BIT);
            assert!(c.ranks.windows(2).all(|w| w[0] < w[1]), "ranks sorted");
            if let Peer::Switch { switch_id } = c.peer {
                // Both ends agree.
                let other = by_id.get(&switch_id).expect("peer switch involved");
                let back = other
                    .connections
                    .iter()
                    .find(|o| o.peer == Peer::Switch { switch_id: r.switch_id })
                    .expect("reverse connection");
                assert_eq!(back.local_qpn, c.peer_qpn);
                assert_eq!(back.peer_qpn, c.local_qpn);
                assert_eq!(back.local_start_psn, c.peer_start_psn);
                assert_eq!(back.peer_start_psn, c.local_start_psn);
                assert_eq!(back.local_ip, c.peer_ip);
                assert_eq!(Some(back.local_mac), c.peer_mac);
            }
        }
        // Children partition the ranks below; parent holds the rest.
        let below: usize = r.children().map(|i| r.connections[i].ranks.len()).sum();
        let above = r.parent.map_or(0, |p| r.connections[p].ranks.len());
        assert_eq!(below + above, n as usize);
        if r.is_root() {
            assert_eq!(below, n as usize);
        }
    }
    // Each host has exactly one path to the root: follow parents from its switch.
    for (rank, ip) in ips.iter().enumerate() {
        let h = t.host_by_ip(*ip).unwrap();
        let mut sw = t.switches[t.hosts[h].attach.switch].id;
        let mut seen = HashSet::new();
        loop {
            assert!(seen.insert(sw), "loop on the way to the root");
            let r = by_id[&sw];
            let own = r.connection_for_rank(rank as u16).unwrap();
            assert_ne!(Some(own), r.parent, "a rank below is never reached through the parent");
            match r.parent {
                None => break,
                Some(p) => match r.connections[p].peer {
                    Peer::Switch { switch_id } => sw = switch_id,
                    Peer::Host { .. } => panic!("parent is a host"),
                },
            }
        }
    }
    // Only switches with participating hosts below them are involved: every leaf of
    // the spanning tree has a host child.
    for r in rules {
        let has_host = r.connections.iter().any(|c| matches!(c.peer, Peer::Host { .. }));
        let has_child_switch =
            r.children().any(|i| matches!(r.connections[i].peer, Peer::Switch { .. }));
        assert!(has_host || has_child_switch);
        if r.is_root() {
            // The root is the lowest common ancestor: it merges at least two branches
            // unless a host sits directly on it.
            assert!(has_host || r.fan_in() >= 2, "root switch {} is not the LCA", r.switch_id);
        }
    }
}

fn arb_case() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<Vec<usize>>, u64)> {
    (0usize..10)
        .prop_flat_map(|ns| {
            (
                proptest::collection::vec(0usize..64, ns),
                proptest::collection::vec(0usize..64, 1..16),
            )
        })
        .prop_flat_map(|(parents, hosts)| {
            let nh = hosts.len();
            let comm = proptest::collection::vec(0..nh, 1..=nh).prop_shuffle();
            (Just(parents), Just(hosts), proptest::collection::vec(comm, 1..5), any::<u64>())
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_trees((parents, hosts, comms, seed) in arb_case()) {
        let yaml = tree_yaml(&parents, &hosts);
        let t = Topology::parse("random.yaml", &yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        let mut alloc = Allocator::new();
        let mut live: Vec<(u32, Vec<SwitchRules>)> = Vec::new();
        for (k, picks) in comms.iter().enumerate() {
            let mut uniq = Vec::new();
            for p in picks {
                if !uniq.contains(p) {
                    uniq.push(*p);
                }
            }
            let ips: Vec<Ipv4Addr> = uniq.iter().map(|&h| t.hosts[h].addr.ip).collect();
            let spec = CommunicatorSpec { comm_id: k as u32 + 1, ranks: demo_ranks(&ips), mtu: None, window: Some(4) };
            let c = compile(&t, &spec, &mut alloc, seed).unwrap();
            check_tree(&t, &c.rules, &ips);
            prop_assert_eq!(c.endpoints.len(), ips.len());
            live.push((c.comm_id, c.rules));
            // Release the oldest now and then, so freed QPNs are reused.
            if k % 3 == 2 {
                let (id, _) = live.remove(0);
                alloc.release(id);
            }
        }
        // No QPN collision across live communicators on any switch.
        let mut qpns: HashMap<u32, HashSet<u32>> = HashMap::new();
        let mut slots: HashMap<u32, u64> = HashMap::new();
        for (_, rules) in &live {
            for r in rules {
                for c in &r.connections {
                    prop_assert!(qpns.entry(r.switch_id).or_default().insert(c.local_qpn), "QPN collision");
                }
                *slots.entry(r.switch_id).or_default() += u64::from(r.slots);
            }
        }
        // Slots held are exactly those of live communicators, within the capacity.
        for (sw, n) in &slots {
            prop_assert_eq!(alloc.live_slots(*sw), *n);
            let cap = t.switches[t.switch_by_id(*sw).unwrap()].max_slots;
            prop_assert!(*n <= u64::from(cap));
        }
        for (sw, q) in &qpns {
            prop_assert_eq!(alloc.live_qpns(*sw), q.len());
        }
    }
}
