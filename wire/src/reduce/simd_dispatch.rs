//! Run-time CPU dispatch of the reduce kernels on x86-64.
//!
//! The portable build targets baseline x86-64 (SSE2), which has no byte shuffle, so the
//! network-order loads and stores of every element are swapped one by one. The same
//! kernels compiled with SSSE3/SSE4.1 (`pshufb`, `pminsd`) or AVX2 vectorise. The
//! instruction set is detected once; the dispatched builds are the very same Rust
//! (`typed_kernel`, inlined into a `#[target_feature]` function per element type and
//! operation), so they compute the
//! same bits as the portable one (Rust never contracts or reorders float operations).
//!
//! This is the only `unsafe` in `inc-wire`: calling a `#[target_feature]` function is
//! unsafe because running it on a CPU without the feature is undefined behaviour.

use std::sync::atomic::{AtomicU8, Ordering};

use std::marker::PhantomData;

use super::{run_kernel, swap_kernel, typed_kernel, with_op, BinOp, Elem, Kernel, OpVisitor};
use crate::dtype::TypeVisitor;

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

/// Runs `k` on the best build for this CPU.
#[inline]
pub(super) fn run(k: Kernel<'_>) -> usize {
    at(level(), k)
}

/// The build for `want`, which must not exceed [`level()`] (checked: a higher level
/// gives `None`, never runs an instruction the CPU lacks).
#[cfg(test)]
fn run_at(want: Level, k: Kernel<'_>) -> Option<usize> {
    (want <= level()).then(|| at(want, k))
}

/// `k` on the build for `want`; `want <= level()`.
///
/// One `target_feature` function per element type and operation (and per swap width),
/// so that each holds only its own loops: LLVM did not vectorise most loops of one
/// function holding every type's and operator's.
#[inline(always)]
fn at(want: Level, k: Kernel<'_>) -> usize {
    debug_assert!(want <= level());
    match (want, k) {
        (Level::Portable, k) => run_kernel(k),
        (want, Kernel::Swap { dtype, src, dst }) => match dtype.size() {
            1 => swap_at::<1>(want, src, dst),
            2 => swap_at::<2>(want, src, dst),
            4 => swap_at::<4>(want, src, dst),
            _ => swap_at::<8>(want, src, dst),
        },
        (want, k) => k.dtype().visit(At(want, k)),
    }
}

fn swap_at<const N: usize>(want: Level, src: &[u8], dst: &mut [u8]) -> usize {
    match want {
        // Safety: `want <= level()` (callers), and `detect` saw AVX2 on this CPU.
        Level::Avx2 => unsafe { swap_avx2::<N>(src, dst) },
        // Safety: `want <= level()`, and `detect` saw SSSE3 and SSE4.1 on this CPU
        // (AVX2 CPUs have both).
        Level::Sse41 => unsafe { swap_sse41::<N>(src, dst) },
        Level::Portable => swap_kernel::<N>(src, dst),
    }
}

/// A kernel to run at a level, given its element type.
struct At<'a>(Level, Kernel<'a>);

impl TypeVisitor for At<'_> {
    type Output = usize;

    #[inline(always)]
    fn visit<E: Elem>(self) -> usize {
        let op = self.1.op();
        if !op.applies_to(E::DTYPE) {
            return 0;
        }
        with_op(op, AtOp::<E>(self.0, self.1, PhantomData))
    }
}

/// A kernel to run at a level, given its element type and operation.
struct AtOp<'a, E>(Level, Kernel<'a>, PhantomData<E>);

impl<E: Elem> OpVisitor for AtOp<'_, E> {
    #[inline(always)]
    fn visit_op<O: BinOp>(self) -> usize {
        match self.0 {
            // Safety: `want <= level()` (callers of `at`), and `detect` saw AVX2.
            Level::Avx2 => unsafe { typed_avx2::<E, O>(self.1) },
            // Safety: `want <= level()`, and `detect` saw SSSE3 and SSE4.1.
            Level::Sse41 => unsafe { typed_sse41::<E, O>(self.1) },
            Level::Portable => typed_kernel::<E, O>(self.1),
        }
    }
}

#[target_feature(enable = "avx2")]
fn typed_avx2<E: Elem, O: BinOp>(k: Kernel<'_>) -> usize {
    typed_kernel::<E, O>(k)
}

#[target_feature(enable = "ssse3,sse4.1")]
fn typed_sse41<E: Elem, O: BinOp>(k: Kernel<'_>) -> usize {
    typed_kernel::<E, O>(k)
}

#[target_feature(enable = "avx2")]
fn swap_avx2<const N: usize>(src: &[u8], dst: &mut [u8]) -> usize {
    swap_kernel::<N>(src, dst)
}

#[target_feature(enable = "ssse3,sse4.1")]
fn swap_sse41<const N: usize>(src: &[u8], dst: &mut [u8]) -> usize {
    swap_kernel::<N>(src, dst)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{be, op_strategy, pairs};
    use super::*;
    use crate::dtype::{DataType, Operator};

    /// Every kernel on copies of the same operands, at `level`; the bytes of every
    /// output slice, or `None` if this CPU cannot run `level`.
    fn all_kernels(
        level: Level,
        op: Operator,
        dtype: DataType,
        a: &[u8],
        b: &[u8],
    ) -> Option<Vec<(usize, Vec<u8>)>> {
        let run = |k: Kernel<'_>| {
            if level == Level::Portable {
                Some(k.run_portable())
            } else {
                run_at(level, k)
            }
        };
        let mut got = Vec::new();
        let mut acc = a.to_vec();
        got.push((run(Kernel::Combine { op, dtype, acc: &mut acc, other: b })?, acc));
        let mut out = vec![0x3Cu8; a.len() + 3];
        got.push((run(Kernel::CombineInto { op, dtype, out: &mut out, a, b })?, out));
        let mut dst = vec![0x5Au8; b.len().saturating_sub(1)];
        got.push((run(Kernel::Swap { dtype, src: a, dst: &mut dst })?, dst));
        let n = a.len() / dtype.size();
        let mut acc = vec![0x11u8; n * dtype.acc_size() + 5];
        got.push((run(Kernel::Widen { dtype, acc: &mut acc, wire: a })?, acc.clone()));
        let mut acc2 = acc.clone();
        got.push((run(Kernel::Accumulate { op, dtype, acc: &mut acc2, wire: b })?, acc2.clone()));
        let mut out = vec![0x77u8; a.len() + 1];
        got.push((run(Kernel::Narrow { dtype, out: &mut out, acc: &acc2 })?, out));
        let mut out = vec![0x66u8; a.len()];
        got.push((
            run(Kernel::AccumulateNarrow { op, dtype, out: &mut out, acc: &acc, wire: b })?,
            out,
        ));
        Some(got)
    }

    proptest! {
        /// Every build this CPU can run gives the portable build's bits, for every
        /// kernel, operator and type, NaNs, infinities and signed zeros included, on
        /// lengths that exercise the vector loops and their tails, with slices of
        /// unequal lengths.
        #[test]
        fn every_build_matches_the_portable_one(
            op in op_strategy(),
            (dtype, pairs) in pairs(300),
            extra in 0usize..4,
        ) {
            let a = be(dtype, pairs.iter().map(|p| p.0));
            let mut b = be(dtype, pairs.iter().map(|p| p.1));
            b.extend(std::iter::repeat_n(0xA5, extra));
            let want = all_kernels(Level::Portable, op, dtype, &a, &b).unwrap();
            for l in [Level::Sse41, Level::Avx2] {
                match all_kernels(l, op, dtype, &a, &b) {
                    Some(got) => prop_assert_eq!(&got, &want, "{:?} {} {}", l, op, dtype),
                    None => prop_assert!(l > level(), "{:?} refused on a {:?} CPU", l, level()),
                }
            }
            let mut got = a.clone();
            prop_assert_eq!(super::super::combine_be(op, dtype, &mut got, &b), want[0].0);
            prop_assert_eq!(&got, &want[0].1);
        }
    }

    #[test]
    fn detected_once_and_stable() {
        assert_eq!(level(), level());
        assert_eq!(level(), detect());
    }
}
