//! Reduce-kernel throughput: `cargo bench -p inc-wire --bench reduce`.
//!
//! Prints ns per 4 KiB chunk (one mtu-4096 contribution) for every type and operator,
//! for the portable build and the run-time dispatched one, best of several rounds
//! (these machines are shared and noisy). With `INC_BENCH_CALLS=N` it instead makes
//! exactly N calls of each and prints nothing else: run that under
//! `valgrind --tool=callgrind` and divide the inclusive instruction counts of
//! `combine_be` and `combine_be_portable` by the calls for instructions per chunk;
//! `INC_BENCH_CASE="Float32 Max"` limits it to one type and operator.

use std::hint::black_box;
use std::time::Duration;

use inc_wire::reduce::{combine_be, combine_be_portable};
use inc_wire::{DataType, Operator};

type Kernel = fn(Operator, DataType, &mut [u8], &[u8]) -> usize;

mod common;
use common::best_per_call;

const CHUNK: usize = 4096;

fn main() {
    let calls: Option<u32> = std::env::var("INC_BENCH_CALLS").ok().and_then(|v| v.parse().ok());
    let only = std::env::var("INC_BENCH_CASE").ok();
    // Values that keep float sums finite and min/max mixed.
    let other: Vec<u8> =
        (0..CHUNK / 4).flat_map(|i| ((i as f32) * 0.5 - 100.0).to_bits().to_be_bytes()).collect();
    let kernels: [(&str, Kernel); 2] =
        [("portable", combine_be_portable), ("dispatched", combine_be)];
    for dtype in [DataType::Int32, DataType::Float32] {
        for op in [Operator::Sum, Operator::Max, Operator::Min] {
            let case = format!("{dtype:?} {op:?}");
            if only.as_ref().is_some_and(|o| *o != case) {
                continue;
            }
            let mut line = format!("{case}:");
            for (name, k) in kernels {
                let mut acc = vec![0u8; CHUNK];
                if let Some(n) = calls {
                    for _ in 0..n {
                        black_box(k(op, dtype, black_box(&mut acc), black_box(&other)));
                    }
                    continue;
                }
                let t = best_per_call(Duration::from_millis(300), || {
                    black_box(k(op, dtype, black_box(&mut acc), black_box(&other)));
                });
                line += &format!("  {name} {:>6} ns", t.as_nanos());
            }
            if calls.is_none() {
                println!("{line}  (per {CHUNK} B chunk)");
            }
        }
    }
}
