//! Inputs and expected results, generated from a seed, checked element for element.
//!
//! Every rank's input is a pure function of (seed, rank, element index). Integers are
//! random bits (SUM wraps, so every result is exact); floats are small integers chosen
//! so that every partial result of any subset of ranks is exactly representable
//! (`|x| <= 2^p / world`, `p` the significand bits): the result does not depend on the
//! order the switches combine contributions in, so it is compared bit for bit.

use inc_wire::reduce::Elem;
use inc_wire::{DataType, Operator, TypeVisitor};

/// Which collective, as the simulator runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// Every rank gets the reduction.
    AllReduce,
    /// Rank `root` gets the reduction.
    Reduce {
        /// Receiving rank.
        root: u16,
    },
    /// Rank `root`'s vector goes to every rank.
    Broadcast {
        /// Sending rank.
        root: u16,
    },
    /// Every rank's vector is `world` blocks; rank `r` gets the reduction of block `r`.
    ReduceScatter,
    /// Rank `r` contributes block `r`; every rank gets all `world` blocks.
    AllGather,
}

impl Collective {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::Reduce { .. } => "reduce",
            Collective::Broadcast { .. } => "broadcast",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllGather => "allgather",
        }
    }

    /// Whether the vector is `world` blocks, one per rank (the size is the whole
    /// vector, as in inc-bench).
    pub fn is_blockwise(self) -> bool {
        matches!(self, Collective::ReduceScatter | Collective::AllGather)
    }

    /// Whether `rank` sends its vector and whether it receives one.
    pub fn role(self, rank: u16) -> (bool, bool) {
        match self {
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather => {
                (true, true)
            }
            Collective::Reduce { root } => (true, rank == root),
            Collective::Broadcast { root } => (rank == root, rank != root),
        }
    }

    /// The nccl-tests bus bandwidth factor (busbw = algbw x factor; algbw of
    /// ReduceScatter and AllGather over the whole vector).
    pub fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter | Collective::AllGather => (n - 1.0) / n,
            _ => 1.0,
        }
    }
}

/// Byte receive-only buffers are filled with, so unwritten elements show up.
pub const POISON: u8 = 0xEE;

/// SplitMix64 step: the generator of every input element.
#[inline(always)]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn significand_bits(dtype: DataType) -> u32 {
    match dtype {
        DataType::Float16 => 11,
        DataType::Bfloat16 => 8,
        DataType::Float32 => 24,
        _ => 53,
    }
}

/// Writes element `x` (a small integer) of a float type in native order.
fn store_float(dtype: DataType, x: i64, out: &mut [u8]) {
    let v = x as f64;
    match dtype {
        DataType::Float16 => out.copy_from_slice(&half::f16::from_f64(v).to_ne_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&half::bf16::from_f64(v).to_ne_bytes()),
        DataType::Float32 => out.copy_from_slice(&(v as f32).to_ne_bytes()),
        _ => out.copy_from_slice(&v.to_ne_bytes()),
    }
}

/// How rank inputs are drawn.
#[derive(Debug, Clone, Copy)]
pub struct InputSpec {
    /// Element type.
    pub dtype: DataType,
    /// Reduction operator.
    pub op: Operator,
    /// Ranks.
    pub world: u16,
    /// Seed.
    pub seed: u64,
}

impl InputSpec {
    /// Fills `out` (whole elements) with rank `rank`'s input.
    pub fn fill(&self, rank: u16, out: &mut [u8]) {
        let size = self.dtype.size();
        let base = mix(self.seed ^ (u64::from(rank) << 40) ^ 0x5157_0000);
        if self.dtype.is_integer() {
            // 8 random bytes serve 8 / size elements.
            for (j, group) in out.chunks_mut(8).enumerate() {
                let bits = mix(base.wrapping_add(j as u64)).to_ne_bytes();
                group.copy_from_slice(&bits[..group.len()]);
            }
            return;
        }
        // |x| <= kmax with world * kmax <= 2^p: every partial sum is exact. When the
        // world is larger than 2^p, only the first 2^p - 1 ranks contribute (+-1 or 0).
        let p = significand_bits(self.dtype);
        let room = (1u64 << p.min(40)) / u64::from(self.world);
        let (kmax, active) = if room >= 1 {
            (room.min(1 << 20) as i64, true)
        } else {
            (1, u64::from(rank) < (1u64 << p) - 1)
        };
        for (i, e) in out.chunks_exact_mut(size).enumerate() {
            let x = if active {
                (mix(base.wrapping_add(i as u64)) % (2 * kmax as u64 + 1)) as i64 - kmax
            } else {
                0
            };
            store_float(self.dtype, x, e);
        }
    }
}

/// `acc = acc op input`, element-wise, in native order.
pub fn combine_into(dtype: DataType, op: Operator, acc: &mut [u8], input: &[u8]) {
    struct V<'a> {
        op: Operator,
        acc: &'a mut [u8],
        input: &'a [u8],
    }
    fn apply<E: Elem>(acc: &mut [u8], input: &[u8], f: impl Fn(E, E) -> E) {
        for (a, b) in acc.chunks_exact_mut(E::SIZE).zip(input.chunks_exact(E::SIZE)) {
            f(E::load_ne(a), E::load_ne(b)).store_ne(a);
        }
    }
    impl TypeVisitor for V<'_> {
        type Output = ();
        fn visit<E: Elem>(self) {
            let (acc, input) = (self.acc, self.input);
            // One loop per operator, so each is a tight monomorphic loop.
            match self.op.in_network() {
                Operator::Sum | Operator::Avg => apply::<E>(acc, input, E::sum),
                Operator::Max => apply::<E>(acc, input, E::maximum),
                Operator::Min => apply::<E>(acc, input, E::minimum),
                op => apply::<E>(acc, input, |a, b| E::combine(op, a, b)),
            }
        }
    }
    dtype.visit(V { op, acc, input });
}

/// Index of the first element where `got` differs from `want`, and both values as
/// hex bytes.
pub fn first_mismatch(dtype: DataType, got: &[u8], want: &[u8]) -> Option<(usize, String, String)> {
    if got.len() != want.len() {
        return Some((0, format!("{} bytes", got.len()), format!("{} bytes", want.len())));
    }
    if got == want {
        return None;
    }
    let size = dtype.size();
    let at = got.chunks_exact(size).zip(want.chunks_exact(size)).position(|(a, b)| a != b)?;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    Some((at, hex(&got[at * size..][..size]), hex(&want[at * size..][..size])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_depend_on_seed_and_rank_only() {
        let s = InputSpec { dtype: DataType::Int32, op: Operator::Sum, world: 4, seed: 1 };
        let (mut a, mut b, mut c) = (vec![0u8; 64], vec![0u8; 64], vec![0u8; 64]);
        s.fill(2, &mut a);
        s.fill(2, &mut b);
        s.fill(3, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn float_inputs_sum_exactly_in_any_order() {
        for dtype in [DataType::Float16, DataType::Bfloat16, DataType::Float32, DataType::Float64] {
            let world = 300u16;
            let s = InputSpec { dtype, op: Operator::Sum, world, seed: 9 };
            let n = 64 * dtype.size();
            let inputs: Vec<Vec<u8>> = (0..world)
                .map(|r| {
                    let mut v = vec![0u8; n];
                    s.fill(r, &mut v);
                    v
                })
                .collect();
            let mut fwd = inputs[0].clone();
            for i in &inputs[1..] {
                combine_into(dtype, Operator::Sum, &mut fwd, i);
            }
            let mut rev = inputs[world as usize - 1].clone();
            for i in inputs[..world as usize - 1].iter().rev() {
                combine_into(dtype, Operator::Sum, &mut rev, i);
            }
            assert_eq!(fwd, rev, "{dtype}");
            assert!(inputs.iter().any(|v| v.iter().any(|&b| b != 0)), "{dtype}: all zero");
        }
    }
}
