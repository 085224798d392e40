//! The run: rounds of (every backend, then the references), interleaved, then the
//! outputs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{elem_size, human_size, iterations, Args, Coll, Config};
use crate::inc::{run_hosts, supported_backends, Fabric, RunSpec};
use crate::kernel::KernelForwarding;
use crate::machine::SchedulingCosts;
use crate::model::{FrameRate, HostBytes, Measurement, Results};
use crate::mpi::{Mpi, RING, RING_ALLGATHER};
use crate::netns::{host_counters, Netns, Plan};
use crate::procs::{check_interrupted, install_signal_handler};
use crate::{plot, refs, report};

/// Directory holding scripts/netns-up: the current directory if it has one, else the
/// source tree this binary was built from.
fn repo_root() -> anyhow::Result<PathBuf> {
    let candidates = [
        std::env::current_dir()?,
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("no parent")?.to_path_buf(),
    ];
    candidates
        .into_iter()
        .find(|d| d.join("scripts/netns-up").is_file())
        .context("cannot find scripts/netns-up: run inc-bench from the repository root")
}

fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn live_line(m: &Measurement) -> String {
    let t = crate::stats::median(&m.times_us);
    let sw = m.switch.as_ref().map_or(String::new(), |s| {
        format!(
            "  switches {:.0} frames/s in, {:.0} ns CPU/frame, retx {}, rnr {}",
            s.rx_fps(),
            s.ns_per_frame(),
            s.retransmits(),
            s.rnrs()
        )
    });
    format!(
        "{:<10} {:<9} {:<7} {:>9} r{}: median {:>11.1} us over {:>4} iterations{}  {}",
        m.system,
        m.collective.name(),
        m.dtype,
        human_size(m.bytes),
        m.round,
        t,
        m.times_us.len(),
        sw,
        m.status
    )
}

/// Everything needed while measuring.
struct Ctx<'a> {
    cfg: &'a Config,
    plan: &'a Plan,
    bins: &'a Path,
    topology: &'a Path,
    logs: PathBuf,
    out: PathBuf,
    pb: ProgressBar,
    res: Results,
    master_port: u16,
    switch_args: String,
    prefix: String,
    /// TX checksum offload on the hosts' veths right now.
    host_tx_offload: bool,
}

impl Ctx<'_> {
    /// A line above the progress bar, or on stderr when there is no bar (not a terminal).
    fn say(&self, line: impl Into<String>) {
        let line = line.into();
        if self.pb.is_hidden() {
            eprintln!("{line}");
        } else {
            self.pb.println(line);
        }
    }

    fn record(&mut self, mut m: Measurement, round: u32) {
        m.round = round;
        self.say(live_line(&m));
        self.pb.inc(1);
        self.res.measurements.push(m);
    }

    /// Sets the hosts' veths up for `system` as `--host-tx-offload` says.
    fn host_tx_offload_for(&mut self, system: &str) -> anyhow::Result<()> {
        let on = self.cfg.host_tx_offload.wants(system);
        if on != self.host_tx_offload {
            crate::netns::set_host_tx_offload(self.plan, on)?;
            self.host_tx_offload = on;
        }
        Ok(())
    }

    fn next_port(&mut self) -> u16 {
        self.master_port = 52300 + (self.master_port + 1 - 52300) % 1000;
        self.master_port
    }

    /// Every size and the small-message tests on one backend.
    fn backend(&mut self, backend: &str, round: u32, first: bool) -> anyhow::Result<()> {
        self.pb.set_message(format!("starting the {backend} switch"));
        let fabric = match Fabric::start(
            self.plan,
            self.topology,
            self.bins,
            backend,
            &self.switch_args,
            &self.logs,
        ) {
            Ok(f) => f,
            Err(e) => {
                // A backend listed by --help but compiled out (e.g. dpdk without the
                // feature) is "not built", not a failure of the run.
                let text = format!("{e:#}");
                let why = match text.lines().find(|l| l.contains("built without")) {
                    Some(l) => format!("not built: {}", l.trim()),
                    None => format!("FAIL: {text}"),
                };
                for &coll in &self.cfg.collectives.clone() {
                    for dtype in &self.cfg.dtypes.clone() {
                        let mut m = Measurement::skipped(backend, coll, dtype, 0, &why);
                        m.round = round;
                        self.res.measurements.push(m);
                    }
                }
                self.say(format!("{backend}: {why}"));
                return Ok(());
            }
        };
        let world = self.plan.hosts.len();
        for &coll in &self.cfg.collectives.clone() {
            for dtype in &self.cfg.dtypes.clone() {
                for &bytes in &self.cfg.sizes.clone() {
                    let Some(count) = coll.count(dtype, bytes, world) else { continue };
                    check_interrupted()?;
                    let (warmup, iters) = iterations(self.cfg, bytes);
                    self.pb.set_message(format!(
                        "{backend} {} {dtype} {}",
                        coll.name(),
                        human_size(bytes)
                    ));
                    // The first datatype of each collective (AllReduce's directory
                    // keeps its name without the collective).
                    let perf = (first
                        && round == 0
                        && *dtype == self.cfg.dtypes[0]
                        && self.cfg.perf_size == Some(bytes))
                    .then(|| {
                        let size = human_size(bytes).replace(' ', "");
                        match coll {
                            Coll::AllReduce => self.out.join(format!("perf-{backend}-{size}")),
                            c => self.out.join(format!("perf-{backend}-{}-{size}", c.name())),
                        }
                    });
                    let spec = RunSpec {
                        coll,
                        dtype: dtype.clone(),
                        op: self.cfg.op.clone(),
                        count,
                        warmup,
                        iters,
                        master_port: self.next_port(),
                        perf_dir: perf,
                        extra: vec![],
                    };
                    let m = run_hosts(&fabric, self.plan, self.bins, &spec, &self.logs, backend)?;
                    self.record(m, round);
                }
            }
        }
        for coll in [Coll::AllReduce, Coll::Barrier] {
            check_interrupted()?;
            self.pb.set_message(format!("{backend} small-message {}", coll.name()));
            let spec = RunSpec {
                coll,
                dtype: self.cfg.dtypes[0].clone(),
                op: self.cfg.op.clone(),
                count: 1,
                warmup: 10,
                iters: self.cfg.small_iters,
                master_port: self.next_port(),
                perf_dir: None,
                extra: vec![],
            };
            let mut m = run_hosts(&fabric, self.plan, self.bins, &spec, &self.logs, backend)?;
            m.small = true;
            self.record(m, round);
        }
        if self.cfg.overlap {
            check_interrupted()?;
            self.pb.set_message(format!("{backend} overlap"));
            let spec = RunSpec {
                coll: Coll::Overlap,
                dtype: "int32".into(),
                op: "sum".into(),
                count: self.cfg.overlap_size / 4,
                // Each warm-up repetition rescales the busy loop to C.
                warmup: 2,
                iters: self.cfg.overlap_iters,
                master_port: self.next_port(),
                perf_dir: None,
                extra: vec!["--requests".into(), self.cfg.overlap_requests.to_string()],
            };
            let m = run_hosts(&fabric, self.plan, self.bins, &spec, &self.logs, backend)?;
            self.record(m, round);
        }
        Ok(())
    }

    /// OpenMPI over kernel forwarding: the sweep, the small-message tests and the
    /// counted bytes of a ring AllReduce.
    fn mpi(&mut self, mpi: &Mpi, round: u32, ring_bytes: u64) -> anyhow::Result<()> {
        let _fwd = KernelForwarding::enable(self.plan)?;
        let sweep: Vec<(u64, u32, u32)> = self
            .cfg
            .sizes
            .iter()
            .map(|&b| {
                let (w, i) = iterations(self.cfg, b);
                (b, w, i)
            })
            .collect();
        let world = self.plan.hosts.len();
        // (collective, datatype, (bytes, warm-up, iterations) per size, small-message test)
        type Job = (Coll, String, Vec<(u64, u32, u32)>, bool);
        let mut jobs: Vec<Job> = Vec::new();
        for coll in [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather] {
            if !self.cfg.collectives.contains(&coll) {
                continue;
            }
            for d in &self.cfg.dtypes {
                let sizes: Vec<_> = sweep
                    .iter()
                    .copied()
                    .filter(|(b, _, _)| coll.count(d, *b, world).is_some())
                    .collect();
                if !sizes.is_empty() {
                    jobs.push((coll, d.clone(), sizes, false));
                }
            }
        }
        let small = vec![(elem_size(&self.cfg.dtypes[0]), 10, self.cfg.small_iters)];
        jobs.push((Coll::AllReduce, self.cfg.dtypes[0].clone(), small.clone(), true));
        jobs.push((Coll::Barrier, "-".into(), vec![(0, 10, self.cfg.small_iters)], true));
        for (coll, dtype, sizes, small) in jobs {
            check_interrupted()?;
            let kind = coll.name();
            self.pb.set_message(format!("MPI {kind} {dtype}{}", if small { " small" } else { "" }));
            let log = self.logs.join(format!(
                "mpi-{kind}-{dtype}-{}-r{round}.log",
                if small { "small" } else { "sweep" }
            ));
            let d = if coll == Coll::Barrier { "int32" } else { dtype.as_str() };
            let t = Instant::now();
            let mca: Vec<(&str, &str)> =
                self.cfg.mpi_mca.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            match mpi.run(kind, d, &self.cfg.op, &sizes, &mca, &log) {
                Ok(rows) => {
                    for r in rows {
                        let mut m = Measurement::skipped("mpi", coll, &dtype, r.bytes, "ok");
                        if coll.blocked() {
                            m.count = coll.count(&dtype, r.bytes, world).unwrap_or(0);
                        }
                        m.small = small;
                        m.warmup = r.warmup;
                        m.iters = r.iters;
                        m.times_us = r.times_us;
                        m.wall_s = t.elapsed().as_secs_f64();
                        if r.wrong > 0 {
                            m.status = format!("FAIL: {} wrong elements", r.wrong);
                        }
                        self.record(m, round);
                    }
                }
                Err(e) => {
                    for (b, _, _) in sizes {
                        let mut m =
                            Measurement::skipped("mpi", coll, &dtype, b, &format!("FAIL: {e:#}"));
                        m.small = small;
                        self.record(m, round);
                    }
                }
            }
        }
        if round == 0 {
            self.mpi_counted(mpi, ring_bytes)?;
        }
        Ok(())
    }

    /// Host interface bytes of one MPI run per collective at `ring_bytes`: Open MPI's
    /// ring AllReduce and ring AllGather (forced), and its Reduce_scatter_block as the
    /// sweep runs it (default, or as --mpi-mca says: coll/tuned has no ring for it).
    fn mpi_counted(&mut self, mpi: &Mpi, ring_bytes: u64) -> anyhow::Result<()> {
        let world = self.plan.hosts.len();
        let d = self.cfg.dtypes[0].clone();
        let user: Vec<(&str, &str)> =
            self.cfg.mpi_mca.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let rs = if user.is_empty() { "mpi-default" } else { "mpi-mca" };
        for (coll, system, mca) in [
            (Coll::AllReduce, "mpi-ring", &RING[..]),
            (Coll::ReduceScatter, rs, &user[..]),
            (Coll::AllGather, "mpi-ring", &RING_ALLGATHER[..]),
        ] {
            let wanted = coll == Coll::AllReduce || self.cfg.collectives.contains(&coll);
            if !wanted || coll.count(&d, ring_bytes, world).is_none() {
                continue;
            }
            check_interrupted()?;
            let what = format!("MPI {system} {} {}", coll.name(), human_size(ring_bytes));
            self.pb.set_message(format!("{what} (counted bytes)"));
            let (w, i) = iterations(self.cfg, ring_bytes);
            let before = host_counters(self.plan)?;
            let log = self.logs.join(format!("{system}-{}.log", coll.name()));
            match mpi.run(coll.name(), &d, &self.cfg.op, &[(ring_bytes, w, i)], mca, &log) {
                Ok(rows) => {
                    let after = host_counters(self.plan)?;
                    let n = f64::from(w + i);
                    self.res.host_bytes.push(HostBytes {
                        system: system.into(),
                        collective: coll,
                        bytes: rows.first().map_or(ring_bytes, |r| r.bytes),
                        per_host: after
                            .iter()
                            .zip(&before)
                            .map(|(a, b)| {
                                let d = a.since(*b);
                                (d.tx_bytes as f64 / n, d.rx_bytes as f64 / n)
                            })
                            .collect(),
                    });
                    if rows.iter().any(|r| r.wrong > 0) {
                        self.res.notes.push(format!("{what} produced wrong elements"));
                    }
                }
                Err(e) => self.res.notes.push(format!("{what} failed: {e:#}")),
            }
            self.pb.inc(1);
        }
        Ok(())
    }

    fn frame_rates(&mut self, round: u32) {
        let frame_len = self.res.mtu + 58; // Ethernet + IPv4 + UDP + BTH + payload + ICRC
        let secs = self.cfg.ref_seconds;
        let results: Vec<(&str, anyhow::Result<FrameRate>)> = if refs::have_testpmd() {
            vec![
                ("kernel-forwarding", refs::kernel(self.plan, frame_len, secs, &self.logs)),
                ("testpmd-io", refs::testpmd_io(self.plan, frame_len, secs, &self.logs)),
            ]
        } else {
            vec![
                (
                    "kernel-forwarding",
                    Err(anyhow::anyhow!("dpdk-testpmd (the generator) is not installed")),
                ),
                (
                    "testpmd-io",
                    Err(anyhow::anyhow!(
                        "dpdk-testpmd is not installed (scripts/setup bench installs it)"
                    )),
                ),
            ]
        };
        for (name, r) in results {
            let mut fr = r.unwrap_or_else(|e| FrameRate {
                system: name.into(),
                round,
                frame_len,
                hops: 0,
                offered_fps: 0.0,
                delivered_fps: 0.0,
                forwarded_fps: 0.0,
                forwarder_cores: 0.0,
                status: format!("FAIL: {e:#}"),
            });
            fr.round = round;
            self.say(format!(
                "{:<18} {} B frames: offered {:.0}/s, delivered {:.0}/s over {} hops  {}",
                fr.system, fr.frame_len, fr.offered_fps, fr.delivered_fps, fr.hops, fr.status
            ));
            self.pb.inc(1);
            self.res.frame_rates.push(fr);
        }
    }
}

/// Run everything; Ok(false) if some measurement failed.
pub fn run(args: &Args) -> anyhow::Result<bool> {
    let cfg = Config::from_args(args)?;
    // Safety: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root: it creates network namespaces and veths (try sudo)");
    }
    install_signal_handler()?;
    let started = Instant::now();
    let root = repo_root()?;
    let bins = match &args.bin_dir {
        Some(d) => d.clone(),
        None => {
            std::env::current_exe()?.parent().context("executable has no directory")?.to_path_buf()
        }
    };
    let mut needed = vec![
        "inc-switch".to_string(),
        "inc-controller".into(),
        "inccl-allreduce".into(),
        "inccl-barrier".into(),
    ];
    needed.extend(cfg.collectives.iter().map(|c| c.program().0));
    if cfg.overlap {
        needed.push(Coll::Overlap.program().0);
    }
    needed.dedup();
    for b in &needed {
        if !bins.join(b).is_file() {
            bail!(
                "{} not found (build with: cargo build --release --bins, or give --bin-dir)",
                bins.join(b).display()
            );
        }
    }
    let topology = args
        .topology
        .canonicalize()
        .with_context(|| format!("topology {}", args.topology.display()))?;
    let topo =
        inc_controller::topology::Topology::load(&topology).map_err(|e| anyhow::anyhow!("{e}"))?;
    let prefix =
        args.prefix.clone().unwrap_or_else(|| format!("b{}", std::process::id() % 100_000));
    let plan = Plan::parse(&inc_controller::plan::render(&topo, &prefix)?)?;
    let out = args.out.clone();
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    std::env::set_var("INC_CONTROLLER", bins.join("inc-controller"));

    let supported = supported_backends(&bins)?;
    let world = plan.hosts.len();
    let mut sweep = 0u64;
    let mut mpi_sweep = 0u64;
    for c in &cfg.collectives {
        for d in &cfg.dtypes {
            let n = cfg.sizes.iter().filter(|&&b| c.count(d, b, world).is_some()).count() as u64;
            sweep += n;
            if matches!(c, Coll::AllReduce | Coll::ReduceScatter | Coll::AllGather) {
                mpi_sweep += n;
            }
        }
    }
    let per_backend = sweep + 2 + u64::from(cfg.overlap);
    let refs_steps = if cfg.refs { mpi_sweep + 6 } else { 0 };
    let runnable = cfg.backends.iter().filter(|b| supported.contains(b)).count() as u64;
    let pb = ProgressBar::new(u64::from(cfg.rounds) * (runnable * per_backend + refs_steps) + 1);
    pb.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let ring_bytes =
        cfg.sizes.iter().copied().filter(|&s| s <= cfg.ring_size).max().unwrap_or(cfg.ring_size);
    let mut ctx = Ctx {
        cfg: &cfg,
        plan: &plan,
        bins: &bins,
        topology: &topology,
        logs: logs.clone(),
        out: out.clone(),
        pb,
        res: Results {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            machine: crate::machine::describe(),
            // Before the namespaces and processes exist, so that it measures the machine.
            scheduling: SchedulingCosts::measure(),
            topology: topology.display().to_string(),
            world: plan.hosts.len(),
            mtu: u32::from(topo.defaults.mtu),
            started: now_utc(),
            duration_s: 0.0,
            supported_backends: supported.clone(),
            measurements: vec![],
            frame_rates: vec![],
            host_bytes: vec![],
            notes: vec![],
            overlap_requests: cfg.overlap_requests,
        },
        master_port: 52300,
        switch_args: args.switch_args.clone(),
        prefix: prefix.clone(),
        // What scripts/netns-up leaves.
        host_tx_offload: true,
    };
    ctx.say(format!(
        "inc-bench: {} on {}; output in {}",
        topo.name,
        ctx.res.machine,
        out.display()
    ));
    match &ctx.res.scheduling {
        Some(c) => ctx.res.notes.push(c.describe()),
        None => {
            ctx.res.notes.push("scheduling costs not measured: threads cannot be pinned".into())
        }
    }
    let netns = Netns::up(&root, &topology, &prefix, &logs.join("netns-up.log"))?;
    ctx.res.notes.push(format!(
        "hosts' veths: TX checksum offload {} (--host-tx-offload {})",
        cfg.host_tx_offload.describe(&cfg.backends),
        cfg.host_tx_offload
    ));
    if !cfg.mpi_mca.is_empty() {
        let list: Vec<String> = cfg.mpi_mca.iter().map(|(k, v)| format!("{k}={v}")).collect();
        ctx.res.notes.push(format!("MPI sweep with --mca {}", list.join(" --mca ")));
    }
    let mpi = if cfg.refs {
        match Mpi::prepare(&plan, &ctx.prefix, &out.join("mpi")) {
            Ok(m) => Some(m),
            Err(e) => {
                ctx.res.notes.push(format!("MPI reference unavailable: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    let outcome = (|| -> anyhow::Result<()> {
        for round in 0..cfg.rounds {
            let mut first = true;
            for b in &cfg.backends {
                if !supported.contains(b) {
                    if round == 0 {
                        let why =
                            format!("not built: inc-switch supports {}", supported.join(", "));
                        for &c in &cfg.collectives {
                            ctx.res.measurements.push(Measurement::skipped(
                                b,
                                c,
                                &cfg.dtypes[0],
                                0,
                                &why,
                            ));
                        }
                        ctx.say(format!("{b}: {why}"));
                    }
                    continue;
                }
                ctx.host_tx_offload_for(b)?;
                ctx.backend(b, round, first)?;
                first = false;
            }
            if cfg.refs {
                ctx.host_tx_offload_for("mpi")?;
                match &mpi {
                    Some(m) => ctx.mpi(m, round, ring_bytes)?,
                    None => ctx.say("MPI reference skipped (see notes)"),
                }
                ctx.frame_rates(round);
            }
        }
        Ok(())
    })();
    drop(netns);
    // INC's counted bytes per iteration at the ring size, from the sweep itself.
    let mut counted = Vec::new();
    for coll in [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather] {
        for b in &cfg.backends {
            let d = &cfg.dtypes[0];
            let Some(count) = coll.count(d, ring_bytes, world) else { continue };
            let bytes = coll.bytes(d, count, world);
            if let Some(m) = ctx.res.measurements.iter().find(|m| {
                &m.system == b
                    && m.collective == coll
                    && &m.dtype == d
                    && m.bytes == bytes
                    && !m.small
                    && m.ok()
                    && m.round == 0
            }) {
                let n = f64::from(m.warmup + m.iters);
                let per_host = m
                    .host_if
                    .iter()
                    .map(|c| (c.tx_bytes as f64 / n, c.rx_bytes as f64 / n))
                    .collect();
                counted.push(HostBytes { system: b.clone(), collective: coll, bytes, per_host });
            }
        }
    }
    counted.append(&mut ctx.res.host_bytes);
    ctx.res.host_bytes = counted;
    ctx.res.duration_s = started.elapsed().as_secs_f64();
    ctx.pb.finish_and_clear();
    let (text, rows) = report::write_all(&out, &ctx.res)?;
    plots(&out, &ctx.res, &rows)?;
    println!("{text}");
    for n in &ctx.res.notes {
        println!("note: {n}");
    }
    println!(
        "outputs: {}/{{table.txt,results.csv,frame_rates.csv,results.json,*.svg}}",
        out.display()
    );
    outcome?;
    let frames_ok = ctx.res.frame_rates.iter().all(|f| f.status == "ok");
    let all_ok = ctx.res.measurements.iter().all(|m| m.ok() || m.status.starts_with("not built"))
        && frames_ok
        && (!cfg.refs || mpi.is_some());
    Ok(all_ok)
}

fn plots(out: &Path, res: &Results, rows: &[report::Summary]) -> anyhow::Result<()> {
    let mut systems: Vec<String> = Vec::new();
    for r in rows {
        if !systems.contains(&r.system) {
            systems.push(r.system.clone());
        }
    }
    let mut kinds: Vec<(Coll, String)> = rows
        .iter()
        .filter(|r| !r.small && r.bytes > 0)
        .map(|r| (r.collective, r.dtype.clone()))
        .collect();
    kinds.dedup();
    kinds.sort_by_key(|k| (k.0.name(), k.1.clone()));
    kinds.dedup();
    for (coll, dtype) in kinds {
        let mut series: Vec<plot::Series> = systems
            .iter()
            .map(|s| plot::Series {
                name: s.clone(),
                points: rows
                    .iter()
                    .filter(|r| {
                        &r.system == s
                            && r.collective == coll
                            && r.dtype == dtype
                            && !r.small
                            && r.status == "ok"
                    })
                    .map(|r| (r.bytes as f64, r.algbw))
                    .collect(),
                reference: false,
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
        let (x0, x1) = xs.iter().fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        for f in res.frame_rates.iter().filter(|f| f.status == "ok" && f.round == 0) {
            // What the forwarder moves in payload per second on the path: a ceiling
            // for any collective whose bytes cross that path once.
            let gbs = f.delivered_fps * f64::from(res.mtu) / 1e9;
            series.push(plot::Series {
                name: format!("{} payload ceiling (1 path)", f.system),
                points: vec![(x0, gbs), (x1, gbs)],
                reference: true,
            });
        }
        plot::lines(
            &out.join(format!("algbw-{}-{dtype}.svg", coll.name())),
            &format!("{} {dtype} sum: algbw vs size ({} ranks)", coll.name(), res.world),
            "message size",
            "algbw (GB/s)",
            true,
            &series,
        )?;
    }
    for (coll, file) in
        [(Coll::AllReduce, "latency-allreduce-1elem.svg"), (Coll::Barrier, "latency-barrier.svg")]
    {
        let samples: Vec<(String, Vec<f64>)> = systems
            .iter()
            .filter_map(|s| {
                let v: Vec<f64> = res
                    .measurements
                    .iter()
                    .filter(|m| &m.system == s && m.small && m.collective == coll && m.ok())
                    .flat_map(|m| m.times_us.iter().copied())
                    .collect();
                (!v.is_empty()).then(|| (s.clone(), v))
            })
            .collect();
        let title = match coll {
            Coll::Barrier => "Barrier latency".to_string(),
            _ => "1-element AllReduce latency".to_string(),
        };
        plot::histogram(&out.join(file), &title, &samples)?;
    }
    Ok(())
}
