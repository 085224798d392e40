//! `inc-sim`: predicts an INC collective's completion time on a topology YAML by
//! running the real switch and host engines over a discrete-event network model.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use inc_link_spec::Impairments;
use inc_sim::analytic::Analytic;
use inc_sim::{Collective, Sim, SimConfig, SimReport};
use inc_wire::{DataType, Operator};
use serde::Serialize;

/// Simulate one INC collective on a topology with the real switch and host engines.
///
/// Every switch of the topology runs the real switch engine with the rules the
/// controller compiles for a communicator of all the topology's hosts (rank i = the
/// i-th host of the YAML); every host runs the real host engine. Links are modelled
/// per direction: serialisation at a rate, a propagation delay, a finite drop-tail
/// output queue, and the YAML's link emulation (`emulate:` loss, burst, dup, reorder,
/// corrupt, jitter; its `rate`, `delay` and `limit` override the defaults below).
/// Simulated time is exact and the run is deterministic for a seed. Every element of
/// every receiving rank is checked against the expected result.
///
/// Example: inc-controller gen tree --fanout 8,8 --hosts-per-leaf 16 -o t.yaml &&
///          inc-sim --topology t.yaml --collective allreduce --size 1M --compare ring
#[derive(Debug, Parser)]
#[command(name = "inc-sim", version)]
struct Args {
    /// Topology YAML (as `inc-controller check` accepts; `inc-controller gen tree` output too).
    #[arg(long, short)]
    topology: PathBuf,
    /// Collective to run.
    #[arg(long, short, value_enum, default_value_t = Coll::Allreduce)]
    collective: Coll,
    /// Bytes per rank: a number with an optional K, M or G suffix (powers of 1024;
    /// KiB, MiB, GiB accepted too). For reducescatter and allgather the whole vector
    /// of one block per rank (ReduceScatter's input, AllGather's output), rounded
    /// down to whole blocks of whole elements.
    #[arg(long, short, default_value = "1M")]
    size: String,
    /// Element type (int32, float32, int8, uint8, uint32, int64, uint64, float16, bfloat16, float64).
    #[arg(long, default_value = "int32")]
    dtype: String,
    /// Reduction operator (sum, max, min, ...; must apply to the type).
    #[arg(long, default_value = "sum")]
    op: String,
    /// Root rank of reduce and broadcast.
    #[arg(long, default_value_t = 0)]
    root: u16,
    /// Seed of inputs, PSNs and link faults: the same seed replays the same run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also print the analytical ring AllReduce time on the same links
    /// (2(n-1)/n·S/B + 2(n-1)·α) and INC's speed-up over it; for reducescatter and
    /// allgather their own ring ((n-1)/n·S/B + (n-1)·α, S the whole vector).
    #[arg(long, value_enum)]
    compare: Option<Compare>,
    /// Link rate where the YAML's emulation gives none (e.g. 100gbit, 200mbit).
    #[arg(long, default_value = "100gbit")]
    link_rate: String,
    /// Propagation delay where the YAML's emulation gives none (e.g. 1us, 500ns, 2ms).
    #[arg(long, default_value = "1us")]
    link_delay: String,
    /// Per-frame processing time of a switch, ns (frames queue while it is busy).
    #[arg(long, default_value_t = 0)]
    switch_frame_cost: u64,
    /// Per-frame processing time of a host, ns.
    #[arg(long, default_value_t = 0)]
    host_frame_cost: u64,
    /// Where a host's unsent frames wait: `nic` takes 4 frames at a time from the
    /// engine as it transmits (a RoCE NIC, and the emulator's paced hosts); `link` hands
    /// the link every frame the engine has at once, so retransmissions and ACKs queue
    /// behind all of them, like the emulator's hosts with `INCCL_NIC_PACING=off`
    /// (docs/SIMULATION.md, validation 2, compares both).
    #[arg(long, value_enum, default_value_t = HostQueue::Nic)]
    host_queue: HostQueue,
    /// Output queue per link direction in frames (waiting or being serialised);
    /// frames beyond it are dropped (tail drop). A YAML `limit=` overrides it.
    #[arg(long, default_value_t = inc_link_spec::DEFAULT_LIMIT)]
    queue_frames: usize,
    /// Extra bytes per frame on the wire (24 for preamble, IFG and FCS); 0 counts
    /// frame bytes only, as the emulator's rate limiter does.
    #[arg(long, default_value_t = 0)]
    wire_overhead: u32,
    /// Payload bytes per chunk (else the YAML's defaults.mtu).
    #[arg(long)]
    mtu: Option<u16>,
    /// Chunks in flight per connection (else the YAML's defaults.window).
    #[arg(long)]
    window: Option<u32>,
    /// Give up at this simulated time, seconds.
    #[arg(long, default_value_t = 600.0)]
    max_time: f64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Coll {
    Allreduce,
    Reduce,
    Broadcast,
    /// The size is the whole vector of one block per rank (rounded down to whole
    /// blocks of whole elements); rank r gets the reduction of block r.
    Reducescatter,
    /// The size is the whole vector of one block per rank (rounded down likewise);
    /// rank r sends block r, every rank gets all.
    Allgather,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Csv,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Compare {
    Ring,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HostQueue {
    Nic,
    Link,
}

fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().with_context(|| format!("--size {s}: expected a number"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "ki" => 1 << 10,
        "m" | "mib" | "mi" => 1 << 20,
        "g" | "gib" | "gi" => 1 << 30,
        other => bail!("--size {s}: unknown unit `{other}` (use K, M or G)"),
    };
    n.checked_mul(mult).with_context(|| format!("--size {s}: too large"))
}

#[derive(Debug, Serialize)]
struct Output<'a> {
    #[serde(flatten)]
    report: &'a SimReport,
    analytic: Analytic,
    in_network_bound_error: f64,
    wall_total_s: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let wall = Instant::now();
    let dtype: DataType = args.dtype.parse().context("--dtype")?;
    let op: Operator = args.op.parse().context("--op")?;
    let rate = |s: &str| -> Result<u64> {
        format!("rate={s}")
            .parse::<Impairments>()
            .with_context(|| format!("--link-rate {s}"))?
            .rate_bps
            .context("--link-rate")
    };
    let delay = |s: &str| -> Result<u64> {
        Ok(format!("delay={s}")
            .parse::<Impairments>()
            .with_context(|| format!("--link-delay {s}"))?
            .delay
            .as_nanos() as u64)
    };
    let collective = match args.collective {
        Coll::Allreduce => Collective::AllReduce,
        Coll::Reduce => Collective::Reduce { root: args.root },
        Coll::Broadcast => Collective::Broadcast { root: args.root },
        Coll::Reducescatter => Collective::ReduceScatter,
        Coll::Allgather => Collective::AllGather,
    };
    let cfg = SimConfig {
        collective,
        dtype,
        op,
        bytes: parse_size(&args.size)?,
        seed: args.seed,
        link_rate_bps: rate(&args.link_rate)?,
        link_delay: delay(&args.link_delay)?,
        queue_frames: args.queue_frames,
        switch_frame_cost: args.switch_frame_cost,
        host_frame_cost: args.host_frame_cost,
        host_tx_ahead: match args.host_queue {
            HostQueue::Nic => inc_sim::HOST_TX_BATCH,
            HostQueue::Link => inc_sim::HOST_TX_ALL,
        },
        wire_overhead: args.wire_overhead,
        mtu: args.mtu,
        window: args.window,
        max_time: (args.max_time * 1e9) as u64,
    };
    let sim = Sim::load(&args.topology, cfg)
        .with_context(|| format!("setting up {}", args.topology.display()))?;
    let analytic = sim.analytic();
    let report = sim.run().with_context(|| format!("simulating on {}", args.topology.display()))?;
    let out = Output {
        report: &report,
        analytic,
        in_network_bound_error: report.time_ns as f64 / analytic.in_network_ns - 1.0,
        wall_total_s: wall.elapsed().as_secs_f64(),
    };
    let mut text = String::new();
    match args.format {
        Format::Json => text = serde_json::to_string_pretty(&out)? + "\n",
        Format::Csv => print_csv(&mut text, &out, args.compare.is_some()),
        Format::Table => print_table(&mut text, &out, args.compare.is_some()),
    }
    // A closed pipe (`| head`) is not an error of the simulation.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("writing the results")
        }
        _ => Ok(()),
    }
}

fn print_csv(out: &mut String, o: &Output<'_>, ring: bool) {
    let r = o.report;
    let mut head = "topology,collective,dtype,op,bytes,hosts,switches,mtu,window,seed,time_us,algbw_gbs,busbw_gbs,bound_us,bound_error,frames,wire_bytes,retransmissions,queue_drops,lost,verified_ranks,events,events_per_s,wall_s".to_string();
    let mut row = format!(
        "{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.5},{},{},{},{},{},{},{},{:.0},{:.3}",
        r.topology,
        r.collective,
        r.dtype,
        r.op,
        r.bytes,
        r.hosts,
        r.switches,
        r.mtu,
        r.window,
        r.seed,
        r.time_ns as f64 / 1e3,
        r.algbw_gbs,
        r.busbw_gbs,
        o.analytic.in_network_ns / 1e3,
        o.in_network_bound_error,
        r.frames,
        r.wire_bytes,
        r.retransmissions,
        r.queue_drops,
        r.lost,
        r.verified_ranks,
        r.events,
        r.events_per_s,
        o.wall_total_s
    );
    if ring {
        head.push_str(",ring_us,inc_speedup");
        row.push_str(&format!(
            ",{:.3},{:.3}",
            o.analytic.ring_ns / 1e3,
            o.analytic.ring_ns / r.time_ns.max(1) as f64
        ));
    }
    let _ = writeln!(out, "{head}\n{row}");
}

fn rate_text(bps: u64) -> String {
    match bps {
        b if b >= 1_000_000_000 && b % 1_000_000_000 == 0 => format!("{}Gb/s", b / 1_000_000_000),
        b if b >= 1_000_000 && b % 1_000_000 == 0 => format!("{}Mb/s", b / 1_000_000),
        b => format!("{b}b/s"),
    }
}

fn print_table(out: &mut String, o: &Output<'_>, ring: bool) {
    let r = o.report;
    let a = &o.analytic;
    let _ = writeln!(
        out,
        "== {} {} {} x {} bytes on {} ({} hosts, {} switches, mtu {}, window {}, seed {})",
        r.collective,
        r.dtype,
        r.op,
        r.bytes,
        r.topology,
        r.hosts,
        r.switches,
        r.mtu,
        r.window,
        r.seed
    );
    let _ = writeln!(
        out,
        "time            {:>12.3} us   (first rank done at {:.3} us)",
        r.time_ns as f64 / 1e3,
        r.first_ns as f64 / 1e3
    );
    let _ = writeln!(out, "algbw           {:>12.3} GB/s", r.algbw_gbs);
    let _ = writeln!(out, "busbw           {:>12.3} GB/s", r.busbw_gbs);
    let _ = writeln!(
        out,
        "in-network bound{:>12.3} us   (fill {:.3} us, {} hops up; simulated is {:+.2}%)",
        a.in_network_ns / 1e3,
        a.fill_ns / 1e3,
        a.max_hops,
        o.in_network_bound_error * 100.0
    );
    if ring {
        let _ = writeln!(
            out,
            "ring {:<10} {:>12.3} us   (B {}, α {} ns; INC is {:.2}x the ring's speed)",
            match r.collective {
                c @ ("reducescatter" | "allgather") => c,
                _ => "allreduce",
            },
            a.ring_ns / 1e3,
            rate_text(a.ring_rate_bps),
            a.ring_alpha_ns,
            a.ring_ns / r.time_ns.max(1) as f64
        );
    }
    let _ = writeln!(out, "frames          {:>12}      ({} wire bytes)", r.frames, r.wire_bytes);
    let _ = writeln!(out, "retransmissions {:>12}", r.retransmissions);
    let _ = writeln!(
        out,
        "drops           {:>12}      (queue full; link emulation: {} lost, {} corrupted, {} duplicated, {} reordered)",
        r.queue_drops, r.lost, r.corrupted, r.duplicated, r.reordered
    );
    if r.verified_ranks == r.receiving_ranks {
        let _ = writeln!(
            out,
            "checked         {:>12}      of {} receiving ranks, every element",
            r.verified_ranks, r.receiving_ranks
        );
    } else {
        let _ = writeln!(
        out,
            "checked         {:>12}      of {} receiving ranks, every element: a sample (above {} ranks, evenly spread ranks and the root keep their own buffers; the others send {} shared input patterns, included in the expected result, and their outputs are not kept)",
            r.verified_ranks,
            r.receiving_ranks,
            inc_sim::sim::SAMPLE_RANKS,
            inc_sim::sim::PATTERNS
        );
    }
    let _ = writeln!(out, "busiest link directions:");
    for l in &r.busiest {
        let _ = writeln!(
            out,
            "  {:>6.2}%  {:<40} {:>10}  {} frames, max queue {}",
            l.utilisation * 100.0,
            l.name,
            rate_text(l.rate_bps),
            l.stats.frames,
            l.stats.max_queue
        );
    }
    for e in r.switch_events.iter().take(10) {
        let _ = writeln!(out, "switch event: {e}");
    }
    let _ = writeln!(
        out,
        "simulator       {} events in {:.3} s: {:.0} events/s; wall {:.3} s (setup {:.3}, inputs {:.3}, run {:.3}, verify {:.3}); peak {} frames in flight",
        r.events,
        r.wall.run_s,
        r.events_per_s,
        o.wall_total_s,
        r.wall.setup_s,
        r.wall.inputs_s,
        r.wall.run_s,
        r.wall.verify_s,
        r.peak_frames_in_flight
    );
}
