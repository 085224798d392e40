//! Engine cost on a simulated 1-2-4 tree.

use super::*;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Engine cost, not a correctness test (the result is still checked):
/// `cargo test -p inc-switch-engine --release -- --ignored throughput --nocapture`.
/// `INC_TP_MTU` (default 1024), `INC_TP_MIB` (MiB per rank, default 16) and
/// `INC_TP_COLL` (`allreduce`, the default, or `allgather`: each rank's block is that
/// many MiB) change the workload; under `valgrind --tool=callgrind` (with
/// `--toggle-collect='inc_switch_engine::SwitchEngine::*'` for the switches alone) it
/// gives instructions per frame.
#[test]
#[ignore]
fn throughput() {
    let mtu: u16 = env_or("INC_TP_MTU", 1024);
    let mib: u64 = env_or("INC_TP_MIB", 16);
    let t = TreeSpec {
        parents: vec![None, Some(0), Some(0)],
        hosts: vec![1, 1, 2, 2],
        mtu,
        window: 64,
    };
    let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
    net.latency = 20_000;
    let count = mib << 18;
    let kind = match std::env::var("INC_TP_COLL").as_deref() {
        Ok("allgather") => CollectiveKind::AllGather,
        Ok("allreduce") | Err(_) => CollectiveKind::AllReduce,
        Ok(other) => panic!("INC_TP_COLL={other}: allreduce or allgather"),
    };
    let input: Vec<Vec<u8>> = (0..4).map(|r| i32s(&input_i32(r, count, 0))).collect();
    let start = std::time::Instant::now();
    net.start(
        |_| CollectiveSpec { kind, op: Operator::Sum, dtype: DataType::Int32, count },
        |r| input[r as usize].clone(),
    );
    net.run(Duration::from_secs(600));
    let wall = start.elapsed();
    let inputs: Vec<Vec<i32>> = (0..4).map(|r| input_i32(r, count, 0)).collect();
    let expect: Vec<i32> = if kind == CollectiveKind::AllGather {
        inputs.concat()
    } else {
        (0..count as usize)
            .map(|i| inputs.iter().fold(0i32, |acc, v| acc.wrapping_add(v[i])))
            .collect()
    };
    for r in 0..4 {
        assert_eq!(net.host(r).result, Some(Ok(())), "rank {r}");
        assert!(from_i32s(&net.host(r).output) == expect, "rank {r}: wrong result");
    }
    let counters: Vec<_> = (0..3).map(|s| net.switch(s).counters()).collect();
    let rx: u64 = counters.iter().map(|c| c.rx_frames).sum();
    let tx: u64 = counters.iter().map(|c| c.tx_frames).sum();
    let sim = Duration::from_nanos(net.now);
    eprintln!(
        "{mib} MiB x 4 ranks {kind:?}, mtu {mtu}: switches rx {rx} tx {tx} frames in {wall:?} wall \
         ({:.0} switch rx frames/s incl. hosts and harness), simulated {sim:?} \
         ({:.2} Gbit/s algbw at 20 us links)",
        rx as f64 / wall.as_secs_f64(),
        (count * 4 * 8 * if kind == CollectiveKind::AllGather { 4 } else { 1 }) as f64
            / sim.as_secs_f64()
            / 1e9
    );
}
