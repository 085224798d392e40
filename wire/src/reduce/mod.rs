//! Element reduce kernels over network-byte-order vectors, and byte-order conversion.
//!
//! Semantics (every rank must receive bit-identical results, whatever order the switch
//! combines contributions in, so every operation here is commutative *bit for bit*):
//!
//! - Integers (int8/32/64, uint8/32/64): SUM and PROD wrap (two's complement); MAX/MIN
//!   compare as signed or unsigned by type; BAND/BOR/BXOR bitwise.
//! - Floats (fp16, bf16, fp32, fp64) SUM/PROD: IEEE 754 at the type's width, round to
//!   nearest even. MAX/MIN: IEEE 754-2019 `maximum`/`minimum`: `-0.0 < +0.0`, so
//!   `max(-0.0, +0.0) = +0.0` and `min(-0.0, +0.0) = -0.0`. The bitwise operators do
//!   not apply to floats: a kernel asked for one processes nothing and returns 0.
//! - NaN: any NaN operand makes the result NaN, and every NaN result is the type's
//!   canonical quiet NaN ([`CanonicalNan`]: `0x7E00`, `0x7FC0`, `0x7FC00000`,
//!   `0x7FF8000000000000`), so payload and sign bits never depend on operand order or
//!   on the CPU.
//! - AVG is SUM here (the hosts divide).
//!
//! Float SUM is commutative but not associative; a reproducible result across runs
//! needs a fixed combination order, which is the switch's job (deterministic mode).
//!
//! **Accumulators.** A switch accumulates fp16 and bf16 in fp32 and rounds to the wire
//! type once per hop ([`Elem::Acc`], [`DataType::acc_size`]): [`widen_be`] turns the
//! first contribution into an accumulator, [`accumulate_be`] adds each further one,
//! [`narrow_be`] (or [`accumulate_narrow_be`] for the last contribution) rounds the
//! result. An accumulator is a vector of the accumulator type in network byte order
//! (`acc_size()` bytes per element), so for every other type it *is* the wire vector
//! and these functions are [`combine_be`] and copies: one code path serves every type.
//!
//! Every kernel runs a build for the best instruction set the CPU has (x86-64: AVX2 or
//! SSE4.1, detected once at run time; see `simd_dispatch`), because swapping byte order
//! one element at a time costs ten times more than the arithmetic on a baseline x86-64
//! build. Every build computes the same bits: [`Kernel::run_portable`] is the reference
//! the tests hold them to.

use crate::dtype::{DataType, Operator, TypeVisitor};

mod elem;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // target_feature functions; see the module's Safety notes
mod simd_dispatch;

pub use elem::{CanonicalNan, Elem};

/// The canonical quiet NaN of FLOAT32 every NaN result is replaced with.
pub const CANONICAL_NAN_BITS: u32 = 0x7fc0_0000;

/// One call of a reduce kernel: what it computes and on which slices. Every kernel
/// processes the whole elements its slices have in common and returns how many; callers
/// compare that with the count they expected (differing lengths are a protocol error
/// the caller must report, not something to reduce around). `Barrier`, and an operator
/// that does not apply to the type, process nothing and return 0.
#[derive(Debug)]
pub enum Kernel<'a> {
    /// `acc[i] = acc[i] op other[i]` (wire vectors).
    Combine { op: Operator, dtype: DataType, acc: &'a mut [u8], other: &'a [u8] },
    /// `out[i] = a[i] op b[i]` (wire vectors).
    CombineInto { op: Operator, dtype: DataType, out: &'a mut [u8], a: &'a [u8], b: &'a [u8] },
    /// Native to network order, or back (the same byte swap).
    Swap { dtype: DataType, src: &'a [u8], dst: &'a mut [u8] },
    /// `acc[i] = widen(wire[i])`.
    Widen { dtype: DataType, acc: &'a mut [u8], wire: &'a [u8] },
    /// `acc[i] = acc[i] op widen(wire[i])`.
    Accumulate { op: Operator, dtype: DataType, acc: &'a mut [u8], wire: &'a [u8] },
    /// `out[i] = narrow(acc[i])`.
    Narrow { dtype: DataType, out: &'a mut [u8], acc: &'a [u8] },
    /// `out[i] = narrow(acc[i] op widen(wire[i]))`.
    AccumulateNarrow {
        op: Operator,
        dtype: DataType,
        out: &'a mut [u8],
        acc: &'a [u8],
        wire: &'a [u8],
    },
}

impl Kernel<'_> {
    /// Runs the best build for this CPU.
    #[inline]
    pub fn run(self) -> usize {
        #[cfg(target_arch = "x86_64")]
        return simd_dispatch::run(self);
        #[cfg(not(target_arch = "x86_64"))]
        return run_kernel(self);
    }

    /// Runs the build for the compilation target only, whatever the CPU offers: the
    /// reference the run-time dispatched builds must match bit for bit.
    pub fn run_portable(self) -> usize {
        run_kernel(self)
    }

    pub(crate) fn dtype(&self) -> DataType {
        match self {
            Kernel::Combine { dtype, .. }
            | Kernel::CombineInto { dtype, .. }
            | Kernel::Swap { dtype, .. }
            | Kernel::Widen { dtype, .. }
            | Kernel::Accumulate { dtype, .. }
            | Kernel::Narrow { dtype, .. }
            | Kernel::AccumulateNarrow { dtype, .. } => *dtype,
        }
    }
}

/// `acc[i] = acc[i] op other[i]` over big-endian elements of `dtype`; returns how many
/// elements (see [`Kernel`]).
pub fn combine_be(op: Operator, dtype: DataType, acc: &mut [u8], other: &[u8]) -> usize {
    Kernel::Combine { op, dtype, acc, other }.run()
}

/// `out[i] = a[i] op b[i]`: [`combine_be`] writing its result elsewhere, so that a
/// switch combines the last contribution straight into the frame that carries the
/// result on (one pass instead of a combine and a copy). Processes the whole elements
/// all three slices have in common and returns how many; the same bits as
/// [`combine_be`] on a copy of `a`.
pub fn combine_be_into(op: Operator, dtype: DataType, out: &mut [u8], a: &[u8], b: &[u8]) -> usize {
    Kernel::CombineInto { op, dtype, out, a, b }.run()
}

/// [`combine_be`] built for the compilation target only.
pub fn combine_be_portable(op: Operator, dtype: DataType, acc: &mut [u8], other: &[u8]) -> usize {
    Kernel::Combine { op, dtype, acc, other }.run_portable()
}

/// Copies native-order elements of `dtype` from `src` into `dst` in network order.
/// Converts the whole elements both slices hold and returns how many.
pub fn to_network(dtype: DataType, src: &[u8], dst: &mut [u8]) -> usize {
    Kernel::Swap { dtype, src, dst }.run()
}

/// Copies network-order elements of `dtype` from `src` into `dst` in native order.
/// Converts the whole elements both slices hold and returns how many.
pub fn from_network(dtype: DataType, src: &[u8], dst: &mut [u8]) -> usize {
    Kernel::Swap { dtype, src, dst }.run()
}

/// Converts whole elements between native and network order in place (the same
/// operation in both directions); returns how many elements.
pub fn swap_in_place(dtype: DataType, buf: &mut [u8]) -> usize {
    let size = dtype.size();
    let mut n = 0;
    for c in buf.chunks_exact_mut(size) {
        if cfg!(target_endian = "little") {
            c.reverse();
        }
        n += 1;
    }
    n
}

/// `acc[i] = widen(wire[i])`: an accumulator (`dtype.acc_size()` bytes per element,
/// network order) holding a wire vector.
pub fn widen_be(dtype: DataType, acc: &mut [u8], wire: &[u8]) -> usize {
    Kernel::Widen { dtype, acc, wire }.run()
}

/// `acc[i] = acc[i] op widen(wire[i])`: one more contribution into an accumulator.
pub fn accumulate_be(op: Operator, dtype: DataType, acc: &mut [u8], wire: &[u8]) -> usize {
    Kernel::Accumulate { op, dtype, acc, wire }.run()
}

/// `out[i] = narrow(acc[i])`: the wire vector of an accumulator, each element rounded
/// once (round to nearest even, NaN canonical).
pub fn narrow_be(dtype: DataType, out: &mut [u8], acc: &[u8]) -> usize {
    Kernel::Narrow { dtype, out, acc }.run()
}

/// `out[i] = narrow(acc[i] op widen(wire[i]))`: the last contribution and the rounding
/// in one pass.
pub fn accumulate_narrow_be(
    op: Operator,
    dtype: DataType,
    out: &mut [u8],
    acc: &[u8],
    wire: &[u8],
) -> usize {
    Kernel::AccumulateNarrow { op, dtype, out, acc, wire }.run()
}

/// The hosts' last step of `op` on a *native-order* result vector of `dtype` from a
/// communicator of `world` ranks: AVG divides every element by `world`
/// ([`Elem::div_count`]); every other operator leaves the vector as it is. Returns the
/// elements changed.
pub fn finalize_native(op: Operator, dtype: DataType, buf: &mut [u8], world: u16) -> usize {
    struct Finalize<'a>(&'a mut [u8], u16);
    impl TypeVisitor for Finalize<'_> {
        type Output = usize;
        fn visit<E: Elem>(self) -> usize {
            let mut n = 0;
            for c in self.0.chunks_exact_mut(E::SIZE) {
                E::load_ne(c).div_count(self.1).store_ne(c);
                n += 1;
            }
            n
        }
    }
    if op != Operator::Avg {
        return 0;
    }
    dtype.visit(Finalize(buf, world))
}

/// An element operation as a type, so that each (type, operator) pair gets its own
/// function: LLVM vectorised only some loops of one function holding every operator's.
pub(crate) trait BinOp {
    /// `a op b`.
    fn apply<T: Elem>(a: T, b: T) -> T;
}

macro_rules! bin_ops {
    ($($name:ident => $method:ident;)*) => {$(
        pub(crate) struct $name;
        impl BinOp for $name {
            #[inline(always)]
            fn apply<T: Elem>(a: T, b: T) -> T {
                a.$method(b)
            }
        }
    )*};
}

bin_ops! {
    SumOp => sum;
    ProdOp => prod;
    MaxOp => maximum;
    MinOp => minimum;
    BandOp => band;
    BorOp => bor;
    BxorOp => bxor;
}

/// Receives the [`BinOp`] of an operator (see [`with_op`]).
pub(crate) trait OpVisitor {
    fn visit_op<O: BinOp>(self) -> usize;
}

/// Calls `v.visit_op::<O>()` with `O` the operation a switch applies for `op`; 0 for
/// `Barrier`.
#[inline(always)]
pub(crate) fn with_op(op: Operator, v: impl OpVisitor) -> usize {
    match op.in_network() {
        Operator::Sum | Operator::Avg => v.visit_op::<SumOp>(),
        Operator::Prod => v.visit_op::<ProdOp>(),
        Operator::Max => v.visit_op::<MaxOp>(),
        Operator::Min => v.visit_op::<MinOp>(),
        Operator::Band => v.visit_op::<BandOp>(),
        Operator::Bor => v.visit_op::<BorOp>(),
        Operator::Bxor => v.visit_op::<BxorOp>(),
        Operator::Barrier => 0,
    }
}

/// The kernels; always inlined, so each caller (the portable one and the
/// `target_feature` builds) gets its own code generated for its instruction set.
#[inline(always)]
fn run_kernel(k: Kernel<'_>) -> usize {
    match k {
        Kernel::Swap { dtype, src, dst } => match dtype.size() {
            1 => swap_kernel::<1>(src, dst),
            2 => swap_kernel::<2>(src, dst),
            4 => swap_kernel::<4>(src, dst),
            _ => swap_kernel::<8>(src, dst),
        },
        k => k.dtype().visit(Typed(k)),
    }
}

/// A [`Kernel`] given its element type.
pub(crate) struct Typed<'a>(pub(crate) Kernel<'a>);

impl Kernel<'_> {
    /// The operator of the kernel (`Sum` for those without one: any operator that
    /// applies to every type would do).
    pub(crate) fn op(&self) -> Operator {
        match self {
            Kernel::Combine { op, .. }
            | Kernel::CombineInto { op, .. }
            | Kernel::Accumulate { op, .. }
            | Kernel::AccumulateNarrow { op, .. } => *op,
            Kernel::Swap { .. } | Kernel::Widen { .. } | Kernel::Narrow { .. } => Operator::Sum,
        }
    }
}

impl TypeVisitor for Typed<'_> {
    type Output = usize;

    #[inline(always)]
    fn visit<E: Elem>(self) -> usize {
        let op = self.0.op();
        if !op.applies_to(E::DTYPE) {
            return 0;
        }
        with_op(op, TypedOp::<E>(self.0, core::marker::PhantomData))
    }
}

/// A [`Kernel`] given its element type and operation.
pub(crate) struct TypedOp<'a, E>(pub(crate) Kernel<'a>, pub(crate) core::marker::PhantomData<E>);

impl<E: Elem> OpVisitor for TypedOp<'_, E> {
    #[inline(always)]
    fn visit_op<O: BinOp>(self) -> usize {
        typed_kernel::<E, O>(self.0)
    }
}

/// Every kernel for element type `E` and operation `O`.
#[inline(always)]
pub(crate) fn typed_kernel<E: Elem, O: BinOp>(k: Kernel<'_>) -> usize {
    if E::BLOCKED {
        return blocked_kernel::<E, O>(k);
    }
    match k {
        Kernel::Combine { acc, other, .. } => zip_in_place::<E, E>(acc, other, O::apply::<E>),
        Kernel::CombineInto { out, a, b, .. } => zip_into::<E, E, E>(out, a, b, O::apply::<E>),
        Kernel::Accumulate { acc, wire, .. } => {
            zip_in_place::<E::Acc, E>(acc, wire, |a, w| O::apply::<E::Acc>(a, w.widen()))
        }
        Kernel::AccumulateNarrow { out, acc, wire, .. } => {
            zip_into::<E, E::Acc, E>(out, acc, wire, |a, w| E::narrow(O::apply(a, w.widen())))
        }
        Kernel::Widen { acc, wire, .. } => map::<E, E::Acc>(acc, wire, E::widen),
        Kernel::Narrow { out, acc, .. } => map::<E::Acc, E>(out, acc, E::narrow),
        Kernel::Swap { .. } => unreachable!("handled by run_kernel"),
    }
}

/// The kernels for the types with [`Elem::BLOCKED`], a [`elem::BLOCK`] of elements at a
/// time: widen the block (`Elem::widen_block`, F16C where there is one), combine in
/// fp32, narrow it. The same bits as the element-wise definitions.
#[inline(always)]
fn blocked_kernel<E: Elem, O: BinOp>(k: Kernel<'_>) -> usize {
    use elem::BLOCK;
    let (s, t) = (E::SIZE, E::Acc::SIZE);
    let mut x = [E::Acc::default(); BLOCK];
    let mut y = [E::Acc::default(); BLOCK];
    let load = |acc: &[u8], x: &mut [E::Acc]| {
        for (a, v) in acc.chunks_exact(t).zip(x.iter_mut()) {
            *v = E::Acc::load_be(a);
        }
    };
    let store = |x: &[E::Acc], acc: &mut [u8]| {
        for (v, a) in x.iter().zip(acc.chunks_exact_mut(t)) {
            v.store_be(a);
        }
    };
    let combine = |x: &mut [E::Acc], y: &[E::Acc]| {
        for (a, b) in x.iter_mut().zip(y) {
            *a = O::apply(*a, *b);
        }
    };
    let blocks = |n: usize| (0..n).step_by(BLOCK).map(move |i| (i, BLOCK.min(n - i)));
    match k {
        Kernel::Combine { acc, other, .. } => {
            let n = acc.len().min(other.len()) / s;
            for (i, m) in blocks(n) {
                let a = &mut acc[i * s..(i + m) * s];
                E::widen_block(a, &mut x[..m]);
                E::widen_block(&other[i * s..(i + m) * s], &mut y[..m]);
                combine(&mut x[..m], &y[..m]);
                E::narrow_block(&x[..m], a);
            }
            n
        }
        Kernel::CombineInto { out, a, b, .. } => {
            let n = out.len().min(a.len()).min(b.len()) / s;
            for (i, m) in blocks(n) {
                E::widen_block(&a[i * s..(i + m) * s], &mut x[..m]);
                E::widen_block(&b[i * s..(i + m) * s], &mut y[..m]);
                combine(&mut x[..m], &y[..m]);
                E::narrow_block(&x[..m], &mut out[i * s..(i + m) * s]);
            }
            n
        }
        Kernel::Accumulate { acc, wire, .. } => {
            let n = (acc.len() / t).min(wire.len() / s);
            for (i, m) in blocks(n) {
                let a = &mut acc[i * t..(i + m) * t];
                load(a, &mut x[..m]);
                E::widen_block(&wire[i * s..(i + m) * s], &mut y[..m]);
                combine(&mut x[..m], &y[..m]);
                store(&x[..m], a);
            }
            n
        }
        Kernel::AccumulateNarrow { out, acc, wire, .. } => {
            let n = (out.len() / s).min(acc.len() / t).min(wire.len() / s);
            for (i, m) in blocks(n) {
                load(&acc[i * t..(i + m) * t], &mut x[..m]);
                E::widen_block(&wire[i * s..(i + m) * s], &mut y[..m]);
                combine(&mut x[..m], &y[..m]);
                E::narrow_block(&x[..m], &mut out[i * s..(i + m) * s]);
            }
            n
        }
        Kernel::Widen { acc, wire, .. } => {
            let n = (acc.len() / t).min(wire.len() / s);
            for (i, m) in blocks(n) {
                E::widen_block(&wire[i * s..(i + m) * s], &mut x[..m]);
                store(&x[..m], &mut acc[i * t..(i + m) * t]);
            }
            n
        }
        Kernel::Narrow { out, acc, .. } => {
            let n = (out.len() / s).min(acc.len() / t);
            for (i, m) in blocks(n) {
                load(&acc[i * t..(i + m) * t], &mut x[..m]);
                E::narrow_block(&x[..m], &mut out[i * s..(i + m) * s]);
            }
            n
        }
        Kernel::Swap { .. } => unreachable!("handled by run_kernel"),
    }
}

/// `a[i] = f(a[i], b[i])` with `a` of type `A` and `b` of type `B`.
#[inline(always)]
fn zip_in_place<A: Elem, B: Elem>(a: &mut [u8], b: &[u8], f: impl Fn(A, B) -> A) -> usize {
    let mut n = 0;
    for (x, y) in a.chunks_exact_mut(A::SIZE).zip(b.chunks_exact(B::SIZE)) {
        f(A::load_be(x), B::load_be(y)).store_be(x);
        n += 1;
    }
    n
}

/// `out[i] = f(a[i], b[i])`.
#[inline(always)]
fn zip_into<O: Elem, A: Elem, B: Elem>(
    out: &mut [u8],
    a: &[u8],
    b: &[u8],
    f: impl Fn(A, B) -> O,
) -> usize {
    let mut n = 0;
    let pairs = a.chunks_exact(A::SIZE).zip(b.chunks_exact(B::SIZE));
    for (o, (x, y)) in out.chunks_exact_mut(O::SIZE).zip(pairs) {
        f(A::load_be(x), B::load_be(y)).store_be(o);
        n += 1;
    }
    n
}

/// `out[i] = f(src[i])`.
#[inline(always)]
fn map<S: Elem, O: Elem>(out: &mut [u8], src: &[u8], f: impl Fn(S) -> O) -> usize {
    let mut n = 0;
    for (o, s) in out.chunks_exact_mut(O::SIZE).zip(src.chunks_exact(S::SIZE)) {
        f(S::load_be(s)).store_be(o);
        n += 1;
    }
    n
}

/// Copies `N`-byte elements from `src` to `dst`, reversing each on little-endian
/// targets (native <-> network order).
#[inline(always)]
fn swap_kernel<const N: usize>(src: &[u8], dst: &mut [u8]) -> usize {
    let mut n = 0;
    for (s, d) in src.chunks_exact(N).zip(dst.chunks_exact_mut(N)) {
        let mut x = [0u8; N];
        x.copy_from_slice(s);
        if cfg!(target_endian = "little") {
            x.reverse();
        }
        d.copy_from_slice(&x);
        n += 1;
    }
    n
}

#[cfg(test)]
pub(crate) mod tests;
