//! Reduce-kernel throughput: `cargo bench -p inc-wire --bench reduce`.
//!
//! Prints GB/s (wire bytes combined per second: one 4 KiB chunk, an mtu-4096
//! contribution, per call) for every type and operator the table allows, for the
//! portable build and the run-time dispatched one, best of several rounds (these
//! machines are shared and noisy); then the fp32-accumulator kernels of the half types
//! (widen, accumulate, narrow). With `INC_BENCH_CALLS=N` it instead makes exactly N
//! calls of each and prints nothing else: run that under `valgrind --tool=callgrind`
//! and divide the inclusive instruction counts of `combine_be` and
//! `combine_be_portable` by the calls for instructions per chunk;
//! `INC_BENCH_CASE="float32 max"` limits it to one type and operator.

use std::hint::black_box;
use std::time::Duration;

use inc_wire::reduce::Kernel;
use inc_wire::{DataType, Operator};

mod common;
use common::best_per_call;

const CHUNK: usize = 4096;

/// A chunk of `dtype` elements that keeps float sums finite and min/max mixed.
fn operand(dtype: DataType) -> Vec<u8> {
    let n = CHUNK / dtype.size();
    let mut native = Vec::with_capacity(CHUNK);
    for i in 0..n {
        let x = (i % 400) as f32 * 0.5 - 100.0;
        match dtype {
            DataType::Float16 => native.extend(half::f16::from_f32(x).to_ne_bytes()),
            DataType::Bfloat16 => native.extend(half::bf16::from_f32(x).to_ne_bytes()),
            DataType::Float32 => native.extend(x.to_ne_bytes()),
            DataType::Float64 => native.extend((x as f64).to_ne_bytes()),
            _ => native.extend(&(i as u64 * 2_654_435_761).to_ne_bytes()[..dtype.size()]),
        }
    }
    let mut wire = vec![0u8; native.len()];
    inc_wire::reduce::to_network(dtype, &native, &mut wire);
    wire
}

fn main() {
    let calls: Option<u32> = std::env::var("INC_BENCH_CALLS").ok().and_then(|v| v.parse().ok());
    let only = std::env::var("INC_BENCH_CASE").ok();
    let gbps = |t: Duration| CHUNK as f64 / t.as_nanos().max(1) as f64;
    let measure = |f: &mut dyn FnMut()| -> Option<Duration> {
        match calls {
            Some(n) => {
                for _ in 0..n {
                    f();
                }
                None
            }
            None => Some(best_per_call(Duration::from_millis(150), f)),
        }
    };
    if calls.is_none() {
        println!(
            "{:<18} {:>14} {:>14}   (GB/s of wire bytes, {CHUNK} B chunks)",
            "type op", "portable", "dispatched"
        );
    }
    for &dtype in DataType::ALL {
        let other = operand(dtype);
        for op in Operator::reductions().filter(|o| o.applies_to(dtype)) {
            let case = format!("{dtype} {op}");
            if only.as_ref().is_some_and(|o| *o != case) {
                continue;
            }
            let mut line = format!("{case:<18}");
            for portable in [true, false] {
                let mut acc = other.clone();
                let t = measure(&mut || {
                    let k = Kernel::Combine {
                        op,
                        dtype,
                        acc: black_box(&mut acc),
                        other: black_box(&other),
                    };
                    black_box(if portable { k.run_portable() } else { k.run() });
                });
                if let Some(t) = t {
                    line += &format!(" {:>9.2} GB/s", gbps(t));
                }
            }
            if calls.is_none() {
                println!("{line}");
            }
        }
    }
    // The fp32 accumulator of the half types: what a switch runs per contribution.
    for dtype in DataType::ALL.iter().copied().filter(|d| d.accumulates_in_f32()) {
        let wire = operand(dtype);
        let mut acc = vec![0u8; wire.len() / dtype.size() * dtype.acc_size()];
        inc_wire::reduce::widen_be(dtype, &mut acc, &wire);
        let mut out = vec![0u8; wire.len()];
        for step in ["widen", "accumulate sum", "narrow", "accumulate+narrow sum"] {
            let case = format!("{dtype} {step}");
            if only.as_ref().is_some_and(|o| *o != case) {
                continue;
            }
            let mut line = format!("{case:<30}");
            for portable in [true, false] {
                let t = measure(&mut || {
                    let (acc, out, wire) =
                        (black_box(&mut acc), black_box(&mut out), black_box(&wire));
                    let op = Operator::Sum;
                    let k = match step {
                        "widen" => Kernel::Widen { dtype, acc, wire },
                        "accumulate sum" => Kernel::Accumulate { op, dtype, acc, wire },
                        "narrow" => Kernel::Narrow { dtype, out, acc },
                        _ => Kernel::AccumulateNarrow { op, dtype, out, acc, wire },
                    };
                    black_box(if portable { k.run_portable() } else { k.run() });
                });
                if let Some(t) = t {
                    line += &format!(" {:>9.2} GB/s", gbps(t));
                }
            }
            if calls.is_none() {
                println!("{line}");
            }
        }
    }
}
