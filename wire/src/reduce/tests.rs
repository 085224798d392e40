//! The kernels against a scalar reference written independently of them: integers in
//! i128, floats in f64 (exact for every product and, where not exact, a rounding that
//! makes the final rounding to the type correct: f64's 53 bits >= 2p + 2 for every
//! narrower type) rounded once to the type, MAX/MIN via `total_cmp`.

use core::cmp::Ordering;

use half::{bf16, f16};
use proptest::prelude::*;

use super::*;
use crate::dtype::Class;

/// An element as its bit pattern in the low `size` bytes.
pub(crate) type Bits = u64;

pub(crate) fn mask(dtype: DataType) -> u64 {
    if dtype.size() == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * dtype.size())) - 1
    }
}

/// Network-order bytes of `elems`.
pub(crate) fn be(dtype: DataType, elems: impl IntoIterator<Item = Bits>) -> Vec<u8> {
    let size = dtype.size();
    elems.into_iter().flat_map(|e| e.to_be_bytes()[8 - size..].to_vec()).collect()
}

pub(crate) fn element_at(dtype: DataType, b: &[u8], i: usize) -> Bits {
    let size = dtype.size();
    let mut x = [0u8; 8];
    x[8 - size..].copy_from_slice(&b[i * size..(i + 1) * size]);
    u64::from_be_bytes(x)
}

pub(crate) fn canonical_nan(dtype: DataType) -> Bits {
    match dtype {
        DataType::Float16 => 0x7e00,
        DataType::Bfloat16 => 0x7fc0,
        DataType::Float32 => 0x7fc0_0000,
        DataType::Float64 => 0x7ff8_0000_0000_0000,
        _ => unreachable!("not a float"),
    }
}

fn to_f64(dtype: DataType, b: Bits) -> f64 {
    match dtype {
        DataType::Float16 => f16::from_bits(b as u16).to_f64(),
        DataType::Bfloat16 => bf16::from_bits(b as u16).to_f64(),
        DataType::Float32 => f32::from_bits(b as u32) as f64,
        DataType::Float64 => f64::from_bits(b),
        _ => unreachable!("not a float"),
    }
}

/// `x` rounded to nearest even at `p` significand bits and minimum exponent `emin`
/// (the result may be out of the type's range: the caller checks overflow).
fn round_to(p: i32, emin: i32, x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let e = (((x.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin);
    let ulp = 2f64.powi(e - (p - 1));
    (x / ulp).round_ties_even() * ulp
}

/// `x` rounded once to `dtype` (NaN canonical). Not `half`'s `from_f64`: half 2.7.1
/// rounds some values next to a tie the wrong way (`f16::from_f64(-514.25 - 2^-14)` is
/// -514.0, not -514.5); this reference rounds by hand and converts exact values only.
fn from_f64(dtype: DataType, x: f64) -> Bits {
    if x.is_nan() {
        return canonical_nan(dtype);
    }
    let exact = |r: f64, max: f64| if r.abs() > max { r.signum() * f64::INFINITY } else { r };
    match dtype {
        DataType::Float16 => {
            f16::from_f32(exact(round_to(11, -14, x), 65504.0) as f32).to_bits() as u64
        }
        DataType::Bfloat16 => {
            let r = exact(round_to(8, -126, x), bf16::MAX.to_f64());
            bf16::from_f32(r as f32).to_bits() as u64
        }
        DataType::Float32 => (x as f32).to_bits() as u64,
        DataType::Float64 => x.to_bits(),
        _ => unreachable!("not a float"),
    }
}

fn to_i128(dtype: DataType, b: Bits) -> i128 {
    match dtype.class() {
        Class::Unsigned => b as i128,
        _ => {
            let shift = 64 - 8 * dtype.size();
            (((b << shift) as i64) >> shift) as i128
        }
    }
}

/// `a op b` (`None` for Barrier and operators that do not apply).
pub(crate) fn reference(op: Operator, dtype: DataType, a: Bits, b: Bits) -> Option<Bits> {
    if op == Operator::Barrier || !op.applies_to(dtype) {
        return None;
    }
    let m = mask(dtype);
    if dtype.is_integer() {
        let (x, y) = (to_i128(dtype, a), to_i128(dtype, b));
        let r = match op.in_network() {
            Operator::Sum => x.wrapping_add(y),
            Operator::Prod => x.wrapping_mul(y),
            Operator::Max => x.max(y),
            Operator::Min => x.min(y),
            Operator::Band => x & y,
            Operator::Bor => x | y,
            Operator::Bxor => x ^ y,
            _ => unreachable!(),
        };
        return Some(r as u64 & m);
    }
    let (x, y) = (to_f64(dtype, a), to_f64(dtype, b));
    if x.is_nan() || y.is_nan() {
        return Some(canonical_nan(dtype));
    }
    Some(match op.in_network() {
        Operator::Sum => from_f64(dtype, x + y),
        Operator::Prod => from_f64(dtype, x * y),
        Operator::Max => {
            if x.total_cmp(&y) == Ordering::Greater {
                a
            } else {
                b
            }
        }
        Operator::Min => {
            if x.total_cmp(&y) == Ordering::Less {
                a
            } else {
                b
            }
        }
        _ => unreachable!(),
    })
}

pub(crate) fn op_strategy() -> impl Strategy<Value = Operator> {
    proptest::sample::select(Operator::ALL.to_vec())
}

/// Bit patterns biased towards each type's interesting values.
pub(crate) fn element(dtype: DataType) -> BoxedStrategy<Bits> {
    let m = mask(dtype);
    let specials: Vec<Bits> = if dtype.is_integer() {
        let sign = 1u64 << (8 * dtype.size() - 1);
        vec![0, 1, m, sign, sign - 1, 2]
    } else {
        let f = move |x: f64| from_f64(dtype, x);
        let nan = canonical_nan(dtype);
        let sign = 1u64 << (8 * dtype.size() - 1);
        vec![
            f(0.0),
            f(-0.0),
            f(f64::INFINITY),
            f(f64::NEG_INFINITY),
            nan,
            (nan | sign) + 1, // a negative NaN with a payload
            m >> 1,           // NaN with every payload bit
            f(1.0),
            f(-1.0),
            1,          // smallest subnormal
            sign | 1,   // its negative
            f(65504.0), // f16 max (finite everywhere)
        ]
    };
    let small = move |v: i64| {
        if dtype.is_integer() {
            v as u64 & m
        } else {
            from_f64(dtype, v as f64 * 0.25)
        }
    };
    prop_oneof![
        any::<u64>().prop_map(move |v| v & m),
        proptest::sample::select(specials),
        (-40i64..40).prop_map(small),
    ]
    .boxed()
}

/// A type and pairs of its elements.
pub(crate) fn pairs(max: usize) -> impl Strategy<Value = (DataType, Vec<(Bits, Bits)>)> {
    proptest::sample::select(DataType::ALL.to_vec()).prop_flat_map(move |d| {
        (Just(d), proptest::collection::vec((element(d), element(d)), 0..max))
    })
}

/// A type and `k` contributions of `len` elements each.
fn contributions() -> impl Strategy<Value = (DataType, Vec<Vec<Bits>>)> {
    (proptest::sample::select(DataType::ALL.to_vec()), 1usize..6, 0usize..40).prop_flat_map(
        |(d, k, len)| {
            (Just(d), proptest::collection::vec(proptest::collection::vec(element(d), len), k))
        },
    )
}

#[test]
fn signed_zero_and_nan() {
    let f = DataType::Float32;
    let (pz, nz) = (0.0f32.to_bits() as u64, (-0.0f32).to_bits() as u64);
    let one = |op, a: u64, b: u64| {
        let mut acc = be(f, [a]);
        combine_be(op, f, &mut acc, &be(f, [b]));
        element_at(f, &acc, 0)
    };
    assert_eq!(one(Operator::Max, nz, pz), pz);
    assert_eq!(one(Operator::Max, pz, nz), pz);
    assert_eq!(one(Operator::Min, nz, pz), nz);
    assert_eq!(one(Operator::Min, pz, nz), nz);
    assert_eq!(one(Operator::Sum, nz, nz), nz);
    assert_eq!(one(Operator::Sum, 0xffc0_0001, pz), CANONICAL_NAN_BITS as u64);
    let inf = f32::INFINITY.to_bits() as u64;
    let ninf = f32::NEG_INFINITY.to_bits() as u64;
    assert_eq!(one(Operator::Sum, inf, ninf), CANONICAL_NAN_BITS as u64);
    assert_eq!(one(Operator::Prod, inf, pz), CANONICAL_NAN_BITS as u64);
}

#[test]
fn bitwise_on_floats_processes_nothing() {
    let mut acc = be(DataType::Float32, [1, 2]);
    let before = acc.clone();
    assert_eq!(combine_be(Operator::Band, DataType::Float32, &mut acc, &before.clone()), 0);
    assert_eq!(acc, before);
    let mut acc = vec![0u8; 8];
    assert_eq!(accumulate_be(Operator::Bor, DataType::Bfloat16, &mut acc, &[0, 1, 0, 2]), 0);
    assert_eq!(combine_be(Operator::Barrier, DataType::Int32, &mut acc, &[0; 8]), 0);
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
    assert_eq!(to_network(DataType::Float64, &src, &mut dst), 8);
    assert_eq!(&dst[..8], &[7, 6, 5, 4, 3, 2, 1, 0]);
    assert_eq!(to_network(DataType::Uint8, &src, &mut dst), 70);
    assert_eq!(&dst[..], &src[..70]);
}

proptest! {
    #[test]
    fn kernels_match_reference(op in op_strategy(), (dtype, pairs) in pairs(80)) {
        let mut acc = be(dtype, pairs.iter().map(|p| p.0));
        let other = be(dtype, pairs.iter().map(|p| p.1));
        let n = combine_be(op, dtype, &mut acc, &other);
        match reference(op, dtype, 0, 0) {
            None => {
                prop_assert_eq!(n, 0);
                prop_assert_eq!(acc, be(dtype, pairs.iter().map(|p| p.0)));
                return Ok(());
            }
            Some(_) => prop_assert_eq!(n, pairs.len()),
        }
        let mut rev = other.clone();
        combine_be(op, dtype, &mut rev, &be(dtype, pairs.iter().map(|p| p.0)));
        prop_assert_eq!(&rev, &acc, "bit-identical regardless of operand order");
        for (i, (a, b)) in pairs.iter().enumerate() {
            let want = reference(op, dtype, *a, *b).unwrap();
            prop_assert_eq!(element_at(dtype, &acc, i), want, "{} {} element {}: {:#x} {:#x}", op, dtype, i, a, b);
        }
    }

    /// `combine_be_into` writes what `combine_be` leaves in its accumulator, the
    /// portable build too, and stops at the shortest of its three slices.
    #[test]
    fn into_matches_in_place(op in op_strategy(), (dtype, pairs) in pairs(80), short in 0usize..3) {
        let size = dtype.size();
        let a = be(dtype, pairs.iter().map(|p| p.0));
        let b = be(dtype, pairs.iter().map(|p| p.1));
        let mut want = a.clone();
        let n = combine_be_portable(op, dtype, &mut want, &b);
        let mut out = vec![0xEEu8; a.len()];
        prop_assert_eq!(combine_be_into(op, dtype, &mut out, &a, &b), n);
        if n > 0 {
            prop_assert_eq!(&out, &want);
            let cut = b.len().saturating_sub(size * short + 1);
            let mut out = vec![0xEEu8; a.len()];
            let m = combine_be_into(op, dtype, &mut out, &a, &b[..cut]);
            prop_assert_eq!(m, cut / size);
            prop_assert_eq!(&out[..size * m], &want[..size * m]);
            prop_assert!(out[size * m..].iter().all(|&x| x == 0xEE));
        }
    }

    /// Accumulating k contributions: for every type but the half ones the accumulator
    /// path is a fold of `combine_be`; for fp16/bf16 it is the fold in fp32 (IEEE
    /// binary32, NaN canonical) rounded once, and the fused last step gives the same
    /// bits as accumulate-then-narrow.
    #[test]
    fn accumulator_is_one_rounding_of_an_acc_fold(op in op_strategy(), (dtype, contribs) in contributions()) {
        let len = contribs[0].len();
        let (size, acc_size) = (dtype.size(), dtype.acc_size());
        let mut acc = vec![0u8; len * acc_size];
        prop_assert_eq!(widen_be(dtype, &mut acc, &be(dtype, contribs[0].iter().copied())), len);
        let last = contribs.len() - 1;
        for c in &contribs[1..last.max(1)] {
            let n = accumulate_be(op, dtype, &mut acc, &be(dtype, c.iter().copied()));
            prop_assert_eq!(n, if reference(op, dtype, 0, 0).is_some() { len } else { 0 });
        }
        let mut out = vec![0u8; len * size];
        if last >= 1 {
            let wire = be(dtype, contribs[last].iter().copied());
            let mut fused = vec![0xEEu8; len * size];
            let n = accumulate_narrow_be(op, dtype, &mut fused, &acc, &wire);
            accumulate_be(op, dtype, &mut acc, &wire);
            prop_assert_eq!(narrow_be(dtype, &mut out, &acc), len);
            if n > 0 {
                prop_assert_eq!(&fused, &out);
            }
        } else {
            prop_assert_eq!(narrow_be(dtype, &mut out, &acc), len);
        }
        if reference(op, dtype, 0, 0).is_none() {
            return Ok(());
        }
        for i in 0..len {
            let want = if dtype.accumulates_in_f32() {
                let w = |b: Bits| match dtype {
                    DataType::Float16 => f16::from_bits(b as u16).to_f32(),
                    _ => bf16::from_bits(b as u16).to_f32(),
                };
                let f32d = DataType::Float32;
                let mut a = w(contribs[0][i]).to_bits() as u64;
                for c in &contribs[1..] {
                    a = reference(op, f32d, a, w(c[i]).to_bits() as u64).unwrap();
                }
                from_f64(dtype, f32::from_bits(a as u32) as f64)
            } else {
                let mut a = contribs[0][i];
                for c in &contribs[1..] {
                    a = reference(op, dtype, a, c[i]).unwrap();
                }
                a
            };
            prop_assert_eq!(element_at(dtype, &out, i), want, "{} {} element {}", op, dtype, i);
        }
    }

    /// AVG's host step: integers truncate, floats divide once at their width.
    #[test]
    fn finalize_divides_for_avg_only(
        (dtype, pairs) in pairs(40),
        world in 1u16..9,
        op in op_strategy(),
    ) {
        let native: Vec<u8> = pairs
            .iter()
            .flat_map(|p| {
                let mut b = p.0.to_be_bytes()[8 - dtype.size()..].to_vec();
                if cfg!(target_endian = "little") {
                    b.reverse();
                }
                b
            })
            .collect();
        let mut buf = native.clone();
        let n = finalize_native(op, dtype, &mut buf, world);
        if op != Operator::Avg {
            prop_assert_eq!(n, 0);
            prop_assert_eq!(buf, native);
            return Ok(());
        }
        prop_assert_eq!(n, pairs.len());
        let mut net = vec![0u8; buf.len()];
        to_network(dtype, &buf, &mut net);
        for (i, p) in pairs.iter().enumerate() {
            let want = if dtype.is_integer() {
                (to_i128(dtype, p.0) / i128::from(world)) as u64 & mask(dtype)
            } else {
                from_f64(dtype, to_f64(dtype, p.0) / f64::from(world))
            };
            prop_assert_eq!(element_at(dtype, &net, i), want, "{} {:#x} / {}", dtype, p.0, world);
        }
    }

    #[test]
    fn byte_order_round_trip(
        dtype in proptest::sample::select(DataType::ALL.to_vec()),
        native in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let size = dtype.size();
        let n = native.len() / size;
        let mut net = vec![0u8; native.len()];
        prop_assert_eq!(to_network(dtype, &native, &mut net), n);
        for i in 0..n {
            let mut e = native[i * size..(i + 1) * size].to_vec();
            if cfg!(target_endian = "little") {
                e.reverse();
            }
            prop_assert_eq!(&net[i * size..(i + 1) * size], &e[..]);
        }
        let mut back = vec![0u8; native.len()];
        from_network(dtype, &net, &mut back);
        prop_assert_eq!(&back[..n * size], &native[..n * size]);
        swap_in_place(dtype, &mut net);
        prop_assert_eq!(&net[..n * size], &native[..n * size]);
    }
}
