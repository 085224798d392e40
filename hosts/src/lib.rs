//! Host test programs for INCCL, with the seed's arguments
//! (`<world_size> <master_addr> <rank> <count>`): fill `in[i] = i * (rank + 1)`, run the
//! collective `--iters` times (blocking, or `--nonblocking K` at once), verify every
//! result exactly, print PASS/FAIL, time and algorithm bandwidth in the style of
//! nccl-tests.

use std::num::NonZeroUsize;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use inccl::{
    CommConfig, Communicator, DataType, Element, Group, GroupConfig, ReduceOp, Request, Scope,
    TransportKind,
};

/// Which collective a program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// AllReduce.
    AllReduce,
    /// Reduce to `--root`.
    Reduce,
    /// Broadcast from `--root`.
    Broadcast,
    /// ReduceScatter: a rank's input is `world_size` blocks of `count` elements; rank `r`
    /// receives the reduction of block `r`.
    ReduceScatter,
    /// AllGather: every rank receives `world_size` blocks of `count` elements, block `r`
    /// from rank `r`.
    AllGather,
    /// Barrier (`count` is ignored).
    Barrier,
}

impl Collective {
    /// Its name in the result rows (and in the program's name, `inccl-NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::Reduce => "reduce",
            Collective::Broadcast => "broadcast",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllGather => "allgather",
            Collective::Barrier => "barrier",
        }
    }

    /// Whether it takes an operator (`--op`).
    pub fn has_op(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter)
    }

    /// Whether it has a root (`--root`).
    pub fn has_root(self) -> bool {
        matches!(self, Collective::Reduce | Collective::Broadcast)
    }

    /// Blocks of `count` elements in a rank's whole buffer: ReduceScatter's input and
    /// AllGather's result hold one per rank.
    pub fn blocks(self, world: u16) -> u64 {
        match self {
            Collective::ReduceScatter | Collective::AllGather => u64::from(world),
            _ => 1,
        }
    }
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
    /// Elements per rank; for ReduceScatter and AllGather per block (a rank's whole
    /// buffer, ReduceScatter's input and AllGather's result, is world_size blocks).
    /// Comma separated for several counts: each runs every (type, operator) pair in turn.
    #[arg(value_name = "COUNT", value_delimiter = ',', num_args = 1, required = true)]
    #[arg(action = clap::ArgAction::Set)]
    pub counts: Vec<u64>,
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
    /// Before every iteration, an untimed Barrier, so that the ranks start each timed
    /// collective together (as OSU's and nccl-tests' timing loops do). Without it a rank
    /// that starts an iteration early also times its wait for the others.
    #[arg(long)]
    pub sync: bool,
    /// Run in place: the result overwrites the input buffer (AllReduce, Reduce on the
    /// root, ReduceScatter into the rank's own block of its input, AllGather from the
    /// rank's own block of the result). Broadcast always runs in place; Barrier has no
    /// buffer.
    #[arg(long)]
    pub in_place: bool,
    /// Non-blocking: every iteration starts K collectives at once (on K buffers, through
    /// Communicator::scope), then waits for each and verifies each. The iteration's
    /// time, size(B) and algbw are those of the K together. In place only for AllReduce
    /// (and Broadcast), as the library has non-blocking in-place calls for those only.
    #[arg(long, value_name = "K")]
    pub nonblocking: Option<NonZeroUsize>,
    /// Controller address host:port (rank 0; default: INCCL_CONTROLLER).
    #[arg(long)]
    pub controller: Option<String>,
    /// Transport: udp or verbs (default: INCCL_TRANSPORT, else udp).
    #[arg(long)]
    pub transport: Option<TransportKind>,
    /// Also print every timed iteration's time (a `#  iter_us` line), for histograms.
    #[arg(long)]
    pub print_times: bool,
    /// Check the arguments (names, type x operator pairs, root, --in-place and
    /// --nonblocking) and exit without connecting: prints the pairs that would run.
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
    /// explicitly, and left out when `all` brought it in. Collectives without an
    /// operator (Broadcast, AllGather, Barrier) run one pair per type with SUM (its
    /// inputs are SUM's); Barrier one pair.
    pub fn pairs(&self, which: Collective) -> anyhow::Result<Vec<(DataType, ReduceOp)>> {
        let dtypes = expand(&self.dtypes, DataType::ALL);
        let ops = if which.has_op() {
            expand(&self.ops, &ReduceOp::reductions().collect::<Vec<_>>())
        } else {
            vec![ReduceOp::Sum]
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

    /// Collectives started at once per iteration: `--nonblocking K`, else 1.
    fn in_flight(&self) -> usize {
        self.nonblocking.map_or(1, NonZeroUsize::get)
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

/// The expected value of every element, in a form cheap enough per element that
/// checking a result costs about what the MPI reference's check costs (a multiply and
/// a compare): otherwise the ranks leave their checks at times further apart than MPI's
/// ranks do, and the next iteration's time, the slowest rank's, carries the difference.
#[derive(Debug, Clone, PartialEq)]
enum Expected {
    /// `(i as u32) * k`, wrapping: INT32 inputs are `i * (rank + 1)`, so their sum, and
    /// one rank's input, are multiples of `i` modulo 2^32.
    Multiple(u32),
    /// `table[i % 1024]`: FLOAT32 inputs repeat every 1024 elements.
    Periodic(Vec<u32>),
    /// The fold over the ranks (INT32 but SUM, whose wrapping inputs have no closed
    /// form).
    Fold(DataType, ReduceOp, u16),
    /// Native-order bytes of the `TABLE_PERIOD` values of [`input_table`]'s inputs (or
    /// of their reductions), and the element size.
    Table(Vec<u8>, usize),
}

impl Expected {
    const PERIOD: u64 = 1024;

    /// Rank `rank`'s input: what a Broadcast from it delivers, and AllGather's block
    /// `rank` (at its indices in the whole buffer).
    fn input(dtype: DataType, op: ReduceOp, rank: u16) -> Self {
        if !seed_inputs(dtype, op) {
            return Expected::table(dtype, |i| input_table(dtype, op, i, rank));
        }
        match dtype {
            DataType::Int32 => Expected::Multiple(u32::from(rank) + 1),
            _ => Expected::Periodic(
                (0..Self::PERIOD).map(|i| input_f32(i, rank).to_bits()).collect(),
            ),
        }
    }

    /// The reduction of every rank's input over `world` ranks, AVG divided as the hosts
    /// do.
    fn reduced(dtype: DataType, op: ReduceOp, world: u16) -> Self {
        if !seed_inputs(dtype, op) {
            return Expected::table_fold(dtype, op, world);
        }
        match (dtype, op) {
            (DataType::Int32, ReduceOp::Sum) => {
                Expected::Multiple((1..=u32::from(world)).fold(0, u32::wrapping_add))
            }
            (DataType::Int32, _) => Expected::Fold(dtype, op, world),
            _ => Expected::Periodic(
                (0..Self::PERIOD).map(|i| expected_bits(dtype, op, i, world)).collect(),
            ),
        }
    }

    /// The fold over ranks of [`input_table`]'s inputs (in rank order: every order
    /// gives the same bits for these inputs), AVG divided as the hosts do.
    fn table_fold(dtype: DataType, op: ReduceOp, world: u16) -> Self {
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
        Expected::table(dtype, |i| {
            let ranks = (0..world.max(1)).map(|r| input_table(dtype, op, i, r)).collect();
            dtype.visit(Fold(op, world, ranks))
        })
    }

    /// The table of `elem(i)` for one period of [`input_table`].
    fn table(dtype: DataType, elem: impl Fn(u64) -> Vec<u8>) -> Self {
        Expected::Table((0..TABLE_PERIOD).flat_map(elem).collect(), dtype.size())
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

    /// The first element of `got`, whose elements have the indices from `first` on,
    /// that differs: (position in `got`, got, expected), as bits.
    fn first_mismatch<T: Element>(&self, got: &[T], first: u64) -> Option<(usize, u64, u64)> {
        let bytes: &[u8] = bytemuck::cast_slice(got);
        let size = std::mem::size_of::<T>();
        let at = |j: usize, v: u64| {
            let want = self.at(first + j as u64);
            (v != want).then_some((j, v, want))
        };
        match self {
            // The common case as a plain loop the compiler can vectorise.
            Expected::Multiple(k) if size == 4 => bytemuck::cast_slice::<T, u32>(got)
                .iter()
                .enumerate()
                .find(|(j, v)| **v != (first as u32).wrapping_add(*j as u32).wrapping_mul(*k))
                .and_then(|(j, v)| at(j, u64::from(*v))),
            _ => bytes.chunks_exact(size).enumerate().find_map(|(j, v)| at(j, bits(v))),
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
fn input_elem<T: Element>(op: ReduceOp, i: u64, rank: u16) -> T {
    match T::DTYPE {
        DataType::Int32 => T::load_ne(&input_i32(i, rank).to_ne_bytes()),
        DataType::Float32 if op != ReduceOp::Prod => T::load_ne(&input_f32(i, rank).to_ne_bytes()),
        dtype => T::load_ne(&input_table(dtype, op, i, rank)),
    }
}

/// Result of one (count, type, operator) row of a program run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Elements per rank (per block for ReduceScatter and AllGather; 0 for Barrier).
    pub count: u64,
    /// Element type.
    pub dtype: DataType,
    /// Operator (SUM for the collectives without one).
    pub op: ReduceOp,
    /// Every iteration verified.
    pub pass: bool,
    /// Time of each timed iteration.
    pub times: Vec<Duration>,
}

/// A part of a rank's result buffer and what it must hold after the collective: its
/// elements are `expected`'s at the indices from `first` on (the indices of the whole,
/// `world_size`-block buffer, which is where every rank's inputs are defined).
#[derive(Debug)]
struct Part {
    range: Range<usize>,
    expected: Expected,
    first: u64,
}

/// One rank's buffers of one collective of `n` elements (per block): the indices of its
/// input, the length of its result buffer, where the input is placed in the result
/// buffer before the call, and what the result buffer must hold after it.
#[derive(Debug)]
struct Layout {
    input: Range<u64>,
    buf_len: usize,
    preload: Option<usize>,
    parts: Vec<Part>,
}

impl Layout {
    fn new(call: &Call, dtype: DataType, n: usize, world: u16) -> anyhow::Result<Self> {
        let Call { which, op, root, rank, in_place } = *call;
        let w = usize::from(world);
        let whole = n.checked_mul(w).context("count times world size overflows")?;
        let (n64, mine) = (n as u64, usize::from(rank));
        let reduced = || Expected::reduced(dtype, op, world);
        // All of a one-block buffer, or block `b` of a whole one.
        let all = |expected| Part { range: 0..n, expected, first: 0 };
        let block = |b: usize, expected| Part {
            range: b * n..(b + 1) * n,
            expected,
            first: (b * n) as u64,
        };
        let placed = in_place.then_some(0);
        let (input, buf_len, preload, parts) = match which {
            Collective::AllReduce => (0..n64, n, placed, vec![all(reduced())]),
            Collective::Reduce if rank == root => (0..n64, n, placed, vec![all(reduced())]),
            Collective::Reduce => (0..n64, if in_place { n } else { 0 }, placed, Vec::new()),
            Collective::Broadcast => {
                let preload = (rank == root).then_some(0);
                (0..n64, n, preload, vec![all(Expected::input(dtype, op, root))])
            }
            Collective::ReduceScatter if in_place => {
                let own = |b| if b == mine { reduced() } else { Expected::input(dtype, op, rank) };
                (0..whole as u64, whole, placed, (0..w).map(|b| block(b, own(b))).collect())
            }
            Collective::ReduceScatter => {
                let part = Part { range: 0..n, expected: reduced(), first: mine as u64 * n64 };
                (0..whole as u64, n, None, vec![part])
            }
            Collective::AllGather => {
                let first = mine as u64 * n64;
                let parts =
                    (0..world).map(|b| block(usize::from(b), Expected::input(dtype, op, b)));
                (first..first + n64, whole, in_place.then_some(mine * n), parts.collect())
            }
            Collective::Barrier => (0..0, 0, None, Vec::new()),
        };
        Ok(Layout { input, buf_len, preload, parts })
    }
}

/// One collective call as the arguments make it.
#[derive(Debug, Clone, Copy)]
struct Call {
    which: Collective,
    op: ReduceOp,
    root: u16,
    rank: u16,
    in_place: bool,
}

impl Call {
    /// Runs the collective on `buf`, input from `src` unless in place.
    fn blocking<T: Element>(
        &self,
        comm: &mut Communicator,
        src: &[T],
        buf: &mut [T],
    ) -> inccl::Result<()> {
        let Call { which, op, root, in_place, .. } = *self;
        match which {
            Collective::AllReduce if in_place => comm.allreduce_in_place(buf, op),
            Collective::AllReduce => comm.allreduce(src, buf, op),
            Collective::Reduce if in_place => {
                comm.reduce_bytes_in_place(bytemuck::cast_slice_mut(buf), T::DTYPE, op, root)
            }
            Collective::Reduce => comm.reduce(src, buf, op, root),
            Collective::Broadcast => comm.broadcast(buf, root),
            Collective::ReduceScatter if in_place => comm.reduce_scatter_in_place(buf, op),
            Collective::ReduceScatter => comm.reduce_scatter(src, buf, op),
            Collective::AllGather if in_place => comm.allgather_in_place(buf),
            Collective::AllGather => comm.allgather(src, buf),
            Collective::Barrier => comm.barrier(),
        }
    }

    /// Starts the collective on `buf` in `scope` (in place only where
    /// [`checked_pairs`] allows it).
    fn start<'s, 'env, T: Element>(
        &self,
        scope: &Scope<'s, 'env>,
        src: &'env [T],
        buf: &'env mut [T],
    ) -> inccl::Result<Request<'s>> {
        let Call { which, op, root, in_place, .. } = *self;
        match which {
            Collective::AllReduce if in_place => scope.iallreduce_in_place(buf, op),
            Collective::AllReduce => scope.iallreduce(src, buf, op),
            Collective::Reduce => scope.ireduce(src, buf, op, root),
            Collective::Broadcast => scope.ibroadcast(buf, root),
            Collective::ReduceScatter => scope.ireduce_scatter(src, buf, op),
            Collective::AllGather => scope.iallgather(src, buf),
            Collective::Barrier => scope.ibarrier(),
        }
    }
}

fn run_typed<T: Element>(
    comm: &mut Communicator,
    which: Collective,
    args: &Args,
    count: u64,
    op: ReduceOp,
) -> anyhow::Result<Report> {
    let n = usize::try_from(count).context("count does not fit this machine's memory")?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let call = Call { which, op, root: args.root, rank, in_place: args.in_place };
    let layout = Layout::new(&call, T::DTYPE, n, world)?;
    let src: Vec<T> = layout.input.clone().map(|i| input_elem(op, i, rank)).collect();
    let zero = <T as bytemuck::Zeroable>::zeroed();
    let mut bufs: Vec<Vec<T>> = vec![vec![zero; layout.buf_len]; args.in_flight()];
    let mut times = Vec::new();
    let mut pass = true;
    for it in 0..args.warmup + args.iters {
        for buf in &mut bufs {
            buf.fill(zero);
            if let Some(at) = layout.preload {
                buf[at..at + src.len()].copy_from_slice(&src);
            }
        }
        if args.sync {
            comm.barrier().context("the barrier before an iteration (--sync)")?;
        }
        let t = Instant::now();
        if args.nonblocking.is_some() {
            let (src, bufs) = (&src[..], &mut bufs[..]);
            comm.scope(move |s| -> anyhow::Result<()> {
                let mut started = Vec::with_capacity(bufs.len());
                for (k, buf) in bufs.iter_mut().enumerate() {
                    started.push(call.start(s, src, buf).with_context(|| format!("request {k}"))?);
                }
                for (k, request) in started.into_iter().enumerate() {
                    request.wait().with_context(|| format!("request {k}"))?;
                }
                Ok(())
            })?;
        } else {
            call.blocking(comm, &src, &mut bufs[0])?;
        }
        let elapsed = t.elapsed();
        for (k, buf) in bufs.iter().enumerate() {
            for part in &layout.parts {
                let got = &buf[part.range.clone()];
                if let Some((j, got, exp)) = part.expected.first_mismatch(got, part.first) {
                    let w = 2 + 2 * std::mem::size_of::<T>();
                    let request = if args.nonblocking.is_some() {
                        format!(" request {k}:")
                    } else {
                        String::new()
                    };
                    let i = part.range.start + j;
                    eprintln!(
                        "rank {rank}: iteration {it}:{request} element {i} is {got:#0w$x}, expected {exp:#0w$x}"
                    );
                    pass = false;
                }
            }
        }
        if it >= args.warmup {
            times.push(elapsed);
        }
    }
    Ok(Report { count, dtype: T::DTYPE, op, pass, times })
}

/// [`run_typed`] for a table row's Rust type (every one is an `inccl::Element`).
fn run_elem<E: inc_wire::reduce::Elem>(
    comm: &mut Communicator,
    which: Collective,
    args: &Args,
    count: u64,
    op: ReduceOp,
) -> anyhow::Result<Report> {
    macro_rules! rows {
        ($($t:ty),*) => {
            $(if E::DTYPE == <$t as inc_wire::reduce::Elem>::DTYPE {
                return run_typed::<$t>(comm, which, args, count, op);
            })*
        };
    }
    rows!(i32, f32, i8, u8, u32, i64, u64, half::f16, half::bf16, f64);
    bail!("datatype {} has no Rust element type in the host programs", E::DTYPE)
}

/// The pairs to run, after the checks that need no peer (names, pairs, root, the
/// non-blocking calls' in-place forms, requests in flight).
fn checked_pairs(which: Collective, args: &Args) -> anyhow::Result<Vec<(DataType, ReduceOp)>> {
    if which.has_root() && args.root >= args.world_size {
        bail!("--root {} is out of range for world size {}", args.root, args.world_size);
    }
    if let Some(k) = args.nonblocking {
        if k.get() > inccl::MAX_PENDING {
            bail!(
                "--nonblocking {k}: a communicator holds at most {} requests",
                inccl::MAX_PENDING
            );
        }
        let in_place_form =
            matches!(which, Collective::AllReduce | Collective::Broadcast | Collective::Barrier);
        if args.in_place && !in_place_form {
            bail!(
                "--in-place with --nonblocking: INCCL has no non-blocking in-place {}",
                which.name()
            );
        }
    }
    args.pairs(which)
}

/// Run a program: create the group and communicator, run and verify every (count,
/// type, operator) row in turn, print a nccl-tests style line for each. Returns the
/// reports (the caller sets the exit code).
pub fn run(which: Collective, args: &Args) -> anyhow::Result<Vec<Report>> {
    let pairs = checked_pairs(which, args)?;
    let mut gcfg = GroupConfig::from_env(args.world_size, args.rank, args.master_addr.clone())?;
    if args.controller.is_some() {
        gcfg.controller = args.controller.clone();
    }
    let group = Group::create(gcfg).context("creating the group")?;
    let widest = pairs.iter().map(|(d, _)| d.size() as u64).max().unwrap_or(1);
    let largest = args.counts.iter().copied().max().unwrap_or(0);
    let bytes = largest.saturating_mul(widest).saturating_mul(which.blocks(args.world_size));
    let mut ccfg = CommConfig::from_env(bytes)?;
    if let Some(t) = args.transport {
        ccfg.transport = t;
    }
    let mut comm = group.communicator(ccfg).context("creating the communicator")?;
    struct Typed<'a>(&'a mut Communicator, Collective, &'a Args, u64, ReduceOp);
    impl inc_wire::TypeVisitor for Typed<'_> {
        type Output = anyhow::Result<Report>;
        fn visit<E: inc_wire::reduce::Elem>(self) -> anyhow::Result<Report> {
            run_elem::<E>(self.0, self.1, self.2, self.3, self.4)
        }
    }
    // A barrier has no data: it runs once, whatever the counts.
    let counts = if which == Collective::Barrier { vec![0] } else { args.counts.clone() };
    println!("{REPORT_HEADER}");
    let mut reports = Vec::new();
    for &count in &counts {
        for &(dtype, op) in &pairs {
            let report = dtype.visit(Typed(&mut comm, which, args, count, op))?;
            print_report(which, args, &report);
            reports.push(report);
        }
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
pub const REPORT_HEADER: &str = "#  rank  collective           size(B)      count     type   op  root  iters    p50(us)  min(us)  p99(us)  max(us)  algbw(GB/s)  algbw(Gbps)  result";

/// Bytes of one timed iteration: the whole buffer of each collective started in it
/// (world_size blocks for ReduceScatter and AllGather, as nccl-tests counts them).
fn iteration_bytes(which: Collective, args: &Args, r: &Report) -> u64 {
    let blocks = which.blocks(args.world_size);
    r.count * r.dtype.size() as u64 * blocks * args.in_flight() as u64
}

fn print_report(which: Collective, args: &Args, r: &Report) {
    let bytes = iteration_bytes(which, args, r);
    let mut sorted = r.times.clone();
    sorted.sort();
    let p50 = quantile(&sorted, 0.5);
    let us = |t: Duration| t.as_secs_f64() * 1e6;
    let algbw = |t: Duration| if t.is_zero() { 0.0 } else { bytes as f64 / t.as_secs_f64() / 1e9 };
    println!(
        "  {:>5}  {:<13} {:>14} {:>10} {:>8} {:>4} {:>5} {:>6} {:>10.1} {:>8.1} {:>8.1} {:>8.1} {:>12.3} {:>12.3}  {}",
        args.rank,
        which.name(),
        bytes,
        r.count,
        if which == Collective::Barrier { "-".to_string() } else { r.dtype.to_string() },
        if which.has_op() { r.op.to_string() } else { "-".to_string() },
        if which.has_root() { args.root.to_string() } else { "-".to_string() },
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

/// `main` of the programs.
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
        for input in [false, true] {
            for dtype in [DataType::Int32, DataType::Float32] {
                let ops = ReduceOp::reductions().filter(|o| o.applies_to(dtype));
                for op in ops.filter(|o| seed_inputs(dtype, *o)) {
                    for (world, root) in [(1, 0), (4, 0), (4, 3), (7, 5)] {
                        let e = if input {
                            Expected::input(dtype, op, root)
                        } else {
                            Expected::reduced(dtype, op, world)
                        };
                        for &i in &indices {
                            let want = match (input, dtype) {
                                (true, DataType::Int32) => input_i32(i, root) as u32,
                                (true, _) => input_f32(i, root).to_bits(),
                                (false, _) => expected_bits(dtype, op, i, world),
                            };
                            assert_eq!(
                                e.at(i),
                                u64::from(want),
                                "input {input} {dtype:?} {op:?} {world} {root} {i}"
                            );
                        }
                    }
                }
            }
        }
        let e = Expected::reduced(DataType::Int32, ReduceOp::Sum, 4);
        let mut got: Vec<i32> = (0..100u64).map(|i| e.at(i) as i32).collect();
        assert_eq!(e.first_mismatch(&got, 0), None);
        got[37] ^= 1;
        got[90] = 0;
        assert_eq!(e.first_mismatch(&got, 0), Some((37, 370 ^ 1, 370)));
        // From index 1000 on (a later block): position 37 is index 1037.
        let mut got: Vec<i32> = (1000..1100u64).map(|i| e.at(i) as i32).collect();
        assert_eq!(e.first_mismatch(&got, 1000), None);
        assert_eq!(e.first_mismatch(&got, 0).map(|m| m.0), Some(0));
        got[37] = 0;
        assert_eq!(e.first_mismatch(&got, 1000), Some((37, 0, 10370)));
        let e = Expected::reduced(DataType::Float32, ReduceOp::Max, 4);
        let mut got: Vec<f32> = (0..2000u64).map(|i| f32::from_bits(e.at(i) as u32)).collect();
        assert_eq!(e.first_mismatch(&got, 0), None);
        got[1500] = 0.5;
        assert_eq!(e.first_mismatch(&got, 0).map(|m| m.0), Some(1500));
    }

    /// Each collective's layout, in place and out of place, on every rank: the buffers
    /// as the collective's definition leaves them (computed here from every rank's
    /// input) pass the parts, which cover every element a rank checks; a wrong element
    /// anywhere in them is found.
    #[test]
    fn layouts_check_what_each_collective_defines() {
        use Collective::*;
        let (world, n, root) = (3u16, 5usize, 1u16);
        let w = usize::from(world);
        let op = ReduceOp::Max;
        let max = |i: usize| (0..world).map(|q| input_i32(i as u64, q)).max().unwrap();
        for which in [AllReduce, Reduce, Broadcast, ReduceScatter, AllGather, Barrier] {
            for in_place in [false, true] {
                for rank in 0..world {
                    let call = Call { which, op, root, rank, in_place };
                    let layout = Layout::new(&call, DataType::Int32, n, world).unwrap();
                    let src: Vec<i32> = layout.input.clone().map(|i| input_i32(i, rank)).collect();
                    let r = usize::from(rank);
                    let mut buf: Vec<i32> = match (which, in_place) {
                        (AllReduce, _) => (0..n).map(max).collect(),
                        (Reduce, _) if rank == root => (0..n).map(max).collect(),
                        (Reduce, true) => src.clone(),
                        (Reduce, false) | (Barrier, _) => Vec::new(),
                        (Broadcast, _) => (0..n).map(|i| input_i32(i as u64, root)).collect(),
                        (ReduceScatter, false) => (r * n..(r + 1) * n).map(max).collect(),
                        (ReduceScatter, true) => {
                            let mut b = src.clone();
                            (r * n..(r + 1) * n).for_each(|i| b[i] = max(i));
                            b
                        }
                        (AllGather, _) => {
                            (0..w * n).map(|i| input_i32(i as u64, (i / n) as u16)).collect()
                        }
                    };
                    assert_eq!(buf.len(), layout.buf_len, "{which:?} {in_place} {rank}");
                    let mismatch = |buf: &[i32]| {
                        layout.parts.iter().find_map(|p| {
                            let got = &buf[p.range.clone()];
                            p.expected.first_mismatch(got, p.first).map(|m| p.range.start + m.0)
                        })
                    };
                    assert_eq!(mismatch(&buf), None, "{which:?} {in_place} {rank}");
                    let checked: usize = layout.parts.iter().map(|p| p.range.len()).sum();
                    let checks = !matches!(which, Barrier) && (which != Reduce || rank == root);
                    assert_eq!(checked, if checks { buf.len() } else { 0 }, "{which:?}");
                    for i in 0..checked {
                        buf[i] ^= 0x100;
                        assert_eq!(mismatch(&buf), Some(i), "{which:?} {in_place} {rank} {i}");
                        buf[i] ^= 0x100;
                    }
                    // In place (and on Broadcast's root) the input goes in at its own
                    // indices of the whole buffer.
                    if let Some(at) = layout.preload {
                        assert!(in_place || (which == Broadcast && rank == root));
                        assert_eq!(at as u64, layout.input.start, "{which:?} {rank}");
                        assert!(at + src.len() <= layout.buf_len, "{which:?} {rank}");
                    }
                }
            }
        }
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
                let e = Expected::reduced(E::DTYPE, op, world);
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
        let e = Expected::reduced(DataType::Uint8, ReduceOp::Bxor, 4);
        let mut got: Vec<u8> = (0..3000u64).map(|i| e.at(i) as u8).collect();
        assert_eq!(e.first_mismatch(&got, 0), None);
        got[2500] ^= 0x10;
        assert_eq!(e.first_mismatch(&got, 0).map(|m| m.0), Some(2500));
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
        assert_eq!((a.world_size, a.rank, &a.counts[..], a.root), (4, 2, &[1024][..], 1));
        assert_eq!(a.pairs(Collective::AllReduce).unwrap(), [(DataType::Float32, ReduceOp::Max)]);
        assert!(Args::try_parse_from(["x", "4", "h", "0", "8", "--op", "mean"]).is_err());
        let a = Args::try_parse_from(["x", "4", "h", "0", "1,7,65537"]).unwrap();
        assert_eq!(a.counts, [1, 7, 65537]);
        assert!(Args::try_parse_from(["x", "4", "h", "0", "8", "9"]).is_err());
        assert!(Args::try_parse_from(["x", "4", "h", "0", "8,x"]).is_err());
    }

    /// --nonblocking: at least one request, at most a communicator's; in place only
    /// where the library has a non-blocking in-place call. The iteration's bytes are
    /// those of every block of every request.
    #[test]
    fn nonblocking_and_in_place() {
        use Collective::*;
        let parse = |extra: &[&str]| {
            let mut v = vec!["x", "4", "h", "0", "8"];
            v.extend_from_slice(extra);
            Args::try_parse_from(v)
        };
        assert!(parse(&["--nonblocking", "0"]).is_err());
        let a = parse(&["--nonblocking", "8", "--in-place"]).unwrap();
        for which in [AllReduce, Broadcast, Barrier] {
            assert!(checked_pairs(which, &a).is_ok(), "{which:?}");
        }
        for which in [Reduce, ReduceScatter, AllGather] {
            let e = checked_pairs(which, &a).unwrap_err().to_string();
            assert!(e.contains(which.name()) && e.contains("--in-place"), "{e}");
        }
        let a = parse(&["--nonblocking", "8"]).unwrap();
        assert!(checked_pairs(ReduceScatter, &a).is_ok());
        let report = Report {
            count: 8,
            dtype: DataType::Float64,
            op: ReduceOp::Sum,
            pass: true,
            times: Vec::new(),
        };
        assert_eq!(iteration_bytes(AllGather, &a, &report), 8 * 8 * 4 * 8);
        assert_eq!(iteration_bytes(AllReduce, &a, &report), 8 * 8 * 8);
        let over = (inccl::MAX_PENDING + 1).to_string();
        let e = checked_pairs(AllReduce, &parse(&["--nonblocking", &over]).unwrap()).unwrap_err();
        assert!(e.to_string().contains(&over), "{e}");
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
        assert_eq!(
            a.pairs(Collective::AllGather).unwrap(),
            a.pairs(Collective::Broadcast).unwrap()
        );
        assert_eq!(a.pairs(Collective::ReduceScatter).unwrap(), pairs);
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
