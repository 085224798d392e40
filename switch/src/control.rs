//! Controller session threads: one per logical switch. Connect and register (retrying
//! with backoff while the controller is away), report the communicators the switch
//! holds and apply the controller's verdict on them, forward pushes to the event loop,
//! wait for the engine's verdict, and acknowledge or reject. While the switch holds
//! orphans (communicators no controller vouches for), sweep them every
//! [`sweep_every`]: those idle for the orphan timeout are freed, and reported to the
//! controller when connected.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use inc_ctrl_proto::{PortInfo, Push, Registration, SwitchSession};
use inc_switch_io::Waker;
use tracing::{info, warn};

use crate::event_loop::Command;

/// How long the event loop may take to apply a push before the push is rejected.
const APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a session checks the shutdown flag while waiting for pushes.
const POLL: Duration = Duration::from_millis(250);
/// Bound of each step of a registration (connect, each reply).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// What a session thread needs.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Controller address (`host:port`).
    pub controller: String,
    /// Shared token, if the controller requires one.
    pub token: Option<String>,
    /// Logical switch index in the event loop.
    pub switch: usize,
    /// Topology id.
    pub switch_id: u32,
    /// Name, for logs.
    pub name: String,
    /// Ports as registered.
    pub ports: Vec<PortInfo>,
    /// Fingerprint of the switch's topology file, if it has one.
    pub topology: Option<String>,
    /// Orphans idle this long are freed (`--orphan-idle-timeout`).
    pub orphan_timeout: Duration,
    /// Orphans the switch holds (kept up to date by the event loop).
    pub orphans: Arc<AtomicUsize>,
}

/// How often orphans are checked: a quarter of the timeout, between 50 ms and 1 s.
pub fn sweep_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// Start the session thread for one switch.
pub fn spawn(
    cfg: SessionConfig,
    commands: Sender<Command>,
    waker: Waker,
    shutdown: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("ctrl-{}", cfg.name))
        .spawn(move || Session { cfg, commands, waker, last_sweep: Instant::now() }.run(&shutdown))
}

struct Session {
    cfg: SessionConfig,
    commands: Sender<Command>,
    waker: Waker,
    last_sweep: Instant,
}

impl Session {
    fn send(&self, cmd: Command) -> bool {
        let ok = self.commands.send(cmd).is_ok();
        self.waker.wake();
        ok
    }

    /// Free orphans that stayed idle, if it is time; their ids.
    fn sweep(&mut self) -> Vec<u32> {
        let every = sweep_every(self.cfg.orphan_timeout);
        if self.cfg.orphans.load(Ordering::Relaxed) == 0 || self.last_sweep.elapsed() < every {
            return Vec::new();
        }
        self.last_sweep = Instant::now();
        let (reply, expired) = crossbeam_channel::bounded(1);
        let cmd = Command::Sweep { switch: self.cfg.switch, idle: self.cfg.orphan_timeout, reply };
        if !self.send(cmd) {
            return Vec::new();
        }
        expired.recv_timeout(APPLY_TIMEOUT).unwrap_or_default()
    }

    fn run(mut self, shutdown: &AtomicBool) {
        let cfg = self.cfg.clone();
        let mut backoff = Duration::from_millis(100);
        let mut last_error = String::new();
        while !shutdown.load(Ordering::Relaxed) {
            let (reply, held) = crossbeam_channel::bounded(1);
            if !self.send(Command::Held { switch: cfg.switch, reply }) {
                return;
            }
            let Ok(held) = held.recv_timeout(APPLY_TIMEOUT) else { return };
            let reported: Vec<u32> = held.iter().map(|h| h.rules.comm_id).collect();
            let reg = Registration {
                switch_id: cfg.switch_id,
                token: cfg.token.clone(),
                ports: cfg.ports.clone(),
                topology: cfg.topology.clone(),
                held,
            };
            let t0 = Instant::now();
            let (mut session, verdict) = match SwitchSession::register(
                cfg.controller.as_str(),
                reg,
                REGISTER_TIMEOUT,
            ) {
                Ok(s) => s,
                Err(e) => {
                    let msg = e.to_string();
                    // Log each distinct failure once, not once per retry.
                    if msg != last_error {
                        warn!(switch = %cfg.name, controller = %cfg.controller, error = %msg, "cannot register with controller; retrying");
                        last_error = msg;
                    }
                    self.sleep_sweeping(backoff, shutdown);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            info!(
                switch = %cfg.name,
                id = cfg.switch_id,
                controller = %cfg.controller,
                held = reported.len(),
                owned = verdict.owned.len(),
                orphaned = verdict.orphaned.len(),
                took_ms = t0.elapsed().as_millis() as u64,
                "registered with controller"
            );
            backoff = Duration::from_millis(100);
            last_error.clear();
            let cmd = if verdict.legacy {
                // A controller that does not judge held communicators re-pushes every
                // live one: drop what was held.
                Command::Reset { switch: cfg.switch }
            } else {
                Command::Verdict { switch: cfg.switch, reported, verdict }
            };
            if !self.send(cmd) {
                return;
            }
            if let Err(e) = self.serve(&mut session, shutdown) {
                warn!(switch = %cfg.name, error = %e, "controller connection lost; reconnecting");
                if !self.send(Command::Orphan { switch: cfg.switch }) {
                    return;
                }
            }
        }
    }

    /// Forward pushes until shutdown (Ok) or a connection error.
    fn serve(
        &mut self,
        session: &mut SwitchSession,
        shutdown: &AtomicBool,
    ) -> Result<(), inc_ctrl_proto::ClientError> {
        let cfg = self.cfg.clone();
        while !shutdown.load(Ordering::Relaxed) {
            let expired = self.sweep();
            if !expired.is_empty() {
                session.notify_expired(expired)?;
            }
            let Some(req) = session.next_push(POLL)? else { continue };
            let (reply, verdict) = crossbeam_channel::bounded(1);
            let cmd = match req.push {
                Push::Install(rules) => Command::Install {
                    switch: cfg.switch,
                    rules: Box::new(rules),
                    origin: req.origin,
                    reply,
                },
                Push::Remove { comm_id } => Command::Remove { switch: cfg.switch, comm_id, reply },
            };
            if !self.send(cmd) {
                return Ok(()); // event loop gone: shutting down
            }
            match verdict.recv_timeout(APPLY_TIMEOUT) {
                Ok(Ok(())) => session.ack(req.id)?,
                Ok(Err(reason)) => session
                    .reject(req.id, format!("switch {} ({}): {reason}", cfg.switch_id, cfg.name))?,
                Err(_) => session.reject(
                    req.id,
                    format!(
                        "switch {} ({}): not applied within {APPLY_TIMEOUT:?}",
                        cfg.switch_id, cfg.name
                    ),
                )?,
            }
        }
        Ok(())
    }

    /// Sleep `d` (cut short by shutdown), sweeping orphans meanwhile: without a
    /// controller, idle orphans are freed here.
    fn sleep_sweeping(&mut self, d: Duration, shutdown: &AtomicBool) {
        let step = Duration::from_millis(50);
        let mut left = d;
        while !left.is_zero() && !shutdown.load(Ordering::Relaxed) {
            let s = left.min(step);
            std::thread::sleep(s);
            left -= s;
            self.sweep();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::thread::JoinHandle;

    use inc_controller::{demo_ranks, Controller, ServiceConfig, Topology};
    use inc_ctrl_proto::ControllerClient;
    use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig};
    use inc_switch_io::memory::MemoryBackend;
    use inc_switch_io::Backend;
    use serde_json::{json, Value};

    use super::*;
    use crate::event_loop::{EventLoop, LogicalSwitch};
    use crate::spec;

    const T: Duration = Duration::from_secs(5);

    fn topology() -> Topology {
        Topology::load(concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-4.yaml")).unwrap()
    }

    /// Switch sw0 of 1-4 over the memory backend with its controller session.
    struct Switch {
        tx: Sender<Command>,
        waker: Waker,
        shutdown: Arc<AtomicBool>,
        threads: Vec<JoinHandle<()>>,
    }

    impl Switch {
        fn start(addr: &str, orphan_timeout: Duration) -> Switch {
            let topo = topology();
            let plans = spec::resolve(&["sw0".parse().unwrap()], &[], Some(&topo)).unwrap();
            let plan = &plans[0];
            let specs = plan.ports.iter().map(|p| p.iface.clone()).collect();
            let (backend, _net) = MemoryBackend::new(specs, 64);
            let ports: Vec<PortConfig> = plan
                .ports
                .iter()
                .map(|p| PortConfig {
                    name: p.port.clone(),
                    ip: p.ip.unwrap(),
                    mac: p.mac.unwrap(),
                })
                .collect();
            let infos = plan
                .ports
                .iter()
                .map(|p| PortInfo {
                    name: p.port.clone(),
                    ip: p.ip,
                    mac: p.mac,
                    takes_gso: false,
                    rx_rate_bps: None,
                })
                .collect();
            let engine = SwitchEngine::new(SwitchEngineConfig {
                switch_id: plan.id,
                ports,
                ..SwitchEngineConfig::default()
            });
            let names = plan.ports.iter().map(|p| p.port.clone()).collect();
            let switch = LogicalSwitch::new(plan.id, plan.name.clone(), engine, 0, names);
            let cfg = SessionConfig {
                controller: addr.to_string(),
                token: None,
                switch: 0,
                switch_id: plan.id,
                name: plan.name.clone(),
                ports: infos,
                topology: Some(topo.fingerprint()),
                orphan_timeout,
                orphans: switch.orphans.clone(),
            };
            let shutdown = Arc::new(AtomicBool::new(false));
            let waker = backend.waker();
            let (tx, rx) = crossbeam_channel::unbounded();
            let el = EventLoop::new(backend, vec![switch], rx, None, shutdown.clone());
            let looping = std::thread::spawn(move || {
                el.run().unwrap();
            });
            let session = spawn(cfg, tx.clone(), waker.clone(), shutdown.clone()).unwrap();
            Switch { tx, waker, shutdown, threads: vec![looping, session] }
        }

        fn stats(&self) -> Value {
            let (reply, rx) = crossbeam_channel::bounded(1);
            self.tx.send(Command::Stats { reply }).unwrap();
            self.waker.wake();
            rx.recv_timeout(T).unwrap()["switches"][0].clone()
        }

        /// Wait (bounded) until the switch's stats satisfy `ok`.
        fn wait(&self, what: &str, ok: impl Fn(&Value) -> bool) {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let s = self.stats();
                if ok(&s) {
                    return;
                }
                assert!(Instant::now() < deadline, "{what}: {s}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }

        fn stop(self) {
            self.shutdown.store(true, Ordering::Relaxed);
            self.waker.wake();
            for t in self.threads {
                t.join().unwrap();
            }
        }
    }

    fn wait_registered(ctrl: &Controller) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ctrl.status().switches.iter().any(|s| s.connected) {
            assert!(Instant::now() < deadline, "switch never registered");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The real controller service and a switch over the memory backend: register, get
    /// rules for a communicator pushed, acknowledge, and drop them on destroy.
    #[test]
    fn registers_installs_acknowledges_and_removes() {
        let topo = topology();
        let hosts: Vec<_> = topo.hosts.iter().map(|h| h.addr.ip).collect();
        let ctrl = Controller::start(ServiceConfig::insecure(topo), "127.0.0.1:0").unwrap();
        let addr = ctrl.local_addr().to_string();
        let sw = Switch::start(&addr, Duration::from_secs(120));
        wait_registered(&ctrl);

        let mut client = ControllerClient::connect(addr.as_str(), T).unwrap();
        let group = client.register_group(None, hosts.clone(), T).unwrap();
        let (comm, endpoints) =
            client.create_communicator(group, demo_ranks(&hosts), None, None, T).unwrap();
        assert_eq!(endpoints.len(), 4);
        assert_eq!(sw.stats()["communicators"], json!([comm]));

        client.destroy_communicator(comm, T).unwrap();
        // Removal may be acknowledged after the reply to the host: wait, bounded.
        sw.wait("communicator removed", |s| s["communicators"] == json!([]));
        assert_eq!(sw.stats()["slot_memory_bytes"], 0);
        sw.stop();
        ctrl.stop();
    }

    /// The controller goes away and another one starts on its address: the switch keeps
    /// its communicators (orphans) across the restart, reports them, the new controller
    /// adopts them; rank 0 destroys one with its key, the other is freed once idle for
    /// the orphan timeout and the controller hears of it; without a controller, idle
    /// orphans are freed too. Nothing in the data path is reset by a registration.
    #[test]
    fn communicators_survive_a_controller_restart_and_are_freed() {
        let topo = topology();
        let hosts: Vec<_> = topo.hosts.iter().map(|h| h.addr.ip).collect();
        let first =
            Controller::start(ServiceConfig::insecure(topo.clone()), "127.0.0.1:0").unwrap();
        let addr = first.local_addr().to_string();
        let orphan_timeout = Duration::from_millis(1500);
        let sw = Switch::start(&addr, orphan_timeout);
        wait_registered(&first);
        let mut client = ControllerClient::connect(addr.as_str(), T).unwrap();
        let group = client.register_group(None, hosts.clone(), T).unwrap();
        let x = client.create_communicator_keyed(group, demo_ranks(&hosts), None, Some(4), T);
        let x = x.unwrap();
        let z = client.create_communicator_keyed(group, demo_ranks(&hosts), None, Some(4), T);
        let z = z.unwrap();
        let ids = json!([x.comm_id, z.comm_id]);
        assert_eq!(sw.stats()["communicators"], ids);
        assert_eq!(sw.stats()["orphans"]["held"], 0);

        // The controller dies: both become orphans, nothing is removed.
        first.stop();
        sw.wait("orphaned", |s| s["orphans"]["held"] == 2);
        assert_eq!(sw.stats()["communicators"], ids);

        let second = Controller::start(ServiceConfig::insecure(topo.clone()), &addr).unwrap();
        let t0 = Instant::now();
        wait_registered(&second);
        let st = second.status();
        let adopted: Vec<(u32, bool)> =
            st.communicators.iter().map(|c| (c.comm_id, c.adopted)).collect();
        assert_eq!(adopted, [(x.comm_id, true), (z.comm_id, true)]);
        assert_eq!(sw.stats()["communicators"], ids, "kept across the registration");

        // Rank 0 comes back on a new connection with x's key.
        let mut again = ControllerClient::connect(addr.as_str(), T).unwrap();
        again.hello(None, T).unwrap();
        again.destroy_communicator_with_key(x.comm_id, x.key.clone(), T).unwrap();
        sw.wait("x removed", |s| s["communicators"] == json!([z.comm_id]));
        assert!(t0.elapsed() < orphan_timeout, "removed by the controller, not by the timeout");

        // z stays idle: freed by the switch, and the controller forgets it.
        sw.wait("z expired", |s| s["communicators"] == json!([]) && s["orphans"]["expired"] == 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !second.status().communicators.is_empty() {
            assert!(Instant::now() < deadline, "controller still lists {:?}", second.status());
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(sw.stats()["slot_memory_bytes"], 0);

        // A communicator of the second controller, which then goes away for good: freed
        // by the switch alone once idle.
        let group = again.register_group(None, hosts.clone(), T).unwrap();
        let (y, _) =
            again.create_communicator(group, demo_ranks(&hosts), None, Some(4), T).unwrap();
        assert_eq!(sw.stats()["communicators"], json!([y]));
        second.stop();
        sw.wait("y expired without a controller", |s| {
            s["communicators"] == json!([]) && s["orphans"]["expired"] == 2
        });
        sw.stop();
    }
}
