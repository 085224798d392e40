//! Reference results computed directly in native types (`i8` ... `f64`, and the `half`
//! crate's `f16`/`bf16`), written apart from the wire crate's reduce kernels, so the
//! simulation checks the engines against plain arithmetic. Only the rows (which types
//! and operators exist, and which pairs are valid) come from `inc_wire`'s tables.
//!
//! Semantics (docs/PROTOCOL.md section 3): integers wrap for SUM and PROD, MAX/MIN by
//! value; floats IEEE with MAX/MIN taking -0 < +0, and every NaN result the type's
//! canonical quiet NaN. A switch folds its children in an accumulator (fp32 for the half
//! types, else the type itself) and rounds to the wire type once; a single child passes
//! bit for bit. AVG is SUM in the network, divided by the world size on the hosts.

use std::fmt;

use half::{bf16, f16};
use inc_wire::{DataType, Operator};

/// What a collective does: the host engine's own enum, so cases pass straight through.
pub use inccl_engine::CollectiveKind as Kind;

/// Short name of a collective for failure messages (`allreduce`, `reduce(root 1)`, ...).
pub fn kind_name(kind: Kind) -> String {
    match kind {
        Kind::AllReduce => "allreduce".to_string(),
        Kind::Reduce { root } => format!("reduce(root {root})"),
        Kind::Broadcast { root } => format!("broadcast(root {root})"),
        Kind::Barrier => "barrier".to_string(),
        Kind::ReduceScatter => "reducescatter".to_string(),
        Kind::AllGather => "allgather".to_string(),
    }
}

/// An input value before it is stored as an element of some type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sample {
    /// An integer, truncated to the type's width (two's complement).
    Int(u64),
    /// A real number, rounded to the float type (nearest even).
    Real(f64),
    /// A float type's bit pattern (low bits), for NaN payloads and -0.
    Bits(u64),
}

/// One element type as the reference computes it.
pub trait Value: Copy + PartialEq + fmt::Debug {
    /// What a switch folds children in: fp32 for the half types, else the type itself.
    type Acc: Value;
    /// Bytes per element.
    const SIZE: usize;
    /// Significand bits including the implicit one (0 for integers).
    const PRECISION: u32;

    /// The element at the start of `b`, native byte order.
    fn read(b: &[u8]) -> Self;
    /// Stores the element at the start of `b`, native byte order.
    fn write(self, b: &mut [u8]);
    /// The element a sample stands for in this type.
    fn from_sample(s: Sample) -> Self;
    /// Into the accumulator (exact).
    fn widen(self) -> Self::Acc;
    /// From the accumulator: rounded to nearest even, NaN canonical.
    fn narrow(acc: Self::Acc) -> Self;
    /// `a op b` in the accumulator (`op` one that applies to the type, not Barrier).
    fn apply(op: Operator, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// AVG's last step on a host: `self / n`.
    fn divide(self, n: u16) -> Self;
    /// The value as an f64 (for error bounds; integers are never bound-checked).
    fn to_f64(self) -> f64;
    /// For failure messages.
    fn show(self) -> String;
}

macro_rules! int_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            type Acc = $t;
            const SIZE: usize = std::mem::size_of::<$t>();
            const PRECISION: u32 = 0;
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b[..Self::SIZE].try_into().expect("element bytes"))
            }
            fn write(self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
            fn from_sample(s: Sample) -> Self {
                match s {
                    Sample::Int(x) | Sample::Bits(x) => x as $t,
                    Sample::Real(_) => panic!("real sample for an integer type"),
                }
            }
            fn widen(self) -> Self {
                self
            }
            fn narrow(acc: Self) -> Self {
                acc
            }
            fn apply(op: Operator, a: Self, b: Self) -> Self {
                match op {
                    Operator::Sum | Operator::Avg => a.wrapping_add(b),
                    Operator::Prod => a.wrapping_mul(b),
                    Operator::Max => a.max(b),
                    Operator::Min => a.min(b),
                    Operator::Band => a & b,
                    Operator::Bor => a | b,
                    Operator::Bxor => a ^ b,
                    Operator::Barrier => panic!("a barrier reduces no data"),
                }
            }
            fn divide(self, n: u16) -> Self {
                // Truncating, as NCCL, in a type wide enough for any world size.
                (i128::from(self) / i128::from(n)) as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn show(self) -> String {
                format!("{self}")
            }
        }
    )*};
}

int_value!(i8, u8, i32, u32, i64, u64);

/// IEEE 754-2019 `maximum`/`minimum` as the protocol states them: any NaN gives the
/// canonical NaN; of two equal values (only +0 and -0 differ) MAX takes +0, MIN -0.
macro_rules! ieee_select {
    ($a:expr, $b:expr, $nan:expr, $greater:expr) => {{
        let (a, b) = ($a, $b);
        if a.is_nan() || b.is_nan() {
            $nan
        } else if a == b {
            if a.is_sign_negative() == $greater {
                b
            } else {
                a
            }
        } else if (a > b) == $greater {
            a
        } else {
            b
        }
    }};
}

macro_rules! float_value {
    ($($t:ty => nan $nan:literal, precision $p:literal;)*) => {$(
        impl Value for $t {
            type Acc = $t;
            const SIZE: usize = std::mem::size_of::<$t>();
            const PRECISION: u32 = $p;
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b[..Self::SIZE].try_into().expect("element bytes"))
            }
            fn write(self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
            fn from_sample(s: Sample) -> Self {
                match s {
                    Sample::Real(x) => x as $t,
                    Sample::Bits(x) => <$t>::from_bits(x as _),
                    Sample::Int(_) => panic!("integer sample for a float type"),
                }
            }
            fn widen(self) -> Self {
                self
            }
            fn narrow(acc: Self) -> Self {
                acc
            }
            fn apply(op: Operator, a: Self, b: Self) -> Self {
                let canon = |x: $t| if x.is_nan() { <$t>::from_bits($nan) } else { x };
                match op {
                    Operator::Sum | Operator::Avg => canon(a + b),
                    Operator::Prod => canon(a * b),
                    Operator::Max => ieee_select!(a, b, <$t>::from_bits($nan), true),
                    Operator::Min => ieee_select!(a, b, <$t>::from_bits($nan), false),
                    _ => panic!("operator {op} does not apply to a float type"),
                }
            }
            fn divide(self, n: u16) -> Self {
                let q = self / <$t>::from(n);
                if q.is_nan() { <$t>::from_bits($nan) } else { q }
            }
            fn to_f64(self) -> f64 {
                self.into()
            }
            fn show(self) -> String {
                format!("{self:e} ({:#x})", self.to_bits())
            }
        }
    )*};
}

float_value! {
    f32 => nan 0x7fc0_0000, precision 24;
    f64 => nan 0x7ff8_0000_0000_0000, precision 53;
}

macro_rules! half_value {
    ($($t:ty => nan $nan:literal, precision $p:literal;)*) => {$(
        impl Value for $t {
            type Acc = f32;
            const SIZE: usize = 2;
            const PRECISION: u32 = $p;
            fn read(b: &[u8]) -> Self {
                <$t>::from_bits(u16::from_ne_bytes([b[0], b[1]]))
            }
            fn write(self, b: &mut [u8]) {
                b[..2].copy_from_slice(&self.to_bits().to_ne_bytes());
            }
            fn from_sample(s: Sample) -> Self {
                match s {
                    Sample::Real(x) => <$t>::from_f64(x),
                    Sample::Bits(x) => <$t>::from_bits(x as u16),
                    Sample::Int(_) => panic!("integer sample for a float type"),
                }
            }
            fn widen(self) -> f32 {
                self.to_f32()
            }
            fn narrow(acc: f32) -> Self {
                if acc.is_nan() { <$t>::from_bits($nan) } else { <$t>::from_f32(acc) }
            }
            fn apply(op: Operator, a: f32, b: f32) -> f32 {
                <f32 as Value>::apply(op, a, b)
            }
            // Through f64: its 53 bits hold 2p + 2, so rounding the f64 quotient again
            // gives the correctly rounded quotient (INCCL divides in f32, which must land
            // on the same value).
            fn divide(self, n: u16) -> Self {
                let q = <$t>::from_f64(self.to_f64() / f64::from(n));
                if q.is_nan() { <$t>::from_bits($nan) } else { q }
            }
            fn to_f64(self) -> f64 {
                <$t>::to_f64(self)
            }
            fn show(self) -> String {
                format!("{self:e} ({:#06x})", self.to_bits())
            }
        }
    )*};
}

half_value! {
    f16 => nan 0x7e00, precision 11;
    bf16 => nan 0x7fc0, precision 8;
}

/// Runs `$body` with `$t` the reference's Rust type of `$dtype`'s row (the match is
/// exhaustive: a new row of the table must be added here).
macro_rules! with_value {
    ($dtype:expr, |$t:ident| $body:expr) => {
        match $dtype {
            DataType::Int8 => {
                type $t = i8;
                $body
            }
            DataType::Uint8 => {
                type $t = u8;
                $body
            }
            DataType::Int32 => {
                type $t = i32;
                $body
            }
            DataType::Uint32 => {
                type $t = u32;
                $body
            }
            DataType::Int64 => {
                type $t = i64;
                $body
            }
            DataType::Uint64 => {
                type $t = u64;
                $body
            }
            DataType::Float16 => {
                type $t = f16;
                $body
            }
            DataType::Bfloat16 => {
                type $t = bf16;
                $body
            }
            DataType::Float32 => {
                type $t = f32;
                $body
            }
            DataType::Float64 => {
                type $t = f64;
                $body
            }
        }
    };
}

/// Element size in bytes, as the reference's Rust type has it.
pub fn size(dtype: DataType) -> usize {
    with_value!(dtype, |T| T::SIZE)
}

/// Significand bits of a float type including the implicit one; 0 for integers.
pub fn precision(dtype: DataType) -> u32 {
    with_value!(dtype, |T| T::PRECISION)
}

/// `samples` stored as elements of `dtype`, native byte order.
pub fn encode(dtype: DataType, samples: &[Sample]) -> Vec<u8> {
    fn go<T: Value>(samples: &[Sample]) -> Vec<u8> {
        let mut out = vec![0; samples.len() * T::SIZE];
        for (s, o) in samples.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            T::from_sample(*s).write(o);
        }
        out
    }
    with_value!(dtype, |T| go::<T>(samples))
}

/// Element `i` of a vector of `dtype`, as an f64.
pub fn element_f64(dtype: DataType, v: &[u8], i: usize) -> f64 {
    with_value!(dtype, |T| T::read(&v[i * T::SIZE..]).to_f64())
}

/// One switch's fold of its children's vectors (`parts`, in ascending child ordinal):
/// a single child passes bit for bit; otherwise the first is widened into the
/// accumulator, each further one combined into it in order, and the result rounded to
/// the wire type once.
pub fn fold(op: Operator, dtype: DataType, parts: &[&[u8]]) -> Vec<u8> {
    fn go<T: Value>(op: Operator, parts: &[&[u8]]) -> Vec<u8> {
        let mut out = parts[0].to_vec();
        if parts.len() == 1 {
            return out;
        }
        for (i, o) in out.chunks_exact_mut(T::SIZE).enumerate() {
            let at = |p: &[u8]| T::read(&p[i * T::SIZE..]).widen();
            let acc = parts[1..].iter().fold(at(parts[0]), |acc, p| T::apply(op, acc, at(p)));
            T::narrow(acc).write(o);
        }
        out
    }
    assert!(parts.iter().all(|p| p.len() == parts[0].len()), "reference operands differ in length");
    with_value!(dtype, |T| go::<T>(op, parts))
}

/// The hosts' last step of `op` on a result from `world` ranks: AVG divides each
/// element by `world` (floats: IEEE division of the wire result; integers: truncating).
pub fn finish(op: Operator, dtype: DataType, result: &mut [u8], world: u16) {
    fn go<T: Value>(result: &mut [u8], world: u16) {
        for c in result.chunks_exact_mut(T::SIZE) {
            T::read(c).divide(world).write(c);
        }
    }
    if op == Operator::Avg {
        with_value!(dtype, |T| go::<T>(result, world));
    }
}

/// A communicator's aggregation tree: a rank, or a switch with its children in
/// ascending ordinal order (the order a switch in deterministic float mode folds them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tree {
    /// A rank's host.
    Rank(u16),
    /// A switch.
    Switch(Vec<Tree>),
}

impl Tree {
    /// One switch with `ranks` ranks below it, in rank order.
    pub fn star(ranks: u16) -> Tree {
        Tree::Switch((0..ranks).map(Tree::Rank).collect())
    }

    /// The reduction as the switches compute it: [`fold`] at every switch, bottom up.
    pub fn reduce(&self, op: Operator, dtype: DataType, inputs: &[Vec<u8>]) -> Vec<u8> {
        match self {
            Tree::Rank(r) => inputs[usize::from(*r)].clone(),
            Tree::Switch(children) => {
                let parts: Vec<Vec<u8>> =
                    children.iter().map(|c| c.reduce(op, dtype, inputs)).collect();
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                fold(op, dtype, &refs)
            }
        }
    }

    /// Most switches with two or more children on a path from a rank to the root: the
    /// roundings to the wire type a value goes through (a switch with one child
    /// forwards bit for bit, and the result comes back down unchanged).
    pub fn depth(&self) -> u32 {
        match self {
            Tree::Rank(_) => 0,
            Tree::Switch(c) => {
                c.iter().map(Tree::depth).max().unwrap_or(0) + u32::from(c.len() > 1)
            }
        }
    }

    /// Most accumulator operations a rank's value goes through on its way up, whatever
    /// order each switch folds in: the sum over its path of (children - 1).
    pub fn path_ops(&self) -> u32 {
        match self {
            Tree::Rank(_) => 0,
            Tree::Switch(c) => c.iter().map(Tree::path_ops).max().unwrap_or(0) + c.len() as u32 - 1,
        }
    }

    /// Switches with two or more children: the roundings a product goes through.
    pub fn folding_switches(&self) -> u32 {
        match self {
            Tree::Rank(_) => 0,
            Tree::Switch(c) => {
                c.iter().map(Tree::folding_switches).sum::<u32>() + u32::from(c.len() > 1)
            }
        }
    }
}

/// Block `block` of each rank's input of `n` equal blocks (ReduceScatter's operands).
pub fn blocks(inputs: &[Vec<u8>], block: usize) -> Vec<&[u8]> {
    let n = inputs.len();
    inputs
        .iter()
        .map(|v| {
            let len = v.len() / n;
            &v[block * len..][..len]
        })
        .collect()
}

/// What each rank's output buffer must hold after the collective, the reduction folded
/// along `tree`; `None` for ranks that receive nothing (Reduce non-roots, the Broadcast
/// root, Barrier). ReduceScatter: rank `r` gets block `r` reduced (each rank's input is
/// `n` blocks); AllGather: every rank gets the inputs concatenated in rank order.
pub fn expected(
    kind: Kind,
    op: Operator,
    dtype: DataType,
    tree: &Tree,
    inputs: &[Vec<u8>],
) -> Vec<Option<Vec<u8>>> {
    let n = inputs.len();
    let result = |inputs: &[Vec<u8>]| {
        let mut r = tree.reduce(op, dtype, inputs);
        finish(op, dtype, &mut r, n as u16);
        r
    };
    match kind {
        Kind::AllReduce => vec![Some(result(inputs)); n],
        Kind::Reduce { root } => {
            let r = result(inputs);
            (0..n).map(|i| (i == usize::from(root)).then(|| r.clone())).collect()
        }
        Kind::Broadcast { root } => (0..n)
            .map(|i| (i != usize::from(root)).then(|| inputs[usize::from(root)].clone()))
            .collect(),
        Kind::Barrier => vec![None; n],
        Kind::ReduceScatter => (0..n)
            .map(|r| {
                let operands: Vec<Vec<u8>> =
                    blocks(inputs, r).into_iter().map(<[u8]>::to_vec).collect();
                Some(result(&operands))
            })
            .collect(),
        Kind::AllGather => vec![Some(inputs.concat()); n],
    }
}

/// First element where `got` and `want` differ (bit for bit), as
/// `(index, got, want)` rendered for the dtype.
pub fn first_mismatch(dtype: DataType, got: &[u8], want: &[u8]) -> Option<(usize, String, String)> {
    if got.len() != want.len() {
        return Some((0, format!("{} bytes", got.len()), format!("{} bytes", want.len())));
    }
    let s = size(dtype);
    let show = |b: &[u8]| with_value!(dtype, |T| T::read(b).show());
    got.chunks_exact(s)
        .zip(want.chunks_exact(s))
        .position(|(g, w)| g != w)
        .map(|i| (i, show(&got[i * s..]), show(&want[i * s..])))
}

/// Unit roundoff of a float type's wire format: 2^-p.
pub fn unit_roundoff(dtype: DataType) -> f64 {
    0.5f64.powi(precision(dtype) as i32)
}

/// Unit roundoff of the accumulator a switch folds `dtype` in.
fn accumulator_roundoff(dtype: DataType) -> f64 {
    with_value!(dtype, |T| 0.5f64.powi(<T as Value>::Acc::PRECISION as i32))
}

/// Whether the network result of `op` on `dtype` depends on the order a switch combines
/// contributions in (float SUM, PROD and AVG; MAX and MIN select).
pub fn order_dependent(op: Operator, dtype: DataType) -> bool {
    !dtype.is_integer() && matches!(op, Operator::Sum | Operator::Prod | Operator::Avg)
}

/// An element of an order-dependent result outside its error bound.
#[derive(Debug, Clone, PartialEq)]
pub struct OutOfBound {
    /// Element index.
    pub index: usize,
    /// What the rank got.
    pub got: f64,
    /// The exact result (f64 arithmetic on the wire inputs).
    pub exact: f64,
    /// The allowed distance.
    pub bound: f64,
}

/// Checks a float SUM, PROD or AVG whose combination order the protocol leaves open
/// against the f64 reference on the same wire inputs, within the worst case over every
/// fold order on `tree` (docs/PROTOCOL.md section 3; first order
/// `(d u_h + k u_a) sum |x_i|` for SUM), barring overflow and underflow:
///
/// - SUM: `gamma sum |x_i|` with `gamma = (1 + u_a)^k (1 + u_h)^d - 1`, `k` the most
///   accumulator additions on a rank's path ([`Tree::path_ops`]), `d` the roundings to
///   the wire type on it ([`Tree::depth`]), `u_a` the accumulator's unit roundoff
///   (2^-24 for fp32, which also holds fp16/bf16; 2^-53 for fp64) and `u_h` the wire
///   type's for the half types (2^-11 fp16, 2^-8 bf16), 0 for the others (no rounding
///   at the hop);
/// - PROD: `gamma |prod x_i|` with every multiplication (`n - 1`) and every folding
///   switch's rounding in `gamma` (each scales the whole product);
/// - AVG: the SUM bound, plus the hosts' one rounding of the quotient, divided by `n`.
///
/// The f64 reference's own rounding (none for most inputs) is allowed for with `n 2^-52`
/// relative. Returns the relative errors `|got - exact| / scale` of every element
/// (scale = `sum |x_i|`, or `|prod x_i|`), or the first element outside its bound.
pub fn check_bound(
    op: Operator,
    dtype: DataType,
    tree: &Tree,
    got: &[u8],
    inputs: &[&[u8]],
) -> Result<Vec<f64>, OutOfBound> {
    let n = inputs.len();
    let u_w = unit_roundoff(dtype);
    let u_a = accumulator_roundoff(dtype);
    // A wider accumulator is rounded to the wire type at every folding switch.
    let u_h = if u_a < u_w { u_w } else { 0.0 };
    let gamma = |ops: u32, roundings: u32| {
        (1.0 + u_a).powi(ops as i32) * (1.0 + u_h).powi(roundings as i32) - 1.0
            + n as f64 * f64::EPSILON
    };
    let (sum_gamma, prod_gamma) =
        (gamma(tree.path_ops(), tree.depth()), gamma(n as u32 - 1, tree.folding_switches()));
    let mut errors = Vec::with_capacity(got.len() / size(dtype));
    for i in 0..got.len() / size(dtype) {
        let x = || inputs.iter().map(|v| element_f64(dtype, v, i));
        let (exact, scale, bound) = match op {
            Operator::Prod => {
                let p: f64 = x().product();
                (p, p.abs(), prod_gamma * p.abs())
            }
            _ => {
                let (s, abs) = (x().sum::<f64>(), x().map(f64::abs).sum::<f64>());
                let b = sum_gamma * abs;
                if op == Operator::Avg {
                    let n = n as f64;
                    (s / n, abs / n, (b + u_w * (s.abs() + b)) / n)
                } else {
                    (s, abs, b)
                }
            }
        };
        let g = element_f64(dtype, got, i);
        let err = (g - exact).abs();
        if err.is_nan() || err > bound {
            return Err(OutOfBound { index: i, got: g, exact, bound });
        }
        errors.push(if scale > 0.0 { err / scale } else { 0.0 });
    }
    Ok(errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(dtype: DataType, xs: &[f64]) -> Vec<u8> {
        let s: Vec<Sample> =
            xs.iter()
                .map(|&x| {
                    if dtype.is_integer() {
                        Sample::Int(x as i64 as u64)
                    } else {
                        Sample::Real(x)
                    }
                })
                .collect();
        encode(dtype, &s)
    }

    fn flat(op: Operator, dtype: DataType, ins: &[Vec<u8>]) -> Vec<u8> {
        Tree::star(ins.len() as u16).reduce(op, dtype, ins)
    }

    #[test]
    fn every_row_of_the_table_has_its_reference_type() {
        for d in DataType::ALL {
            assert_eq!(size(*d), d.size(), "{d}");
            assert_eq!(precision(*d) == 0, d.is_integer(), "{d}");
        }
    }

    #[test]
    fn integers_wrap_and_compare_by_signedness() {
        use DataType::*;
        let (a, b) = (v(Int8, &[127.0, -5.0, 7.0]), v(Int8, &[1.0, 3.0, -9.0]));
        assert_eq!(
            flat(Operator::Sum, Int8, &[a.clone(), b.clone()]),
            v(Int8, &[-128.0, -2.0, -2.0])
        );
        assert_eq!(flat(Operator::Max, Int8, &[a.clone(), b.clone()]), v(Int8, &[127.0, 3.0, 7.0]));
        assert_eq!(flat(Operator::Prod, Int8, &[a, b]), v(Int8, &[127.0, -15.0, -63.0]));
        let (a, b) = (v(Uint8, &[255.0, 200.0]), v(Uint8, &[1.0, 2.0]));
        assert_eq!(flat(Operator::Min, Uint8, &[a.clone(), b.clone()]), v(Uint8, &[1.0, 2.0]));
        assert_eq!(flat(Operator::Sum, Uint8, &[a, b]), v(Uint8, &[0.0, 202.0]));
        let (a, b) = (v(Uint64, &[12.0]), v(Uint64, &[10.0]));
        assert_eq!(flat(Operator::Band, Uint64, &[a.clone(), b.clone()]), v(Uint64, &[8.0]));
        assert_eq!(flat(Operator::Bor, Uint64, &[a.clone(), b.clone()]), v(Uint64, &[14.0]));
        assert_eq!(flat(Operator::Bxor, Uint64, &[a, b]), v(Uint64, &[6.0]));
    }

    #[test]
    fn avg_divides_once_on_the_host() {
        use DataType::*;
        let ins = vec![v(Int32, &[-7.0, 7.0]), v(Int32, &[0.0, 0.0])];
        let e = expected(Kind::AllReduce, Operator::Avg, Int32, &Tree::star(2), &ins);
        assert_eq!(e[0], Some(v(Int32, &[-3.0, 3.0])), "truncating, as NCCL");
        // Any world size, also beyond the element type's range.
        let mut r = v(Int8, &[-128.0, 127.0]);
        finish(Operator::Avg, Int8, &mut r, 200);
        assert_eq!(r, v(Int8, &[0.0, 0.0]));
        let mut r = v(Uint8, &[255.0]);
        finish(Operator::Avg, Uint8, &mut r, 256);
        assert_eq!(r, v(Uint8, &[0.0]));
        let mut r = v(Float16, &[1.0]);
        finish(Operator::Avg, Float16, &mut r, 3);
        assert_eq!(r, v(Float16, &[1.0 / 3.0]));
    }

    #[test]
    fn half_types_accumulate_in_fp32_and_round_once_per_switch() {
        use DataType::*;
        // 1 + 2^-11 + 2^-11: rounded after each addition (a tie to even) it stays 1;
        // in an fp32 accumulator rounded once it is 1 + 2^-10.
        let t = 2f64.powi(-11);
        let ins = vec![v(Float16, &[1.0]), v(Float16, &[t]), v(Float16, &[t])];
        assert_eq!(flat(Operator::Sum, Float16, &ins), v(Float16, &[1.0 + 2.0 * t]));
        // The same three ranks under two switches: the lower one rounds 1 + 2^-11 to 1.
        let two_level =
            Tree::Switch(vec![Tree::Switch(vec![Tree::Rank(0), Tree::Rank(1)]), Tree::Rank(2)]);
        assert_eq!(two_level.reduce(Operator::Sum, Float16, &ins), v(Float16, &[1.0]));
        assert_eq!(
            (two_level.depth(), two_level.path_ops(), two_level.folding_switches()),
            (2, 2, 2)
        );
        // Overflow to infinity at a hop even if the exact result is finite.
        let ins = vec![v(Float16, &[60000.0]), v(Float16, &[60000.0]), v(Float16, &[-60000.0])];
        assert_eq!(flat(Operator::Sum, Float16, &ins), v(Float16, &[60000.0]));
        assert_eq!(two_level.reduce(Operator::Sum, Float16, &ins), v(Float16, &[f64::INFINITY]));
    }

    #[test]
    fn float_max_min_order_zeros_and_canonicalise_nan() {
        for d in [DataType::Float16, DataType::Bfloat16, DataType::Float32, DataType::Float64] {
            let zero = v(d, &[0.0, -0.0, 1.0]);
            let nzero = v(d, &[-0.0, 0.0, f64::NAN]);
            let max = flat(Operator::Max, d, &[zero.clone(), nzero.clone()]);
            let min = flat(Operator::Min, d, &[nzero, zero]);
            let bits = |b: &[u8], i| element_f64(d, b, i);
            assert!(bits(&max, 0).is_sign_positive() && bits(&max, 1).is_sign_positive(), "{d}");
            assert!(bits(&min, 0).is_sign_negative() && bits(&min, 1).is_sign_negative(), "{d}");
            let canonical = match d {
                DataType::Float16 => encode(d, &[Sample::Bits(0x7e00)]),
                DataType::Bfloat16 => encode(d, &[Sample::Bits(0x7fc0)]),
                DataType::Float32 => encode(d, &[Sample::Bits(0x7fc0_0000)]),
                _ => encode(d, &[Sample::Bits(0x7ff8_0000_0000_0000)]),
            };
            assert_eq!(max[2 * d.size()..], canonical[..], "{d}");
            assert_eq!(min[2 * d.size()..], canonical[..], "{d}");
        }
    }

    #[test]
    fn one_child_passes_bit_for_bit() {
        let nan = encode(DataType::Float16, &[Sample::Bits(0xfd01)]);
        assert_eq!(fold(Operator::Sum, DataType::Float16, &[&nan]), nan);
        let summed = fold(Operator::Sum, DataType::Float16, &[&nan, &nan]);
        assert_eq!(summed, encode(DataType::Float16, &[Sample::Bits(0x7e00)]));
    }

    #[test]
    fn expected_outputs_per_kind() {
        let d = DataType::Int32;
        let ins = vec![v(d, &[1.0, 2.0]), v(d, &[10.0, 20.0]), v(d, &[100.0, 200.0])];
        let tree = Tree::star(3);
        let sum = Some(v(d, &[111.0, 222.0]));
        let e = expected(Kind::AllReduce, Operator::Sum, d, &tree, &ins);
        assert_eq!(e, vec![sum.clone(), sum.clone(), sum.clone()]);
        let e = expected(Kind::Reduce { root: 1 }, Operator::Sum, d, &tree, &ins);
        assert_eq!(e, vec![None, sum, None]);
        let e = expected(Kind::Broadcast { root: 2 }, Operator::Sum, d, &tree, &ins);
        assert_eq!(e, vec![Some(ins[2].clone()), Some(ins[2].clone()), None]);
        assert_eq!(expected(Kind::Barrier, Operator::Sum, d, &tree, &ins), vec![None; 3]);
        let all = Some(v(d, &[1.0, 2.0, 10.0, 20.0, 100.0, 200.0]));
        assert_eq!(expected(Kind::AllGather, Operator::Sum, d, &tree, &ins), vec![all; 3]);
        // Three blocks of 2 elements per rank: rank r gets block r reduced.
        let ins: Vec<Vec<u8>> = (1..=3)
            .map(|k| v(d, &[k as f64, 0.0, 10.0 * k as f64, 1.0, 100.0 * k as f64, 2.0]))
            .collect();
        let e = expected(Kind::ReduceScatter, Operator::Sum, d, &tree, &ins);
        let want = [[6.0, 0.0], [60.0, 3.0], [600.0, 6.0]];
        assert_eq!(e, want.iter().map(|w| Some(v(d, w))).collect::<Vec<_>>());
        // AVG divides each block's sum by the world size on the host.
        let e = expected(Kind::ReduceScatter, Operator::Avg, d, &tree, &ins);
        let want = [[2.0, 0.0], [20.0, 1.0], [200.0, 2.0]];
        assert_eq!(e, want.iter().map(|w| Some(v(d, w))).collect::<Vec<_>>());
    }

    #[test]
    fn mismatch_reports_the_first_differing_element() {
        let d = DataType::Float32;
        let (a, b) = (v(d, &[1.0, 2.0, 3.0]), v(d, &[1.0, 2.5, 3.5]));
        let (i, got, want) = first_mismatch(d, &a, &b).unwrap();
        assert_eq!(i, 1);
        assert!(got.starts_with("2e0") && want.starts_with("2.5e0"), "{got} {want}");
        assert!(first_mismatch(d, &a, &a).is_none());
    }

    #[test]
    fn bound_accepts_reordered_sums_only() {
        let d = DataType::Float32;
        let xs = [v(d, &[1e8, 3.0]), v(d, &[1.0, 1e-3]), v(d, &[-1e8, 2.0])];
        let ins: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
        let tree = Tree::star(3);
        let fwd = tree.reduce(Operator::Sum, d, &xs);
        let rev: Vec<Vec<u8>> = xs.iter().rev().cloned().collect();
        // (1e8 + 1) - 1e8 = 0 but 1e8 - 1e8 + 1 = 1: both are within the bound.
        assert!(check_bound(Operator::Sum, d, &tree, &fwd, &ins).is_ok());
        let back = tree.reduce(Operator::Sum, d, &rev);
        assert!(check_bound(Operator::Sum, d, &tree, &back, &ins).is_ok());
        let wrong = v(d, &[0.0, 6.5]);
        assert_eq!(check_bound(Operator::Sum, d, &tree, &wrong, &ins).map_err(|e| e.index), Err(1));
    }
}
