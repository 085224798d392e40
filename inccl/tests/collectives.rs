//! Four ranks run every collective for every operator and datatype through the real
//! controller and switch engines (1-2-4 tree) over the userspace RoCEv2 transport, in a
//! private network namespace. Also the bounded-time failures: a missing controller, a
//! wrong rank, a rank that never shows up, and a rank that dies.

mod common;

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{free_port, Fabric};
use inccl::{CommConfig, DataType, Error, Group, GroupConfig, ReduceOp};

const WORLD: u16 = 4;

fn in_i32(i: usize, r: u16) -> i32 {
    (i as u32).wrapping_mul(u32::from(r) + 1) as i32
}

fn in_f32(i: usize, r: u16) -> f32 {
    (i % 1024) as f32 * f32::from(r + 1)
}

fn reduce_i32(i: usize, op: ReduceOp) -> i32 {
    let v = (0..WORLD).map(|r| in_i32(i, r));
    match op {
        ReduceOp::Sum => v.fold(0, i32::wrapping_add),
        ReduceOp::Max => v.max().unwrap(),
        ReduceOp::Min => v.min().unwrap(),
        _ => unreachable!("the seed's operators only"),
    }
}

fn reduce_f32(i: usize, op: ReduceOp) -> f32 {
    let v = (0..WORLD).map(|r| in_f32(i, r));
    match op {
        ReduceOp::Sum => v.sum(),
        ReduceOp::Max => v.fold(f32::MIN, f32::max),
        ReduceOp::Min => v.fold(f32::MAX, f32::min),
        _ => unreachable!("the seed's operators only"),
    }
}

fn comm_config() -> CommConfig {
    let mut c = CommConfig::new(1 << 20);
    c.op_timeout = Duration::from_secs(5);
    c
}

/// Run `f(rank, config)` on `WORLD` threads (inside the fabric's namespace).
fn ranks<T: Send>(fabric: &Fabric, f: impl Fn(u16, GroupConfig) -> T + Sync) -> Vec<T> {
    let port = free_port();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..WORLD)
            .map(|r| {
                let cfg = fabric.group_config(WORLD, r, port);
                let f = &f;
                s.spawn(move || f(r, cfg))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

#[test]
fn every_collective_operator_and_datatype() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    // Not a multiple of the 1024-byte MTU, and more chunks than the window of 64.
    let n = 100_003;
    ranks(&fabric, |rank, cfg| {
        let group = Group::create(cfg).unwrap();
        let mut comm = group.communicator(comm_config()).unwrap();
        let si: Vec<i32> = (0..n).map(|i| in_i32(i, rank)).collect();
        let sf: Vec<f32> = (0..n).map(|i| in_f32(i, rank)).collect();
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            let mut d = vec![0i32; n];
            comm.allreduce(&si, &mut d, op).unwrap();
            assert!((0..n).all(|i| d[i] == reduce_i32(i, op)), "rank {rank} allreduce int32 {op}");
            let mut d = vec![0f32; n];
            comm.allreduce(&sf, &mut d, op).unwrap();
            assert!(
                (0..n).all(|i| d[i].to_bits() == reduce_f32(i, op).to_bits()),
                "rank {rank} allreduce f32 {op}"
            );

            let root = 2;
            let mut d = vec![0i32; if rank == root { n } else { 0 }];
            comm.reduce(&si, &mut d, op, root).unwrap();
            if rank == root {
                assert!((0..n).all(|i| d[i] == reduce_i32(i, op)), "reduce int32 {op}");
            }
            let mut d = vec![0f32; if rank == root { n } else { 0 }];
            comm.reduce(&sf, &mut d, op, root).unwrap();
            if rank == root {
                assert!((0..n).all(|i| d[i] == reduce_f32(i, op)), "reduce f32 {op}");
            }
        }
        for root in [1u16, 3] {
            let mut b: Vec<i32> = if rank == root { si.clone() } else { vec![0; n] };
            comm.broadcast(&mut b, root).unwrap();
            assert!(
                (0..n).all(|i| b[i] == in_i32(i, root)),
                "rank {rank} broadcast int32 from {root}"
            );
            let mut b: Vec<f32> =
                (0..n).map(|i| if rank == root { in_f32(i, root) } else { -1.0 }).collect();
            comm.broadcast(&mut b, root).unwrap();
            assert!(
                (0..n).all(|i| b[i] == in_f32(i, root)),
                "rank {rank} broadcast f32 from {root}"
            );
        }
        comm.barrier().unwrap();
        // In place, and tiny vectors right after large ones.
        let mut v = vec![rank as i32 + 1; 3];
        comm.allreduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, vec![10; 3]);
        let mut b = vec![0u8; 0];
        comm.allreduce_bytes_in_place(&mut b, DataType::Int32, ReduceOp::Max).unwrap();
        comm.destroy().unwrap();
        group.destroy().unwrap();
    });
}

/// Native bytes of element `i` of rank `r`: values every combining order reduces to the
/// same bits (integers wrap; floats are small integers, powers of two for PROD).
fn in_any(dtype: DataType, op: ReduceOp, i: usize, r: u16) -> Vec<u8> {
    let (i, r) = (i as u64, u64::from(r));
    if dtype.is_integer() {
        return (i.wrapping_mul(r + 1).wrapping_add(r)).to_ne_bytes()[..dtype.size()].to_vec();
    }
    let x = if op == ReduceOp::Prod {
        [1.0, -1.0, 2.0, -2.0, 1.0][((i * 7 + r * 3) % 5) as usize]
    } else {
        ((i * 7 + r * 3) % 5) as f32 - 2.0
    };
    match dtype {
        DataType::Float16 => half::f16::from_f32(x).to_ne_bytes().to_vec(),
        DataType::Bfloat16 => half::bf16::from_f32(x).to_ne_bytes().to_vec(),
        DataType::Float32 => x.to_ne_bytes().to_vec(),
        _ => f64::from(x).to_ne_bytes().to_vec(),
    }
}

/// The fold over ranks, AVG divided by the world size as the hosts do.
fn reduce_any(dtype: DataType, op: ReduceOp, i: usize) -> Vec<u8> {
    struct Fold(ReduceOp, usize);
    impl inc_wire::TypeVisitor for Fold {
        type Output = Vec<u8>;
        fn visit<E: inc_wire::reduce::Elem>(self) -> Vec<u8> {
            let Fold(op, i) = self;
            let v = (0..WORLD).map(|r| E::load_ne(&in_any(E::DTYPE, op, i, r)));
            let acc = v.reduce(|a, b| E::combine(op.in_network(), a, b)).unwrap();
            let mut out = vec![0u8; E::SIZE];
            acc.store_ne(&mut out);
            inc_wire::reduce::finalize_native(op, E::DTYPE, &mut out, WORLD);
            out
        }
    }
    dtype.visit(Fold(op, i))
}

/// Every (type, operator) of the tables, AllReduce and Reduce, through the real
/// stack; invalid pairs refused before anything is sent (the communicator stays
/// usable).
#[test]
fn every_table_type_and_operator() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let n = 3001;
    ranks(&fabric, |rank, cfg| {
        let group = Group::create(cfg).unwrap();
        let mut comm = group.communicator(comm_config()).unwrap();
        for &dtype in DataType::ALL {
            for op in ReduceOp::reductions() {
                let src: Vec<u8> = (0..n).flat_map(|i| in_any(dtype, op, i, rank)).collect();
                let mut d = vec![0u8; src.len()];
                let r = comm.allreduce_bytes(&src, &mut d, dtype, op);
                if !op.applies_to(dtype) {
                    let e = r.unwrap_err();
                    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
                    assert!(
                        e.to_string().contains(&format!("{op} does not apply to datatype {dtype}")),
                        "{e}"
                    );
                    continue;
                }
                r.unwrap();
                let want: Vec<u8> = (0..n).flat_map(|i| reduce_any(dtype, op, i)).collect();
                assert!(d == want, "rank {rank} allreduce {dtype} {op}");
                let root = 1;
                let mut d = vec![0u8; if rank == root { src.len() } else { 0 }];
                comm.reduce_bytes(&src, &mut d, dtype, op, root).unwrap();
                if rank == root {
                    assert!(d == want, "reduce {dtype} {op}");
                }
            }
        }
        let e = comm.allreduce_in_place(&mut [0i32; 4], ReduceOp::Barrier).unwrap_err();
        assert!(e.to_string().contains("not a reduction"), "{e}");
        comm.barrier().unwrap();
        comm.destroy().unwrap();
        group.destroy().unwrap();
    });
}

/// ReduceScatter for every (type, operator), AllGather for every type, in place and
/// out of place, then eight non-blocking collectives of every kind in flight at once
/// on one communicator, completing in start order while the rank computes.
#[test]
fn reduce_scatter_allgather_and_nonblocking() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let b = 751; // elements per block: not a whole number of chunks
    let w = usize::from(WORLD);
    ranks(&fabric, |rank, cfg| {
        let group = Group::create(cfg).unwrap();
        let mut comm = group.communicator(comm_config()).unwrap();
        let me = usize::from(rank);
        for &dtype in DataType::ALL {
            let sz = dtype.size();
            for (k, op) in ReduceOp::reductions().enumerate() {
                if !op.applies_to(dtype) {
                    continue;
                }
                let src: Vec<u8> = (0..w * b).flat_map(|i| in_any(dtype, op, i, rank)).collect();
                let want: Vec<u8> =
                    (me * b..(me + 1) * b).flat_map(|i| reduce_any(dtype, op, i)).collect();
                if k % 2 == 0 {
                    let mut d = vec![0u8; b * sz];
                    comm.reduce_scatter_bytes(&src, &mut d, dtype, op).unwrap();
                    assert!(d == want, "rank {rank} reduce-scatter {dtype} {op}");
                } else {
                    let mut buf = src.clone();
                    comm.reduce_scatter_bytes_in_place(&mut buf, dtype, op).unwrap();
                    assert!(
                        buf[me * b * sz..][..b * sz] == want[..],
                        "rank {rank} in-place reduce-scatter {dtype} {op}"
                    );
                    assert!(buf[..me * b * sz] == src[..me * b * sz], "other blocks untouched");
                }
            }
            let block = |r: u16| -> Vec<u8> {
                (0..b).flat_map(|i| in_any(dtype, ReduceOp::Sum, i, r)).collect()
            };
            let want: Vec<u8> = (0..WORLD).flat_map(block).collect();
            let mut d = vec![0u8; w * b * sz];
            comm.allgather_bytes(&block(rank), &mut d, dtype).unwrap();
            assert!(d == want, "rank {rank} allgather {dtype}");
            let mut buf = vec![0u8; w * b * sz];
            buf[me * b * sz..][..b * sz].copy_from_slice(&block(rank));
            comm.allgather_bytes_in_place(&mut buf, dtype).unwrap();
            assert!(buf == want, "rank {rank} in-place allgather {dtype}");
        }
        let e = comm.reduce_scatter(&[0i32; 7], &mut [0i32; 2], ReduceOp::Sum).unwrap_err();
        assert!(e.to_string().contains("expected 4 blocks"), "{e}");

        // Eight in flight, every kind; buffers are lent to the scope.
        let n = 20_000;
        let src: Vec<i32> = (0..n).map(|i| in_i32(i, rank)).collect();
        let (mut a, mut bb, mut c) = (vec![0i32; n], vec![0i32; n], vec![0i32; 3]);
        let mut rs = vec![0i32; n / w];
        let mut ag = vec![0i32; n * w];
        let mut bc: Vec<i32> = if rank == 3 { src.clone() } else { vec![0; n] };
        let mut red = vec![0i32; if rank == 0 { n } else { 0 }];
        let mut inplace = vec![i32::from(rank) + 1; 5];
        let small = [i32::from(rank); 3];
        let computed = comm.scope(|s| {
            let reqs = vec![
                s.iallreduce(&src, &mut a, ReduceOp::Sum).unwrap(),
                s.ireduce_scatter(&src, &mut rs, ReduceOp::Max).unwrap(),
                s.iallgather(&src, &mut ag).unwrap(),
                s.ibroadcast(&mut bc, 3).unwrap(),
                s.ireduce(&src, &mut red, ReduceOp::Min, 0).unwrap(),
                s.ibarrier().unwrap(),
                s.iallreduce_in_place(&mut inplace, ReduceOp::Sum).unwrap(),
                s.iallreduce(&src, &mut bb, ReduceOp::Max).unwrap(),
            ];
            let last = s.iallreduce(&small, &mut c, ReduceOp::Max).unwrap();
            // Compute while the progress thread runs them.
            let computed: u64 =
                (0..2_000_000u64).fold(0, |x, i| x.wrapping_mul(31).wrapping_add(i));
            while !last.test().unwrap() {
                std::thread::yield_now();
            }
            // Completion in start order: all earlier ones are done too.
            for r in &reqs {
                assert!(r.test().unwrap());
            }
            for r in reqs {
                r.wait().unwrap();
            }
            last.wait().unwrap();
            computed
        });
        assert_ne!(computed, 1);
        assert!((0..n).all(|i| a[i] == reduce_i32(i, ReduceOp::Sum)), "rank {rank} iallreduce");
        assert!(
            (0..n).all(|i| bb[i] == reduce_i32(i, ReduceOp::Max)),
            "rank {rank} iallreduce max"
        );
        let lo = me * (n / w);
        assert!(
            (0..n / w).all(|i| rs[i] == reduce_i32(lo + i, ReduceOp::Max)),
            "rank {rank} ireduce_scatter"
        );
        assert!(
            (0..n * w).all(|i| ag[i] == in_i32(i % n, (i / n) as u16)),
            "rank {rank} iallgather"
        );
        assert!((0..n).all(|i| bc[i] == in_i32(i, 3)), "rank {rank} ibroadcast");
        if rank == 0 {
            assert!((0..n).all(|i| red[i] == reduce_i32(i, ReduceOp::Min)), "ireduce");
        }
        assert_eq!(inplace, vec![10; 5]);
        assert_eq!(c, vec![3; 3]);
        // Blocking calls after non-blocking ones keep the order.
        comm.barrier().unwrap();
        comm.destroy().unwrap();
        group.destroy().unwrap();
    });
}

#[test]
fn missing_controller_fails_fast_on_every_rank() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let dead = format!("127.0.0.1:{}", free_port());
    let t = Instant::now();
    let errs = ranks(&fabric, |_, mut cfg| {
        cfg.controller = Some(dead.clone());
        Group::create(cfg).unwrap_err().to_string()
    });
    assert!(t.elapsed() < Duration::from_secs(8), "took {:?}", t.elapsed());
    assert!(errs[0].contains(&dead), "{}", errs[0]);
    for e in &errs[1..] {
        assert!(e.contains("rank 0 aborted") && e.contains(&dead), "{e}");
    }
}

#[test]
fn wrong_and_missing_ranks_are_named() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let port = free_port();
    let out: Vec<String> = std::thread::scope(|s| {
        let mk = |r: u16| {
            let mut c = fabric.group_config(3, r, port);
            c.timeout = Duration::from_secs(2);
            c
        };
        let h0 = s.spawn(move || Group::create(mk(0)).unwrap_err());
        std::thread::sleep(Duration::from_millis(200));
        let h1 = s.spawn(move || Group::create(mk(1)));
        std::thread::sleep(Duration::from_millis(200));
        // A second process claiming rank 1; rank 2 never starts.
        let dup = Group::create(mk(1)).unwrap_err();
        let e0 = h0.join().unwrap();
        let e1 = h1.join().unwrap().unwrap_err();
        vec![e0.to_string(), dup.to_string(), e1.to_string()]
    });
    assert!(out[0].contains("ranks [2]") && out[0].contains("timed out"), "{}", out[0]);
    assert!(out[1].contains("rank 1") && out[1].contains("already taken"), "{}", out[1]);
    assert!(out[2].contains("rank 0 aborted") && out[2].contains("[2]"), "{}", out[2]);
    // A rank outside the world is refused before any network traffic.
    let e = Group::create(fabric.group_config(3, 3, port)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("rank 3"), "{e}");
}

#[test]
fn dead_rank_gives_a_bounded_error() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let t = Instant::now();
    let errs = ranks(&fabric, |rank, cfg| {
        let group = Group::create(cfg).unwrap();
        let mut c = comm_config();
        c.op_timeout = Duration::from_secs(2);
        let mut comm = group.communicator(c).unwrap();
        if rank == 3 {
            // Dies: its QP and bootstrap connection go away without a word.
            drop(comm);
            drop(group);
            return None;
        }
        std::thread::sleep(Duration::from_millis(300));
        let src = vec![1i32; 50_000];
        let mut dst = vec![0i32; 50_000];
        let e = comm.allreduce(&src, &mut dst, ReduceOp::Sum).unwrap_err();
        // Unusable afterwards, with the reason.
        let again = comm.barrier().unwrap_err();
        assert!(matches!(again, Error::Unusable(..)), "{again}");
        Some(e)
    });
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
    for (r, e) in errs.iter().enumerate().take(3) {
        let e = e.as_ref().unwrap();
        let s = e.to_string();
        assert!(matches!(e, Error::Collective { .. }), "rank {r}: {s}");
        assert!(s.contains("no progress"), "rank {r}: {s}");
    }
    let s0 = errs[0].as_ref().unwrap().to_string();
    // Rank 3 for sure; ranks that already gave up may be listed too.
    assert!(s0.contains("3] lost their bootstrap connection"), "{s0}");
}

#[test]
fn two_communicators_interleave() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    ranks(&fabric, |rank, cfg| {
        let group = Group::create(cfg).unwrap();
        let mut a = group.communicator(comm_config()).unwrap();
        let mut b = group.communicator(comm_config()).unwrap();
        assert_ne!(a.comm_id(), b.comm_id());
        let src = vec![i32::from(rank) + 1; 5000];
        for round in 0..3 {
            let mut d = vec![0; 5000];
            a.allreduce(&src, &mut d, ReduceOp::Sum).unwrap();
            assert!(d.iter().all(|v| *v == 10), "round {round} comm a");
            let mut d = vec![0; 5000];
            b.allreduce(&src, &mut d, ReduceOp::Max).unwrap();
            assert!(d.iter().all(|v| *v == 4), "round {round} comm b");
        }
        a.destroy().unwrap();
        // The other communicator keeps working after one is destroyed.
        b.barrier().unwrap();
        b.destroy().unwrap();
        group.destroy().unwrap();
    });
}

/// A meeting point for `parties` threads that fails (panics) instead of hanging when
/// one of them never arrives, e.g. because it panicked.
struct Rendezvous {
    arrived: Mutex<usize>,
    all_here: Condvar,
    parties: usize,
}

impl Rendezvous {
    fn new(parties: usize) -> Self {
        Rendezvous { arrived: Mutex::new(0), all_here: Condvar::new(), parties }
    }

    fn meet(&self, what: &str) {
        // A thread that panicked while holding the lock left the count consistent.
        let mut n = self.arrived.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        self.all_here.notify_all();
        let (n, t) = self
            .all_here
            .wait_timeout_while(n, Duration::from_secs(30), |n| *n < self.parties)
            .unwrap_or_else(|p| p.into_inner());
        assert!(!t.timed_out(), "only {} of {} threads reached {what}", *n, self.parties);
    }
}

#[test]
fn communicators_in_two_namespaces_with_the_same_addresses_run_at_once() {
    // Two fabrics of the same topology, each in a namespace of its own: every host
    // address exists twice in this process, and each rank's QP must use the socket of
    // its own namespace while the other fabric's ranks hold theirs.
    let created = Rendezvous::new(2 * usize::from(WORLD));
    let finished = Rendezvous::new(2 * usize::from(WORLD));
    std::thread::scope(|s| {
        let fabrics: Vec<_> = (0..2i32)
            .map(|k| {
                let (created, finished) = (&created, &finished);
                s.spawn(move || {
                    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
                    ranks(&fabric, |rank, cfg| {
                        let group = Group::create(cfg).unwrap();
                        let mut comm = group.communicator(comm_config()).unwrap();
                        created.meet("communicator creation");
                        let src = vec![i32::from(rank) + 1 + 100 * k; 20_000];
                        for round in 0..3 {
                            let mut d = vec![0; src.len()];
                            comm.allreduce(&src, &mut d, ReduceOp::Sum).unwrap();
                            assert!(
                                d.iter().all(|v| *v == 10 + 400 * k),
                                "fabric {k} rank {rank} round {round}"
                            );
                        }
                        finished.meet("the end of the collectives");
                        comm.destroy().unwrap();
                        group.destroy().unwrap();
                    });
                })
            })
            .collect();
        for f in fabrics {
            f.join().expect("fabric thread panicked");
        }
    });
}

#[cfg(not(feature = "verbs"))]
#[test]
fn verbs_transport_without_the_feature_is_a_clear_error() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let errs = ranks(&fabric, |_, cfg| {
        let group = Group::create(cfg).unwrap();
        let mut c = comm_config();
        c.transport = inccl::TransportKind::Verbs;
        let e = group.communicator(c).unwrap_err();
        group.destroy().unwrap();
        e
    });
    for e in errs {
        assert!(
            matches!(e, Error::TransportUnavailable(_))
                && e.to_string().contains("--features verbs"),
            "{e}"
        );
    }
}

#[test]
fn idle_rank_keeps_its_connection_between_collectives() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    ranks(&fabric, |rank, cfg| {
        let group = Group::create(cfg).unwrap();
        let mut comm = group.communicator(comm_config()).unwrap();
        let src = vec![1i32; 20_000];
        for _ in 0..3 {
            let mut d = vec![0; if rank == 3 { 20_000 } else { 0 }];
            comm.reduce(&src, &mut d, ReduceOp::Sum, 3).unwrap();
        }
        if rank == 3 {
            // "Computing": the library gets no calls, yet the switch still talks to
            // this rank (late progress and ACK requests) and must get answers.
            std::thread::sleep(Duration::from_secs(3));
            // ... and the progress threads that answer do not spin meanwhile.
            let ticks = progress_thread_cpu_ticks();
            assert!(ticks.len() >= 4, "one progress thread per rank: {ticks:?}");
            assert!(ticks.iter().all(|t| *t < 30), "progress threads used CPU ticks {ticks:?}");
        }
        let mut d = vec![0; 20_000];
        comm.allreduce(&src, &mut d, ReduceOp::Sum).unwrap();
        assert!(d.iter().all(|v| *v == 4));
        comm.destroy().unwrap();
        group.destroy().unwrap();
    });
}

/// User+system CPU time (clock ticks) of each INCCL progress thread of this process.
fn progress_thread_cpu_ticks() -> Vec<u64> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("inccl-progress") {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // Fields after "(comm)": state is field 3, utime 14, stime 15.
        let rest: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        out.push(rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap());
    }
    out
}

#[test]
fn rank_on_an_unknown_host_is_named() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let errs = ranks(&fabric, |rank, mut cfg| {
        if rank == 2 {
            // An address the topology does not know.
            cfg.local_ip = Some(std::net::Ipv4Addr::LOCALHOST);
        }
        Group::create(cfg).unwrap_err().to_string()
    });
    // Every rank learns which rank and address the controller refused.
    for e in &errs {
        assert!(e.contains("rank 2: host IP 127.0.0.1 is not a host"), "{e}");
    }
}
