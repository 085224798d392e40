//! Dead links and lost ACKs: failures are reported, never silent success.

use super::*;

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
