//! Element reduce kernels over network-byte-order vectors, and byte-order conversion.
//!
//! Semantics (every rank must receive bit-identical results, whatever order the switch
//! combines contributions in, so every operation here is commutative *bit for bit*):
//!
//! - INT32: SUM wraps (two's complement); MAX/MIN compare as signed.
//! - FLOAT32 SUM: IEEE 754 binary32 addition, round to nearest even.
//! - FLOAT32 MAX/MIN: IEEE 754-2019 `maximum`/`minimum`: `-0.0 < +0.0`, so
//!   `max(-0.0, +0.0) = +0.0` and `min(-0.0, +0.0) = -0.0`.
//! - NaN: any NaN operand makes the result NaN, and every NaN result is the canonical
//!   quiet NaN `0x7FC00000`, so payload and sign bits never depend on operand order or
//!   on the CPU.
//!
//! Float SUM is commutative but not associative; a reproducible result across runs
//! needs a fixed combination order, which is the switch's job (deterministic mode).
//!
//! [`combine_be`] runs a build of the same kernels for the best instruction set the CPU
//! has (x86-64: AVX2 or SSE4.1, detected once at run time; see `simd_dispatch`),
//! because swapping byte order one element at a time costs ten times more than the
//! arithmetic on a baseline x86-64 build. Every build computes the same bits:
//! [`combine_be_portable`] is the reference the tests hold them to.

use crate::imm::{DataType, Operator};

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // target_feature functions; see the module's Safety notes
mod simd_dispatch;

/// The canonical quiet NaN every NaN result is replaced with.
pub const CANONICAL_NAN_BITS: u32 = 0x7fc0_0000;

#[inline(always)]
fn canon(x: f32) -> u32 {
    if x.is_nan() {
        CANONICAL_NAN_BITS
    } else {
        x.to_bits()
    }
}

// MAX/MIN as selects without short-circuits, so they vectorise. Equal operands are
// either the same bits or +0.0 and -0.0, where AND of the bits gives +0.0 (MAX) and OR
// gives -0.0 (MIN).
#[inline(always)]
fn f32_max(a: f32, b: f32) -> u32 {
    let (x, y) = (a.to_bits(), b.to_bits());
    let r = if a > b {
        x
    } else if a < b {
        y
    } else {
        x & y
    };
    if a.is_nan() | b.is_nan() {
        CANONICAL_NAN_BITS
    } else {
        r
    }
}

#[inline(always)]
fn f32_min(a: f32, b: f32) -> u32 {
    let (x, y) = (a.to_bits(), b.to_bits());
    let r = if a < b {
        x
    } else if a > b {
        y
    } else {
        x | y
    };
    if a.is_nan() | b.is_nan() {
        CANONICAL_NAN_BITS
    } else {
        r
    }
}

/// Combines two elements given as their bit patterns (host order). `Barrier` returns
/// `a` unchanged.
pub fn combine_element(op: Operator, dtype: DataType, a: u32, b: u32) -> u32 {
    match (dtype, op) {
        (_, Operator::Barrier) => a,
        (DataType::Int32, Operator::Sum) => a.wrapping_add(b),
        (DataType::Int32, Operator::Max) => (a as i32).max(b as i32) as u32,
        (DataType::Int32, Operator::Min) => (a as i32).min(b as i32) as u32,
        (DataType::Float32, Operator::Sum) => canon(f32::from_bits(a) + f32::from_bits(b)),
        (DataType::Float32, Operator::Max) => f32_max(f32::from_bits(a), f32::from_bits(b)),
        (DataType::Float32, Operator::Min) => f32_min(f32::from_bits(a), f32::from_bits(b)),
    }
}

/// Where a kernel reads its two operands and writes its result: the loop of every
/// kernel, written once per operand layout and inlined into each build.
trait Operands {
    /// Applies `f` (host-order bit patterns) to every whole element pair; returns how
    /// many.
    fn zip(self, f: impl Fn(u32, u32) -> u32) -> usize;
}

/// `acc[i] = acc[i] op other[i]`.
struct InPlace<'a> {
    acc: &'a mut [u8],
    other: &'a [u8],
}

/// `out[i] = a[i] op b[i]`.
struct ToOut<'a> {
    out: &'a mut [u8],
    a: &'a [u8],
    b: &'a [u8],
}

#[inline(always)]
fn load_be(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl Operands for InPlace<'_> {
    #[inline(always)]
    fn zip(self, f: impl Fn(u32, u32) -> u32) -> usize {
        let mut n = 0;
        for (a, b) in self.acc.chunks_exact_mut(4).zip(self.other.chunks_exact(4)) {
            let v = f(load_be(a), load_be(b));
            a.copy_from_slice(&v.to_be_bytes());
            n += 1;
        }
        n
    }
}

impl Operands for ToOut<'_> {
    #[inline(always)]
    fn zip(self, f: impl Fn(u32, u32) -> u32) -> usize {
        let mut n = 0;
        let pairs = self.a.chunks_exact(4).zip(self.b.chunks_exact(4));
        for (o, (a, b)) in self.out.chunks_exact_mut(4).zip(pairs) {
            o.copy_from_slice(&f(load_be(a), load_be(b)).to_be_bytes());
            n += 1;
        }
        n
    }
}

/// `acc[i] = acc[i] op other[i]` over big-endian elements of `dtype`.
///
/// Processes the whole elements the two slices have in common and returns how many
/// that was; callers compare it with the count they expected (differing lengths are a
/// protocol error the caller must report, not something to reduce around).
/// `Barrier` carries no data and returns 0.
pub fn combine_be(op: Operator, dtype: DataType, acc: &mut [u8], other: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if let Some(n) = simd_dispatch::combine_be(op, dtype, acc, other) {
        return n;
    }
    combine_kernels(op, dtype, InPlace { acc, other })
}

/// `out[i] = a[i] op b[i]`: [`combine_be`] writing its result elsewhere, so that a
/// switch combines the last contribution straight into the frame that carries the
/// result on (one pass instead of a combine and a copy). Processes the whole elements
/// all three slices have in common and returns how many; the same bits as
/// [`combine_be`] on a copy of `a`.
pub fn combine_be_into(op: Operator, dtype: DataType, out: &mut [u8], a: &[u8], b: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if let Some(n) = simd_dispatch::combine_be_into(op, dtype, out, a, b) {
        return n;
    }
    combine_kernels(op, dtype, ToOut { out, a, b })
}

/// [`combine_be`] built for the compilation target only, whatever the CPU offers: the
/// reference the run-time dispatched builds must match bit for bit.
pub fn combine_be_portable(op: Operator, dtype: DataType, acc: &mut [u8], other: &[u8]) -> usize {
    combine_kernels(op, dtype, InPlace { acc, other })
}

/// The kernels of [`combine_be`]; always inlined, so each caller (the portable one and
/// the `target_feature` builds) gets its own code generated for its instruction set.
#[inline(always)]
fn combine_kernels(op: Operator, dtype: DataType, operands: impl Operands) -> usize {
    // One monomorphic loop per case so the compiler can keep the hot loop branch-free.
    match (dtype, op) {
        (_, Operator::Barrier) => 0,
        (DataType::Int32, Operator::Sum) => operands.zip(|a, b| a.wrapping_add(b)),
        (DataType::Int32, Operator::Max) => operands.zip(|a, b| (a as i32).max(b as i32) as u32),
        (DataType::Int32, Operator::Min) => operands.zip(|a, b| (a as i32).min(b as i32) as u32),
        (DataType::Float32, Operator::Sum) => {
            operands.zip(|a, b| canon(f32::from_bits(a) + f32::from_bits(b)))
        }
        (DataType::Float32, Operator::Max) => {
            operands.zip(|a, b| f32_max(f32::from_bits(a), f32::from_bits(b)))
        }
        (DataType::Float32, Operator::Min) => {
            operands.zip(|a, b| f32_min(f32::from_bits(a), f32::from_bits(b)))
        }
    }
}

/// Which way [`convert_kernel`] converts.
#[derive(Debug, Clone, Copy)]
enum Order {
    ToNetwork,
    FromNetwork,
}

/// Copies native-order elements of `dtype` from `src` into `dst` in network order.
/// Converts the whole elements both slices hold and returns how many. Like
/// [`combine_be`], it runs the best build for the CPU: one element at a time the
/// swap costs more than the copy.
pub fn to_network(dtype: DataType, src: &[u8], dst: &mut [u8]) -> usize {
    let _ = dtype; // every supported type is 4 bytes wide
    #[cfg(target_arch = "x86_64")]
    if let Some(n) = simd_dispatch::convert(Order::ToNetwork, src, dst) {
        return n;
    }
    convert_kernel(Order::ToNetwork, src, dst)
}

/// Copies network-order elements of `dtype` from `src` into `dst` in native order.
/// Converts the whole elements both slices hold and returns how many.
pub fn from_network(dtype: DataType, src: &[u8], dst: &mut [u8]) -> usize {
    let _ = dtype; // every supported type is 4 bytes wide
    #[cfg(target_arch = "x86_64")]
    if let Some(n) = simd_dispatch::convert(Order::FromNetwork, src, dst) {
        return n;
    }
    convert_kernel(Order::FromNetwork, src, dst)
}

/// The loop of [`to_network`] and [`from_network`]; always inlined, like
/// [`combine_kernels`], so each build vectorises it for its instruction set.
#[inline(always)]
fn convert_kernel(order: Order, src: &[u8], dst: &mut [u8]) -> usize {
    let mut n = 0;
    for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(4)) {
        let s = [s[0], s[1], s[2], s[3]];
        let v = match order {
            Order::ToNetwork => u32::from_ne_bytes(s).to_be_bytes(),
            Order::FromNetwork => u32::from_be_bytes(s).to_ne_bytes(),
        };
        d.copy_from_slice(&v);
        n += 1;
    }
    n
}

/// Converts whole elements between native and network order in place (the same
/// operation in both directions); returns how many elements.
pub fn swap_in_place(dtype: DataType, buf: &mut [u8]) -> usize {
    let _ = dtype;
    let mut n = 0;
    for c in buf.chunks_exact_mut(4) {
        let v = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        c.copy_from_slice(&v.to_ne_bytes());
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cmp::Ordering;
    use proptest::prelude::*;

    /// Scalar reference written independently of the kernels: float MAX/MIN via
    /// `total_cmp` (which orders -0.0 below +0.0) after handling NaN.
    fn reference(op: Operator, dtype: DataType, a: u32, b: u32) -> u32 {
        let (fa, fb) = (f32::from_bits(a), f32::from_bits(b));
        let nan = fa.is_nan() || fb.is_nan();
        match (dtype, op) {
            (_, Operator::Barrier) => a,
            (DataType::Int32, Operator::Sum) => (a as i32).wrapping_add(b as i32) as u32,
            (DataType::Int32, Operator::Max) => {
                if (a as i32) >= (b as i32) {
                    a
                } else {
                    b
                }
            }
            (DataType::Int32, Operator::Min) => {
                if (a as i32) <= (b as i32) {
                    a
                } else {
                    b
                }
            }
            (DataType::Float32, _) if nan => CANONICAL_NAN_BITS,
            (DataType::Float32, Operator::Sum) => {
                let s = fa + fb;
                if s.is_nan() {
                    CANONICAL_NAN_BITS
                } else {
                    s.to_bits()
                }
            }
            (DataType::Float32, Operator::Max) => {
                if fa.total_cmp(&fb) == Ordering::Greater {
                    a
                } else {
                    b
                }
            }
            (DataType::Float32, Operator::Min) => {
                if fa.total_cmp(&fb) == Ordering::Less {
                    a
                } else {
                    b
                }
            }
        }
    }

    pub(super) fn op_strategy() -> impl Strategy<Value = Operator> {
        prop_oneof![Just(Operator::Sum), Just(Operator::Max), Just(Operator::Min)]
    }
    pub(super) fn dtype_strategy() -> impl Strategy<Value = DataType> {
        prop_oneof![Just(DataType::Int32), Just(DataType::Float32)]
    }
    /// Bit patterns biased towards the interesting floats.
    pub(super) fn element() -> impl Strategy<Value = u32> {
        prop_oneof![
            any::<u32>(),
            Just(0u32),
            Just(0x8000_0000u32),
            Just(0x7fc0_0000u32),
            Just(0xffc0_0001u32),
            Just(0x7f80_0000u32),
            Just(0xff80_0000u32),
            Just(0x7fff_ffffu32),
            Just(0x8000_0001u32),
            (-1000i32..1000).prop_map(|v| (v as f32).to_bits()),
        ]
    }

    #[test]
    fn signed_zero_and_nan() {
        let (pz, nz) = (0.0f32.to_bits(), (-0.0f32).to_bits());
        let f = DataType::Float32;
        assert_eq!(combine_element(Operator::Max, f, nz, pz), pz);
        assert_eq!(combine_element(Operator::Max, f, pz, nz), pz);
        assert_eq!(combine_element(Operator::Min, f, nz, pz), nz);
        assert_eq!(combine_element(Operator::Min, f, pz, nz), nz);
        assert_eq!(combine_element(Operator::Sum, f, nz, nz), nz);
        assert_eq!(combine_element(Operator::Sum, f, 0xffc0_0001, pz), CANONICAL_NAN_BITS);
        let inf = f32::INFINITY.to_bits();
        let ninf = f32::NEG_INFINITY.to_bits();
        assert_eq!(combine_element(Operator::Sum, f, inf, ninf), CANONICAL_NAN_BITS);
        assert_eq!(combine_element(Operator::Sum, DataType::Int32, i32::MAX as u32, 1), 1 << 31);
        assert_eq!(combine_element(Operator::Max, DataType::Int32, u32::MAX, 1), 1);
    }

    #[test]
    fn uneven_lengths_convert_whole_common_elements() {
        // 18 elements (a block and a tail) against 17 and a stray byte.
        let src: Vec<u8> = (0..73u8).collect();
        let mut dst = vec![0xAAu8; 70];
        assert_eq!(to_network(DataType::Int32, &src, &mut dst), 17);
        assert_eq!(&dst[64..68], &[67, 66, 65, 64]);
        assert_eq!(&dst[68..], &[0xAA, 0xAA], "bytes beyond whole elements untouched");
        let mut acc = vec![0u8; 73];
        assert_eq!(combine_be(Operator::Sum, DataType::Int32, &mut acc, &src[..70]), 17);
        assert_eq!(&acc[64..68], &src[64..68]);
        assert_eq!(&acc[68..], &[0; 5]);
    }

    proptest! {
        #[test]
        fn kernels_match_reference(
            op in op_strategy(),
            dtype in dtype_strategy(),
            pairs in proptest::collection::vec((element(), element()), 0..80),
        ) {
            let mut acc: Vec<u8> = pairs.iter().flat_map(|p| p.0.to_be_bytes()).collect();
            let other: Vec<u8> = pairs.iter().flat_map(|p| p.1.to_be_bytes()).collect();
            prop_assert_eq!(combine_be(op, dtype, &mut acc, &other), pairs.len());
            for (i, (a, b)) in pairs.iter().enumerate() {
                let got = u32::from_be_bytes(acc[4 * i..4 * i + 4].try_into().unwrap());
                prop_assert_eq!(got, reference(op, dtype, *a, *b), "element {}", i);
                prop_assert_eq!(got, combine_element(op, dtype, *a, *b));
                // Bit-identical regardless of operand order.
                prop_assert_eq!(got, combine_element(op, dtype, *b, *a));
            }
        }

        /// `combine_be_into` writes what `combine_be` leaves in its accumulator, the
        /// portable build too, and stops at the shortest of its three slices.
        #[test]
        fn into_matches_in_place(
            op in op_strategy(),
            dtype in dtype_strategy(),
            pairs in proptest::collection::vec((element(), element()), 0..80),
            short in 0usize..3,
        ) {
            let a: Vec<u8> = pairs.iter().flat_map(|p| p.0.to_be_bytes()).collect();
            let b: Vec<u8> = pairs.iter().flat_map(|p| p.1.to_be_bytes()).collect();
            let mut want = a.clone();
            let n = combine_be_portable(op, dtype, &mut want, &b);
            let mut out = vec![0xEEu8; a.len()];
            prop_assert_eq!(combine_be_into(op, dtype, &mut out, &a, &b), n);
            prop_assert_eq!(&out, &want);
            let cut = b.len().saturating_sub(4 * short + 1);
            let mut out = vec![0xEEu8; a.len()];
            let m = combine_be_into(op, dtype, &mut out, &a, &b[..cut]);
            prop_assert_eq!(m, cut / 4);
            prop_assert_eq!(&out[..4 * m], &want[..4 * m]);
            prop_assert!(out[4 * m..].iter().all(|&x| x == 0xEE));
        }

        #[test]
        fn byte_order_round_trip(vals in proptest::collection::vec(any::<u32>(), 0..80)) {
            let native: Vec<u8> = vals.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let mut net = vec![0u8; native.len()];
            prop_assert_eq!(to_network(DataType::Int32, &native, &mut net), vals.len());
            for (i, v) in vals.iter().enumerate() {
                prop_assert_eq!(&net[4 * i..4 * i + 4], &v.to_be_bytes()[..]);
            }
            let mut back = vec![0u8; native.len()];
            from_network(DataType::Float32, &net, &mut back);
            prop_assert_eq!(&back, &native);
            swap_in_place(DataType::Int32, &mut net);
            prop_assert_eq!(&net, &native);
        }
    }
}
