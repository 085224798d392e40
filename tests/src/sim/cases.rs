//! Seeded generation of collectives and their inputs.
//!
//! A plain seeded generator (not proptest shrinking): every case is a pure function of
//! its seed, so a failure is reproduced by re-running that one seed.

use inc_wire::{DataType, Operator};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::reference::{encode, kind_name, precision, Kind, Sample};

/// How float inputs are drawn (integers ignore it: every integer result is exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatInputs {
    /// Every partial result of any subset of the ranks is a representable wire value,
    /// so every fold order and every tree gives the same bits. SUM, MAX, MIN, AVG:
    /// multiples of 1/8 whose sum over all ranks stays within the type's significand;
    /// PROD: +-1, and +-2 or +-1/2 from at most 12 ranks.
    Exact,
    /// Finite nonzero values over a wide exponent range (PROD: magnitudes in
    /// `[1, 1 + 1/world)`): SUM, PROD and AVG depend on the combination order, so they
    /// are checked within a bound, or bit for bit against the tree fold in
    /// deterministic float mode.
    Wide,
    /// Standard normal values (mixed signs, magnitudes around 1, as gradients are),
    /// checked as [`FloatInputs::Wide`]; PROD draws wide-style inputs.
    Normal,
    /// [`FloatInputs::Exact`] values mixed with +-0, +-infinity and NaNs of any sign and
    /// payload (only dedicated tests draw these): results still do not depend on the
    /// order, and show the -0 < +0 and canonical NaN rules.
    Special,
}

/// One collective of a generated sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveCase {
    /// Kind (with root).
    pub kind: Kind,
    /// Operator (Barrier for a barrier; Broadcast sends it but computes nothing).
    pub op: Operator,
    /// Element type.
    pub dtype: DataType,
    /// Elements (0 for Barrier); for ReduceScatter and AllGather the elements of one
    /// block (a ReduceScatter input and an AllGather output hold `world` blocks).
    pub count: usize,
    /// The result overwrites the input (AllReduce, Reduce root), lands in the rank's
    /// own block of its input (ReduceScatter), or the input is the rank's own block of
    /// the output (AllGather).
    pub in_place: bool,
    /// Float input style.
    pub floats: FloatInputs,
}

impl CollectiveCase {
    /// Short description for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {} count={} in_place={} floats={:?}",
            kind_name(self.kind),
            self.op,
            self.dtype,
            self.count,
            self.in_place,
            self.floats
        )
    }

    /// Elements of one rank's input in a communicator of `world` ranks: `world` blocks
    /// for ReduceScatter, else `count`.
    pub fn input_len(&self, world: u16) -> usize {
        match self.kind {
            Kind::ReduceScatter => self.count * usize::from(world),
            _ => self.count,
        }
    }
}

/// Bounds for [`gen_collective`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaseShape {
    /// Largest element count drawn (per rank: a ReduceScatter or AllGather block is at
    /// most `max_count / world`).
    pub max_count: usize,
    /// Probability of a Barrier.
    pub barrier: f64,
    /// Probability of wide-range float inputs when the dtype is a float type.
    pub wide_floats: f64,
}

impl Default for CaseShape {
    fn default() -> Self {
        CaseShape { max_count: 40_000, barrier: 0.05, wide_floats: 0.2 }
    }
}

/// Draws an element count for elements of `size` bytes: mostly small, many near packet
/// boundaries (every valid MTU is a multiple of 256 bytes), a few up to `max`.
pub fn gen_count(rng: &mut ChaCha8Rng, max: usize, size: usize) -> usize {
    let max = max.max(1);
    let per_256 = 256 / size;
    let c = match rng.gen_range(0..100) {
        0..=9 => rng.gen_range(1..=4),
        10..=44 => rng.gen_range(1..=300),
        45..=74 => {
            (rng.gen_range(1..=64usize) * per_256).saturating_add_signed(rng.gen_range(-1..=1))
        }
        75..=94 => rng.gen_range(1..=20_000),
        _ => rng.gen_range(1..=max),
    };
    c.clamp(1, max)
}

/// Draws one collective for a communicator of `world` ranks: any kind, any type of the
/// table and any operator that applies to it.
pub fn gen_collective(rng: &mut ChaCha8Rng, world: u16, shape: &CaseShape) -> CollectiveCase {
    let root = rng.gen_range(0..world);
    let kind = if rng.gen_bool(shape.barrier) {
        Kind::Barrier
    } else {
        *[
            Kind::AllReduce,
            Kind::AllReduce,
            Kind::Reduce { root },
            Kind::Broadcast { root },
            Kind::ReduceScatter,
            Kind::AllGather,
        ]
        .choose(rng)
        .expect("non-empty")
    };
    let dtype = *DataType::ALL.choose(rng).expect("non-empty");
    let ops: Vec<Operator> = Operator::reductions().filter(|o| o.applies_to(dtype)).collect();
    let op = *ops.choose(rng).expect("SUM applies to every type");
    // A block per rank: the buffers of a blockwise collective hold `world` of them, and
    // `max_count` bounds what a rank holds.
    let max_count =
        if kind.is_blockwise() { shape.max_count / usize::from(world) } else { shape.max_count };
    let (op, count) = match kind {
        Kind::Barrier => (Operator::Barrier, 0),
        _ => (op, gen_count(rng, max_count, dtype.size())),
    };
    let in_place = !matches!(kind, Kind::Barrier | Kind::Broadcast { .. }) && rng.gen_bool(0.3);
    let floats =
        if rng.gen_bool(shape.wide_floats) { FloatInputs::Wide } else { FloatInputs::Exact };
    CollectiveCase { kind, op, dtype, count, in_place, floats }
}

/// Inputs of every rank in native byte order, [`CollectiveCase::input_len`] elements
/// each. Integers: `in[i] = i * (rank + 1)` plus random data (wrapping), sparse bits for
/// BOR and mostly ones for BAND (so that many ranks leave some bits); floats per
/// [`FloatInputs`], never -0 or NaN unless [`FloatInputs::Special`].
pub fn gen_inputs(rng: &mut ChaCha8Rng, case: &CollectiveCase, world: u16) -> Vec<Vec<u8>> {
    (0..world)
        .map(|rank| {
            let noisy = rng.gen_bool(0.8);
            let samples: Vec<Sample> = (0..case.input_len(world) as u64)
                .map(|i| sample(rng, case, world, rank, i, noisy))
                .collect();
            encode(case.dtype, &samples)
        })
        .collect()
}

/// Input element `i` of `rank`.
fn sample(
    rng: &mut ChaCha8Rng,
    case: &CollectiveCase,
    world: u16,
    rank: u16,
    i: u64,
    noisy: bool,
) -> Sample {
    if case.dtype.is_integer() {
        let structured = i.wrapping_mul(u64::from(rank) + 1);
        return Sample::Int(match case.op {
            Operator::Band => !sparse_bits(rng),
            Operator::Bor => sparse_bits(rng),
            _ if noisy => structured.wrapping_add(rng.gen()),
            _ => structured,
        });
    }
    let exact = |rng: &mut ChaCha8Rng| {
        if case.op == Operator::Prod {
            // Powers of two from few ranks: every partial product is exact in any type.
            let e = if rank < 12 { rng.gen_range(-1..=1) } else { 0 };
            return Sample::Real(sign(rng) * 2f64.powi(e));
        }
        // |k| <= 2^p / world: the sum of every subset is a multiple of 1/8 within the
        // significand.
        let kmax = (1i64 << precision(case.dtype)).div_euclid(i64::from(world)).min(20_480);
        let noise = if noisy { rng.gen_range(-4096..=4096) } else { 0 };
        let k = (i % 1024) as i64 * (i64::from(rank) % 16 + 1) + noise;
        Sample::Real((k.rem_euclid(2 * kmax + 1) - kmax) as f64 / 8.0)
    };
    match case.floats {
        FloatInputs::Exact => exact(rng),
        FloatInputs::Wide | FloatInputs::Normal if case.op == Operator::Prod => {
            Sample::Real(sign(rng) * (1.0 + rng.gen::<f64>() / f64::from(world)))
        }
        FloatInputs::Wide => {
            let (lo, hi) = wide_exponents(case.dtype, world);
            Sample::Real(sign(rng) * rng.gen_range(1.0..2.0) * 2f64.powi(rng.gen_range(lo..hi)))
        }
        FloatInputs::Normal => {
            // Box-Muller.
            let (u, v): (f64, f64) = (1.0 - rng.gen::<f64>(), rng.gen());
            Sample::Real((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos())
        }
        FloatInputs::Special => match rng.gen_range(0..40) {
            0 => Sample::Bits(nan_bits(rng, case.dtype)),
            1 => Sample::Real(f64::INFINITY),
            2 => Sample::Real(f64::NEG_INFINITY),
            3..=6 => Sample::Real(-0.0),
            7..=10 => Sample::Real(0.0),
            _ => exact(rng),
        },
    }
}

/// Exponents of wide-range inputs: fp16 keeps the sum of `world` of them below its
/// largest finite value (2^16); the others' ranges cannot overflow.
fn wide_exponents(dtype: DataType, world: u16) -> (i32, i32) {
    match dtype {
        DataType::Float16 => (-8, 14 - world.next_power_of_two().trailing_zeros() as i32),
        DataType::Float64 => (-60, 60),
        _ => (-30, 30),
    }
}

fn sign(rng: &mut ChaCha8Rng) -> f64 {
    if rng.gen_bool(0.5) {
        -1.0
    } else {
        1.0
    }
}

/// About one bit in eight set.
fn sparse_bits(rng: &mut ChaCha8Rng) -> u64 {
    rng.gen::<u64>() & rng.gen::<u64>() & rng.gen::<u64>()
}

/// A NaN of a float type with a random sign and payload (quiet or signalling).
fn nan_bits(rng: &mut ChaCha8Rng, dtype: DataType) -> u64 {
    let bits = 8 * dtype.size() as u32;
    let fraction = (1u64 << (precision(dtype) - 1)) - 1;
    let exponent = (u64::MAX >> (64 - bits + 1)) & !fraction;
    let sign = u64::from(rng.gen_bool(0.5)) << (bits - 1);
    sign | exponent | (rng.gen::<u64>() & fraction).max(1)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::super::reference::{element_f64, Tree};
    use super::*;

    #[test]
    fn generation_is_a_function_of_the_seed() {
        let gen = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let c = gen_collective(&mut rng, 4, &CaseShape::default());
            let i = gen_inputs(&mut rng, &c, 4);
            (c, i)
        };
        assert_eq!(gen(5), gen(5));
        assert_ne!(gen(5), gen(6));
    }

    #[test]
    fn counts_cover_small_boundary_and_large() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let counts: Vec<usize> = (0..2000).map(|_| gen_count(&mut rng, 40_000, 4)).collect();
        assert!(counts.iter().all(|&c| (1..=40_000).contains(&c)));
        assert!(counts.contains(&1));
        assert!(counts.iter().any(|&c| c % 64 == 63) && counts.iter().any(|&c| c % 64 == 1));
        assert!(counts.iter().any(|&c| c > 20_000));
        let bytes: Vec<usize> = (0..2000).map(|_| gen_count(&mut rng, 40_000, 8) * 8).collect();
        assert!(bytes.iter().any(|&b| b % 256 == 248) && bytes.iter().any(|&b| b % 256 == 8));
    }

    #[test]
    fn cases_draw_every_valid_pair() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let shape = CaseShape { barrier: 0.0, ..CaseShape::default() };
        let mut seen = std::collections::HashSet::new();
        let mut kinds = std::collections::HashSet::new();
        let mut in_place = std::collections::HashSet::new();
        for _ in 0..5000 {
            let c = gen_collective(&mut rng, 4, &shape);
            assert!(c.op.applies_to(c.dtype), "{}", c.describe());
            seen.insert((c.dtype, c.op));
            kinds.insert(std::mem::discriminant(&c.kind));
            if c.kind.is_blockwise() {
                assert!(c.count <= 40_000 / 4, "{}", c.describe());
                in_place.insert((c.kind, c.in_place));
            }
        }
        let valid = DataType::ALL
            .iter()
            .flat_map(|d| Operator::reductions().filter(move |o| o.applies_to(*d)))
            .count();
        assert_eq!(seen.len(), valid);
        assert_eq!(kinds.len(), 5, "every kind but Barrier (disabled here)");
        assert_eq!(in_place.len(), 4, "ReduceScatter and AllGather, in place and not");
    }

    #[test]
    fn reduce_scatter_inputs_hold_one_block_per_rank() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let mut c = gen_collective(&mut rng, 3, &CaseShape::default());
        (c.kind, c.count) = (Kind::ReduceScatter, 7);
        let ins = gen_inputs(&mut rng, &c, 3);
        assert!(ins.iter().all(|v| v.len() == 3 * 7 * c.dtype.size()), "{}", c.describe());
        c.kind = Kind::AllGather;
        let ins = gen_inputs(&mut rng, &c, 3);
        assert!(ins.iter().all(|v| v.len() == 7 * c.dtype.size()), "{}", c.describe());
    }

    /// Exact-style inputs give the same bits in rank order, reversed, and on a deep
    /// tree that rounds at every level, for every float type and operator, at the
    /// widest fan-in the suite runs; and they hold no -0 or NaN.
    #[test]
    fn exact_float_inputs_do_not_depend_on_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let world = 70u16;
        // A chain: ((r0 + r1) + r2) + ..., one rounding per rank.
        let chain = (1..world).fold(Tree::Rank(0), |t, r| Tree::Switch(vec![t, Tree::Rank(r)]));
        for dtype in DataType::ALL.iter().copied().filter(|d| !d.is_integer()) {
            for op in Operator::reductions().filter(|o| o.applies_to(dtype)) {
                let case = CollectiveCase {
                    kind: Kind::AllReduce,
                    op,
                    dtype,
                    count: 3000,
                    in_place: false,
                    floats: FloatInputs::Exact,
                };
                let ins = gen_inputs(&mut rng, &case, world);
                let rev: Vec<Vec<u8>> = ins.iter().rev().cloned().collect();
                let star = Tree::star(world);
                let want = star.reduce(op, dtype, &ins);
                assert_eq!(star.reduce(op, dtype, &rev), want, "{dtype} {op}");
                assert_eq!(chain.reduce(op, dtype, &ins), want, "{dtype} {op}");
                let special = ins.iter().flat_map(|v| {
                    (0..case.count).map(|i| element_f64(dtype, v, i)).collect::<Vec<_>>()
                });
                for x in special {
                    assert!(x.is_finite() && (x != 0.0 || x.is_sign_positive()), "{dtype} {op}");
                }
            }
        }
    }
}
