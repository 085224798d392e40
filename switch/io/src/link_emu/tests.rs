use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::backend::{Backend, PortSpec};
use crate::memory::MemoryBackend;

fn ms(x: u64) -> Time {
    Time::from_nanos(x * 1_000_000)
}

fn link(spec: &str) -> LinkEmu {
    let imp: Impairments = spec.parse().unwrap();
    let seed = seed_for(imp.seed, "test");
    LinkEmu::new(imp, seed)
}

/// A frame that carries its index, so order and identity can be checked.
fn frame(i: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0xA5; len.max(4)];
    f[..4].copy_from_slice(&i.to_be_bytes());
    f
}

fn id(f: &[u8]) -> u32 {
    u32::from_be_bytes(f[..4].try_into().unwrap())
}

fn drain(l: &mut LinkEmu, now: Time) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    l.pop_due(now, &mut |f| {
        out.push(f.to_vec());
        true
    });
    out
}

fn check_invariant(c: &LinkEmuCounters) {
    assert_eq!(
        c.offered + c.duplicated,
        c.lost + c.queue_drops + c.passed + c.released + c.held,
        "{c:?}"
    );
}

#[test]
fn a_clean_link_passes_everything_untouched() {
    let mut l = link("");
    for i in 0..1000 {
        let mut f = frame(i, 100);
        assert_eq!(l.offer(ms(u64::from(i)), &mut f), Verdict::Send);
        assert_eq!(f, frame(i, 100));
    }
    assert_eq!(l.next_due(), None);
    assert_eq!(l.counters().passed, 1000);
}

#[test]
fn random_loss_matches_its_rate_and_repeats_with_the_seed() {
    let run = |spec: &str| {
        let mut l = link(spec);
        (0..100_000)
            .map(|i| l.offer(Time::ZERO, &mut frame(i, 64)) == Verdict::Dropped)
            .collect::<Vec<_>>()
    };
    let a = run("loss=1%,seed=1");
    let lost = a.iter().filter(|&&d| d).count();
    assert!((800..1200).contains(&lost), "{lost} of 100000 lost at 1%");
    assert_eq!(a, run("loss=1%,seed=1"), "same seed, same losses");
    assert_ne!(a, run("loss=1%,seed=2"), "another seed, other losses");
    assert!(run("loss=100%").iter().all(|&d| d));
}

#[test]
fn bursty_loss_has_the_mean_rate_and_burst_length() {
    let mut l = link("loss=2%,burst=5,seed=9");
    let mut run = 0u64;
    let mut runs = Vec::new();
    for i in 0..400_000 {
        if l.offer(Time::ZERO, &mut frame(i, 64)) == Verdict::Dropped {
            run += 1;
        } else if run > 0 {
            runs.push(run);
            run = 0;
        }
    }
    let c = l.counters();
    let rate = c.lost as f64 / c.offered as f64;
    assert!((0.016..0.024).contains(&rate), "loss rate {rate}");
    let mean = runs.iter().sum::<u64>() as f64 / runs.len() as f64;
    assert!((4.0..6.0).contains(&mean), "mean burst {mean}");
    assert_eq!(c.burst_lost, c.lost);
    assert_eq!(c.bursts as usize, runs.len() + usize::from(run > 0));
}

#[test]
fn delay_holds_frames_until_their_deadline_in_order() {
    let mut l = link("delay=10ms");
    for i in 0..5 {
        assert_eq!(l.offer(ms(u64::from(i)), &mut frame(i, 64)), Verdict::Held);
    }
    assert_eq!(l.next_due(), Some(ms(10)));
    assert!(drain(&mut l, ms(9)).is_empty());
    let out = drain(&mut l, ms(12));
    assert_eq!(out.iter().map(|f| id(f)).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(l.next_due(), Some(ms(13)));
    let out = drain(&mut l, ms(100));
    assert_eq!(out.iter().map(|f| id(f)).collect::<Vec<_>>(), vec![3, 4]);
    check_invariant(&l.counters());
}

#[test]
fn rate_limit_serialises_frames() {
    // 1000-byte frames at 1 Mbit/s: 8 ms each.
    let mut l = link("rate=1mbit");
    assert_eq!(l.offer(ms(0), &mut frame(0, 1000)), Verdict::Send);
    assert_eq!(l.offer(ms(0), &mut frame(1, 1000)), Verdict::Held);
    assert_eq!(l.offer(ms(1), &mut frame(2, 1000)), Verdict::Held);
    assert_eq!(l.next_due(), Some(ms(8)));
    assert_eq!(drain(&mut l, ms(8)).len(), 1);
    assert_eq!(l.next_due(), Some(ms(16)));
    // Once the backlog drained, a frame goes at once again.
    assert_eq!(drain(&mut l, ms(16)).len(), 1);
    assert_eq!(l.offer(ms(30), &mut frame(3, 1000)), Verdict::Send);
}

#[test]
fn duplicates_follow_their_original() {
    let mut l = link("dup=100%");
    let mut f = frame(7, 64);
    assert_eq!(l.offer(ms(1), &mut f), Verdict::Send);
    assert_eq!(l.next_due(), Some(ms(1)));
    let out = drain(&mut l, ms(1));
    assert_eq!(out, vec![frame(7, 64)]);
    let c = l.counters();
    assert_eq!((c.passed, c.released, c.duplicated), (1, 1, 1));
}

#[test]
fn corruption_flips_exactly_one_bit() {
    let mut l = link("corrupt=100%,seed=4");
    for i in 0..200 {
        let mut f = frame(i, 300);
        assert_eq!(l.offer(Time::ZERO, &mut f), Verdict::Send);
        let flipped: u32 = f.iter().zip(frame(i, 300)).map(|(a, b)| (a ^ b).count_ones()).sum();
        assert_eq!(flipped, 1);
    }
    assert_eq!(l.counters().corrupted, 200);
}

#[test]
fn reordered_frames_are_overtaken() {
    let mut l = link("reorder=100%,reorder-delay=5ms");
    assert_eq!(l.offer(ms(0), &mut frame(0, 64)), Verdict::Held);
    let mut later = link("reorder=0");
    assert_eq!(later.offer(ms(1), &mut frame(1, 64)), Verdict::Send);
    // Mixed: every third frame is held back; the others pass it.
    let mut l = link("reorder=35%,reorder-delay=2ms,seed=3");
    let mut order = Vec::new();
    for i in 0..300u32 {
        let now = Time::from_nanos(u64::from(i) * 10_000);
        order.extend(drain(&mut l, now).iter().map(|f| id(f)));
        if l.offer(now, &mut frame(i, 64)) == Verdict::Send {
            order.push(i);
        }
    }
    order.extend(drain(&mut l, ms(1000)).iter().map(|f| id(f)));
    assert_eq!(order.len(), 300);
    let inversions = order.windows(2).filter(|w| w[0] > w[1]).count();
    assert!(inversions > 10, "{inversions} inversions");
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..300).collect::<Vec<_>>(), "nothing lost or duplicated");
}

#[test]
fn a_full_queue_drops_the_newest() {
    let mut l = link("delay=1s,limit=3");
    for i in 0..5 {
        let v = l.offer(Time::ZERO, &mut frame(i, 64));
        assert_eq!(v, if i < 3 { Verdict::Held } else { Verdict::Dropped });
    }
    let c = l.counters();
    assert_eq!((c.held, c.queue_drops, c.max_held), (3, 2, 3));
}

#[test]
fn pop_due_stops_when_the_receiver_is_full() {
    let mut l = link("delay=1ms");
    for i in 0..4 {
        l.offer(Time::ZERO, &mut frame(i, 64));
    }
    let mut taken = 0;
    assert_eq!(
        l.pop_due(ms(5), &mut |_| {
            taken += 1;
            taken <= 2
        }),
        2
    );
    assert_eq!(drain(&mut l, ms(5)).iter().map(|f| id(f)).collect::<Vec<_>>(), vec![2, 3]);
}

fn impairments() -> impl Strategy<Value = Impairments> {
    (
        (0u32..=30, prop::option::of(1u32..=8), 0u32..=20, 0u32..=20, 0u32..=20),
        (0u64..=3_000, 0u64..=2_000, prop::option::of(1u64..=100), 1usize..=64, any::<u64>()),
    )
        .prop_map(
            |((loss, burst, dup, reorder, corrupt), (delay, jitter, mbit, limit, seed))| {
                Impairments {
                    loss: f64::from(loss) / 100.0,
                    burst: burst.map(f64::from),
                    duplicate: f64::from(dup) / 100.0,
                    reorder: f64::from(reorder) / 100.0,
                    reorder_delay: Duration::from_micros(500),
                    corrupt: f64::from(corrupt) / 100.0,
                    delay: Duration::from_micros(delay),
                    jitter: Duration::from_micros(jitter),
                    rate_bps: mbit.map(|m| m * 1_000_000),
                    limit,
                    seed,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the impairments and the timing: counters add up, the queue stays within
    /// its limit, nothing leaves before its deadline or twice unless duplicated, frames
    /// keep their order unless reordering is on, and corruption only when asked.
    #[test]
    fn the_model_keeps_its_invariants(
        imp in impairments(),
        steps in prop::collection::vec((0u64..400, 60usize..1500), 1..300),
    ) {
        let mut l = LinkEmu::new(imp.clone(), imp.seed);
        let mut now = Time::ZERO;
        let mut delivered: Vec<(u32, Vec<u8>)> = Vec::new();
        for (i, &(gap_us, len)) in steps.iter().enumerate() {
            now += Duration::from_micros(gap_us);
            l.pop_due(now, &mut |f| {
                delivered.push((id(f), f.to_vec()));
                true
            });
            prop_assert!(l.next_due().is_none_or(|t| t > now));
            let mut f = frame(i as u32, len);
            if l.offer(now, &mut f) == Verdict::Send {
                delivered.push((i as u32, f));
            }
            let c = l.counters();
            check_invariant(&c);
            prop_assert!(c.held as usize <= imp.limit);
        }
        l.pop_due(Time::from_nanos(u64::MAX), &mut |f| {
            delivered.push((id(f), f.to_vec()));
            true
        });
        let c = l.counters();
        check_invariant(&c);
        prop_assert_eq!(c.held, 0);
        prop_assert_eq!(delivered.len() as u64, c.passed + c.released);
        if imp.corrupt > 0.0 {
            return Ok(()); // identities below are read from the frames
        }
        for (i, f) in &delivered {
            prop_assert_eq!(f, &frame(*i, f.len()));
        }
        if imp.reorder == 0.0 {
            prop_assert!(delivered.windows(2).all(|w| w[0].0 <= w[1].0), "order kept");
        }
        if imp.duplicate == 0.0 {
            let mut ids: Vec<u32> = delivered.iter().map(|d| d.0).collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), delivered.len());
        }
        if imp.loss == 0.0 && imp.duplicate == 0.0 && c.queue_drops == 0 {
            prop_assert_eq!(delivered.len(), steps.len());
        }
    }
}

fn memory(n: usize) -> (MemoryBackend, crate::memory::MemoryNet) {
    let ports: Vec<PortSpec> = (0..n).map(|i| format!("p{i}").parse().unwrap()).collect();
    MemoryBackend::new(ports, 1024)
}

fn send(b: &mut impl Backend, port: usize, f: &[u8]) {
    let buf = b.tx_buffer().expect("a tx buffer");
    buf[..f.len()].copy_from_slice(f);
    b.commit_tx(port, f.len());
}

#[test]
fn the_backend_applies_per_port_and_direction() {
    let (inner, net) = memory(3);
    let config = vec![
        PortLinkEmu { tx: Some("loss=100%".parse().unwrap()), rx: None },
        PortLinkEmu { tx: None, rx: Some("loss=100%".parse().unwrap()) },
    ];
    let mut b = LinkEmuBackend::new(inner, config).unwrap();
    for port in 0..3 {
        send(&mut b, port, &frame(port as u32, 64));
    }
    b.flush().unwrap();
    let out: Vec<usize> = net.drain().into_iter().map(|(p, _)| p).collect();
    assert_eq!(out, vec![1, 2], "port 0 loses everything it sends");
    for port in 0..3 {
        net.inject(port, &frame(port as u32, 64));
    }
    let mut got = Vec::new();
    b.recv_batch(16, &mut |p, _| got.push(p)).unwrap();
    assert_eq!(got, vec![0, 2], "port 1 loses everything it receives");
    let s = b.link_emu_stats(0).unwrap();
    assert_eq!(s.tx.unwrap().counters.lost, 1);
    assert!(s.rx.is_none());
    assert_eq!(b.link_emu_stats(1).unwrap().rx.unwrap().counters.lost, 1);
    assert!(b.link_emu_stats(2).is_none());
    assert!(LinkEmuBackend::new(memory(1).0, vec![PortLinkEmu::default(); 2]).is_err());
}

#[test]
fn the_backend_releases_delayed_frames_when_its_wait_ends() {
    let (inner, net) = memory(1);
    let delay = "delay=30ms".parse::<Impairments>().unwrap();
    let config = vec![PortLinkEmu { tx: Some(delay.clone()), rx: Some(delay) }];
    let mut b = LinkEmuBackend::new(inner, config).unwrap();
    let t0 = std::time::Instant::now();
    send(&mut b, 0, &frame(1, 64));
    b.flush().unwrap();
    net.inject(0, &frame(2, 64));
    let mut got = Vec::new();
    b.recv_batch(16, &mut |_, f| got.push(id(f))).unwrap();
    assert!(got.is_empty() && net.drain().is_empty(), "both directions held");
    // A wait without timeout still ends at the deadline of the held frames.
    while got.is_empty() {
        b.wait(None).unwrap();
        b.recv_batch(16, &mut |_, f| got.push(id(f))).unwrap();
    }
    b.flush().unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(30));
    assert_eq!(got, vec![2]);
    assert_eq!(net.drain().into_iter().map(|(_, f)| id(&f)).collect::<Vec<_>>(), vec![1]);
}

#[test]
fn an_inactive_wrapper_is_transparent() {
    let (inner, net) = memory(1);
    let mut b = LinkEmuBackend::new(inner, vec![PortLinkEmu::default()]).unwrap();
    assert!(!b.is_active());
    send(&mut b, 0, b"abc");
    assert_eq!(b.flush().unwrap(), 1);
    assert_eq!(net.drain(), vec![(0, b"abc".to_vec())]);
    assert!(b.link_emu_stats(0).is_none());
}

/// In-process ports stay intact under emulation without corruption; any corruption,
/// on any port and direction, has every frame's ICRC checked again.
#[test]
fn intact_ports_stay_intact_unless_something_corrupts() {
    let linked = |config: Vec<PortLinkEmu>| {
        let inner = crate::in_process::InProcessLinks::new(memory(3).0, &[(1, 2)]).unwrap();
        let b = LinkEmuBackend::new(inner, config).unwrap();
        (0..3).map(|p| b.rx_intact(p)).collect::<Vec<_>>()
    };
    assert_eq!(linked(vec![]), [false, true, true]);
    let lossy = PortLinkEmu { tx: Some("loss=5%,delay=1ms".parse().unwrap()), rx: None };
    assert_eq!(linked(vec![PortLinkEmu::default(), lossy]), [false, true, true]);
    let corrupting = PortLinkEmu { tx: None, rx: Some("corrupt=1%".parse().unwrap()) };
    assert_eq!(linked(vec![corrupting]), [false, false, false]);
}
