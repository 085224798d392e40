//! A topology deployed in network namespaces process by process, for fault tests.
//!
//! Unlike `scripts/demo`, the test keeps a handle on every process: it can kill and
//! restart one switch, kill one host, read a switch's counters while a collective runs
//! and inject frames next to it. One switch process per switch (each in its own
//! namespace, counters on its `127.0.0.1:7100`). Runs hold the same lock file as
//! [`run_demo`](crate::netns::run_demo), so end-to-end runs never overlap; dropping a
//! [`Deployment`] stops every process it started (by PID) and tears the namespaces down.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use inc_controller::{Credentials, Role};
use inc_ctrl_proto::TOKEN_ENV;
use nix::fcntl::{Flock, FlockArg};
use serde_json::Value;

use crate::netns::{bin_dir, repo_root, TeardownGuard};

/// What `inc-controller plan` prints, read back by the controller's own parser.
pub use inc_controller::plan::{ParsedPlan as Plan, PlanHost, PlanPort, PlanSwitch};

/// How one host process ended.
#[derive(Debug)]
pub struct HostOutcome {
    /// Rank.
    pub rank: usize,
    /// Exit status (`None`: killed at the deadline or by the test).
    pub status: Option<ExitStatus>,
    /// When it exited, from the start of the run.
    pub exited_after: Duration,
    /// Everything it printed (stdout, then stderr).
    pub output: String,
}

impl HostOutcome {
    /// Exit 0 and a PASS line.
    pub fn passed(&self) -> bool {
        self.status.is_some_and(|s| s.success()) && self.output.contains("PASS")
    }

    /// The median time (µs) from the program's result line, if it printed one.
    pub fn time_us(&self) -> Option<f64> {
        self.output
            .lines()
            .find(|l| l.trim_end().ends_with("PASS") || l.trim_end().ends_with("FAIL"))
            .and_then(|l| l.split_whitespace().nth(8))
            .and_then(|t| t.parse().ok())
    }
}

/// Host processes of one collective run.
#[derive(Debug)]
pub struct HostRun {
    children: Vec<(usize, Option<Child>, PathBuf)>,
    started: Instant,
}

impl HostRun {
    /// When the processes were started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// SIGKILL the process of `rank` now (it then reports no status).
    pub fn kill(&mut self, rank: usize) {
        if let Some((_, Some(c), _)) = self.children.iter_mut().find(|(r, _, _)| *r == rank) {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(e) = self.children.iter_mut().find(|(r, _, _)| *r == rank) {
            e.1 = None;
        }
    }

    /// How many of the processes are still running.
    pub fn running(&mut self) -> usize {
        self.children
            .iter_mut()
            .filter_map(|(_, c, _)| c.as_mut())
            .filter_map(|c| c.try_wait().ok())
            .filter(Option::is_none)
            .count()
    }

    /// Wait for every process, up to `timeout` from now; stragglers are killed.
    pub fn wait(mut self, timeout: Duration) -> Vec<HostOutcome> {
        let deadline = Instant::now() + timeout;
        let mut done: BTreeMap<usize, (Option<ExitStatus>, Duration)> = BTreeMap::new();
        for (rank, c, _) in &self.children {
            if c.is_none() {
                done.insert(*rank, (None, self.started.elapsed()));
            }
        }
        while done.len() < self.children.len() {
            for (rank, c, _) in &mut self.children {
                let Some(child) = c.as_mut() else { continue };
                if done.contains_key(rank) {
                    continue;
                }
                if let Ok(Some(s)) = child.try_wait() {
                    done.insert(*rank, (Some(s), self.started.elapsed()));
                } else if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    done.insert(*rank, (None, self.started.elapsed()));
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.children
            .iter_mut()
            .map(|(rank, c, log)| {
                *c = None;
                let (status, exited_after) = done[rank];
                let output = std::fs::read_to_string(&*log).unwrap_or_default();
                HostOutcome { rank: *rank, status, exited_after, output }
            })
            .collect()
    }
}

impl Drop for HostRun {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.children {
            if let Some(c) = c.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A deployed topology. Fields drop in order: processes (in `Drop`), then the
/// namespaces, then the lock.
#[derive(Debug)]
pub struct Deployment {
    /// Namespace prefix.
    pub prefix: String,
    /// Topology file.
    pub topology: PathBuf,
    /// The plan.
    pub plan: Plan,
    /// Where process logs go (removed on drop unless the test panicked).
    pub logdir: PathBuf,
    link_emu: Vec<String>,
    /// More `inc-switch run` arguments (e.g. `--orphan-idle-timeout`).
    switch_args: Vec<String>,
    /// The controller's credentials (token file `controller.token` in `logdir`):
    /// switches present the switch token, hosts the host token, as in `scripts/demo`.
    creds: Credentials,
    controller: Option<Child>,
    /// Controller processes started so far (each logs to its own file).
    controller_starts: usize,
    switches: BTreeMap<String, Child>,
    _guard: TeardownGuard,
    _lock: Flock<File>,
}

fn spawn_in(
    ns: &str,
    log: &Path,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
) -> Child {
    let out = File::create(log).expect("log file");
    let err = out.try_clone().expect("log file");
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {} in {ns}: {e}", program.display()))
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Deployment {
    /// Bring `topology` (relative to the repository) up under `prefix`, start the
    /// controller and one process per switch with `--link-emu` arguments `link_emu`,
    /// and wait until every switch registered.
    pub fn up(prefix: &str, topology: &str, link_emu: &[&str]) -> Deployment {
        Self::up_with(prefix, topology, link_emu, &[])
    }

    /// [`Deployment::up`] with more `inc-switch run` arguments for every switch.
    pub fn up_with(
        prefix: &str,
        topology: &str,
        link_emu: &[&str],
        switch_args: &[&str],
    ) -> Deployment {
        let root = repo_root();
        let lock_file = File::create(std::env::temp_dir().join("inc-e2e.lock")).expect("lock");
        let lock = Flock::lock(lock_file, FlockArg::LockExclusive).expect("flock");
        let guard = TeardownGuard::new(prefix);
        let topology = root.join(topology);
        let logdir = std::env::temp_dir().join(format!("inc-faults-{prefix}"));
        let _ = std::fs::remove_dir_all(&logdir);
        std::fs::create_dir_all(&logdir).expect("log dir");
        let ctrl = bin_dir().join("inc-controller");
        let up = Command::new(root.join("scripts/netns-up"))
            .arg(&topology)
            .args(["--prefix", prefix])
            .env("INC_CONTROLLER", &ctrl)
            .output()
            .expect("scripts/netns-up");
        assert!(up.status.success(), "netns-up: {}", String::from_utf8_lossy(&up.stderr));
        let plan = Command::new(&ctrl)
            .args(["plan", "--topology"])
            .arg(&topology)
            .args(["--prefix", prefix])
            .output()
            .expect("inc-controller plan");
        assert!(plan.status.success(), "plan: {}", String::from_utf8_lossy(&plan.stderr));
        let plan = Plan::parse(&String::from_utf8_lossy(&plan.stdout)).expect("plan");
        // Created here (mode 0600) rather than by `serve`, so the tokens are known
        // before the controller is up.
        let token_file = logdir.join("controller.token");
        let (creds, _) = Credentials::load_or_create(&token_file).expect("token file");
        let mut d = Deployment {
            prefix: prefix.to_string(),
            topology,
            plan,
            logdir,
            link_emu: link_emu.iter().map(|s| s.to_string()).collect(),
            switch_args: switch_args.iter().map(|s| s.to_string()).collect(),
            creds,
            controller: None,
            controller_starts: 0,
            switches: BTreeMap::new(),
            _guard: guard,
            _lock: lock,
        };
        d.start_controller(None, None);
        let names: Vec<String> = d.plan.switches.iter().map(|s| s.name.clone()).collect();
        for name in &names {
            d.start_switch(name);
        }
        for name in &names {
            d.wait_registered(name);
        }
        d
    }

    /// Log file of switch `name` (since its last start).
    pub fn switch_log(&self, name: &str) -> PathBuf {
        self.logdir.join(format!("switch-{name}.log"))
    }

    /// Log file of the controller process started last.
    pub fn controller_log(&self) -> PathBuf {
        match self.controller_starts {
            0 | 1 => self.logdir.join("controller.log"),
            n => self.logdir.join(format!("controller-{n}.log")),
        }
    }

    /// The controller's token file (`controller.token` in the log directory).
    pub fn token_file(&self) -> PathBuf {
        self.logdir.join("controller.token")
    }

    /// Start a controller (after [`Deployment::kill_controller`]) with `topology` and
    /// `token_file` instead of the deployment's (`None`: the deployment's). Its log is a
    /// new file ([`Deployment::controller_log`]).
    pub fn start_controller(&mut self, topology: Option<&Path>, token_file: Option<&Path>) {
        assert!(self.controller.is_none(), "a controller is running");
        let topology = topology.unwrap_or(&self.topology).display().to_string();
        let token_file = token_file.map_or_else(|| self.token_file(), Path::to_path_buf);
        let args = vec![
            "serve".to_string(),
            "--topology".into(),
            topology,
            "--listen".into(),
            self.plan.controller_addr.clone(),
            "--token-file".into(),
            token_file.display().to_string(),
        ];
        self.controller_starts += 1;
        let ctrl = bin_dir().join("inc-controller");
        let log = self.controller_log();
        self.controller = Some(spawn_in(&self.plan.controller_ns, &log, &ctrl, &args, &[]));
    }

    /// SIGKILL the controller process (by its PID); its PID, if one was running.
    pub fn kill_controller(&mut self) -> Option<u32> {
        let mut c = self.controller.take()?;
        let pid = c.id();
        let _ = c.kill();
        let _ = c.wait();
        Some(pid)
    }

    /// Whether the controller process is running (has not exited).
    pub fn controller_running(&mut self) -> bool {
        self.controller.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Whether the process of switch `name` is running (has not exited).
    pub fn switch_running(&mut self, name: &str) -> bool {
        self.switches.get_mut(name).is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// How many times switch `name` logged a registration since its last start.
    pub fn registrations(&self, name: &str) -> usize {
        let log = std::fs::read_to_string(self.switch_log(name)).unwrap_or_default();
        log.lines().filter(|l| l.contains("registered with controller")).count()
    }

    /// `inc-controller status --json` from the controller's namespace, with the host
    /// credential; `None` if it does not answer.
    pub fn controller_status(&self) -> Option<Value> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.plan.controller_ns])
            .arg(bin_dir().join("inc-controller"))
            .args(["status", "--json", "--controller", &self.plan.controller_addr])
            .env(TOKEN_ENV, self.creds.token(Role::Host))
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Start (or restart) the process of switch `name`.
    pub fn start_switch(&mut self, name: &str) {
        let sw = self
            .plan
            .switch(name)
            .unwrap_or_else(|| panic!("no switch {name} in the plan"))
            .clone();
        let mut args = vec![
            "run".to_string(),
            "--backend".into(),
            "af_packet".into(),
            "--topology".into(),
            self.topology.display().to_string(),
            "--controller".into(),
            self.plan.controller_addr.clone(),
            "--stats-listen".into(),
            "127.0.0.1:7100".into(),
            "--switch".into(),
            format!("{}:{}", sw.id, sw.name),
        ];
        for p in self.plan.ports.iter().filter(|p| p.switch == name) {
            args.push("--port".into());
            args.push(format!("{}:{}={}", name, p.port, p.ifname));
        }
        for e in &self.link_emu {
            args.push(format!("--link-emu={e}"));
        }
        args.extend(self.switch_args.iter().cloned());
        let log = self.switch_log(name);
        let env = [(TOKEN_ENV.to_string(), self.creds.token(Role::Switch).to_string())];
        let child = spawn_in(&sw.ns, &log, &bin_dir().join("inc-switch"), &args, &env);
        self.switches.insert(name.to_string(), child);
    }

    /// Wait until switch `name` logged its registration (since its last start).
    pub fn wait_registered(&self, name: &str) {
        let log = self.switch_log(name);
        wait_until(&format!("switch {name} to register"), Duration::from_secs(30), || {
            std::fs::read_to_string(&log).is_ok_and(|s| s.contains("registered with controller"))
        });
    }

    /// Wait up to `timeout` until switch `name` logged at least `n` registrations
    /// since its last start; false if it did not.
    pub fn wait_registrations(&self, name: &str, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.registrations(name) < n {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// SIGKILL the process of switch `name`.
    pub fn kill_switch(&mut self, name: &str) {
        if let Some(mut c) = self.switches.remove(name) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The counters of switch `name` (`inc-switch stats`), or `None` if it does not answer.
    pub fn try_stats(&self, name: &str) -> Option<Value> {
        let sw = self.plan.switch(name).unwrap_or_else(|| panic!("no switch {name} in the plan"));
        let out = Command::new("ip")
            .args(["netns", "exec", &sw.ns])
            .arg(bin_dir().join("inc-switch"))
            .args(["stats", "127.0.0.1:7100"])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The counters of switch `name`; panics if it does not answer.
    pub fn stats(&self, name: &str) -> Value {
        self.try_stats(name).unwrap_or_else(|| panic!("switch {name} does not serve its counters"))
    }

    /// The link emulation counters (`inc-switch stats`, `link_emu`) of every emulated
    /// direction (`tx`, `rx`) of every port of every switch, keyed by (switch, port,
    /// direction).
    pub fn link_emu_counters(&self) -> BTreeMap<(String, String, &'static str), Value> {
        let mut out = BTreeMap::new();
        for sw in &self.plan.switches {
            let s = self.stats(&sw.name);
            for port in s["switches"][0]["ports"].as_array().into_iter().flatten() {
                let name = port["name"].as_str().unwrap_or("?");
                for dir in ["tx", "rx"] {
                    let c = &port["link_emu"][dir]["counters"];
                    if c.is_object() {
                        out.insert((sw.name.clone(), name.to_string(), dir), c.clone());
                    }
                }
            }
        }
        out
    }

    /// Start `program` (e.g. `inccl-allreduce`) on every host: `count` elements,
    /// `extra` arguments, `env` on top of the controller and interface settings.
    /// `job` picks the bootstrap port, so runs may overlap.
    pub fn start_hosts(
        &self,
        job: u16,
        program: &str,
        count: u64,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> HostRun {
        let world = self.plan.hosts.len();
        let master = format!("{}:{}", self.plan.hosts[0].mgmt, 52223 + job);
        let started = Instant::now();
        let children = self
            .plan
            .hosts
            .iter()
            .enumerate()
            .map(|(rank, h)| {
                let mut args =
                    vec![world.to_string(), master.clone(), rank.to_string(), count.to_string()];
                args.extend(extra.iter().map(|s| s.to_string()));
                let mut envs = vec![
                    ("INCCL_CONTROLLER".to_string(), self.plan.controller_addr.clone()),
                    ("INCCL_IFACE".to_string(), h.ifname.clone()),
                    (TOKEN_ENV.to_string(), self.creds.token(Role::Host).to_string()),
                ];
                envs.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
                let log = self.logdir.join(format!("job{job}-{program}-rank{rank}.log"));
                let child = spawn_in(&h.ns, &log, &bin_dir().join(program), &args, &envs);
                (rank, Some(child), log)
            })
            .collect();
        HostRun { children, started }
    }

    /// Run a shell command inside namespace `ns`; panics on failure.
    pub fn exec_in(&self, ns: &str, cmd: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(cmd)
            .output()
            .unwrap_or_else(|e| panic!("{cmd:?} in {ns}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?} in {ns} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Panics naming every rank of `out` that did not pass, with its output and the
    /// processes' logs; `what` names the run.
    pub fn assert_all_pass(&self, what: &str, out: &[HostOutcome]) {
        for o in out {
            assert!(
                o.passed(),
                "{what}: rank {} did not pass (status {:?}):\n{}\n{}",
                o.rank,
                o.status,
                o.output,
                self.logs()
            );
        }
    }

    /// Every log of this deployment, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        let Ok(dir) = std::fs::read_dir(&self.logdir) else { return s };
        let mut files: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            s += &format!("----- {}\n", f.display());
            for l in tail.iter().rev() {
                s += l;
                s += "\n";
            }
        }
        s
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        // SIGTERM first so switches print their counters into the logs.
        let pids: Vec<i32> =
            self.switches.values().chain(self.controller.as_ref()).map(|c| c.id() as i32).collect();
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for c in self.switches.values_mut().chain(self.controller.as_mut()) {
            loop {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if std::thread::panicking() {
            eprintln!("logs kept in {}", self.logdir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.logdir);
        }
    }
}
