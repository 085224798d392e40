//! Every (datatype, operator) of the tables through real switches and hosts, checked
//! element for element against a reference fold computed the way the switches are
//! specified to: each switch combines its children's vectors, fp16/bf16 in an fp32
//! accumulator rounded to the wire type once per hop, in child order in deterministic
//! mode. AVG is SUM in the network (the hosts divide).

use std::time::Duration;

use half::{bf16, f16};
use inc_wire::reduce::Elem;
use inc_wire::{DataType, Operator, TypeVisitor};
use inccl_engine::{CollectiveKind, CollectiveSpec};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// Native-order bytes of `count` elements of `dtype` for `rank`: random bit patterns
/// (NaNs, infinities, subnormals included for floats), small values (so float sums
/// round and cancel) and signed zeros.
fn input(dtype: DataType, rank: u16, count: u64, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed * 1000 + u64::from(rank));
    let size = dtype.size();
    let mut out = Vec::with_capacity(count as usize * size);
    for _ in 0..count {
        let bits: u64 = rng.gen();
        let x = match rng.gen_range(0..8) {
            0..=3 => None,
            4 => Some(if rng.gen() { 0.0 } else { -0.0 }),
            _ => Some(rng.gen_range(-300i32..300) as f64 * 0.375 + 1.0 / 1024.0),
        };
        let e: Vec<u8> = match (x, dtype) {
            (None, _) => bits.to_ne_bytes()[..size].to_vec(),
            (Some(x), DataType::Float16) => f16::from_f32(x as f32).to_ne_bytes().to_vec(),
            (Some(x), DataType::Bfloat16) => bf16::from_f32(x as f32).to_ne_bytes().to_vec(),
            (Some(x), DataType::Float32) => (x as f32).to_ne_bytes().to_vec(),
            (Some(x), DataType::Float64) => x.to_ne_bytes().to_vec(),
            (Some(x), _) => (x as i64).to_ne_bytes()[..size].to_vec(),
        };
        out.extend(e);
    }
    out
}

fn elems<E: Elem>(b: &[u8]) -> Vec<E> {
    b.chunks_exact(E::SIZE).map(E::load_ne).collect()
}

fn bytes<E: Elem>(v: &[E]) -> Vec<u8> {
    let mut b = vec![0u8; v.len() * E::SIZE];
    for (e, o) in v.iter().zip(b.chunks_exact_mut(E::SIZE)) {
        e.store_ne(o);
    }
    b
}

/// One hop: the switch's fold of its children's vectors `parts`, in that order.
fn hop<E: Elem>(op: Operator, parts: &[Vec<E>]) -> Vec<E> {
    (0..parts[0].len())
        .map(|i| {
            if parts.len() == 1 {
                return parts[0][i];
            }
            let mut acc = parts[0][i].widen();
            for p in &parts[1..] {
                acc = <E::Acc as Elem>::combine(op, acc, p[i].widen());
            }
            E::narrow(acc)
        })
        .collect()
}

/// Whether the result does not depend on the order contributions meet in.
fn order_free(dtype: DataType, op: Operator) -> bool {
    dtype.is_integer() || matches!(op, Operator::Max | Operator::Min)
}

struct Check {
    op: Operator,
    /// One switch with four hosts (fan-in 4) instead of 1-2-4.
    flat: bool,
    deterministic: bool,
    seed: u64,
}

impl TypeVisitor for Check {
    type Output = ();
    fn visit<E: Elem>(self) {
        let Check { op, flat, deterministic, seed } = self;
        let dtype = E::DTYPE;
        let tree = if flat {
            TreeSpec { parents: vec![None], hosts: vec![0; 4], mtu: 256, window: 8 }
        } else {
            tree_1_2_4()
        };
        let cfg = SwitchEngineConfig { deterministic_float: deterministic, ..Default::default() };
        let mut net = build(&tree, cfg, 0.01, seed);
        // Several chunks whatever the width, the last one short.
        let count = 2000 / dtype.size() as u64 + 3;
        let spec = |_| CollectiveSpec { kind: CollectiveKind::AllReduce, op, dtype, count };
        net.start(spec, |r| input(dtype, r, count, seed));
        net.run(Duration::from_secs(30));
        let v: Vec<Vec<E>> = (0..4).map(|r| elems(&input(dtype, r, count, seed))).collect();
        let want = if flat {
            hop(op, &v)
        } else {
            let leaves = [hop(op, &v[..2]), hop(op, &v[2..])];
            hop(op, &leaves)
        };
        let want = bytes(&want);
        for r in 0..4 {
            let h = net.host(r);
            assert_eq!(h.result, Some(Ok(())), "{dtype} {op} rank {r}");
            let bad = h
                .output
                .chunks_exact(E::SIZE)
                .zip(want.chunks_exact(E::SIZE))
                .position(|(a, b)| a != b);
            assert!(
                bad.is_none(),
                "{dtype} {op} flat {flat} rank {r}: element {} is {:?}, expected {:?}",
                bad.unwrap(),
                E::load_ne(&h.output[bad.unwrap() * E::SIZE..]),
                E::load_ne(&want[bad.unwrap() * E::SIZE..]),
            );
        }
    }
}

/// 1-2-4: two children per switch, so every fold is order-free and the result exact
/// in either mode; every type, every operator that applies to it.
#[test]
fn every_type_and_operator_on_1_2_4() {
    for (i, &dtype) in DataType::ALL.iter().enumerate() {
        for op in Operator::reductions().filter(|o| o.applies_to(dtype)) {
            let seed = i as u64 * 16 + op.code() as u64;
            dtype.visit(Check { op, flat: false, deterministic: seed % 2 == 0, seed });
        }
    }
}

/// Fan-in 4 in deterministic mode: floats are folded in child order in fp32 (fp16,
/// bf16) or at their width and rounded once; integers and MAX/MIN in any mode.
#[test]
fn every_type_and_operator_fan_in_4() {
    for (i, &dtype) in DataType::ALL.iter().enumerate() {
        for op in Operator::reductions().filter(|o| o.applies_to(dtype)) {
            let seed = 500 + i as u64 * 16 + op.code() as u64;
            let deterministic = !order_free(dtype, op) || seed % 2 == 0;
            dtype.visit(Check { op, flat: true, deterministic, seed });
        }
    }
}

/// The half types are rounded once per hop, not once per combine: on one switch,
/// 1 + 3 x 2^-9 in bf16 (8 significant bits) is 1 + 2^-7 rounded once (the fp32 sum
/// 1.005859375 is nearer 1.0078125 than 1.0), but 1.0 if rounded after each addition.
#[test]
fn half_types_round_once_per_hop() {
    let tree = TreeSpec { parents: vec![None], hosts: vec![0; 4], mtu: 256, window: 8 };
    for deterministic in [false, true] {
        let cfg = SwitchEngineConfig { deterministic_float: deterministic, ..Default::default() };
        let mut net = build(&tree, cfg, 0.0, 3);
        let count = 3u64;
        let dtype = DataType::Bfloat16;
        let spec =
            |_| CollectiveSpec { kind: CollectiveKind::AllReduce, op: Operator::Sum, dtype, count };
        let x = |v: f32| {
            (0..count).flat_map(move |_| bf16::from_f32(v).to_ne_bytes()).collect::<Vec<u8>>()
        };
        net.start(spec, |r| if r == 0 { x(1.0) } else { x(2f32.powi(-9)) });
        net.run(Duration::from_secs(5));
        for r in 0..4 {
            let h = net.host(r);
            assert_eq!(h.result, Some(Ok(())));
            let got: Vec<bf16> = elems(&h.output);
            assert_eq!(got, vec![bf16::from_f32(1.0078125); 3], "deterministic {deterministic}");
        }
    }
}

/// Broadcast and Reduce carry every width; Broadcast delivers the root's bits exactly,
/// non-canonical NaNs included (a single contribution is never widened or rounded).
#[test]
fn broadcast_and_reduce_every_width() {
    for &dtype in DataType::ALL {
        let mut net = build(&tree_1_2_4(), SwitchEngineConfig::default(), 0.01, 9);
        let count = 700 / dtype.size() as u64 + 1;
        let root = 2;
        let mut data = input(dtype, root, count, 77);
        // A NaN with a payload in the first element of a float vector.
        if !dtype.is_integer() {
            let nan: u64 = match dtype.size() {
                2 if dtype == DataType::Float16 => 0xfd01,
                2 => 0xff81,
                4 => 0xffc0_0123,
                _ => 0xfff0_0000_0000_0123,
            };
            data[..dtype.size()].copy_from_slice(&nan.to_ne_bytes()[..dtype.size()]);
        }
        let spec = |_| CollectiveSpec {
            kind: CollectiveKind::Broadcast { root },
            op: Operator::Sum,
            dtype,
            count,
        };
        net.start(spec, |r| if r == root { data.clone() } else { vec![0; data.len()] });
        net.run(Duration::from_secs(30));
        for r in 0..4 {
            let h = net.host(r);
            assert_eq!(h.result, Some(Ok(())), "{dtype} rank {r}");
            if r != root as usize {
                assert_eq!(h.output, data, "{dtype} broadcast to rank {r}");
            }
        }
        let spec = |_| CollectiveSpec {
            kind: CollectiveKind::Reduce { root: 1 },
            op: Operator::Max,
            dtype,
            count,
        };
        net.start(spec, |r| input(dtype, r, count, 78));
        net.run(Duration::from_secs(30));
        struct Max(Vec<Vec<u8>>, Vec<u8>);
        impl TypeVisitor for Max {
            type Output = ();
            fn visit<E: Elem>(self) {
                let v: Vec<Vec<E>> = self.0.iter().map(|b| elems(b)).collect();
                let want =
                    hop(Operator::Max, &[hop(Operator::Max, &v[..2]), hop(Operator::Max, &v[2..])]);
                // Bytes, not elements: NaN != NaN.
                assert_eq!(self.1, bytes(&want), "{} reduce", E::DTYPE);
            }
        }
        assert_eq!(net.host(1).result, Some(Ok(())));
        let inputs = (0..4).map(|r| input(dtype, r, count, 78)).collect();
        dtype.visit(Max(inputs, net.host(1).output.clone()));
    }
}
