//! Tables (nccl-tests style), ratios, CSV and JSON from the measurements.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::cli::{human_size, Coll};
use crate::model::{FrameRate, Measurement, Results};
use crate::stats::{median, quantile, sign_test, spread};

/// One system at one size, over all rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// System.
    pub system: String,
    /// Collective.
    pub collective: Coll,
    /// Datatype.
    pub dtype: String,
    /// Small-message latency test.
    pub small: bool,
    /// Bytes.
    pub bytes: u64,
    /// Elements.
    pub count: u64,
    /// Rounds measured.
    pub rounds: usize,
    /// Timed iterations over all rounds.
    pub iters: usize,
    /// Median iteration time (us), all rounds pooled.
    pub median_us: f64,
    /// Minimum (us).
    pub min_us: f64,
    /// Maximum (us).
    pub max_us: f64,
    /// 99th percentile (us).
    pub p99_us: f64,
    /// (max - min) / median of the per-round medians.
    pub spread: f64,
    /// Message bytes / median time (GB/s).
    pub algbw: f64,
    /// algbw x the nccl-tests bus factor.
    pub busbw: f64,
    /// Switch frames in per second, all switches (mean over rounds).
    pub switch_rx_fps: Option<f64>,
    /// Switch frames out per second.
    pub switch_tx_fps: Option<f64>,
    /// Per switch: (name, in fps, out fps).
    pub per_switch: Vec<(String, f64, f64)>,
    /// Switch retransmissions (sum over rounds).
    pub retransmits: u64,
    /// RNR NAKs sent and received by the switches.
    pub rnrs: u64,
    /// Drops by reason.
    pub drops: BTreeMap<String, u64>,
    /// Switch CPU seconds (sum over rounds).
    pub switch_cpu_s: Option<f64>,
    /// Switch CPU nanoseconds per frame in.
    pub switch_ns_per_frame: Option<f64>,
    /// Host CPU seconds (sum over rounds).
    pub host_cpu_s: Option<f64>,
    /// "ok" or the first failure.
    pub status: String,
}

/// Group measurements by system, collective, datatype, size and kind.
pub fn summarize(ms: &[Measurement], world: usize) -> Vec<Summary> {
    let mut groups: BTreeMap<(String, &str, String, bool, u64), Vec<&Measurement>> =
        BTreeMap::new();
    let mut order = Vec::new();
    // The overlap measurement has its own table (`overlap`).
    for m in ms.iter().filter(|m| m.collective != Coll::Overlap) {
        let key = (m.system.clone(), m.collective.name(), m.dtype.clone(), m.small, m.bytes);
        if !groups.contains_key(&key) {
            order.push(key.clone());
        }
        groups.entry(key).or_default().push(m);
    }
    order
        .into_iter()
        .map(|k| {
            let g = &groups[&k];
            let times: Vec<f64> = g.iter().flat_map(|m| m.times_us.iter().copied()).collect();
            let round_medians: Vec<f64> =
                g.iter().filter(|m| !m.times_us.is_empty()).map(|m| m.median_us()).collect();
            let med = median(&times);
            let first = g[0];
            let algbw = if med > 0.0 { first.bytes as f64 / (med * 1e-6) / 1e9 } else { 0.0 };
            let sw: Vec<_> = g.iter().filter_map(|m| m.switch.as_ref()).collect();
            let n = sw.len().max(1) as f64;
            let mut per_switch: Vec<(String, f64, f64)> = Vec::new();
            let mut drops = BTreeMap::new();
            for s in &sw {
                for d in &s.switches {
                    match per_switch.iter_mut().find(|p| p.0 == d.name) {
                        Some(p) => {
                            p.1 += d.rx_fps / n;
                            p.2 += d.tx_fps / n;
                        }
                        None => per_switch.push((d.name.clone(), d.rx_fps / n, d.tx_fps / n)),
                    }
                }
                for (k, v) in s.drops() {
                    *drops.entry(k).or_default() += v;
                }
            }
            let frames: u64 = sw.iter().map(|s| s.rx_frames()).sum();
            let cpu: f64 = sw.iter().map(|s| s.cpu_s).sum();
            Summary {
                system: first.system.clone(),
                collective: first.collective,
                dtype: first.dtype.clone(),
                small: first.small,
                bytes: first.bytes,
                count: first.count,
                rounds: g.len(),
                iters: times.len(),
                median_us: med,
                min_us: quantile(&times, 0.0),
                max_us: quantile(&times, 1.0),
                p99_us: quantile(&times, 0.99),
                spread: spread(&round_medians),
                algbw,
                busbw: algbw * first.collective.bus_factor(world),
                switch_rx_fps: (!sw.is_empty())
                    .then(|| sw.iter().map(|s| s.rx_fps()).sum::<f64>() / n),
                switch_tx_fps: (!sw.is_empty())
                    .then(|| sw.iter().map(|s| s.tx_fps()).sum::<f64>() / n),
                per_switch,
                retransmits: sw.iter().map(|s| s.retransmits()).sum(),
                rnrs: sw.iter().map(|s| s.rnrs()).sum(),
                drops,
                switch_cpu_s: (!sw.is_empty()).then_some(cpu),
                switch_ns_per_frame: (frames > 0).then(|| cpu * 1e9 / frames as f64),
                host_cpu_s: g.iter().map(|m| m.host_cpu_s).sum(),
                status: g.iter().find(|m| !m.ok()).map_or("ok".into(), |m| m.status.clone()),
            }
        })
        .collect()
}

fn drops_text(d: &BTreeMap<String, u64>) -> String {
    if d.is_empty() {
        return "-".into();
    }
    d.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// The nccl-tests style table.
pub fn table(rows: &[Summary]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# {:<10} {:<9} {:<8} {:>11} {:>10} {:>6} {:>11} {:>11} {:>11} {:>11} {:>6} {:>9} {:>9} {:>10} {:>10} {:>6} {:>6} {:>8} {:>8}  {:<40} {:<10} status",
        "system", "coll", "type", "size(B)", "count", "iters", "median(us)", "min(us)", "max(us)",
        "p99(us)", "spread", "algbw", "busbw", "sw-in/s", "sw-out/s", "retx", "rnr", "sw-cpu-s",
        "ns/frame", "per switch in/out frames/s", "drops"
    );
    let _ = writeln!(o, "# {:>112} {:>9} {:>9}", "", "(GB/s)", "(GB/s)");
    for r in rows {
        let opt = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
        let per: Vec<String> =
            r.per_switch.iter().map(|(n, i, o)| format!("{n}:{:.0}/{:.0}", i, o)).collect();
        let kind =
            if r.small { format!("{}*", r.collective.name()) } else { r.collective.name().into() };
        let _ = writeln!(
            o,
            "  {:<10} {:<9} {:<8} {:>11} {:>10} {:>6} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>5.0}% {:>9.4} {:>9.4} {:>10} {:>10} {:>6} {:>6} {:>8} {:>8}  {:<40} {:<10} {}",
            r.system, kind, r.dtype, r.bytes, r.count, r.iters, r.median_us, r.min_us, r.max_us,
            r.p99_us, r.spread * 100.0, r.algbw, r.busbw, opt(r.switch_rx_fps, 0),
            opt(r.switch_tx_fps, 0), r.retransmits, r.rnrs, opt(r.switch_cpu_s, 2),
            opt(r.switch_ns_per_frame, 0), if per.is_empty() { "-".into() } else { per.join(" ") },
            drops_text(&r.drops), r.status
        );
    }
    o
}

/// Frame-rate references and the INC switches' best rates.
pub fn frame_table(refs: &[FrameRate], rows: &[Summary], backends: &[String]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# {:<22} {:>6} {:>5} {:>14} {:>14} {:>16} {:>8}  status",
        "forwarder", "frame", "hops", "offered fps", "delivered fps", "forwarded fps", "cores"
    );
    for r in refs {
        let _ = writeln!(
            o,
            "  {:<22} {:>6} {:>5} {:>14.0} {:>14.0} {:>16.0} {:>8.2}  {}",
            r.system,
            r.frame_len,
            r.hops,
            r.offered_fps,
            r.delivered_fps,
            r.forwarded_fps,
            r.forwarder_cores,
            r.status
        );
    }
    for b in backends {
        if let Some(best) = best_switch_fps(rows, b) {
            let _ = writeln!(
                o,
                "  {:<22} {:>6} {:>5} {:>14} {:>14} {:>16.0} {:>8}  INC switches, frames in, best AllReduce size",
                format!("inc {b}"), "-", "all", "-", "-", best, "-"
            );
        }
    }
    o
}

/// Highest all-switch frames-in rate of a backend over its AllReduce sweep.
pub fn best_switch_fps(rows: &[Summary], backend: &str) -> Option<f64> {
    rows.iter()
        .filter(|r| {
            r.system == backend && r.collective == Coll::AllReduce && !r.small && r.status == "ok"
        })
        .filter_map(|r| r.switch_rx_fps)
        .reduce(f64::max)
}

fn find<'a>(
    rows: &'a [Summary],
    system: &str,
    coll: Coll,
    dtype: &str,
    bytes: u64,
    small: bool,
) -> Option<&'a Summary> {
    rows.iter().find(|r| {
        r.system == system
            && r.collective == coll
            && r.dtype == dtype
            && r.bytes == bytes
            && r.small == small
            && r.status == "ok"
            && r.iters > 0
    })
}

fn rounds_of(ms: &[Measurement]) -> usize {
    ms.iter().map(|m| m.round as usize + 1).max().unwrap_or(0)
}

/// INC / MPI of each round's medians (both measured in that round), as median [min-max]
/// over the rounds: the pooled ratios above hide how far the rounds disagree, and on a
/// shared machine they disagree a lot. Rounds where either side failed are left out.
fn round_ratios(
    ms: &[Measurement],
    system: &str,
    coll: Coll,
    dtype: Option<&str>,
    small: bool,
    bytes: Option<u64>,
) -> Option<(f64, f64, f64)> {
    let pick = |sys: &str, round: u32| {
        ms.iter().find(|m| {
            m.system == sys
                && m.round == round
                && m.collective == coll
                && m.small == small
                && dtype.is_none_or(|d| m.dtype == d)
                && bytes.is_none_or(|b| m.bytes == b)
                && m.status == "ok"
                && !m.times_us.is_empty()
        })
    };
    let ratios: Vec<f64> = (0..rounds_of(ms) as u32)
        .filter_map(|r| Some(pick(system, r)?.median_us() / pick("mpi", r)?.median_us()))
        .collect();
    let lo = ratios.iter().copied().reduce(f64::min)?;
    let hi = ratios.iter().copied().reduce(f64::max)?;
    Some((median(&ratios), lo, hi))
}

fn per_round_ratios(
    o: &mut String,
    ms: &[Measurement],
    backends: &[&String],
    sizes: &[(Coll, String, u64)],
) {
    let _ = writeln!(
        o,
        "== INC time / MPI time per round: median [min-max] over the rounds of each round's \
         ratio of medians"
    );
    ratio_table(o, backends, sizes, 20, |b, row| {
        let r = match row {
            Row::Size(coll, dtype, bytes) => {
                round_ratios(ms, b, coll, Some(dtype), false, Some(bytes))
            }
            Row::Small(coll) => round_ratios(ms, b, coll, None, true, None),
        };
        r.map_or(format!("{:>20}", "-"), |(m, lo, hi)| {
            format!("{:>20}", format!("{m:.2} [{lo:.2}-{hi:.2}]"))
        })
    });
}

/// A row of an INC / MPI table.
#[derive(Clone, Copy)]
enum Row<'a> {
    /// This collective, datatype and size.
    Size(Coll, &'a str, u64),
    /// The small-message test of this collective (p50).
    Small(Coll),
}

/// The header, a row per collective and size, then the 1-element AllReduce and
/// Barrier rows, with `cell(backend, row)` (`width` wide) in each backend's column.
fn ratio_table(
    o: &mut String,
    backends: &[&String],
    sizes: &[(Coll, String, u64)],
    width: usize,
    cell: impl Fn(&str, Row<'_>) -> String,
) {
    let header: String = backends.iter().map(|b| format!("{b:>width$}")).collect();
    let _ = writeln!(o, "# {:<13} {:<8} {:>11} {header}", "collective", "type", "size");
    for (coll, dtype, bytes) in sizes {
        let cells: String =
            backends.iter().map(|b| cell(b, Row::Size(*coll, dtype, *bytes))).collect();
        let _ =
            writeln!(o, "  {:<13} {:<8} {:>11} {cells}", coll.name(), dtype, human_size(*bytes));
    }
    for (small_kind, coll) in
        [("1-element AllReduce p50", Coll::AllReduce), ("Barrier p50", Coll::Barrier)]
    {
        let cells: String = backends.iter().map(|b| cell(b, Row::Small(coll))).collect();
        let _ = writeln!(o, "  {:<35} {cells}", small_kind);
    }
}

/// The ratios of the issue: INC / MPI time per size, backend / testpmd frames/s, best
/// backend / pcap.
pub fn ratios(rows: &[Summary], refs: &[FrameRate], backends: &[String], res: &Results) -> String {
    let mut o = String::new();
    let ok_backends: Vec<&String> = backends
        .iter()
        .filter(|b| rows.iter().any(|r| &r.system == *b && r.status == "ok"))
        .collect();
    // The collectives MPI is measured with, in this order.
    let order = [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather];
    let mut sizes: Vec<(Coll, String, u64)> = rows
        .iter()
        .filter(|r| order.contains(&r.collective) && !r.small && r.iters > 0)
        .map(|r| (r.collective, r.dtype.clone(), r.bytes))
        .collect();
    sizes.sort_by_key(|(c, d, b)| (order.iter().position(|o| o == c), d.clone(), *b));
    sizes.dedup();
    let _ = writeln!(
        o,
        "== INC time / MPI time (median over iterations; < 1: INC faster; ReduceScatter and \
         AllGather: size = S, the whole vector of {} blocks)",
        res.world
    );
    let small = |system: &str, coll: Coll| {
        rows.iter()
            .find(|r| r.system == system && r.small && r.collective == coll && r.status == "ok")
    };
    ratio_table(&mut o, &ok_backends, &sizes, 12, |b, row| {
        let (inc, mpi) = match row {
            Row::Size(coll, dtype, bytes) => (
                find(rows, b, coll, dtype, bytes, false),
                find(rows, "mpi", coll, dtype, bytes, false),
            ),
            Row::Small(coll) => (small(b, coll), small("mpi", coll)),
        };
        let ratio = inc.zip(mpi).map(|(i, m)| i.median_us / m.median_us);
        ratio.map_or(format!("{:>12}", "-"), |v| format!("{v:>12.2}"))
    });
    if rounds_of(&res.measurements) > 1 {
        per_round_ratios(&mut o, &res.measurements, &ok_backends, &sizes);
    }
    let testpmd = refs
        .iter()
        .filter(|r| r.system == "testpmd-io" && r.status == "ok")
        .map(|r| r.forwarded_fps)
        .reduce(f64::max);
    let kernel = refs
        .iter()
        .filter(|r| r.system == "kernel-forwarding" && r.status == "ok")
        .map(|r| r.forwarded_fps)
        .reduce(f64::max);
    let _ = writeln!(o, "== switch frames/s (all switches, frames in, best AllReduce size) / forwarders' frames/s on the same path");
    for b in &ok_backends {
        let fps = best_switch_fps(rows, b);
        let r = |x: Option<f64>| fps.zip(x).map_or("-".into(), |(a, b)| format!("{:.3}", a / b));
        let _ =
            writeln!(o, "  {:<10} / testpmd-io {:>7}   / kernel {:>7}", b, r(testpmd), r(kernel));
    }
    if ok_backends.iter().any(|b| b.as_str() == "pcap") {
        let _ = writeln!(
            o,
            "== best backend vs pcap, AllReduce: pcap time / best time (> 1: best is faster)"
        );
        for (coll, dtype, bytes) in &sizes {
            let Some(p) = find(rows, "pcap", *coll, dtype, *bytes, false) else { continue };
            let best = ok_backends
                .iter()
                .filter_map(|b| find(rows, b, *coll, dtype, *bytes, false))
                .min_by(|a, b| a.median_us.total_cmp(&b.median_us));
            if let Some(best) = best {
                let _ = writeln!(
                    o,
                    "  {:<13} {:<8} {:>11} {:>8.2}  best: {}",
                    coll.name(),
                    dtype,
                    human_size(*bytes),
                    p.median_us / best.median_us,
                    best.system
                );
            }
        }
    } else {
        let _ = writeln!(o, "== best backend vs pcap: no pcap measurement in this run");
    }
    o += &host_bytes_table(res);
    o += &overlap_table(&res.measurements, backends, res.overlap_requests);
    o
}

/// Bytes each host sent and received per iteration, counted on its interface, for
/// each collective and system, with the mean over hosts as a multiple of the size.
pub fn host_bytes_table(res: &Results) -> String {
    let mut o = String::new();
    if res.host_bytes.is_empty() {
        return o;
    }
    let _ = writeln!(
        o,
        "== bytes per host per iteration (interface counters): mean over hosts / size, then \
         each rank's sent/received (size: the vector; ReduceScatter and AllGather: S, the \
         whole vector of {} blocks)",
        res.world
    );
    let _ = writeln!(
        o,
        "# {:<13} {:<11} {:>11} {:>7} {:>7}  per rank sent/received (MiB)",
        "collective", "system", "size", "sent/S", "recv/S"
    );
    let order = [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather];
    let mut hbs: Vec<&crate::model::HostBytes> = res.host_bytes.iter().collect();
    hbs.sort_by_key(|h| {
        (order.iter().position(|c| *c == h.collective), h.system.starts_with("mpi"))
    });
    for hb in hbs {
        let n = hb.per_host.len().max(1) as f64;
        let s = hb.bytes.max(1) as f64;
        let sent = hb.per_host.iter().map(|p| p.0).sum::<f64>() / n / s;
        let recv = hb.per_host.iter().map(|p| p.1).sum::<f64>() / n / s;
        let cells: Vec<String> = hb
            .per_host
            .iter()
            .map(|(t, r)| format!("{:.2}/{:.2}", t / 1048576.0, r / 1048576.0))
            .collect();
        let _ = writeln!(
            o,
            "  {:<13} {:<11} {:>11} {:>7.3} {:>7.3}  {}",
            hb.collective.name(),
            hb.system,
            human_size(hb.bytes),
            sent,
            recv,
            cells.join("  ")
        );
    }
    o
}

/// The timed parts of the overlap measurement (inc-bench-rank's names).
const PARTS: [&str; 7] =
    ["blocking", "nonblocking", "collective", "compute", "overlapped", "idle", "idleoverlapped"];

/// One backend's overlap measurement, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct OverlapSummary {
    /// Backend.
    pub system: String,
    /// Bytes of each AllReduce.
    pub bytes: u64,
    /// Rounds measured (passed).
    pub rounds: usize,
    /// Median (pooled over rounds) of each part: blocking, nonblocking, collective,
    /// compute, overlapped (us).
    pub median_us: BTreeMap<String, f64>,
    /// Per round: nonblocking / blocking, of the round's medians.
    pub nb_over_b: Vec<f64>,
    /// Per repetition of every round: nonblocking / blocking of that repetition (the
    /// two batches run back to back, in alternating order).
    pub nb_over_b_paired: Vec<f64>,
    /// Of the repetitions whose two batches differ: how many the non-blocking batch
    /// was faster in, how many there were, and the sign test's two-sided p-value.
    pub nb_faster: (usize, usize, f64),
    /// Per round: (compute + collective) / overlapped, of the round's medians.
    pub speedup: Vec<f64>,
    /// Per round: overlapped / max(compute, collective).
    pub over_max: Vec<f64>,
    /// Per round: (idle + collective) / idleoverlapped (a sleep instead of the busy
    /// loop), of the round's medians.
    pub idle_speedup: Vec<f64>,
    /// "ok" or the first failure.
    pub status: String,
}

/// Summaries of the overlap measurements, per backend in `backends` order.
pub fn overlap_summaries(ms: &[Measurement], backends: &[String]) -> Vec<OverlapSummary> {
    let mut out = Vec::new();
    for b in backends {
        let mine: Vec<&Measurement> =
            ms.iter().filter(|m| &m.system == b && m.collective == Coll::Overlap).collect();
        let Some(first) = mine.first() else { continue };
        let ok: Vec<&&Measurement> =
            mine.iter().filter(|m| m.ok() && !m.parts.is_empty()).collect();
        let part = |m: &Measurement, p: &str| m.parts.get(p).map_or(0.0, |v| median(v));
        let ratio = |f: &dyn Fn(&Measurement) -> f64| -> Vec<f64> {
            ok.iter().map(|m| f(m)).filter(|v| v.is_finite()).collect()
        };
        let pooled = |p: &str| -> Vec<f64> {
            ok.iter().flat_map(|m| m.parts.get(p).cloned().unwrap_or_default()).collect()
        };
        let (blocking, nonblocking) = (pooled("blocking"), pooled("nonblocking"));
        let mut median_us = BTreeMap::new();
        for p in PARTS {
            median_us.insert(p.to_string(), median(&pooled(p)));
        }
        out.push(OverlapSummary {
            system: b.clone(),
            bytes: first.bytes,
            rounds: ok.len(),
            median_us,
            nb_over_b: ratio(&|m| part(m, "nonblocking") / part(m, "blocking")),
            nb_over_b_paired: nonblocking.iter().zip(&blocking).map(|(n, b)| n / b).collect(),
            nb_faster: sign_test(&nonblocking, &blocking),
            speedup: ratio(&|m| {
                (part(m, "compute") + part(m, "collective")) / part(m, "overlapped")
            }),
            over_max: ratio(&|m| {
                part(m, "overlapped") / part(m, "compute").max(part(m, "collective"))
            }),
            idle_speedup: ratio(&|m| {
                (part(m, "idle") + part(m, "collective")) / part(m, "idleoverlapped")
            }),
            status: mine.iter().find(|m| !m.ok()).map_or("ok".into(), |m| m.status.clone()),
        });
    }
    out
}

/// median [min-max] of per-round values.
fn range_text(v: &[f64]) -> String {
    match (v.iter().copied().reduce(f64::min), v.iter().copied().reduce(f64::max)) {
        (Some(lo), Some(hi)) => format!("{:.2} [{lo:.2}-{hi:.2}]", median(v)),
        _ => "-".into(),
    }
}

/// The overlap table: times pooled over rounds, ratios per round.
pub fn overlap_table(ms: &[Measurement], backends: &[String], requests: u32) -> String {
    let mut o = String::new();
    let sums = overlap_summaries(ms, backends);
    let Some(first) = ms.iter().find(|m| m.collective == Coll::Overlap) else { return o };
    let _ = writeln!(
        o,
        "== overlap, int32 sum AllReduces of {}. Batch: {requests} of them blocking one \
         after another vs started non-blocking and then waited for. Compute: C one \
         non-blocking AllReduce alone, T a busy loop alone, overlapped the busy loop while \
         it runs; idle: the same with a sleep of about C instead of the busy loop (compute \
         that leaves the CPUs free). Times: medians over every iteration of every round \
         (slowest rank); ratios: median [min-max] over the rounds of each round's medians",
        human_size(first.bytes)
    );
    let _ = writeln!(
        o,
        "# {:<10} {:>6} {:>12} {:>12} {:>20}  status",
        "system", "rounds", "blocking", "non-block.", "non-block./blocking"
    );
    let _ = writeln!(o, "# {:<10} {:>6} {:>12} {:>12}", "", "", "(us, batch)", "(us, batch)");
    let t = |s: &OverlapSummary, p: &str| s.median_us.get(p).copied().unwrap_or(0.0);
    for s in &sums {
        let _ = writeln!(
            o,
            "  {:<10} {:>6} {:>12.0} {:>12.0} {:>20}  {}",
            s.system,
            s.rounds,
            t(s, "blocking"),
            t(s, "nonblocking"),
            range_text(&s.nb_over_b),
            s.status
        );
    }
    for s in &sums {
        let (faster, n, p) = s.nb_faster;
        let _ = writeln!(
            o,
            "  {:<10} per repetition (paired): non-block./blocking {:.3} [{:.3}-{:.3}] \
             (median [quartiles]); non-blocking faster in {faster} of {n} (sign test \
             p = {p:.2e})",
            s.system,
            median(&s.nb_over_b_paired),
            quantile(&s.nb_over_b_paired, 0.25),
            quantile(&s.nb_over_b_paired, 0.75),
        );
    }
    let _ = writeln!(
        o,
        "# {:<10} {:>9} {:>9} {:>10} {:>18} {:>19} {:>9} {:>10} {:>18}",
        "system",
        "C coll.",
        "T busy",
        "overlap.",
        "(T+C)/overlapped",
        "overlapped/max",
        "idle",
        "idle-ov.",
        "(idle+C)/idle-ov."
    );
    let _ = writeln!(
        o,
        "# {:<10} {:>9} {:>9} {:>10} {:>18} {:>19} {:>9} {:>10}",
        "", "(us)", "(us)", "(us)", "", "(T,C)", "(us)", "(us)"
    );
    for s in &sums {
        let _ = writeln!(
            o,
            "  {:<10} {:>9.0} {:>9.0} {:>10.0} {:>18} {:>19} {:>9.0} {:>10.0} {:>18}",
            s.system,
            t(s, "collective"),
            t(s, "compute"),
            t(s, "overlapped"),
            range_text(&s.speedup),
            range_text(&s.over_max),
            t(s, "idle"),
            t(s, "idleoverlapped"),
            range_text(&s.idle_speedup),
        );
    }
    o
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// CSV header of [`csv`].
pub const CSV_HEADER: &str = "system,collective,dtype,small,bytes,count,rounds,iters,median_us,min_us,max_us,p99_us,spread,algbw_gbs,busbw_gbs,switch_rx_fps,switch_tx_fps,per_switch,retransmits,rnrs,drops,switch_cpu_s,switch_ns_per_frame,host_cpu_s,status";

/// One CSV line per summary row.
pub fn csv(rows: &[Summary]) -> String {
    let mut o = format!("{CSV_HEADER}\n");
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    for r in rows {
        let per: Vec<String> =
            r.per_switch.iter().map(|(n, i, t)| format!("{n}:{i:.0}/{t:.0}")).collect();
        let _ = writeln!(
            o,
            "{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.4},{:.6},{:.6},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&r.system), r.collective.name(), r.dtype, r.small, r.bytes, r.count, r.rounds,
            r.iters, r.median_us, r.min_us, r.max_us, r.p99_us, r.spread, r.algbw, r.busbw,
            opt(r.switch_rx_fps), opt(r.switch_tx_fps), csv_field(&per.join(" ")), r.retransmits,
            r.rnrs, csv_field(&drops_text(&r.drops)), opt(r.switch_cpu_s),
            opt(r.switch_ns_per_frame), opt(r.host_cpu_s), csv_field(&r.status)
        );
    }
    o
}

/// Write table, ratios, CSV and JSON into `out`; returns the text printed.
pub fn write_all(out: &Path, res: &Results) -> anyhow::Result<(String, Vec<Summary>)> {
    let rows = summarize(&res.measurements, res.world);
    let backends = res.supported_backends.clone();
    let mut text = table(&rows);
    text += "\n";
    text += &frame_table(&res.frame_rates, &rows, &backends);
    text += "\n";
    text += &ratios(&rows, &res.frame_rates, &backends, res);
    // The file also says where it was measured (the run prints these lines at its end).
    let mut file = format!("{text}\nmachine: {}\n", res.machine);
    for n in &res.notes {
        let _ = writeln!(file, "note: {n}");
    }
    std::fs::write(out.join("table.txt"), file)?;
    std::fs::write(out.join("results.csv"), csv(&rows))?;
    let mut fr = String::from("system,round,frame_len,hops,offered_fps,delivered_fps,forwarded_fps,forwarder_cores,status\n");
    for r in &res.frame_rates {
        let _ = writeln!(
            fr,
            "{},{},{},{},{:.0},{:.0},{:.0},{:.3},{}",
            r.system,
            r.round,
            r.frame_len,
            r.hops,
            r.offered_fps,
            r.delivered_fps,
            r.forwarded_fps,
            r.forwarder_cores,
            csv_field(&r.status)
        );
    }
    std::fs::write(out.join("frame_rates.csv"), fr)?;
    let overlap = overlap_summaries(&res.measurements, &backends);
    let json = serde_json::json!({ "results": res, "summary": rows, "overlap": overlap });
    std::fs::write(out.join("results.json"), serde_json::to_string_pretty(&json)?)?;
    Ok((text, rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SwitchDelta, SwitchSample};

    fn m(system: &str, bytes: u64, times: &[f64], round: u32) -> Measurement {
        let mut m = Measurement::skipped(system, Coll::AllReduce, "int32", bytes, "ok");
        m.times_us = times.to_vec();
        m.round = round;
        m.iters = times.len() as u32;
        if system != "mpi" {
            m.switch = Some(SwitchSample {
                backend: system.into(),
                cpu_s: 1.0,
                rss_bytes: 0,
                switches: vec![SwitchDelta {
                    name: "root".into(),
                    rx_frames: 1000,
                    rx_fps: 500.0,
                    ..Default::default()
                }],
            });
        }
        m
    }

    #[test]
    fn summary_pools_rounds_and_ratios_compare_like_with_like() {
        let ms = vec![
            m("af_packet", 1024, &[10.0, 12.0], 0),
            m("mpi", 1024, &[5.0, 5.0], 0),
            m("af_packet", 1024, &[11.0, 30.0], 1),
            m("mpi", 1024, &[5.0, 6.0], 1),
        ];
        let rows = summarize(&ms, 4);
        assert_eq!(rows.len(), 2);
        let a = &rows[0];
        assert_eq!((a.rounds, a.iters, a.median_us, a.max_us), (2, 4, 11.0, 30.0));
        assert_eq!(a.switch_ns_per_frame, Some(1e6));
        assert!((a.busbw / a.algbw - 1.5).abs() < 1e-12);
        let res = Results {
            command: String::new(),
            machine: String::new(),
            scheduling: None,
            topology: String::new(),
            world: 4,
            mtu: 1024,
            started: String::new(),
            duration_s: 0.0,
            supported_backends: vec!["af_packet".into()],
            measurements: ms,
            frame_rates: vec![],
            host_bytes: vec![],
            notes: vec![],
            overlap_requests: 8,
        };
        let r = ratios(&rows, &[], &res.supported_backends, &res);
        assert!(r.contains("2.20"), "{r}");
        // Per round (`stats::median` takes the lower middle of an even count): round 0
        // 10 / 5 = 2.0, round 1 11 / 5 = 2.2.
        assert!(r.contains("2.00 [2.00-2.20]"), "{r}");
        assert!(!r.contains("== overlap"), "{r}");
        let c = csv(&rows);
        assert_eq!(c.lines().count(), 3);
        let cols = CSV_HEADER.split(',').count();
        assert!(c.lines().all(|l| l.split(',').count() == cols), "{c}");
    }

    #[test]
    fn overlap_ratios_per_round_and_bytes_per_host() {
        let mut ms = Vec::new();
        for (round, nb) in [(0, 80.0), (1, 120.0)] {
            let mut m = Measurement::skipped("af_packet", Coll::Overlap, "int32", 8 << 20, "ok");
            m.round = round;
            for (p, v) in [
                ("blocking", vec![100.0, 100.0, 100.0]),
                ("nonblocking", vec![nb, nb, 1.0]),
                ("collective", vec![10.0]),
                ("compute", vec![10.0]),
                ("overlapped", vec![16.0]),
                ("idle", vec![10.0]),
                ("idleoverlapped", vec![10.0]),
            ] {
                m.parts.insert(p.into(), v);
            }
            ms.push(m);
        }
        let s = overlap_summaries(&ms, &["af_packet".into(), "pcap".into()]);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].rounds, s[0].nb_over_b.clone()), (2, vec![0.8, 1.2]));
        assert_eq!(s[0].speedup, vec![1.25, 1.25]);
        assert_eq!(s[0].over_max, vec![1.6, 1.6]);
        assert_eq!(s[0].idle_speedup, vec![2.0, 2.0]);
        let t = overlap_table(&ms, &["af_packet".into()], 8);
        assert!(t.contains("Batch: 8 of them") && t.contains("0.80 [0.80-1.20]"), "{t}");
        // Pairs: 0.8, 0.8, 0.01 (round 0), 1.2, 1.2, 0.01 (round 1): 4 of 6 faster.
        assert_eq!(s[0].nb_over_b_paired, vec![0.8, 0.8, 0.01, 1.2, 1.2, 0.01]);
        assert_eq!((s[0].nb_faster.0, s[0].nb_faster.1), (4, 6));
        assert!(t.contains("non-blocking faster in 4 of 6 (sign test p = 6.88e-1)"), "{t}");
        // Overlap measurements stay out of the size table.
        assert!(summarize(&ms, 4).is_empty());

        let mut res = Results {
            command: String::new(),
            machine: String::new(),
            scheduling: None,
            topology: String::new(),
            world: 2,
            mtu: 4096,
            started: String::new(),
            duration_s: 0.0,
            supported_backends: vec![],
            measurements: vec![],
            frame_rates: vec![],
            host_bytes: vec![],
            notes: vec![],
            overlap_requests: 8,
        };
        let mib = 1048576.0;
        for (system, coll, per_host) in [
            ("mpi-ring", Coll::AllGather, vec![(0.5 * mib, 0.5 * mib), (0.5 * mib, 0.5 * mib)]),
            ("af_packet", Coll::AllGather, vec![(0.5 * mib, 0.5 * mib), (0.5 * mib, 0.5 * mib)]),
            ("af_packet", Coll::ReduceScatter, vec![(mib, 0.5 * mib), (mib, 0.5 * mib)]),
        ] {
            res.host_bytes.push(crate::model::HostBytes {
                system: system.into(),
                collective: coll,
                bytes: 1 << 20,
                per_host,
            });
        }
        let t = host_bytes_table(&res);
        let lines: Vec<&str> = t.lines().skip(2).collect();
        assert!(lines[0].starts_with("  reducescatter af_packet"), "{t}");
        assert!(lines[0].contains("1.000   0.500  1.00/0.50  1.00/0.50"), "{t}");
        assert!(lines[1].contains("allgather     af_packet"), "{t}");
        assert!(lines[2].contains("allgather     mpi-ring"), "{t}");
    }
}
