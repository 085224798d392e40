//! Every collective kind, exact results, over lossy links and odd trees.

use super::*;

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
        // With room downstream every last contribution goes straight into the frame
        // that carries the result on; the exact results above show it combines right.
        let comm = &c.comms[0];
        assert!(comm.chunks_aggregated > 0, "switch {s}");
        assert_eq!(comm.chunks_combined_into_frame, comm.chunks_aggregated, "switch {s}");
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
        // The fixed fold order needs every contribution in the slot first.
        for s in 0..3 {
            assert_eq!(net.switch(s).counters().comms[0].chunks_combined_into_frame, 0);
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

/// ReduceScatter and AllGather run as one collective each of interleaved blocks: every
/// block reduced and delivered to its owner only, every block replicated to every other
/// rank; exact over loss, with counts that end mid-chunk, and aligned with the
/// AllReduce after them.
#[test]
fn reduce_scatter_and_allgather_over_loss() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.02, 5);
    let world = 4u16;
    for (round, count) in [(0u32, 1u64), (1, 7), (2, 333)] {
        let all = count * u64::from(world);
        net.start(
            |_| CollectiveSpec {
                kind: CollectiveKind::ReduceScatter,
                op: Operator::Sum,
                dtype: DataType::Int32,
                count,
            },
            |r| i32s(&input_i32(r, all, round)),
        );
        net.run(Duration::from_secs(30));
        for r in 0..world {
            let lo = (u64::from(r) * count) as usize;
            let expect: Vec<i32> = (lo..lo + count as usize)
                .map(|i| (0..world).fold(0i32, |a, q| a.wrapping_add(input_i32(q, all, round)[i])))
                .collect();
            let h = net.host(r as usize);
            assert_eq!(h.result, Some(Ok(())), "rank {r}");
            assert_eq!(from_i32s(&h.output), expect, "reduce-scatter rank {r} count {count}");
        }
        allgather(&mut net, world, count, round);
    }
    // 3 rounds of a ReduceScatter and an AllGather, one collective each.
    for s in 0..3 {
        assert_eq!(net.switch(s).counters().comms[0].collectives_completed, 6, "switch {s}");
    }
    allreduce(&mut net, world, 500, 9);
}

/// Without loss every AllGather position passes every switch once: straight from the
/// frame it arrived in when its turn has come, or held in its slot until the positions
/// before it went; the exact results show that every link carried them in stream order
/// and that the ICRCs read off the arriving frames are right (a receiver drops a bad
/// one).
#[test]
fn lossless_allgather_sends_every_position_once() {
    let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.0, 2);
    allgather(&mut net, 4, 20_000, 0);
    // 80,000 bytes per block: 313 chunks of 256 bytes, 4 blocks.
    let positions = 4 * 313;
    for s in 0..3 {
        let c = net.switch(s).counters();
        assert_eq!(c.retransmits(), 0, "switch {s}");
        let comm = &c.comms[0];
        assert_eq!(comm.chunks_aggregated + comm.chunks_down, positions, "switch {s}");
        assert!(comm.gather_chunks_held < positions, "switch {s}: {comm:?}");
    }
}
