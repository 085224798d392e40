//! `inc-bench-rank`: the INCCL side of inc-bench's ReduceScatter, AllGather and overlap
//! measurements, one process per host namespace, as the `inccl-*` host programs are for
//! AllReduce, Reduce, Broadcast and Barrier. Same arguments
//! (`<world_size> <master_addr> <rank> <count> [--dtype T] [--op O] [--iters N]
//! [--warmup N] [--print-times] [--wait-stdin]`) and the same output lines the harness
//! reads (`#  iter_us rank=R: ...`, then a result line ending in PASS or FAIL).
//!
//! - `--collective reducescatter`: `count` elements per block; the input is the whole
//!   vector S of world-size blocks, the result this rank's block
//!   (`reduce_scatter_bytes`).
//! - `--collective allgather`: `count` elements per block; the input is this rank's
//!   block, the result the whole vector S (`allgather_bytes`).
//! - `--collective overlap`: int32 sum AllReduces of `count` elements. Each repetition
//!   times, after a barrier each: `--requests` AllReduces blocking one after another
//!   (`blocking`) and the same started as non-blocking calls and then waited for
//!   (`nonblocking`), in alternating order; one non-blocking AllReduce alone
//!   (`collective`, C); a busy loop alone (`compute`, T), the same work on every rank,
//!   calibrated to take about C (its rate measured at start-up while every rank runs it,
//!   then rescaled by each warm-up repetition's C / T, all the slowest rank's); and the
//!   busy loop while one non-blocking AllReduce runs (`overlapped`); then the same with
//!   a sleep of C (the last warm-up's) instead of the busy loop (`idle`,
//!   `idleoverlapped`): compute that leaves the host's CPUs free, as an accelerator's
//!   would. Lines `#  part_us rank=R part=NAME: ...`.
//!
//! Inputs are the MPI reference's (bench/mpi/inc_mpi_bench.c): small integers (powers
//! of two for PROD), exact in every type and combining order; every element of every
//! iteration is compared with the fold of all ranks' inputs, outside the timing.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use inc_wire::dtype::Class;
use inc_wire::reduce::Elem;
use inc_wire::TypeVisitor;
use inccl::{CommConfig, Communicator, DataType, Group, GroupConfig, ReduceOp};

/// What this process measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kind {
    /// ReduceScatter.
    Reducescatter,
    /// AllGather.
    Allgather,
    /// Non-blocking batches and compute overlapped with a collective.
    Overlap,
}

/// Command line (the host programs' arguments, plus --collective and --requests).
#[derive(Debug, Parser)]
#[command(name = "inc-bench-rank", version)]
struct Args {
    /// Number of ranks.
    world_size: u16,
    /// Rank 0's address (host or host:port).
    master_addr: String,
    /// This process's rank.
    rank: u16,
    /// Elements per block (ReduceScatter: of the result; AllGather: of the input), or
    /// of each AllReduce (overlap).
    count: u64,
    /// What to measure.
    #[arg(long, value_enum)]
    collective: Kind,
    /// Element type (overlap: int32 always).
    #[arg(long, default_value = "int32")]
    dtype: DataType,
    /// Reduction operator of ReduceScatter (overlap: sum always).
    #[arg(long, default_value = "sum")]
    op: ReduceOp,
    /// Accepted and ignored (the harness passes it to every host program).
    #[arg(long, default_value_t = 0)]
    root: u16,
    /// Timed iterations (overlap: repetitions of every part).
    #[arg(long, default_value_t = 1)]
    iters: u32,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 0)]
    warmup: u32,
    /// Overlap: AllReduces per batch.
    #[arg(long, default_value_t = 8)]
    requests: usize,
    /// Print every timed iteration's time.
    #[arg(long)]
    print_times: bool,
    /// Wait for end of input on stdin before destroying the communicator.
    #[arg(long)]
    wait_stdin: bool,
}

/// Period of the inputs in the element index: lcm(16, 15) (`(i / 8) % 2` and
/// `(i + r) % 3`, `% 5`).
const PERIOD: u64 = 240;

/// Input element `i` of rank `r`, as inc_mpi_bench.c's `input()`.
fn input(dtype: DataType, op: ReduceOp, i: u64, r: u16) -> i64 {
    let unsigned = dtype.class() == Class::Unsigned;
    let r = u64::from(r);
    if op == ReduceOp::Prod {
        let x = if (i + r) % 3 == 0 { 2 } else { 1 };
        if !unsigned && (i + r) % 5 == 0 {
            -x
        } else {
            x
        }
    } else {
        let x = (i % 8 + r % 8) as i64;
        if !unsigned && (i / 8) % 2 == 1 {
            -x
        } else {
            x
        }
    }
}

/// `x` as a native-order element of `dtype` into `out` (integers wrap).
fn encode(dtype: DataType, x: i64, out: &mut [u8]) {
    match dtype {
        DataType::Float16 => out.copy_from_slice(&half::f16::from_f64(x as f64).to_ne_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&half::bf16::from_f64(x as f64).to_ne_bytes()),
        DataType::Float32 => out.copy_from_slice(&(x as f32).to_ne_bytes()),
        DataType::Float64 => out.copy_from_slice(&(x as f64).to_ne_bytes()),
        _ => {
            let b = x.to_ne_bytes();
            let n = out.len();
            if cfg!(target_endian = "little") {
                out.copy_from_slice(&b[..n]);
            } else {
                out.copy_from_slice(&b[8 - n..]);
            }
        }
    }
}

/// Native bytes of elements `first .. first + n` of rank `r`'s input.
fn inputs(dtype: DataType, op: ReduceOp, first: u64, n: u64, r: u16) -> Vec<u8> {
    let s = dtype.size();
    let period: Vec<u8> = (0..PERIOD.min(n))
        .flat_map(|k| {
            let mut b = vec![0u8; s];
            encode(dtype, input(dtype, op, first + k, r), &mut b);
            b
        })
        .collect();
    tile(&period, n as usize * s)
}

/// `period` repeated to `len` bytes.
fn tile(period: &[u8], len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let take = period.len().min(len - v.len());
        v.extend_from_slice(&period[..take]);
    }
    v
}

/// The reduction over every rank of elements `first .. first + n`, in rank order, AVG
/// divided as the library does.
fn expected(dtype: DataType, op: ReduceOp, first: u64, n: u64, world: u16) -> Vec<u8> {
    struct Fold(ReduceOp, Vec<Vec<u8>>);
    impl TypeVisitor for Fold {
        type Output = Vec<u8>;
        fn visit<E: Elem>(self) -> Vec<u8> {
            let Fold(op, ranks) = self;
            let mut out = ranks[0].clone();
            for c in (0..out.len()).step_by(E::SIZE) {
                let mut acc = E::load_ne(&ranks[0][c..]);
                for r in &ranks[1..] {
                    acc = E::combine(op, acc, E::load_ne(&r[c..]));
                }
                acc.store_ne(&mut out[c..c + E::SIZE]);
            }
            out
        }
    }
    let p = PERIOD.min(n);
    let ranks = (0..world).map(|r| inputs(dtype, op, first, p, r)).collect();
    let mut period = dtype.visit(Fold(op, ranks));
    inc_wire::reduce::finalize_native(op, dtype, &mut period, world);
    tile(&period, n as usize * dtype.size())
}

/// The first differing element of `got` against `want`: (index, got, want) as hex.
fn mismatch(got: &[u8], want: &[u8], size: usize) -> Option<(usize, String, String)> {
    if got == want {
        return None;
    }
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    got.chunks(size)
        .zip(want.chunks(size))
        .position(|(g, w)| g != w)
        .map(|i| (i, hex(&got[i * size..][..size]), hex(&want[i * size..][..size])))
}

/// Busy work whose result is used: `units` steps of a xorshift chain.
fn spin(units: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..units {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// Median of durations.
fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s.get(s.len().saturating_sub(1) / 2).copied().unwrap_or_default()
}

fn us(t: Duration) -> f64 {
    t.as_secs_f64() * 1e6
}

/// Times of one timed part, in iteration order.
#[derive(Debug, Default)]
struct Part {
    name: &'static str,
    times: Vec<Duration>,
}

/// Outcome of a run: every result exact, and the timed parts.
#[derive(Debug)]
struct Outcome {
    pass: bool,
    parts: Vec<Part>,
    /// Bytes per timed iteration of the first part (S for RS/AG, a batch for overlap).
    bytes: u64,
    note: String,
}

/// ReduceScatter or AllGather, `warmup + iters` times, checked.
fn blocked(comm: &mut Communicator, a: &Args) -> anyhow::Result<Outcome> {
    let (dtype, op, n) = (a.dtype, a.op, a.count);
    let s = dtype.size();
    let world = comm.world_size();
    let (rank, w) = (u64::from(comm.rank()), u64::from(world));
    let whole = n * w;
    let (src, want) = match a.collective {
        Kind::Reducescatter => {
            (inputs(dtype, op, 0, whole, comm.rank()), expected(dtype, op, rank * n, n, world))
        }
        _ => {
            let mut want = Vec::with_capacity((whole * s as u64) as usize);
            for r in 0..world {
                want.extend_from_slice(&inputs(dtype, op, u64::from(r) * n, n, r));
            }
            (inputs(dtype, op, rank * n, n, comm.rank()), want)
        }
    };
    let mut dst = vec![0u8; want.len()];
    let mut part = Part { name: "iter", times: Vec::new() };
    let mut pass = true;
    for it in 0..a.warmup + a.iters {
        dst.fill(0);
        let t = Instant::now();
        match a.collective {
            Kind::Reducescatter => comm.reduce_scatter_bytes(&src, &mut dst, dtype, op)?,
            _ => comm.allgather_bytes(&src, &mut dst, dtype)?,
        }
        let el = t.elapsed();
        if let Some((i, g, x)) = mismatch(&dst, &want, s) {
            eprintln!("rank {rank}: iteration {it}: element {i} is 0x{g}, expected 0x{x}");
            pass = false;
        }
        if it >= a.warmup {
            part.times.push(el);
        }
    }
    Ok(Outcome { pass, parts: vec![part], bytes: whole * s as u64, note: String::new() })
}

/// The largest `d` over the ranks (an INC AllReduce MAX of nanoseconds).
fn slowest(comm: &mut Communicator, d: Duration) -> anyhow::Result<Duration> {
    let mine = [u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)];
    let mut max = [0u64];
    comm.allreduce(&mine, &mut max, ReduceOp::Max)?;
    Ok(Duration::from_nanos(max[0]))
}

/// What the caller does while a collective runs.
#[derive(Debug, Clone, Copy)]
enum Meanwhile {
    /// Nothing (waits at once).
    Nothing,
    /// This many units of busy loop.
    Spin(u64),
    /// Sleeps this long: compute that needs no host CPU (an accelerator's).
    Sleep(Duration),
}

impl Meanwhile {
    fn run(self) {
        match self {
            Meanwhile::Nothing => {}
            Meanwhile::Spin(units) => {
                spin(units);
            }
            Meanwhile::Sleep(d) => std::thread::sleep(d),
        }
    }
}

/// One non-blocking AllReduce of `src` into `dst`, doing `meanwhile` while it runs.
fn one(
    comm: &mut Communicator,
    src: &[i32],
    dst: &mut [i32],
    meanwhile: Meanwhile,
) -> anyhow::Result<()> {
    comm.scope(move |s| -> anyhow::Result<()> {
        let r = s.iallreduce(src, dst, ReduceOp::Sum)?;
        meanwhile.run();
        Ok(r.wait()?)
    })
}

/// The overlap measurement (see the crate documentation).
fn overlap(comm: &mut Communicator, a: &Args) -> anyhow::Result<Outcome> {
    let (n, world, rank) = (a.count, comm.world_size(), comm.rank());
    let src: Vec<i32> =
        (0..n).map(|i| input(DataType::Int32, ReduceOp::Sum, i, rank) as i32).collect();
    let want_bytes = expected(DataType::Int32, ReduceOp::Sum, 0, n, world);
    let want: Vec<i32> =
        want_bytes.chunks_exact(4).map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut dsts: Vec<Vec<i32>> = (0..a.requests.max(1)).map(|_| vec![0i32; n as usize]).collect();
    let mut pass = true;
    let mut check = |dsts: &mut [Vec<i32>], what: &str, it: u32| {
        for (k, d) in dsts.iter_mut().enumerate() {
            if let Some(i) = d.iter().zip(&want).position(|(g, w)| g != w) {
                eprintln!(
                    "rank {rank}: {what} {it}, request {k}: element {i} is {}, expected {}",
                    d[i], want[i]
                );
                pass = false;
            }
            d.fill(0);
        }
    };
    // Calibration, the same amount of work on every rank: C (the slowest rank's median)
    // from warm-up collectives, then the busy loop's rate measured while every rank
    // computes (as in the timed parts), doubling until it takes 20 ms (the slowest
    // rank's rate).
    let mut c = Vec::new();
    for it in 0..a.warmup.max(3) {
        comm.barrier()?;
        let t = Instant::now();
        one(comm, &src, &mut dsts[0], Meanwhile::Nothing)?;
        c.push(t.elapsed());
        check(&mut dsts[..1], "calibration", it);
    }
    let c = slowest(comm, median(&c))?;
    comm.barrier()?;
    let mut units = 1u64 << 16;
    let per_unit = loop {
        let t = Instant::now();
        spin(units);
        let el = t.elapsed();
        if el >= Duration::from_millis(20) {
            break el.as_secs_f64() / units as f64;
        }
        units *= 2;
    };
    // (as a duration: the slowest rank's time per million units)
    let per_unit = slowest(comm, Duration::from_secs_f64(per_unit * 1e6))?.as_secs_f64() / 1e6;
    let mut work = ((c.as_secs_f64() / per_unit) as u64).max(1);
    // The sleep of the idle parts: C, updated like `work` by the warm-up.
    let mut nap = c;
    comm.barrier()?;
    let names = [
        "blocking",
        "nonblocking",
        "collective",
        "compute",
        "overlapped",
        "idle",
        "idleoverlapped",
    ];
    let mut parts: Vec<Part> = names.iter().map(|&name| Part { name, times: vec![] }).collect();
    let src_ref = &src;
    for it in 0..a.warmup + a.iters {
        let batches = if it % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut t = [Duration::ZERO; 7];
        for b in batches {
            comm.barrier()?;
            let t0 = Instant::now();
            if b == 0 {
                for d in dsts.iter_mut() {
                    comm.allreduce(src_ref, d, ReduceOp::Sum)?;
                }
            } else {
                let ds: &mut [Vec<i32>] = &mut dsts;
                comm.scope(move |s| -> anyhow::Result<()> {
                    let reqs = ds
                        .iter_mut()
                        .map(|d| s.iallreduce(src_ref, d, ReduceOp::Sum))
                        .collect::<Result<Vec<_>, _>>()?;
                    for r in reqs {
                        r.wait()?;
                    }
                    Ok(())
                })?;
            }
            t[b] = t0.elapsed();
            check(&mut dsts, names[b], it);
        }
        comm.barrier()?;
        let t0 = Instant::now();
        one(comm, &src, &mut dsts[0], Meanwhile::Nothing)?;
        t[2] = t0.elapsed();
        check(&mut dsts[..1], names[2], it);
        comm.barrier()?;
        let t0 = Instant::now();
        spin(work);
        t[3] = t0.elapsed();
        if it < a.warmup {
            // The rate measured alone rarely holds exactly: rescale to this warm-up's C,
            // both the slowest rank's, as the timed parts are.
            let (c_now, t) = (slowest(comm, t[2])?, slowest(comm, t[3])?);
            if !t.is_zero() {
                work = ((work as f64 * c_now.as_secs_f64() / t.as_secs_f64()) as u64).max(1);
            }
            nap = c_now;
        }
        comm.barrier()?;
        let t0 = Instant::now();
        one(comm, &src, &mut dsts[0], Meanwhile::Spin(work))?;
        t[4] = t0.elapsed();
        check(&mut dsts[..1], names[4], it);
        // The same with compute that leaves the host's CPUs free: a sleep of C.
        comm.barrier()?;
        let t0 = Instant::now();
        Meanwhile::Sleep(nap).run();
        t[5] = t0.elapsed();
        comm.barrier()?;
        let t0 = Instant::now();
        one(comm, &src, &mut dsts[0], Meanwhile::Sleep(nap))?;
        t[6] = t0.elapsed();
        check(&mut dsts[..1], names[6], it);
        if it >= a.warmup {
            for (p, t) in parts.iter_mut().zip(t) {
                p.times.push(t);
            }
        }
    }
    let note = format!(
        "calibration: collective {:.1} us, busy loop {:.3} ns per unit; {work} units after \
         the warm-up's rescaling",
        us(c),
        per_unit * 1e9
    );
    // The result line's times are the blocking batch's.
    Ok(Outcome { pass, parts, bytes: n * 4 * dsts.len() as u64, note })
}

/// Column header of the result line (the host programs').
const HEADER: &str = "#  rank  collective        size(B)      count     type   op  root  iters    p50(us)  min(us)  p99(us)  max(us)  algbw(GB/s)  algbw(Gbps)  result";

fn report(a: &Args, o: &Outcome) {
    let name = match a.collective {
        Kind::Reducescatter => "reducescatter",
        Kind::Allgather => "allgather",
        Kind::Overlap => "overlap",
    };
    let times = &o.parts[0].times;
    let mut sorted = times.clone();
    sorted.sort();
    let q = |f: f64| {
        let k = (f * sorted.len() as f64).ceil() as usize;
        sorted.get(k.clamp(1, sorted.len().max(1)) - 1).copied().unwrap_or_default()
    };
    let p50 = q(0.5);
    let algbw = if p50.is_zero() { 0.0 } else { o.bytes as f64 / p50.as_secs_f64() / 1e9 };
    let (dtype, op) = match a.collective {
        Kind::Overlap => ("int32".to_string(), "sum".to_string()),
        Kind::Allgather => (a.dtype.to_string(), "-".to_string()),
        Kind::Reducescatter => (a.dtype.to_string(), a.op.to_string()),
    };
    println!("{HEADER}");
    if !o.note.is_empty() {
        println!("#  note rank={}: {}", a.rank, o.note);
    }
    // The times first: the harness takes a rank's output as complete at its result line.
    if a.print_times {
        for p in &o.parts {
            let list: Vec<String> = p.times.iter().map(|t| format!("{:.1}", us(*t))).collect();
            if p.name == "iter" {
                println!("#  iter_us rank={}: {}", a.rank, list.join(" "));
            } else {
                println!("#  part_us rank={} part={}: {}", a.rank, p.name, list.join(" "));
            }
        }
    }
    println!(
        "  {:>5}  {:<14} {:>14} {:>10} {:>8} {:>4} {:>5} {:>6} {:>10.1} {:>8.1} {:>8.1} {:>8.1} {:>12.3} {:>12.3}  {}",
        a.rank,
        name,
        o.bytes,
        a.count,
        dtype,
        op,
        "-",
        times.len(),
        us(p50),
        us(q(0.0)),
        us(q(0.99)),
        us(q(1.0)),
        algbw,
        algbw * 8.0,
        if o.pass { "PASS" } else { "FAIL" }
    );
}

fn run(a: &Args) -> anyhow::Result<bool> {
    if a.collective == Kind::Reducescatter {
        a.op.check(a.dtype).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    if a.count == 0 {
        bail!("count must be at least 1");
    }
    let group = Group::create(GroupConfig::from_env(a.world_size, a.rank, a.master_addr.clone())?)
        .context("creating the group")?;
    let bytes = match a.collective {
        Kind::Overlap => a.count * 4,
        _ => a.count * a.dtype.size() as u64 * u64::from(a.world_size),
    };
    let mut comm =
        group.communicator(CommConfig::from_env(bytes)?).context("creating the communicator")?;
    let outcome = match a.collective {
        Kind::Overlap => overlap(&mut comm, a)?,
        _ => blocked(&mut comm, a)?,
    };
    report(a, &outcome);
    if a.wait_stdin {
        std::io::stdout().flush().context("flushing the report")?;
        let mut sink = Vec::new();
        std::io::stdin().read_to_end(&mut sink).context("waiting for stdin to close")?;
    }
    comm.destroy().context("destroying the communicator")?;
    group.destroy().context("destroying the group")?;
    Ok(outcome.pass)
}

fn main() -> std::process::ExitCode {
    inc_log::init("INCCL_LOG", "warn");
    let a = Args::parse();
    match run(&a) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("rank {}: error: {e:#}", a.rank);
            std::process::ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_repeat_with_the_period_and_fold_exactly() {
        for &dtype in DataType::ALL {
            for op in ReduceOp::reductions().filter(|o| o.applies_to(dtype)) {
                let a = inputs(dtype, op, 7, 3 * PERIOD + 5, 2);
                let s = dtype.size();
                for k in [0u64, 1, 239, 240, 500, 3 * PERIOD + 4] {
                    let mut b = vec![0u8; s];
                    encode(dtype, input(dtype, op, 7 + k, 2), &mut b);
                    assert_eq!(&a[k as usize * s..][..s], &b[..], "{dtype} {op} {k}");
                }
                // The period-long fold, tiled, is the element-wise fold (any offset).
                let e = expected(dtype, op, 1000, 600, 9);
                let e1 = expected(dtype, op, 1000 + 300, 1, 9);
                assert_eq!(&e[300 * s..][..s], &e1[..], "{dtype} {op}");
            }
        }
    }

    #[test]
    fn integer_sums_are_the_mpi_programs() {
        // int32 sum over 4 ranks of element 9: -(1+0) - (1+1) - (1+2) - (1+3) = -10.
        let e = expected(DataType::Int32, ReduceOp::Sum, 9, 1, 4);
        assert_eq!(i32::from_ne_bytes(e[..4].try_into().unwrap()), -10);
        let e = expected(DataType::Uint8, ReduceOp::Avg, 3, 1, 4);
        assert_eq!(e, vec![(3 + 4 + 5 + 6) / 4]);
        let got = [1u8, 2, 3, 4];
        assert_eq!(mismatch(&got, &[1, 2, 9, 4], 2).map(|m| m.0), Some(1));
        assert_eq!(mismatch(&got, &got, 2), None);
    }
}
