//! Host test programs for INCCL, with the seed's arguments
//! (`<world_size> <master_addr> <rank> <count>`): fill `in[i] = i * (rank + 1)`, run the
//! collective `--iters` times, verify every result exactly, print PASS/FAIL, time and
//! algorithm bandwidth in the style of nccl-tests.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use inccl::{CommConfig, Communicator, DataType, Group, GroupConfig, ReduceOp, TransportKind};

/// Which collective a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// AllReduce.
    AllReduce,
    /// Reduce to `--root`.
    Reduce,
    /// Broadcast from `--root`.
    Broadcast,
    /// Barrier (`count` is ignored).
    Barrier,
}

/// Command line shared by the host programs.
#[derive(Debug, Parser)]
pub struct Args {
    /// Number of ranks.
    pub world_size: u16,
    /// Rank 0's address (host or host:port; default port 52223).
    pub master_addr: String,
    /// This process's rank.
    pub rank: u16,
    /// Elements per rank.
    pub count: u64,
    /// Root rank of Reduce and Broadcast.
    #[arg(long, default_value_t = 0)]
    pub root: u16,
    /// Element types, comma separated, or `all`: int32, float32, int8, uint8, uint32,
    /// int64, uint64, float16, bfloat16, float64 (the rows of the datatype table). Every
    /// (type, operator) pair runs in turn on one communicator.
    #[arg(long = "dtype", value_delimiter = ',', default_value = "int32")]
    pub dtypes: Vec<Choice<DataType>>,
    /// Operators, comma separated, or `all`: sum, max, min, prod, avg, band, bor, bxor.
    /// Bitwise operators take integer types only: naming one with a float type is an
    /// error; `all` leaves out the pairs that do not apply.
    #[arg(long = "op", value_delimiter = ',', default_value = "sum")]
    pub ops: Vec<Choice<ReduceOp>>,
    /// Timed iterations (each one verified).
    #[arg(long, default_value_t = 1)]
    pub iters: u32,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 0)]
    pub warmup: u32,
    /// Controller address host:port (rank 0; default: INCCL_CONTROLLER).
    #[arg(long)]
    pub controller: Option<String>,
    /// Transport: udp or verbs (default: INCCL_TRANSPORT, else udp).
    #[arg(long)]
    pub transport: Option<TransportKind>,
    /// Also print every timed iteration's time (a `#  iter_us` line), for histograms.
    #[arg(long)]
    pub print_times: bool,
    /// Check the arguments (names, type x operator pairs, root) and exit without
    /// connecting: prints the pairs that would run.
    #[arg(long)]
    pub check: bool,
    /// After printing the result, wait for end of input on stdin before destroying the
    /// communicator, so a harness can read the switches' per-communicator counters.
    #[arg(long)]
    pub wait_stdin: bool,
}

/// One value of a list option, or `all` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice<T> {
    /// Every row of the table.
    All,
    /// One named row.
    One(T),
}

impl<T: std::str::FromStr> std::str::FromStr for Choice<T> {
    type Err = T::Err;
    fn from_str(s: &str) -> Result<Self, T::Err> {
        if s.eq_ignore_ascii_case("all") {
            Ok(Choice::All)
        } else {
            s.parse().map(Choice::One)
        }
    }
}

/// The rows a list option names, in the order given (`all` in table order), each once.
fn expand<T: Copy + PartialEq>(choices: &[Choice<T>], all: &[T]) -> Vec<T> {
    let mut rows: Vec<T> = Vec::new();
    for c in choices {
        let add: Vec<T> = match c {
            Choice::All => all.to_vec(),
            Choice::One(t) => vec![*t],
        };
        for t in add {
            if !rows.contains(&t) {
                rows.push(t);
            }
        }
    }
    rows
}

impl Args {
    /// The (type, operator) pairs to run, in order: every type with every operator that
    /// applies to it. A pair that does not apply is an error when both were named
    /// explicitly, and left out when `all` brought it in. Broadcast and Barrier have no
    /// operator: one pair per type with SUM (its inputs are SUM's).
    pub fn pairs(&self, which: Collective) -> anyhow::Result<Vec<(DataType, ReduceOp)>> {
        let dtypes = expand(&self.dtypes, DataType::ALL);
        let ops = match which {
            Collective::Broadcast | Collective::Barrier => vec![ReduceOp::Sum],
            _ => expand(&self.ops, &ReduceOp::reductions().collect::<Vec<_>>()),
        };
        let dtypes_named = !self.dtypes.contains(&Choice::All);
        let ops_named = !self.ops.contains(&Choice::All);
        let mut pairs = Vec::new();
        for &d in &dtypes {
            for &o in &ops {
                match o.check(d) {
                    Ok(()) => pairs.push((d, o)),
                    Err(e) if dtypes_named && ops_named => bail!("{e}"),
                    Err(_) => {}
                }
            }
        }
        if pairs.is_empty() {
            bail!("no operator of --op applies to any type of --dtype");
        }
        if which == Collective::Barrier {
            pairs.truncate(1);
        }
        Ok(pairs)
    }
}

/// Input element `i` of rank `r` (INT32 wraps).
pub fn input_i32(i: u64, r: u16) -> i32 {
    (i as u32).wrapping_mul(u32::from(r) + 1) as i32
}

/// Input element `i` of rank `r` for FLOAT32: small integers, so every summation
/// order gives the exact same result.
pub fn input_f32(i: u64, r: u16) -> f32 {
    (i % 1024) as f32 * f32::from(r + 1)
}

/// Expected reduction of element `i` over `world` ranks, as the bit pattern, for the
/// seed's types (INT32, and FLOAT32 but for PROD: see [`seed_inputs`]).
pub fn expected_bits(dtype: DataType, op: ReduceOp, i: u64, world: u16) -> u32 {
    match dtype {
        DataType::Int32 => {
            let vals = (0..world).map(|r| input_i32(i, r));
            (match op {
                ReduceOp::Sum => vals.fold(0i32, i32::wrapping_add),
                ReduceOp::Max => vals.max().unwrap_or(0),
                ReduceOp::Min => vals.min().unwrap_or(0),
                ReduceOp::Prod => vals.fold(1i32, i32::wrapping_mul),
                ReduceOp::Avg => {
                    vals.fold(0i32, i32::wrapping_add).wrapping_div(i32::from(world.max(1)))
                }
                ReduceOp::Band => vals.fold(-1i32, |a, b| a & b),
                ReduceOp::Bor => vals.fold(0i32, |a, b| a | b),
                ReduceOp::Bxor => vals.fold(0i32, |a, b| a ^ b),
                ReduceOp::Barrier => 0,
            }) as u32
        }
        _ => {
            let vals = (0..world).map(|r| input_f32(i, r));
            (match op {
                ReduceOp::Max => vals.fold(f32::MIN, f32::max),
                ReduceOp::Min => vals.fold(f32::MAX, f32::min),
                ReduceOp::Avg => vals.sum::<f32>() / f32::from(world.max(1)),
                _ => vals.sum::<f32>(),
            })
            .to_bits()
        }
    }
}

/// Whether `(dtype, op)` uses the seed's inputs and closed forms: INT32 (every
/// operator), FLOAT32 but for PROD (whose products of the seed's inputs round, so would
/// depend on the switches' combining order). Every other pair uses [`input_table`].
pub fn seed_inputs(dtype: DataType, op: ReduceOp) -> bool {
    dtype == DataType::Int32 || (dtype == DataType::Float32 && op != ReduceOp::Prod)
}

/// Period of [`input_table`]'s inputs.
pub const TABLE_PERIOD: u64 = 1020;

/// Native-order input element `i` of rank `r` for the types and operators that do not
/// use the seed's inputs, chosen so that every combining order gives the same bits
/// (every partial result is exact in the type): integers `(i mod 1020) * (r + 1) + r`
/// (wrapping), fp64 `(i mod 1020) * (r + 1)`, fp16/bf16 small integers in -2..=2, and
/// for float PROD powers of two (1, -1, 2, -2).
pub fn input_table(dtype: DataType, op: ReduceOp, i: u64, r: u16) -> Vec<u8> {
    let j = i % TABLE_PERIOD;
    let r64 = u64::from(r);
    let small = ((j * 7 + r64 * 3) % 5) as i64 - 2;
    let float = |x: f64| -> Vec<u8> {
        match dtype {
            DataType::Float16 => half::f16::from_f32(x as f32).to_ne_bytes().to_vec(),
            DataType::Bfloat16 => half::bf16::from_f32(x as f32).to_ne_bytes().to_vec(),
            DataType::Float32 => (x as f32).to_ne_bytes().to_vec(),
            _ => x.to_ne_bytes().to_vec(),
        }
    };
    if dtype.is_integer() {
        let v = j.wrapping_mul(r64 + 1).wrapping_add(r64);
        return v.to_ne_bytes()[..dtype.size()].to_vec();
    }
    match (op, dtype) {
        (ReduceOp::Prod, _) => float([1.0, -1.0, 2.0, -2.0, 1.0][(j * 7 + r64 * 3) as usize % 5]),
        (_, DataType::Float64) => float((j * (r64 + 1)) as f64),
        _ => float(small as f64),
    }
}

/// The expected result of every element, in a form cheap enough per element that
/// checking a result costs about what the MPI reference's check costs (a multiply and
/// a compare): otherwise the ranks leave their checks at times further apart than MPI's
/// ranks do, and the next iteration's time, the slowest rank's, carries the difference.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// `(i as u32) * k`, wrapping: INT32 inputs are `i * (rank + 1)`, so their sum, and a
    /// Broadcast's input, are multiples of `i` modulo 2^32.
    Multiple(u32),
    /// `table[i % 1024]`: FLOAT32 inputs repeat every 1024 elements.
    Periodic(Vec<u32>),
    /// The fold over the ranks (INT32 but SUM, whose wrapping inputs have no closed
    /// form).
    Fold(DataType, ReduceOp, u16),
    /// Native-order bytes of the `TABLE_PERIOD` results of [`input_table`]'s inputs,
    /// and the element size.
    Table(Vec<u8>, usize),
}

impl Expected {
    fn new(which: Collective, dtype: DataType, op: ReduceOp, root: u16, world: u16) -> Self {
        const PERIOD: u64 = 1024;
        if !seed_inputs(dtype, op) {
            return Expected::table(which, dtype, op, root, world);
        }
        match (which, dtype, op) {
            (Collective::Broadcast, DataType::Int32, _) => Expected::Multiple(u32::from(root) + 1),
            (Collective::Broadcast, _, _) => {
                Expected::Periodic((0..PERIOD).map(|i| input_f32(i, root).to_bits()).collect())
            }
            (_, DataType::Int32, ReduceOp::Sum) => {
                Expected::Multiple((1..=u32::from(world)).fold(0, u32::wrapping_add))
            }
            (_, DataType::Int32, _) => Expected::Fold(dtype, op, world),
            _ => Expected::Periodic(
                (0..PERIOD).map(|i| expected_bits(dtype, op, i, world)).collect(),
            ),
        }
    }

    /// The fold over ranks of [`input_table`]'s inputs (in rank order: every order
    /// gives the same bits for these inputs), AVG divided as the hosts do.
    fn table(which: Collective, dtype: DataType, op: ReduceOp, root: u16, world: u16) -> Self {
        struct Fold(ReduceOp, u16, Vec<Vec<u8>>);
        impl inc_wire::TypeVisitor for Fold {
            type Output = Vec<u8>;
            fn visit<E: inc_wire::reduce::Elem>(self) -> Vec<u8> {
                let Fold(op, world, ranks) = self;
                let mut acc = E::load_ne(&ranks[0]);
                for r in &ranks[1..] {
                    acc = E::combine(op.in_network(), acc, E::load_ne(r));
                }
                let mut out = vec![0u8; E::SIZE];
                acc.store_ne(&mut out);
                inc_wire::reduce::finalize_native(op, E::DTYPE, &mut out, world);
                out
            }
        }
        let bytes = (0..TABLE_PERIOD)
            .flat_map(|i| match which {
                Collective::Broadcast => input_table(dtype, op, i, root),
                _ => {
                    let ranks = (0..world.max(1)).map(|r| input_table(dtype, op, i, r)).collect();
                    dtype.visit(Fold(op, world, ranks))
                }
            })
            .collect();
        Expected::Table(bytes, dtype.size())
    }

    /// Element `i`'s expected bits.
    fn at(&self, i: u64) -> u64 {
        match self {
            Expected::Multiple(k) => u64::from((i as u32).wrapping_mul(*k)),
            Expected::Periodic(t) => u64::from(t[(i % t.len() as u64) as usize]),
            Expected::Fold(dtype, op, world) => u64::from(expected_bits(*dtype, *op, i, *world)),
            Expected::Table(t, size) => {
                let at = (i % TABLE_PERIOD) as usize * size;
                bits(&t[at..at + size])
            }
        }
    }

    /// The first element of `got` that differs: (index, got, expected), as bits.
    fn first_mismatch<T: inccl::Element>(&self, got: &[T]) -> Option<(usize, u64, u64)> {
        let bytes: &[u8] = bytemuck::cast_slice(got);
        let size = std::mem::size_of::<T>();
        let at = |i: usize, v: u64| {
            let want = self.at(i as u64);
            (v != want).then_some((i, v, want))
        };
        match self {
            // The common case as a plain loop the compiler can vectorise.
            Expected::Multiple(k) if size == 4 => bytemuck::cast_slice::<T, u32>(got)
                .iter()
                .enumerate()
                .find(|(i, v)| **v != (*i as u32).wrapping_mul(*k))
                .and_then(|(i, v)| at(i, u64::from(*v))),
            _ => bytes.chunks_exact(size).enumerate().find_map(|(i, v)| at(i, bits(v))),
        }
    }
}

/// The bits of a native-order element.
fn bits(b: &[u8]) -> u64 {
    let mut x = [0u8; 8];
    if cfg!(target_endian = "little") {
        x[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(x)
    } else {
        x[8 - b.len()..].copy_from_slice(b);
        u64::from_be_bytes(x)
    }
}

/// Input element `i` of `rank` for `(T, op)`.
fn input_elem<T: inccl::Element>(op: ReduceOp, i: u64, rank: u16) -> T {
    match T::DTYPE {
        DataType::Int32 => T::load_ne(&input_i32(i, rank).to_ne_bytes()),
        DataType::Float32 if op != ReduceOp::Prod => T::load_ne(&input_f32(i, rank).to_ne_bytes()),
        dtype => T::load_ne(&input_table(dtype, op, i, rank)),
    }
}

/// Result of one (type, operator) pair of a program run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Element type.
    pub dtype: DataType,
    /// Operator (SUM for Broadcast and Barrier).
    pub op: ReduceOp,
    /// Every iteration verified.
    pub pass: bool,
    /// Time of each timed iteration.
    pub times: Vec<Duration>,
}

fn run_typed<T: inccl::Element>(
    comm: &mut Communicator,
    which: Collective,
    args: &Args,
    op: ReduceOp,
) -> anyhow::Result<Report> {
    let n = usize::try_from(args.count).context("count does not fit this machine's memory")?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let src: Vec<T> = (0..n as u64).map(|i| input_elem(op, i, rank)).collect();
    let mut dst: Vec<T> = vec![<T as bytemuck::Zeroable>::zeroed(); n];
    let mut times = Vec::new();
    let mut pass = true;
    let expected = Expected::new(which, T::DTYPE, op, args.root, world);
    for it in 0..args.warmup + args.iters {
        dst.iter_mut().for_each(|v| *v = <T as bytemuck::Zeroable>::zeroed());
        let t = Instant::now();
        match which {
            Collective::AllReduce => comm.allreduce(&src, &mut dst, op)?,
            Collective::Reduce => {
                let out: &mut [T] = if rank == args.root { &mut dst } else { &mut [] };
                comm.reduce(&src, out, op, args.root)?
            }
            Collective::Broadcast => {
                if rank == args.root {
                    dst.copy_from_slice(&src);
                }
                comm.broadcast(&mut dst, args.root)?
            }
            Collective::Barrier => comm.barrier()?,
        }
        let elapsed = t.elapsed();
        let check = match which {
            Collective::AllReduce => true,
            Collective::Reduce => rank == args.root,
            Collective::Broadcast => true,
            Collective::Barrier => false,
        };
        if check {
            if let Some((i, got, exp)) = expected.first_mismatch(&dst) {
                let w = 2 + 2 * std::mem::size_of::<T>();
                eprintln!(
                    "rank {rank}: iteration {it}: element {i} is {got:#0w$x}, expected {exp:#0w$x}"
                );
                pass = false;
            }
        }
        if it >= args.warmup {
            times.push(elapsed);
        }
    }
    Ok(Report { dtype: T::DTYPE, op, pass, times })
}

/// [`run_typed`] for a table row's Rust type (every one is an `inccl::Element`).
fn run_elem<E: inc_wire::reduce::Elem>(
    comm: &mut Communicator,
    which: Collective,
    args: &Args,
    op: ReduceOp,
) -> anyhow::Result<Report> {
    macro_rules! rows {
        ($($t:ty),*) => {
            $(if E::DTYPE == <$t as inc_wire::reduce::Elem>::DTYPE {
                return run_typed::<$t>(comm, which, args, op);
            })*
        };
    }
    rows!(i32, f32, i8, u8, u32, i64, u64, half::f16, half::bf16, f64);
    bail!("datatype {} has no Rust element type in the host programs", E::DTYPE)
}

fn run_barrier(comm: &mut Communicator, args: &Args) -> anyhow::Result<Report> {
    let mut times = Vec::new();
    for it in 0..args.warmup + args.iters {
        let t = Instant::now();
        comm.barrier()?;
        if it >= args.warmup {
            times.push(t.elapsed());
        }
    }
    Ok(Report { dtype: DataType::Int32, op: ReduceOp::Sum, pass: true, times })
}

/// The pairs to run, after the checks that need no peer (names, pairs, root).
fn checked_pairs(which: Collective, args: &Args) -> anyhow::Result<Vec<(DataType, ReduceOp)>> {
    if matches!(which, Collective::Reduce | Collective::Broadcast) && args.root >= args.world_size {
        bail!("--root {} is out of range for world size {}", args.root, args.world_size);
    }
    args.pairs(which)
}

/// Run a program: create the group and communicator, run and verify every (type,
/// operator) pair in turn, print a nccl-tests style line for each. Returns the reports
/// (the caller sets the exit code).
pub fn run(which: Collective, args: &Args) -> anyhow::Result<Vec<Report>> {
    let pairs = checked_pairs(which, args)?;
    let mut gcfg = GroupConfig::from_env(args.world_size, args.rank, args.master_addr.clone())?;
    if args.controller.is_some() {
        gcfg.controller = args.controller.clone();
    }
    let group = Group::create(gcfg).context("creating the group")?;
    let widest = pairs.iter().map(|(d, _)| d.size() as u64).max().unwrap_or(1);
    let bytes = args.count.saturating_mul(widest);
    let mut ccfg = CommConfig::from_env(bytes)?;
    if let Some(t) = args.transport {
        ccfg.transport = t;
    }
    let mut comm = group.communicator(ccfg).context("creating the communicator")?;
    struct Typed<'a>(&'a mut Communicator, Collective, &'a Args, ReduceOp);
    impl inc_wire::TypeVisitor for Typed<'_> {
        type Output = anyhow::Result<Report>;
        fn visit<E: inc_wire::reduce::Elem>(self) -> anyhow::Result<Report> {
            run_elem::<E>(self.0, self.1, self.2, self.3)
        }
    }
    println!("{REPORT_HEADER}");
    let mut reports = Vec::new();
    for (dtype, op) in pairs {
        let report = match which {
            Collective::Barrier => run_barrier(&mut comm, args)?,
            _ => dtype.visit(Typed(&mut comm, which, args, op))?,
        };
        print_report(which, args, &report);
        reports.push(report);
    }
    if args.wait_stdin {
        use std::io::{Read, Write};
        std::io::stdout().flush().context("flushing the report")?;
        // Anything read is ignored; end of input (the harness closing the pipe) is the signal.
        let mut sink = Vec::new();
        std::io::stdin().read_to_end(&mut sink).context("waiting for stdin to close")?;
    }
    comm.destroy().context("destroying the communicator")?;
    group.destroy().context("destroying the group")?;
    Ok(reports)
}

/// The `q`-quantile (0..=1) of sorted times, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Column header of the result line.
pub const REPORT_HEADER: &str = "#  rank  collective        size(B)      count     type   op  root  iters    p50(us)  min(us)  p99(us)  max(us)  algbw(GB/s)  algbw(Gbps)  result";

fn print_report(which: Collective, args: &Args, r: &Report) {
    let bytes = if which == Collective::Barrier { 0 } else { args.count * r.dtype.size() as u64 };
    let mut sorted = r.times.clone();
    sorted.sort();
    let p50 = quantile(&sorted, 0.5);
    let us = |t: Duration| t.as_secs_f64() * 1e6;
    let algbw = |t: Duration| if t.is_zero() { 0.0 } else { bytes as f64 / t.as_secs_f64() / 1e9 };
    let name = match which {
        Collective::AllReduce => "allreduce",
        Collective::Reduce => "reduce",
        Collective::Broadcast => "broadcast",
        Collective::Barrier => "barrier",
    };
    println!(
        "  {:>5}  {:<10} {:>14} {:>10} {:>8} {:>4} {:>5} {:>6} {:>10.1} {:>8.1} {:>8.1} {:>8.1} {:>12.3} {:>12.3}  {}",
        args.rank,
        name,
        bytes,
        if which == Collective::Barrier { 0 } else { args.count },
        if which == Collective::Barrier { "-".to_string() } else { r.dtype.to_string() },
        if matches!(which, Collective::Broadcast | Collective::Barrier) {
            "-".to_string()
        } else {
            r.op.to_string()
        },
        if matches!(which, Collective::Reduce | Collective::Broadcast) {
            args.root.to_string()
        } else {
            "-".to_string()
        },
        r.times.len(),
        us(p50),
        us(quantile(&sorted, 0.0)),
        us(quantile(&sorted, 0.99)),
        us(quantile(&sorted, 1.0)),
        algbw(p50),
        algbw(p50) * 8.0,
        if r.pass { "PASS" } else { "FAIL" }
    );
    if args.print_times {
        // In iteration order, so a harness can take the maximum over ranks per iteration.
        let times: Vec<String> = r.times.iter().map(|t| format!("{:.1}", us(*t))).collect();
        println!("#  iter_us rank={}: {}", args.rank, times.join(" "));
    }
}

/// `main` of the three programs.
pub fn main_for(which: Collective) -> std::process::ExitCode {
    inc_log::init("INCCL_LOG", "warn");
    let args = Args::parse();
    if args.check {
        return match checked_pairs(which, &args) {
            Ok(pairs) => {
                let names: Vec<String> = pairs.iter().map(|(d, o)| format!("{d}/{o}")).collect();
                println!("{} pairs: {}", pairs.len(), names.join(" "));
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::from(2)
            }
        };
    }
    match run(which, &args) {
        Ok(r) if r.iter().all(|r| r.pass) => std::process::ExitCode::SUCCESS,
        Ok(_) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("rank {}: error: {e:#}", args.rank);
            std::process::ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cheap forms give the fold's (and the Broadcast root's input's) value for
    /// every collective, datatype, operator, root and world size, at small, wrapping
    /// and beyond-4G indices; and the check finds the first wrong element.
    #[test]
    fn expected_forms_agree_with_the_fold() {
        let indices = (0..3000u64).chain([0x4000_0000, 0x8000_0001, u64::from(u32::MAX), 1 << 33]);
        let indices: Vec<u64> = indices.collect();
        for which in [Collective::AllReduce, Collective::Reduce, Collective::Broadcast] {
            for dtype in [DataType::Int32, DataType::Float32] {
                let ops = ReduceOp::reductions().filter(|o| o.applies_to(dtype));
                for op in ops.filter(|o| seed_inputs(dtype, *o)) {
                    for (world, root) in [(1, 0), (4, 0), (4, 3), (7, 5)] {
                        let e = Expected::new(which, dtype, op, root, world);
                        for &i in &indices {
                            let want = match (which, dtype) {
                                (Collective::Broadcast, DataType::Int32) => {
                                    input_i32(i, root) as u32
                                }
                                (Collective::Broadcast, DataType::Float32) => {
                                    input_f32(i, root).to_bits()
                                }
                                _ => expected_bits(dtype, op, i, world),
                            };
                            assert_eq!(
                                e.at(i),
                                u64::from(want),
                                "{which:?} {dtype:?} {op:?} {world} {root} {i}"
                            );
                        }
                    }
                }
            }
        }
        let e = Expected::new(Collective::AllReduce, DataType::Int32, ReduceOp::Sum, 0, 4);
        let mut got: Vec<i32> = (0..100u64).map(|i| e.at(i) as i32).collect();
        assert_eq!(e.first_mismatch(&got), None);
        got[37] ^= 1;
        got[90] = 0;
        assert_eq!(e.first_mismatch(&got), Some((37, 370 ^ 1, 370)));
        let e = Expected::new(Collective::AllReduce, DataType::Float32, ReduceOp::Max, 0, 4);
        let mut got: Vec<f32> = (0..2000u64).map(|i| f32::from_bits(e.at(i) as u32)).collect();
        assert_eq!(e.first_mismatch(&got), None);
        got[1500] = 0.5;
        assert_eq!(e.first_mismatch(&got).map(|m| m.0), Some(1500));
    }

    /// The table inputs give the same result in any combining order (here: ranks in
    /// reverse, and pairs first as a 1-2-4 tree would; fp16/bf16 through fp32), for
    /// every type and operator that does not use the seed's forms; a wrong element is
    /// found.
    #[test]
    fn table_inputs_are_order_free() {
        struct Orders(ReduceOp, u16);
        impl inc_wire::TypeVisitor for Orders {
            type Output = ();
            fn visit<E: inc_wire::reduce::Elem>(self) {
                let Orders(op, world) = self;
                let e = Expected::new(Collective::AllReduce, E::DTYPE, op, 0, world);
                let got: Vec<E> = (0..2 * TABLE_PERIOD)
                    .map(|i| {
                        let v: Vec<E> = (0..world)
                            .map(|r| E::load_ne(&input_table(E::DTYPE, op, i, r)))
                            .collect();
                        let c = |a: E, b: E| E::combine(op.in_network(), a, b);
                        let halves = v.chunks(2).map(|p| p.iter().copied().reduce(c).unwrap());
                        let tree = halves.rev().reduce(c).unwrap();
                        let mut b = vec![0u8; E::SIZE];
                        tree.store_ne(&mut b);
                        inc_wire::reduce::finalize_native(op, E::DTYPE, &mut b, world);
                        E::load_ne(&b)
                    })
                    .collect();
                let bytes: Vec<u8> = got
                    .iter()
                    .flat_map(|x| {
                        let mut b = vec![0u8; E::SIZE];
                        x.store_ne(&mut b);
                        b
                    })
                    .collect();
                let mismatch = bytes
                    .chunks_exact(E::SIZE)
                    .enumerate()
                    .find(|(i, b)| bits(b) != e.at(*i as u64));
                assert_eq!(mismatch.map(|m| m.0), None, "{} {op} world {world}", E::DTYPE);
            }
        }
        for &dtype in DataType::ALL {
            for op in ReduceOp::reductions().filter(|o| o.applies_to(dtype)) {
                if !seed_inputs(dtype, op) {
                    for world in [1, 4, 7] {
                        dtype.visit(Orders(op, world));
                    }
                }
            }
        }
        let e = Expected::new(Collective::AllReduce, DataType::Uint8, ReduceOp::Bxor, 0, 4);
        let mut got: Vec<u8> = (0..3000u64).map(|i| e.at(i) as u8).collect();
        assert_eq!(e.first_mismatch(&got), None);
        got[2500] ^= 0x10;
        assert_eq!(e.first_mismatch(&got).map(|m| m.0), Some(2500));
    }

    #[test]
    fn expected_values() {
        // Sum over 4 ranks of i * (r + 1) is 10 i.
        assert_eq!(expected_bits(DataType::Int32, ReduceOp::Sum, 7, 4), 70);
        assert_eq!(expected_bits(DataType::Int32, ReduceOp::Max, 7, 4), 28);
        assert_eq!(expected_bits(DataType::Int32, ReduceOp::Min, 7, 4), 7);
        // Wrap-around: i * 4 overflows for large i and becomes negative.
        let i = 0x4000_0000u64;
        assert_eq!(input_i32(i, 3), 0);
        assert_eq!(expected_bits(DataType::Int32, ReduceOp::Max, i, 4), 0x4000_0000);
        assert_eq!(expected_bits(DataType::Int32, ReduceOp::Min, i, 4) as i32, i32::MIN);
        assert_eq!(expected_bits(DataType::Float32, ReduceOp::Sum, 1025, 4), 10.0f32.to_bits());
        assert_eq!(expected_bits(DataType::Float32, ReduceOp::Min, 3, 2), 3.0f32.to_bits());
    }

    #[test]
    fn args_parse_like_the_seed() {
        let a = Args::try_parse_from([
            "x", "4", "10.0.0.1", "2", "1024", "--dtype", "float32", "--op", "max", "--root", "1",
        ])
        .unwrap();
        assert_eq!((a.world_size, a.rank, a.count, a.root), (4, 2, 1024, 1));
        assert_eq!(a.pairs(Collective::AllReduce).unwrap(), [(DataType::Float32, ReduceOp::Max)]);
        assert!(Args::try_parse_from(["x", "4", "h", "0", "8", "--op", "mean"]).is_err());
    }

    /// Lists and `all` expand in order, each row once; a named pair that does not apply
    /// is refused with both names, one brought in by `all` is left out.
    #[test]
    fn type_and_operator_lists() {
        let parse = |extra: &[&str]| {
            let mut v = vec!["x", "4", "h", "0", "8"];
            v.extend_from_slice(extra);
            Args::try_parse_from(v).unwrap()
        };
        use DataType::*;
        let a = parse(&["--dtype", "bfloat16,int8,bfloat16", "--op", "sum,bxor"]);
        let e = a.pairs(Collective::AllReduce).unwrap_err().to_string();
        assert!(e.contains("bxor") && e.contains("bfloat16"), "{e}");
        let a = parse(&["--dtype", "all", "--op", "band"]);
        let ints: Vec<DataType> =
            DataType::ALL.iter().copied().filter(|d| d.is_integer()).collect();
        let got: Vec<DataType> =
            a.pairs(Collective::AllReduce).unwrap().iter().map(|p| p.0).collect();
        assert_eq!(got, ints);
        let a = parse(&["--dtype", "float64,int8", "--op", "all"]);
        let pairs = a.pairs(Collective::Reduce).unwrap();
        assert_eq!(pairs.len(), 5 + 8);
        assert_eq!(pairs[0], (Float64, ReduceOp::Sum));
        assert_eq!(pairs[5], (Int8, ReduceOp::Sum));
        // Broadcast has no operator (one pair per type); Barrier one pair.
        assert_eq!(
            a.pairs(Collective::Broadcast).unwrap(),
            [(Float64, ReduceOp::Sum), (Int8, ReduceOp::Sum)]
        );
        assert_eq!(a.pairs(Collective::Barrier).unwrap().len(), 1);
        let a = parse(&["--dtype", "float32", "--op", "all"]);
        assert!(a.pairs(Collective::AllReduce).unwrap().iter().all(|(_, o)| o.applies_to(Float32)));
        let a = parse(&["--dtype", "float16", "--op", "bor,band"]);
        assert!(a.pairs(Collective::AllReduce).is_err());
        assert!(Args::try_parse_from(["x", "4", "h", "0", "8", "--dtype", "int33"]).is_err());
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let t: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(quantile(&t, 0.5), Duration::from_micros(50));
        assert_eq!(quantile(&t, 0.99), Duration::from_micros(99));
        assert_eq!(quantile(&t, 0.0), Duration::from_micros(1));
        assert_eq!(quantile(&t, 1.0), Duration::from_micros(100));
        assert_eq!(quantile(&t[..1], 0.99), Duration::from_micros(1));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }
}
