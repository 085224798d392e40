//! The emulator under test: controller and switches for one backend, host programs for
//! one collective and size, switch counters around it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use inc_controller::auth::TOKEN_ENV;
use inc_controller::{Credentials, Role};
use serde_json::Value;

use crate::cli::Coll;
use crate::model::{Measurement, SwitchDelta, SwitchSample};
use crate::netns::{host_counters, Plan};
use crate::procs::{check_interrupted, cpu_seconds, in_ns, rss_bytes, tail, wait_until, Proc};
use crate::stats::max_over_ranks;

const STATS_ADDR: &str = "127.0.0.1:7100";

/// Backends `inc-switch run --backend` accepts (from its --help).
pub fn supported_backends(bins: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(bins.join("inc-switch"))
        .args(["run", "--help"])
        .output()
        .with_context(|| format!("cannot run {}", bins.join("inc-switch").display()))?;
    let help = String::from_utf8_lossy(&out.stdout);
    // clap lists them either inline ("[possible values: a, b]") or one per line
    // ("Possible values:" then "- name: ...") depending on whether they have help text.
    let mut after = false;
    let mut names = Vec::new();
    for line in help.lines() {
        let t = line.trim();
        if t.starts_with("--backend") {
            after = true;
            if let Some(v) = t.split("[possible values: ").nth(1) {
                return Ok(v.trim_end_matches(']').split(", ").map(str::to_string).collect());
            }
        } else if after && t.starts_with("- ") {
            names.push(t[2..].split(':').next().unwrap_or("").trim().to_string());
        } else if after && t.starts_with("--") {
            break;
        } else if after && t.contains("[possible values: ") {
            let v = t.split("[possible values: ").nth(1).unwrap_or("");
            return Ok(v.trim_end_matches(']').split(", ").map(str::to_string).collect());
        }
    }
    if names.is_empty() {
        bail!("cannot find the --backend values in `inc-switch run --help`");
    }
    Ok(names)
}

/// Controller and switch process of one backend.
#[derive(Debug)]
pub struct Fabric {
    /// The switch process (every logical switch of the topology in one process).
    pub switch: Proc,
    _controller: Proc,
    /// The controller's credentials: the switch presents the switch token, the host
    /// programs the host token (as in `scripts/demo`).
    creds: Credentials,
    ctrl_ns: String,
    bins: PathBuf,
}

impl Fabric {
    /// Start the controller and one switch process for all switches, wait until every
    /// switch registered.
    pub fn start(
        plan: &Plan,
        topology: &Path,
        bins: &Path,
        backend: &str,
        switch_args: &str,
        logs: &Path,
    ) -> anyhow::Result<Fabric> {
        // Fresh credentials per run (mode 0600), written before `serve` reads them.
        let token_file = logs.join(format!("controller-{backend}.token"));
        let _ = std::fs::remove_file(&token_file);
        let (creds, _) = Credentials::load_or_create(&token_file)?;
        let controller = Proc::spawn(
            "inc-controller",
            in_ns(&plan.ctrl_ns, bins.join("inc-controller"))
                .args(["serve", "--topology"])
                .arg(topology)
                .args(["--listen", &plan.ctrl_addr])
                .arg("--token-file")
                .arg(&token_file)
                .stdin(Stdio::null()),
            Some(&logs.join(format!("controller-{backend}.log"))),
        )?;
        let (host, port) = plan.ctrl_addr.rsplit_once(':').context("controller address")?;
        let probe = format!("exec 3<>/dev/tcp/{host}/{port}");
        wait_until(20, &format!("the controller on {}", plan.ctrl_addr), || {
            in_ns(&plan.ctrl_ns, "bash")
                .args(["-c", &probe])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })?;
        let mut cmd = in_ns(&plan.ctrl_ns, bins.join("inc-switch"));
        cmd.args(["run", "--backend", backend, "--topology"])
            .arg(topology)
            .args(["--controller", &plan.ctrl_addr, "--stats-listen", STATS_ADDR])
            .env(TOKEN_ENV, creds.token(Role::Switch))
            .args(switch_args.split_whitespace())
            .stdin(Stdio::null());
        for s in &plan.switches {
            cmd.arg("--switch").arg(format!("{}:{}", s.id, s.name));
        }
        for p in &plan.ports {
            cmd.arg("--port").arg(format!("{}:{}={}/{}", p.switch, p.port, p.ns, p.ifname));
        }
        let log = logs.join(format!("switch-{backend}.log"));
        let mut switch = Proc::spawn("inc-switch", &mut cmd, Some(&log))?;
        let n = plan.switches.len();
        let registered = wait_until(30, "every switch to register with the controller", || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            text.matches("registered with controller").count() >= n || !switch.running()
        });
        if let Err(e) = registered.and_then(|()| {
            if switch.running() {
                Ok(())
            } else {
                // The error line, not the backtrace that may follow it.
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let why = text.lines().find(|l| l.starts_with("Error:")).map(str::to_string);
                bail!(
                    "inc-switch --backend {backend} exited:\n{}",
                    why.unwrap_or_else(|| tail(&log, 15))
                )
            }
        }) {
            return Err(e.context(format!("starting the {backend} switch (log {})", log.display())));
        }
        Ok(Fabric {
            switch,
            _controller: controller,
            creds,
            ctrl_ns: plan.ctrl_ns.clone(),
            bins: bins.into(),
        })
    }

    /// One counter snapshot of the switch process.
    pub fn snapshot(&self) -> anyhow::Result<Value> {
        let out = in_ns(&self.ctrl_ns, self.bins.join("inc-switch"))
            .args(["stats", STATS_ADDR])
            .output()
            .context("cannot run inc-switch stats")?;
        if !out.status.success() {
            bail!("inc-switch stats: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        serde_json::from_slice(&out.stdout).context("switch stats are not JSON")
    }
}

/// Engine-level counters of each switch plus per-communicator RC counters.
fn per_switch(v: &Value) -> BTreeMap<String, (SwitchDelta, BTreeMap<u64, [u64; 4]>)> {
    let mut m = BTreeMap::new();
    for s in v["switches"].as_array().into_iter().flatten() {
        let e = &s["engine"];
        let mut d = SwitchDelta {
            name: s["name"].as_str().unwrap_or("?").to_string(),
            rx_frames: e["rx_frames"].as_u64().unwrap_or(0),
            tx_frames: e["tx_frames"].as_u64().unwrap_or(0),
            ..SwitchDelta::default()
        };
        for (k, n) in e["drops"].as_object().into_iter().flatten() {
            d.drops.insert(k.clone(), n.as_u64().unwrap_or(0));
        }
        for p in s["ports"].as_array().into_iter().flatten() {
            for k in ["rx_dropped", "rx_truncated", "tx_dropped"] {
                *d.drops.entry(format!("port_{k}")).or_default() +=
                    p["io"][k].as_u64().unwrap_or(0);
            }
        }
        let mut comms = BTreeMap::new();
        for c in e["comms"].as_array().into_iter().flatten() {
            let mut t = [0u64; 4];
            for conn in c["connections"].as_array().into_iter().flatten() {
                let rc = &conn["rc"];
                for (i, k) in
                    ["retransmits", "tx_rnr_naks", "rx_rnr_naks", "timeouts"].iter().enumerate()
                {
                    t[i] += rc[*k].as_u64().unwrap_or(0);
                }
            }
            comms.insert(c["comm_id"].as_u64().unwrap_or(0), t);
        }
        m.insert(d.name.clone(), (d, comms));
    }
    m
}

/// Counters between two snapshots; communicators created in between count from zero.
pub fn switch_delta(before: &Value, after: &Value, wall_s: f64) -> Vec<SwitchDelta> {
    let b = per_switch(before);
    let mut out = Vec::new();
    for (name, (a, comms)) in per_switch(after) {
        let (b0, bcomms) = b.get(&name).cloned().unwrap_or_default();
        let mut d = SwitchDelta {
            rx_frames: a.rx_frames.saturating_sub(b0.rx_frames),
            tx_frames: a.tx_frames.saturating_sub(b0.tx_frames),
            ..a.clone()
        };
        d.rx_fps = d.rx_frames as f64 / wall_s.max(1e-9);
        d.tx_fps = d.tx_frames as f64 / wall_s.max(1e-9);
        d.drops = a
            .drops
            .iter()
            .map(|(k, v)| (k.clone(), v.saturating_sub(*b0.drops.get(k).unwrap_or(&0))))
            .filter(|(_, v)| *v > 0)
            .collect();
        for (id, t) in comms {
            let t0 = bcomms.get(&id).copied().unwrap_or_default();
            d.retransmits += t[0] - t0[0].min(t[0]);
            d.rnr_sent += t[1] - t0[1].min(t[1]);
            d.rnr_received += t[2] - t0[2].min(t[2]);
            d.timeouts += t[3] - t0[3].min(t[3]);
        }
        out.push(d);
    }
    out
}

/// One host-program run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Collective.
    pub coll: Coll,
    /// Datatype name.
    pub dtype: String,
    /// Operator name.
    pub op: String,
    /// Elements per rank's call (ReduceScatter, AllGather: per block).
    pub count: u64,
    /// Warm-up iterations.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
    /// Rank 0's bootstrap port.
    pub master_port: u16,
    /// Profile the switch and rank 0 with perf into this directory.
    pub perf_dir: Option<PathBuf>,
    /// Further arguments of the host program (e.g. the overlap's `--requests 8`).
    pub extra: Vec<String>,
}

impl RunSpec {
    /// Bytes the ranks move in all, for the time budget: the message per iteration, for
    /// the overlap measurement every part of it (two batches of `--requests`, the
    /// collective alone and overlapped, the compute alone about as long as one) and
    /// its calibration.
    fn budget_bytes(&self, bytes: u64) -> f64 {
        let per_iter = if self.coll == Coll::Overlap {
            let requests = self
                .extra
                .iter()
                .position(|a| a == "--requests")
                .and_then(|i| self.extra.get(i + 1)?.parse::<u64>().ok())
                .unwrap_or(8);
            bytes * (2 * requests + 3)
        } else {
            bytes
        };
        per_iter as f64 * f64::from(self.warmup + self.iters + 2)
    }
}

/// Parsed output of one rank.
#[derive(Debug, Default)]
struct RankOut {
    pass: Option<bool>,
    times: Option<Vec<f64>>,
    /// Times of named parts (inc-bench-rank's overlap measurement), printed before the
    /// result line.
    parts: BTreeMap<String, Vec<f64>>,
}

impl RankOut {
    fn complete(&self) -> bool {
        self.pass.is_some() && (self.times.is_some() || !self.parts.is_empty())
    }
}

fn parse_line(line: &str, r: &mut RankOut) {
    let list = |rest: &str| -> Vec<f64> {
        let list = rest.split_once(':').map_or("", |(_, l)| l);
        list.split_whitespace().filter_map(|t| t.parse().ok()).collect()
    };
    if let Some(rest) = line.strip_prefix("#  iter_us rank=") {
        r.times = Some(list(rest));
    } else if let Some(rest) = line.strip_prefix("#  part_us rank=") {
        let name = rest.split_once(" part=").and_then(|(_, p)| p.split_once(':'));
        if let Some((name, _)) = name {
            r.parts.insert(name.to_string(), list(rest));
        }
    } else if !line.starts_with('#') {
        match line.split_whitespace().last() {
            Some("PASS") => r.pass = Some(true),
            Some("FAIL") => r.pass = Some(false),
            _ => {}
        }
    }
}

/// Run the host programs once on every host and measure.
pub fn run_hosts(
    fabric: &Fabric,
    plan: &Plan,
    bins: &Path,
    spec: &RunSpec,
    logs: &Path,
    system: &str,
) -> anyhow::Result<Measurement> {
    let world = plan.hosts.len();
    let bytes = match spec.coll {
        Coll::Barrier => 0,
        Coll::Overlap => spec.count * 4,
        c => c.bytes(&spec.dtype, spec.count, world),
    };
    let (program, select) = spec.coll.program();
    let program = bins.join(program);
    let master = format!("{}:{}", plan.hosts[0].mgmt, spec.master_port);
    let tag = format!("{system}-{}-{}-{bytes}", spec.coll.name(), spec.dtype);
    let before_sw = fabric.snapshot()?;
    let before_if = host_counters(plan)?;
    let before_cpu = cpu_seconds(fabric.switch.pid())?;
    let start = Instant::now();
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut ranks = Vec::new();
    for (r, h) in plan.hosts.iter().enumerate() {
        let mut cmd = in_ns(&h.ns, &program);
        cmd.args([world.to_string(), master.clone(), r.to_string(), spec.count.max(1).to_string()])
            .args(["--dtype", &spec.dtype, "--op", &spec.op, "--root", "0"])
            .args(["--iters", &spec.iters.to_string(), "--warmup", &spec.warmup.to_string()])
            .args(["--print-times", "--wait-stdin"])
            .args(&select)
            .args(&spec.extra)
            .env("INCCL_CONTROLLER", &plan.ctrl_addr)
            .env("INCCL_IFACE", &h.ifname)
            .env(TOKEN_ENV, fabric.creds.token(Role::Host))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(logs.join(format!("{tag}-rank{r}.err")))?);
        let mut p = Proc::spawn(&format!("rank {r} ({})", h.name), &mut cmd, None)?;
        let out = p.child.stdout.take().context("stdout")?;
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((r, line)).is_err() {
                    break;
                }
            }
        });
        ranks.push(p);
    }
    drop(tx);
    let perf = match &spec.perf_dir {
        Some(dir) => Some(crate::perf::Profile::start(dir, fabric.switch.pid(), ranks[0].pid())?),
        None => None,
    };
    let budget = 60.0 + spec.budget_bytes(bytes) / 5e6 + f64::from(spec.warmup + spec.iters) * 0.05;
    let deadline = start + Duration::from_secs_f64(budget);
    let mut outs: Vec<RankOut> = (0..world).map(|_| RankOut::default()).collect();
    let mut transcript: Vec<Vec<String>> = vec![Vec::new(); world];
    let complete = |o: &RankOut| o.complete();
    let mut failure = None;
    while !outs.iter().all(complete) {
        check_interrupted()?;
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((r, line)) => {
                parse_line(&line, &mut outs[r]);
                transcript[r].push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                failure = Some("every rank closed its output before reporting".to_string());
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some(r) = (0..world).find(|&r| !complete(&outs[r]) && !ranks[r].running()) {
            failure = Some(format!("rank {r} exited before reporting"));
            break;
        }
        if Instant::now() > deadline {
            failure = Some(format!("no result from every rank within {budget:.0} s"));
            break;
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    // Counters while the communicator still exists (the ranks wait for stdin to close).
    let after_sw = fabric.snapshot();
    let after_cpu = cpu_seconds(fabric.switch.pid()).unwrap_or(before_cpu);
    let host_cpu: f64 = ranks.iter().filter_map(|p| cpu_seconds(p.pid()).ok()).sum();
    let rss = rss_bytes(fabric.switch.pid());
    if let Some(p) = perf {
        p.finish()?;
    }
    let mut statuses = Vec::new();
    for p in &mut ranks {
        drop(p.child.stdin.take()); // the signal to destroy the communicator and exit
    }
    let exit_deadline = Instant::now() + Duration::from_secs(20);
    for p in &mut ranks {
        while p.running() && Instant::now() < exit_deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        statuses.push(if p.running() { None } else { p.child.wait().ok() });
    }
    let after_if = host_counters(plan)?;
    for (r, lines) in transcript.iter().enumerate() {
        let mut f = std::fs::File::create(logs.join(format!("{tag}-rank{r}.out")))?;
        writeln!(f, "{}", lines.join("\n"))?;
    }
    if failure.is_none() {
        if let Some(r) = outs.iter().position(|o| o.pass == Some(false)) {
            failure = Some(format!("rank {r} reported FAIL (wrong elements)"));
        } else if let Some(r) = statuses.iter().position(|s| !s.is_some_and(|s| s.success())) {
            failure = Some(format!("rank {r} exit status {:?} after reporting", statuses[r]));
        }
    }
    let status = match failure {
        None => "ok".to_string(),
        Some(why) => {
            let errs: Vec<String> = (0..world)
                .map(|r| tail(&logs.join(format!("{tag}-rank{r}.err")), 2))
                .filter(|s| !s.is_empty())
                .collect();
            format!("FAIL: {why}; {}", errs.join(" | ").replace('\n', " "))
        }
    };
    let mut parts = BTreeMap::new();
    if let Some(first) = outs.first() {
        for name in first.parts.keys() {
            let per_rank: Vec<Vec<f64>> =
                outs.iter().map(|o| o.parts.get(name).cloned().unwrap_or_default()).collect();
            parts.insert(name.clone(), max_over_ranks(&per_rank));
        }
    }
    let per_rank: Vec<Vec<f64>> = outs.into_iter().map(|o| o.times.unwrap_or_default()).collect();
    let switch = after_sw.ok().map(|a| SwitchSample {
        backend: a["backend"].as_str().unwrap_or(system).to_string(),
        cpu_s: after_cpu - before_cpu,
        rss_bytes: rss,
        switches: switch_delta(&before_sw, &a, wall_s),
    });
    Ok(Measurement {
        system: system.to_string(),
        collective: spec.coll,
        dtype: if spec.coll == Coll::Barrier { "-".into() } else { spec.dtype.clone() },
        bytes,
        count: if spec.coll == Coll::Barrier { 0 } else { spec.count },
        small: false,
        round: 0,
        warmup: spec.warmup,
        iters: spec.iters,
        times_us: max_over_ranks(&per_rank),
        status,
        wall_s,
        switch,
        host_if: after_if.iter().zip(&before_if).map(|(a, b)| a.since(*b)).collect(),
        host_cpu_s: Some(host_cpu),
        parts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(rx: u64, comms: &[(u64, u64)]) -> Value {
        let comms: Vec<Value> = comms
            .iter()
            .map(|(id, re)| {
                serde_json::json!({"comm_id": id, "connections": [
                    {"rc": {"retransmits": re, "tx_rnr_naks": 1, "rx_rnr_naks": 0, "timeouts": 0}}]})
            })
            .collect();
        serde_json::json!({"backend": "af_packet", "switches": [{
            "name": "root",
            "ports": [{"io": {"rx_dropped": rx / 10, "rx_truncated": 0, "tx_dropped": 0}}],
            "engine": {"rx_frames": rx, "tx_frames": rx * 2,
                       "drops": {"not_roce": 3, "bad_icrc": 0}, "comms": comms}}]})
    }

    #[test]
    fn deltas_count_new_communicators_from_zero() {
        let b = snap(100, &[(1, 5)]);
        let a = snap(1100, &[(1, 7), (2, 4)]);
        let d = switch_delta(&b, &a, 2.0);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].rx_frames, d[0].tx_frames), (1000, 2000));
        assert_eq!(d[0].rx_fps, 500.0);
        assert_eq!(d[0].retransmits, 2 + 4);
        assert_eq!(d[0].rnr_sent, 1);
        assert_eq!(d[0].drops.get("port_rx_dropped"), Some(&100));
        assert!(!d[0].drops.contains_key("not_roce"));
    }

    #[test]
    fn rank_output_is_parsed() {
        let mut r = RankOut::default();
        parse_line("#  rank  collective ... result", &mut r);
        assert_eq!(r.pass, None);
        parse_line(
            "      0  allreduce  4  1  int32  sum  -  2  10.0  9.0  11.0  11.0  0.000  0.000  PASS",
            &mut r,
        );
        parse_line("#  iter_us rank=0: 10.5 9.0", &mut r);
        assert_eq!(r.pass, Some(true));
        assert_eq!(r.times, Some(vec![10.5, 9.0]));
        parse_line("  1  allreduce  4  1  int32  sum  -  2  1  1  1  1  0  0  FAIL", &mut r);
        assert_eq!(r.pass, Some(false));
        let mut r = RankOut::default();
        parse_line("#  part_us rank=3 part=nonblocking: 5.5 6", &mut r);
        parse_line("#  part_us rank=3 part=compute: 7", &mut r);
        assert!(!r.complete());
        parse_line("      3  overlap  32  8  int32  sum  -  2  1  1  1  1  0  0  PASS", &mut r);
        assert!(r.complete());
        assert_eq!(r.parts["nonblocking"], vec![5.5, 6.0]);
        assert_eq!(r.parts.len(), 2);
    }
}
