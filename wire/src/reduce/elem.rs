//! [`Elem`]: what the reduce kernels need of an element type, implemented for the Rust
//! type of every row of the datatype table.

use core::fmt;

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::dtype::{DataType, Operator};

/// An element type the reduce kernels are generic over.
///
/// Every operation is commutative bit for bit (`op(a, b)` and `op(b, a)` have the same
/// bits), so results do not depend on the order a switch sees contributions in.
pub trait Elem: Copy + Default + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// The table row of this type.
    const DTYPE: DataType;
    /// Bytes per element.
    const SIZE: usize;
    /// What a switch accumulates this type in: `Self`, or `f32` for the half types.
    type Acc: Elem;

    /// Reads one element from the first `SIZE` bytes of `b`, network order.
    fn load_be(b: &[u8]) -> Self;
    /// Writes one element to the first `SIZE` bytes of `b`, network order.
    fn store_be(self, b: &mut [u8]);
    /// Reads one element from the first `SIZE` bytes of `b`, native order.
    fn load_ne(b: &[u8]) -> Self;
    /// Writes one element to the first `SIZE` bytes of `b`, native order.
    fn store_ne(self, b: &mut [u8]);

    /// SUM: integers wrap; floats IEEE (round to nearest even), NaN canonical.
    fn sum(self, b: Self) -> Self;
    /// PROD: integers wrap; floats IEEE, NaN canonical.
    fn prod(self, b: Self) -> Self;
    /// MAX: by value, signed or unsigned by type; floats IEEE 754-2019 `maximum`
    /// (-0 < +0; any NaN gives the canonical NaN).
    fn maximum(self, b: Self) -> Self;
    /// MIN, as [`Elem::maximum`].
    fn minimum(self, b: Self) -> Self;
    /// Bitwise AND, OR, XOR of the bit patterns (the kernels apply them to integer
    /// types only: see [`Operator::applies_to`]).
    fn band(self, b: Self) -> Self;
    /// Bitwise OR.
    fn bor(self, b: Self) -> Self;
    /// Bitwise XOR.
    fn bxor(self, b: Self) -> Self;

    /// The accumulator value of an element (exact).
    fn widen(self) -> Self::Acc;
    /// The element nearest to an accumulator value (round to nearest even; NaN
    /// canonical; overflow to infinity).
    fn narrow(acc: Self::Acc) -> Self;

    /// Whether the kernels convert this type a [`BLOCK`] at a time
    /// ([`Elem::widen_block`], [`Elem::narrow_block`]) rather than element by element:
    /// fp16, whose block conversions use F16C where the CPU has it (bf16 converts by a
    /// shift and a rounding that the element-wise loop vectorises better).
    const BLOCKED: bool = false;

    /// [`Elem::widen`] of the network-order elements of `wire` into `out`, as many as
    /// both hold (at most [`BLOCK`]).
    #[inline(always)]
    fn widen_block(wire: &[u8], out: &mut [Self::Acc]) {
        for (w, o) in wire.chunks_exact(Self::SIZE).zip(out.iter_mut()) {
            *o = Self::load_be(w).widen();
        }
    }

    /// [`Elem::narrow`] of `acc` into network-order elements of `wire`, as many as both
    /// hold (at most [`BLOCK`]).
    #[inline(always)]
    fn narrow_block(acc: &[Self::Acc], wire: &mut [u8]) {
        for (a, w) in acc.iter().zip(wire.chunks_exact_mut(Self::SIZE)) {
            Self::narrow(*a).store_be(w);
        }
    }

    /// AVG's final step on a host: `self / n` (integers: truncating division, as
    /// NCCL; floats: IEEE division at the type's width, rounded once, NaN canonical).
    fn div_count(self, n: u16) -> Self;

    /// `a op b` for any operator (`Barrier` and operators that do not apply to the
    /// type give `a`): the scalar form of the kernels.
    #[inline(always)]
    fn combine(op: Operator, a: Self, b: Self) -> Self {
        if !op.applies_to(Self::DTYPE) {
            return a;
        }
        match op.in_network() {
            Operator::Sum | Operator::Avg => a.sum(b),
            Operator::Prod => a.prod(b),
            Operator::Max => a.maximum(b),
            Operator::Min => a.minimum(b),
            Operator::Band => a.band(b),
            Operator::Bor => a.bor(b),
            Operator::Bxor => a.bxor(b),
            Operator::Barrier => a,
        }
    }
}

/// Elements per block of the blocked kernels of the half types.
pub const BLOCK: usize = 256;

macro_rules! bytes_io {
    ($t:ty, $size:literal) => {
        #[inline(always)]
        fn load_be(b: &[u8]) -> Self {
            let mut x = [0u8; $size];
            x.copy_from_slice(&b[..$size]);
            <$t>::from_be_bytes(x)
        }
        #[inline(always)]
        fn store_be(self, b: &mut [u8]) {
            b[..$size].copy_from_slice(&self.to_be_bytes());
        }
        #[inline(always)]
        fn load_ne(b: &[u8]) -> Self {
            let mut x = [0u8; $size];
            x.copy_from_slice(&b[..$size]);
            <$t>::from_ne_bytes(x)
        }
        #[inline(always)]
        fn store_ne(self, b: &mut [u8]) {
            b[..$size].copy_from_slice(&self.to_ne_bytes());
        }
    };
}

macro_rules! int_elem {
    ($($t:ty => $dtype:ident, $size:literal;)*) => {$(
        impl Elem for $t {
            const DTYPE: DataType = DataType::$dtype;
            const SIZE: usize = $size;
            type Acc = $t;
            bytes_io!($t, $size);
            #[inline(always)]
            fn sum(self, b: Self) -> Self { self.wrapping_add(b) }
            #[inline(always)]
            fn prod(self, b: Self) -> Self { self.wrapping_mul(b) }
            #[inline(always)]
            fn maximum(self, b: Self) -> Self { Ord::max(self, b) }
            #[inline(always)]
            fn minimum(self, b: Self) -> Self { Ord::min(self, b) }
            #[inline(always)]
            fn band(self, b: Self) -> Self { self & b }
            #[inline(always)]
            fn bor(self, b: Self) -> Self { self | b }
            #[inline(always)]
            fn bxor(self, b: Self) -> Self { self ^ b }
            #[inline(always)]
            fn div_count(self, n: u16) -> Self {
                // Truncating, in i128: the world size does not fit every element type
                // (an int8 world of 200, a uint8 one of 256), and `MIN / n` cannot
                // overflow there. n = 0 gives self.
                if n == 0 { self } else { (i128::from(self) / i128::from(n)) as $t }
            }
            #[inline(always)]
            fn widen(self) -> Self { self }
            #[inline(always)]
            fn narrow(acc: Self) -> Self { acc }
        }
    )*};
}

int_elem! {
    i8 => Int8, 1;
    u8 => Uint8, 1;
    i32 => Int32, 4;
    u32 => Uint32, 4;
    i64 => Int64, 8;
    u64 => Uint64, 8;
}

/// The canonical quiet NaN of each float type: every NaN result is replaced by it, so
/// payload and sign bits never depend on operand order or on the CPU.
pub trait CanonicalNan {
    /// Its bit pattern.
    const CANONICAL_NAN: Self;
}

macro_rules! float_elem {
    ($($t:ty => $dtype:ident, $size:literal, $nan:expr;)*) => {$(
        impl CanonicalNan for $t {
            const CANONICAL_NAN: $t = <$t>::from_bits($nan);
        }
        impl Elem for $t {
            const DTYPE: DataType = DataType::$dtype;
            const SIZE: usize = $size;
            type Acc = $t;
            bytes_io!($t, $size);
            #[inline(always)]
            fn sum(self, b: Self) -> Self { canon(self + b) }
            #[inline(always)]
            fn prod(self, b: Self) -> Self { canon(self * b) }
            // Selects without short-circuits, so they vectorise. Equal operands are
            // either the same bits or +0.0 and -0.0, where AND of the bits gives +0.0
            // (MAX) and OR gives -0.0 (MIN).
            #[inline(always)]
            fn maximum(self, b: Self) -> Self {
                let (x, y) = (self.to_bits(), b.to_bits());
                let r = if self > b { x } else if self < b { y } else { x & y };
                if self.is_nan() | b.is_nan() { Self::CANONICAL_NAN } else { <$t>::from_bits(r) }
            }
            #[inline(always)]
            fn minimum(self, b: Self) -> Self {
                let (x, y) = (self.to_bits(), b.to_bits());
                let r = if self < b { x } else if self > b { y } else { x | y };
                if self.is_nan() | b.is_nan() { Self::CANONICAL_NAN } else { <$t>::from_bits(r) }
            }
            #[inline(always)]
            fn band(self, b: Self) -> Self { <$t>::from_bits(self.to_bits() & b.to_bits()) }
            #[inline(always)]
            fn bor(self, b: Self) -> Self { <$t>::from_bits(self.to_bits() | b.to_bits()) }
            #[inline(always)]
            fn bxor(self, b: Self) -> Self { <$t>::from_bits(self.to_bits() ^ b.to_bits()) }
            #[inline(always)]
            fn div_count(self, n: u16) -> Self { canon(self / <$t>::from(n)) }
            #[inline(always)]
            fn widen(self) -> Self { self }
            #[inline(always)]
            fn narrow(acc: Self) -> Self { acc }
        }
    )*};
}

float_elem! {
    f32 => Float32, 4, 0x7fc0_0000;
    f64 => Float64, 8, 0x7ff8_0000_0000_0000;
}

#[inline(always)]
fn canon<T: CanonicalNan + IsNan>(x: T) -> T {
    if x.is_nan_() {
        T::CANONICAL_NAN
    } else {
        x
    }
}

/// `is_nan` of every float type (f32, f64 and the half types).
pub trait IsNan: Copy {
    /// Whether this is a NaN.
    fn is_nan_(self) -> bool;
}

macro_rules! is_nan {
    ($($t:ty),*) => {$(
        impl IsNan for $t {
            #[inline(always)]
            fn is_nan_(self) -> bool { self.is_nan() }
        }
    )*};
}
is_nan!(f32, f64, f16, bf16);

// The half types compute in f32 and round once. A sum or product of two halves is
// exact in f32 up to the one rounding (f32's 24-bit significand holds the 2 x 11 + 2
// bits that make double rounding innocuous), so each result is the correctly rounded
// IEEE half result; MAX/MIN on the widened values select exactly.
macro_rules! half_elem {
    ($($t:ty => $dtype:ident, $nan:expr, blocked $blocked:literal, $widen:path, $narrow:path;)*) => {$(
        impl CanonicalNan for $t {
            const CANONICAL_NAN: $t = <$t>::from_bits($nan);
        }
        impl Elem for $t {
            const DTYPE: DataType = DataType::$dtype;
            const SIZE: usize = 2;
            type Acc = f32;
            const BLOCKED: bool = $blocked;
            bytes_io!($t, 2);
            #[inline(always)]
            fn sum(self, b: Self) -> Self { Self::narrow(self.widen().sum(b.widen())) }
            #[inline(always)]
            fn prod(self, b: Self) -> Self { Self::narrow(self.widen().prod(b.widen())) }
            #[inline(always)]
            fn maximum(self, b: Self) -> Self { Self::narrow(Elem::maximum(self.widen(), b.widen())) }
            #[inline(always)]
            fn minimum(self, b: Self) -> Self { Self::narrow(Elem::minimum(self.widen(), b.widen())) }
            #[inline(always)]
            fn band(self, b: Self) -> Self { <$t>::from_bits(self.to_bits() & b.to_bits()) }
            #[inline(always)]
            fn bor(self, b: Self) -> Self { <$t>::from_bits(self.to_bits() | b.to_bits()) }
            #[inline(always)]
            fn bxor(self, b: Self) -> Self { <$t>::from_bits(self.to_bits() ^ b.to_bits()) }
            // In f32 and rounded once more: f32's 24 bits >= 2p + 2, so the result is
            // the correctly rounded quotient at the half type's width.
            #[inline(always)]
            fn div_count(self, n: u16) -> Self { Self::narrow(self.widen() / f32::from(n)) }
            #[inline(always)]
            fn widen(self) -> f32 { $widen(self) }
            #[inline(always)]
            fn narrow(acc: f32) -> Self { $narrow(acc) }
            // `half`'s slice conversions: F16C, 8 lanes at a time, where the CPU has it.
            #[inline(always)]
            fn widen_block(wire: &[u8], out: &mut [f32]) {
                let n = out.len().min(wire.len() / 2).min(BLOCK);
                let mut h = [<$t>::ZERO; BLOCK];
                for (w, x) in wire.chunks_exact(2).zip(h[..n].iter_mut()) {
                    *x = <$t>::from_bits(u16::from_be_bytes([w[0], w[1]]));
                }
                h[..n].convert_to_f32_slice(&mut out[..n]);
            }
            #[inline(always)]
            fn narrow_block(acc: &[f32], wire: &mut [u8]) {
                let n = acc.len().min(wire.len() / 2).min(BLOCK);
                let mut h = [<$t>::ZERO; BLOCK];
                h[..n].convert_from_f32_slice(&acc[..n]);
                for ((x, a), w) in h[..n].iter().zip(&acc[..n]).zip(wire.chunks_exact_mut(2)) {
                    let bits: u16 = if a.is_nan() { $nan } else { x.to_bits() };
                    w.copy_from_slice(&bits.to_be_bytes());
                }
            }
        }
    )*};
}

half_elem! {
    f16 => Float16, 0x7e00, blocked true, f16::to_f32, f16_narrow;
    bf16 => Bfloat16, 0x7fc0, blocked false, bf16::to_f32, bf16_narrow;
}

#[inline(always)]
fn f16_narrow(x: f32) -> f16 {
    canon(f16::from_f32(x))
}

/// `bf16::from_f32` (round to nearest even) with NaN canonical, without branches, so
/// the element loops vectorise (half's conversion branches on NaN per element).
#[inline(always)]
fn bf16_narrow(x: f32) -> bf16 {
    let u = x.to_bits();
    // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry
    // out of the fraction bumps the exponent, up to infinity, as it should.
    let rounded = (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16;
    let nan = (u & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits(if nan { 0x7fc0 } else { rounded })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::TypeVisitor;

    struct Sizes;
    impl TypeVisitor for Sizes {
        type Output = (DataType, usize, usize);
        fn visit<E: Elem>(self) -> Self::Output {
            (E::DTYPE, E::SIZE, E::Acc::SIZE)
        }
    }

    #[test]
    fn every_row_has_its_elem() {
        for d in DataType::ALL {
            assert_eq!(d.visit(Sizes), (*d, d.size(), d.acc_size()), "{d}");
        }
    }

    #[test]
    fn half_rounding_and_specials() {
        // 1 + 2^-11 is a tie in f16 (10 fraction bits): rounds to even, 1.0.
        let one = f16::from_f32(1.0);
        let tiny = f16::from_f32(2f32.powi(-11));
        assert_eq!(one.sum(tiny), one);
        let big = f16::MAX;
        assert_eq!(big.sum(big), f16::INFINITY);
        assert_eq!(f16::INFINITY.sum(f16::NEG_INFINITY).to_bits(), 0x7e00);
        assert_eq!(bf16::from_bits(0xffc1).sum(bf16::ONE).to_bits(), 0x7fc0);
        assert_eq!(f16::NEG_ZERO.maximum(f16::ZERO).to_bits(), 0);
        assert_eq!(bf16::NEG_ZERO.minimum(bf16::ZERO).to_bits(), 0x8000);
        assert_eq!(f64::NAN.prod(1.0).to_bits(), 0x7ff8_0000_0000_0000);
        assert_eq!(i8::MAX.sum(1), i8::MIN);
        assert_eq!(u8::MAX.maximum(1), u8::MAX);
        assert_eq!((-1i64).maximum(1), 1);
        assert_eq!(u64::MAX.prod(u64::MAX), 1);
        assert_eq!((-7i32).div_count(2), -3, "truncating, as NCCL");
        assert_eq!(i8::MIN.div_count(1), i8::MIN);
        assert_eq!(7u8.div_count(0), 7);
        assert_eq!(1.0f32.div_count(3), 1.0 / 3.0);
        assert_eq!(f16::from_f32(1.0).div_count(3), f16::from_f32(1.0 / 3.0));
        assert_eq!(bf16::ONE.div_count(0).to_bits(), bf16::INFINITY.to_bits());
    }

    /// AVG's division by a world size wider than the element type (issue [13] review:
    /// it used to be cast into the type first).
    #[test]
    fn integer_average_of_large_worlds() {
        assert_eq!(100i8.div_count(200), 0);
        assert_eq!((-128i8).div_count(300), 0);
        assert_eq!(200u8.div_count(300), 0);
        assert_eq!(200u8.div_count(256), 0);
        assert_eq!(255u8.div_count(2), 127);
        assert_eq!(i64::MIN.div_count(65535), i64::MIN / 65535);
        assert_eq!(u64::MAX.div_count(65535), u64::MAX / 65535);
        assert_eq!((-7i32).div_count(2), -3);
    }

    /// The branch-free bf16 rounding is `half`'s (NaN canonical) for every class of
    /// input: ties both ways, the largest finite values rounding to infinity, zeros,
    /// subnormals, infinities and NaNs of either sign and any payload.
    #[test]
    fn bf16_narrow_is_halfs_rounding() {
        let mut x: u32 = 0x1234_5678;
        let special = [
            0,
            0x8000_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x7f7f_ffff,
            0xff7f_8000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0xffff_ffff,
            0x7f80_0001,
            0x0000_0001,
            0x807f_ffff,
        ];
        let xorshift = |x: &mut u32| {
            *x ^= *x << 13;
            *x ^= *x >> 17;
            *x ^= *x << 5;
            *x
        };
        for bits in special.into_iter().chain((0..200_000).map(|_| xorshift(&mut x))) {
            let f = f32::from_bits(bits);
            let want = canon(bf16::from_f32(f)).to_bits();
            assert_eq!(bf16_narrow(f).to_bits(), want, "{bits:#010x}");
        }
    }
}
