//! Run-time CPU dispatch of the reduce kernels on x86-64.
//!
//! The portable build targets baseline x86-64 (SSE2), which has no byte shuffle, so the
//! network-order loads and stores of every element are swapped one by one. The same
//! kernels compiled with SSSE3/SSE4.1 (`pshufb`, `pminsd`) or AVX2 vectorise. The
//! instruction set is detected once; the dispatched builds are the very same Rust
//! (`combine_kernels`, inlined into a `#[target_feature]` function), so they compute the
//! same bits as the portable one (Rust never contracts or reorders float operations).
//!
//! This is the only `unsafe` in `inc-wire`: calling a `#[target_feature]` function is
//! unsafe because running it on a CPU without the feature is undefined behaviour.

use std::sync::atomic::{AtomicU8, Ordering};

use super::{combine_kernels, convert_kernel, InPlace, Operands, Order, ToOut};
use crate::imm::{DataType, Operator};

/// Instruction-set levels, best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(super) enum Level {
    /// Baseline x86-64: the portable build.
    Portable = 1,
    /// SSSE3 + SSE4.1 (part of x86-64-v2).
    Sse41 = 2,
    /// AVX2 (part of x86-64-v3).
    Avx2 = 3,
}

/// 0 until detected, then a `Level`.
static LEVEL: AtomicU8 = AtomicU8::new(0);

/// The best level this CPU supports (detected on the first call).
pub(super) fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        1 => Level::Portable,
        2 => Level::Sse41,
        3 => Level::Avx2,
        _ => {
            let l = detect();
            LEVEL.store(l as u8, Ordering::Relaxed);
            l
        }
    }
}

fn detect() -> Level {
    if std::is_x86_feature_detected!("avx2") {
        Level::Avx2
    } else if std::is_x86_feature_detected!("ssse3") && std::is_x86_feature_detected!("sse4.1") {
        Level::Sse41
    } else {
        Level::Portable
    }
}

/// [`super::combine_be`] on the best build for this CPU; `None` when that is the
/// portable one.
#[inline]
pub(super) fn combine_be(
    op: Operator,
    dtype: DataType,
    acc: &mut [u8],
    other: &[u8],
) -> Option<usize> {
    combine_at(level(), op, dtype, InPlace { acc, other })
}

/// [`super::combine_be_into`] on the best build for this CPU; `None` when that is the
/// portable one.
#[inline]
pub(super) fn combine_be_into(
    op: Operator,
    dtype: DataType,
    out: &mut [u8],
    a: &[u8],
    b: &[u8],
) -> Option<usize> {
    combine_at(level(), op, dtype, ToOut { out, a, b })
}

/// The build for `level`, which must not exceed [`level()`] (checked: a higher level
/// falls back to `None`, never runs an instruction the CPU lacks).
fn combine_at(
    want: Level,
    op: Operator,
    dtype: DataType,
    operands: impl Operands,
) -> Option<usize> {
    if want > level() {
        return None;
    }
    match want {
        // Safety: `want <= level()`, and `detect` saw AVX2 on this CPU.
        Level::Avx2 => Some(unsafe { combine_avx2(op, dtype, operands) }),
        // Safety: `want <= level()`, and `detect` saw SSSE3 and SSE4.1 on this CPU
        // (AVX2 CPUs have both).
        Level::Sse41 => Some(unsafe { combine_sse41(op, dtype, operands) }),
        Level::Portable => None,
    }
}

#[target_feature(enable = "avx2")]
fn combine_avx2(op: Operator, dtype: DataType, operands: impl Operands) -> usize {
    combine_kernels(op, dtype, operands)
}

#[target_feature(enable = "ssse3,sse4.1")]
fn combine_sse41(op: Operator, dtype: DataType, operands: impl Operands) -> usize {
    combine_kernels(op, dtype, operands)
}

/// [`super::to_network`] / [`super::from_network`] on the best build for this CPU;
/// `None` when that is the portable one.
#[inline]
pub(super) fn convert(order: Order, src: &[u8], dst: &mut [u8]) -> Option<usize> {
    convert_at(level(), order, src, dst)
}

/// The conversion build for `level`, checked like [`combine_at`].
fn convert_at(want: Level, order: Order, src: &[u8], dst: &mut [u8]) -> Option<usize> {
    if want > level() {
        return None;
    }
    match want {
        // Safety: `want <= level()`, and `detect` saw AVX2 on this CPU.
        Level::Avx2 => Some(unsafe { convert_avx2(order, src, dst) }),
        // Safety: `want <= level()`, and `detect` saw SSSE3 and SSE4.1 on this CPU.
        Level::Sse41 => Some(unsafe { convert_sse41(order, src, dst) }),
        Level::Portable => None,
    }
}

#[target_feature(enable = "avx2")]
fn convert_avx2(order: Order, src: &[u8], dst: &mut [u8]) -> usize {
    convert_kernel(order, src, dst)
}

#[target_feature(enable = "ssse3,sse4.1")]
fn convert_sse41(order: Order, src: &[u8], dst: &mut [u8]) -> usize {
    convert_kernel(order, src, dst)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::combine_be_portable;
    use super::super::tests::{dtype_strategy, element, op_strategy};
    use super::*;

    proptest! {
        /// Every conversion build gives the portable build's bytes, both ways, on
        /// lengths that exercise the vector loops and their tails, with `dst` shorter
        /// or longer than `src`.
        #[test]
        fn every_conversion_build_matches_the_portable_one(
            src in proptest::collection::vec(any::<u8>(), 0..1300),
            dst_len in 0usize..1300,
        ) {
            for order in [super::super::Order::ToNetwork, super::super::Order::FromNetwork] {
                let mut want = vec![0x5Au8; dst_len];
                let n = super::super::convert_kernel(order, &src, &mut want);
                prop_assert_eq!(n, src.len().min(dst_len) / 4);
                for l in [Level::Sse41, Level::Avx2] {
                    let mut got = vec![0x5Au8; dst_len];
                    match convert_at(l, order, &src, &mut got) {
                        Some(m) => {
                            prop_assert_eq!(m, n);
                            prop_assert_eq!(&got, &want, "{:?} {:?}", l, order);
                        }
                        None => prop_assert!(l > level()),
                    }
                }
            }
        }
    }

    proptest! {
        /// Every build this CPU can run gives the portable build's bits, for every
        /// operator and type, NaNs, infinities and signed zeros included, on lengths
        /// that exercise the vector loops and their tails.
        #[test]
        fn every_build_matches_the_portable_one(
            op in op_strategy(),
            dtype in dtype_strategy(),
            pairs in proptest::collection::vec((element(), element()), 0..300),
            extra in 0usize..4,
        ) {
            let acc: Vec<u8> = pairs.iter().flat_map(|p| p.0.to_be_bytes()).collect();
            let mut other: Vec<u8> = pairs.iter().flat_map(|p| p.1.to_be_bytes()).collect();
            other.extend(std::iter::repeat_n(0xA5, extra));
            let mut want = acc.clone();
            let n = combine_be_portable(op, dtype, &mut want, &other);
            for l in [Level::Sse41, Level::Avx2] {
                let mut got = acc.clone();
                match combine_at(l, op, dtype, InPlace { acc: &mut got, other: &other }) {
                    Some(m) => {
                        prop_assert_eq!(m, n);
                        prop_assert_eq!(&got, &want, "{:?}", l);
                    }
                    None => prop_assert!(l > level(), "{:?} refused on a {:?} CPU", l, level()),
                }
                // The three-operand form: the same bits, the rest of `out` untouched.
                let mut out = vec![0x3Cu8; acc.len() + extra];
                match combine_at(l, op, dtype, ToOut { out: &mut out, a: &acc, b: &other }) {
                    Some(m) => {
                        prop_assert_eq!(m, n);
                        prop_assert_eq!(&out[..4 * n], &want[..4 * n], "{:?} into", l);
                        prop_assert!(out[4 * n..].iter().all(|&b| b == 0x3C));
                    }
                    None => prop_assert!(l > level()),
                }
            }
            let mut got = acc.clone();
            prop_assert_eq!(super::super::combine_be(op, dtype, &mut got, &other), n);
            prop_assert_eq!(&got, &want);
        }
    }

    #[test]
    fn detected_once_and_stable() {
        assert_eq!(level(), level());
        assert_eq!(level(), detect());
    }
}
