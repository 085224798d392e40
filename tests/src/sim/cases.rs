//! Seeded generation of collectives and their inputs.
//!
//! A plain seeded generator (not proptest shrinking): every case is a pure function of
//! its seed, so a failure is reproduced by re-running that one seed.

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::reference::{kind_name, Dtype, Kind, Op, ELEM};

/// How FLOAT32 inputs are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatInputs {
    /// Multiples of 1/8 below 2^15 in magnitude: every partial sum of up to 256 ranks is
    /// exactly representable, so SUM is bit-exact in any combination order.
    Exact,
    /// Finite values over a wide exponent range: SUM depends on the combination order,
    /// so it is compared within a tolerance (and bit-identical across ranks).
    Wide,
}

/// One collective of a generated sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveCase {
    /// Kind (with root).
    pub kind: Kind,
    /// Operator (ignored by Broadcast and Barrier).
    pub op: Op,
    /// Element type.
    pub dtype: Dtype,
    /// Elements (0 for Barrier).
    pub count: usize,
    /// AllReduce/Reduce root writes the result over its input.
    pub in_place: bool,
    /// FLOAT32 input style.
    pub floats: FloatInputs,
}

impl CollectiveCase {
    /// Short description for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {:?} {:?} count={} in_place={} floats={:?}",
            kind_name(self.kind),
            self.op,
            self.dtype,
            self.count,
            self.in_place,
            self.floats
        )
    }
}

/// Bounds for [`gen_collective`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaseShape {
    /// Largest element count drawn.
    pub max_count: usize,
    /// Probability of a Barrier.
    pub barrier: f64,
    /// Probability of wide-range float inputs when the dtype is FLOAT32.
    pub wide_floats: f64,
}

impl Default for CaseShape {
    fn default() -> Self {
        CaseShape { max_count: 40_000, barrier: 0.05, wide_floats: 0.2 }
    }
}

/// Draws an element count: mostly small, many near packet boundaries (every valid MTU
/// is a multiple of 256 bytes = 64 elements), a few up to `max`.
pub fn gen_count(rng: &mut ChaCha8Rng, max: usize) -> usize {
    let max = max.max(1);
    let c = match rng.gen_range(0..100) {
        0..=9 => rng.gen_range(1..=4),
        10..=44 => rng.gen_range(1..=300),
        45..=74 => (rng.gen_range(1..=64usize) * 64).saturating_add_signed(rng.gen_range(-1..=1)),
        75..=94 => rng.gen_range(1..=20_000),
        _ => rng.gen_range(1..=max),
    };
    c.clamp(1, max)
}

/// Draws one collective for a communicator of `world` ranks.
pub fn gen_collective(rng: &mut ChaCha8Rng, world: u16, shape: &CaseShape) -> CollectiveCase {
    let root = rng.gen_range(0..world);
    let kind = if rng.gen_bool(shape.barrier) {
        Kind::Barrier
    } else {
        *[Kind::AllReduce, Kind::AllReduce, Kind::Reduce { root }, Kind::Broadcast { root }]
            .choose(rng)
            .expect("non-empty")
    };
    let op = *[Op::Sum, Op::Sum, Op::Max, Op::Min].choose(rng).expect("non-empty");
    let dtype = if rng.gen_bool(0.5) { Dtype::Int32 } else { Dtype::Float32 };
    let count = if kind == Kind::Barrier { 0 } else { gen_count(rng, shape.max_count) };
    let in_place = matches!(kind, Kind::AllReduce | Kind::Reduce { .. }) && rng.gen_bool(0.3);
    let floats =
        if rng.gen_bool(shape.wide_floats) { FloatInputs::Wide } else { FloatInputs::Exact };
    CollectiveCase { kind, op, dtype, count, in_place, floats }
}

/// Inputs of every rank in native byte order: `in[i] = i * (rank + 1)` plus random data
/// (INT32 wraps; FLOAT32 per [`FloatInputs`], never -0.0 or NaN, whose MAX/MIN and bit
/// patterns IEEE leaves open).
pub fn gen_inputs(rng: &mut ChaCha8Rng, case: &CollectiveCase, world: u16) -> Vec<Vec<u8>> {
    (0..u32::from(world))
        .map(|rank| {
            let mut v = Vec::with_capacity(case.count * ELEM);
            let noisy = rng.gen_bool(0.8);
            for i in 0..case.count as u32 {
                let bytes = match case.dtype {
                    Dtype::Int32 => {
                        let noise = if noisy { rng.gen::<u32>() } else { 0 };
                        i.wrapping_mul(rank + 1).wrapping_add(noise).to_ne_bytes()
                    }
                    Dtype::Float32 => match case.floats {
                        FloatInputs::Exact => {
                            let noise = if noisy { rng.gen_range(-4096..=4096) } else { 0 };
                            let k = (i % 1024) as i32 * (rank as i32 % 16 + 1) + noise;
                            (k as f32 / 8.0).to_ne_bytes()
                        }
                        FloatInputs::Wide => {
                            let m: f32 = rng.gen_range(1.0..2.0);
                            let e = rng.gen_range(-30..30);
                            let s = if rng.gen_bool(0.5) { -1.0 } else { 1.0 };
                            (s * m * 2f32.powi(e)).to_ne_bytes()
                        }
                    },
                };
                v.extend_from_slice(&bytes);
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::super::reference::reduce;
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
        let counts: Vec<usize> = (0..2000).map(|_| gen_count(&mut rng, 40_000)).collect();
        assert!(counts.iter().all(|&c| (1..=40_000).contains(&c)));
        assert!(counts.contains(&1));
        assert!(counts.iter().any(|&c| c % 64 == 63) && counts.iter().any(|&c| c % 64 == 1));
        assert!(counts.iter().any(|&c| c > 20_000));
    }

    #[test]
    fn exact_float_sums_do_not_depend_on_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let case = CollectiveCase {
            kind: Kind::AllReduce,
            op: Op::Sum,
            dtype: Dtype::Float32,
            count: 5000,
            in_place: false,
            floats: FloatInputs::Exact,
        };
        let ins = gen_inputs(&mut rng, &case, 16);
        let fwd: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
        let rev: Vec<&[u8]> = ins.iter().rev().map(Vec::as_slice).collect();
        assert_eq!(reduce(Op::Sum, Dtype::Float32, &fwd), reduce(Op::Sum, Dtype::Float32, &rev));
        let negative_zero =
            ins.iter().flat_map(|v| v.chunks_exact(4)).any(|c| c == (-0f32).to_ne_bytes());
        assert!(!negative_zero);
    }
}
