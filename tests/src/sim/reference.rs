//! Reference results computed directly in native types, independent of the wire crate's
//! reduce kernels, so the simulation checks the engines against plain arithmetic.

/// Reduction operator of a collective (Barrier is a [`Kind`], not an operator here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Sum (INT32 wraps, FLOAT32 is IEEE addition).
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// Element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// Two's complement 32-bit integer.
    Int32,
    /// IEEE-754 binary32.
    Float32,
}

/// What a collective does: the host engine's own enum, so cases pass straight through.
pub use inccl_engine::CollectiveKind as Kind;

/// Short name of a collective for failure messages (`allreduce`, `reduce(root 1)`, ...).
pub fn kind_name(kind: Kind) -> String {
    match kind {
        Kind::AllReduce => "allreduce".to_string(),
        Kind::Reduce { root } => format!("reduce(root {root})"),
        Kind::Broadcast { root } => format!("broadcast(root {root})"),
        Kind::Barrier => "barrier".to_string(),
    }
}

/// Element size in bytes (both types are 4 bytes wide).
pub const ELEM: usize = 4;

/// Combines `other` into `acc` element-wise; both in native byte order.
pub fn combine(op: Op, dtype: Dtype, acc: &mut [u8], other: &[u8]) {
    assert_eq!(acc.len(), other.len(), "reference operands differ in length");
    for (a, b) in acc.chunks_exact_mut(ELEM).zip(other.chunks_exact(ELEM)) {
        let x: [u8; 4] = (&*a).try_into().expect("4-byte chunk");
        let y: [u8; 4] = b.try_into().expect("4-byte chunk");
        let r = match dtype {
            Dtype::Int32 => {
                let (x, y) = (i32::from_ne_bytes(x), i32::from_ne_bytes(y));
                match op {
                    Op::Sum => x.wrapping_add(y),
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                }
                .to_ne_bytes()
            }
            Dtype::Float32 => {
                let (x, y) = (f32::from_ne_bytes(x), f32::from_ne_bytes(y));
                match op {
                    Op::Sum => x + y,
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                }
                .to_ne_bytes()
            }
        };
        a.copy_from_slice(&r);
    }
}

/// Reduction of `inputs` combined left to right (rank order).
pub fn reduce(op: Op, dtype: Dtype, inputs: &[&[u8]]) -> Vec<u8> {
    let mut acc = inputs[0].to_vec();
    for other in &inputs[1..] {
        combine(op, dtype, &mut acc, other);
    }
    acc
}

/// What each rank's output buffer must hold after the collective; `None` for ranks
/// that receive nothing (Reduce non-roots, the Broadcast root, Barrier).
pub fn expected(kind: Kind, op: Op, dtype: Dtype, inputs: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let n = inputs.len();
    let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    match kind {
        Kind::AllReduce => vec![Some(reduce(op, dtype, &refs)); n],
        Kind::Reduce { root } => {
            let r = reduce(op, dtype, &refs);
            (0..n).map(|i| (i == usize::from(root)).then(|| r.clone())).collect()
        }
        Kind::Broadcast { root } => (0..n)
            .map(|i| (i != usize::from(root)).then(|| inputs[usize::from(root)].clone()))
            .collect(),
        Kind::Barrier => vec![None; n],
    }
}

/// First element where `got` and `want` differ (bit for bit), as
/// `(index, got, want)` rendered for the dtype.
pub fn first_mismatch(dtype: Dtype, got: &[u8], want: &[u8]) -> Option<(usize, String, String)> {
    if got.len() != want.len() {
        return Some((0, format!("{} bytes", got.len()), format!("{} bytes", want.len())));
    }
    let show = |b: &[u8]| {
        let a: [u8; 4] = b.try_into().expect("4-byte chunk");
        match dtype {
            Dtype::Int32 => format!("{}", i32::from_ne_bytes(a)),
            Dtype::Float32 => {
                let f = f32::from_ne_bytes(a);
                format!("{f:e} ({:#010x})", f.to_bits())
            }
        }
    };
    got.chunks_exact(ELEM)
        .zip(want.chunks_exact(ELEM))
        .position(|(g, w)| g != w)
        .map(|i| (i, show(&got[i * ELEM..][..ELEM]), show(&want[i * ELEM..][..ELEM])))
}

/// Checks a FLOAT32 SUM whose combination order the protocol leaves open: every element
/// must lie within `n * 2^-23 * sum(|x_i|)` of the exact (f64) sum of the `inputs`, the
/// worst-case rounding error of any order of `n - 1` additions. Returns the first
/// element outside that bound as `(index, got, exact, bound)`.
pub fn float_sum_out_of_bound(got: &[u8], inputs: &[&[u8]]) -> Option<(usize, f32, f64, f64)> {
    let n = inputs.len() as f64;
    let at =
        |b: &[u8], i: usize| f32::from_ne_bytes(b[i * ELEM..][..ELEM].try_into().expect("4 bytes"));
    (0..got.len() / ELEM).find_map(|i| {
        let exact: f64 = inputs.iter().map(|x| f64::from(at(x, i))).sum();
        let abs: f64 = inputs.iter().map(|x| f64::from(at(x, i)).abs()).sum();
        let bound = n * f64::from(f32::EPSILON) * abs;
        let g = at(got, i);
        ((f64::from(g) - exact).abs() > bound || !g.is_finite()).then_some((i, g, exact, bound))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i32s(v: &[i32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }
    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn int32_sum_wraps_and_max_min_are_signed() {
        let a = i32s(&[i32::MAX, -5, 7]);
        let b = i32s(&[1, 3, -9]);
        assert_eq!(reduce(Op::Sum, Dtype::Int32, &[&a, &b]), i32s(&[i32::MIN, -2, -2]));
        assert_eq!(reduce(Op::Max, Dtype::Int32, &[&a, &b]), i32s(&[i32::MAX, 3, 7]));
        assert_eq!(reduce(Op::Min, Dtype::Int32, &[&a, &b]), i32s(&[1, -5, -9]));
    }

    #[test]
    fn float32_is_ieee() {
        let a = f32s(&[1.5, f32::INFINITY, -0.25]);
        let b = f32s(&[2.25, 1.0, 0.5]);
        assert_eq!(reduce(Op::Sum, Dtype::Float32, &[&a, &b]), f32s(&[3.75, f32::INFINITY, 0.25]));
        assert_eq!(reduce(Op::Min, Dtype::Float32, &[&a, &b]), f32s(&[1.5, 1.0, -0.25]));
    }

    #[test]
    fn expected_outputs_per_kind() {
        let ins = vec![i32s(&[1, 2]), i32s(&[10, 20]), i32s(&[100, 200])];
        let sum = Some(i32s(&[111, 222]));
        let e = expected(Kind::AllReduce, Op::Sum, Dtype::Int32, &ins);
        assert_eq!(e, vec![sum.clone(), sum.clone(), sum.clone()]);
        let e = expected(Kind::Reduce { root: 1 }, Op::Sum, Dtype::Int32, &ins);
        assert_eq!(e, vec![None, sum, None]);
        let e = expected(Kind::Broadcast { root: 2 }, Op::Sum, Dtype::Int32, &ins);
        assert_eq!(e, vec![Some(ins[2].clone()), Some(ins[2].clone()), None]);
        assert_eq!(expected(Kind::Barrier, Op::Sum, Dtype::Int32, &ins), vec![None; 3]);
    }

    #[test]
    fn mismatch_reports_the_first_differing_element() {
        let a = f32s(&[1.0, 2.0, 3.0]);
        let b = f32s(&[1.0, 2.5, 3.5]);
        let (i, got, want) = first_mismatch(Dtype::Float32, &a, &b).unwrap();
        assert_eq!(i, 1);
        assert!(got.starts_with("2e0") && want.starts_with("2.5e0"), "{got} {want}");
        assert!(first_mismatch(Dtype::Float32, &a, &a).is_none());
    }

    #[test]
    fn float_sum_bound_accepts_reordered_sums_only() {
        let xs = [f32s(&[1e8, 3.0]), f32s(&[1.0, 1e-3]), f32s(&[-1e8, 2.0])];
        let ins: Vec<&[u8]> = xs.iter().map(Vec::as_slice).collect();
        let fwd = reduce(Op::Sum, Dtype::Float32, &ins);
        let rev: Vec<&[u8]> = ins.iter().rev().copied().collect();
        // (1e8 + 1) - 1e8 = 0 but 1e8 - 1e8 + 1 = 1: both are within the bound.
        assert!(float_sum_out_of_bound(&fwd, &ins).is_none());
        assert!(float_sum_out_of_bound(&reduce(Op::Sum, Dtype::Float32, &rev), &ins).is_none());
        let wrong = f32s(&[0.0, 6.5]);
        assert_eq!(float_sum_out_of_bound(&wrong, &ins).map(|e| e.0), Some(1));
    }
}
