//! Controller session threads: one per logical switch. Connect and register (retrying
//! with backoff while the controller is away), forward pushes to the event loop, wait
//! for the engine's verdict, and acknowledge or reject.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;
use inc_ctrl_proto::{PortInfo, Push, SwitchSession};
use inc_switch_io::Waker;
use tracing::{info, warn};

use crate::event_loop::Command;

/// How long the event loop may take to apply a push before the push is rejected.
const APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a session checks the shutdown flag while waiting for pushes.
const POLL: Duration = Duration::from_millis(250);

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
        .spawn(move || run(&cfg, &commands, &waker, &shutdown))
}

fn run(cfg: &SessionConfig, commands: &Sender<Command>, waker: &Waker, shutdown: &AtomicBool) {
    let mut backoff = Duration::from_millis(100);
    let mut last_error = String::new();
    while !shutdown.load(Ordering::Relaxed) {
        let session = SwitchSession::connect(
            cfg.controller.as_str(),
            cfg.switch_id,
            cfg.token.clone(),
            cfg.ports.clone(),
            Duration::from_secs(5),
        );
        let mut session = match session {
            Ok(s) => s,
            Err(e) => {
                let msg = e.to_string();
                // Log each distinct failure once, not once per retry.
                if msg != last_error {
                    warn!(switch = %cfg.name, controller = %cfg.controller, error = %msg, "cannot register with controller; retrying");
                    last_error = msg;
                }
                sleep_unless_shutdown(backoff, shutdown);
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        info!(switch = %cfg.name, id = cfg.switch_id, controller = %cfg.controller, "registered with controller");
        backoff = Duration::from_millis(100);
        last_error.clear();
        // The controller re-pushes every live communicator after a registration.
        if commands.send(Command::Reset { switch: cfg.switch }).is_err() {
            return;
        }
        waker.wake();
        if let Err(e) = serve(cfg, &mut session, commands, waker, shutdown) {
            warn!(switch = %cfg.name, error = %e, "controller connection lost; reconnecting");
        }
    }
}

/// Forward pushes until shutdown (Ok) or a connection error.
fn serve(
    cfg: &SessionConfig,
    session: &mut SwitchSession,
    commands: &Sender<Command>,
    waker: &Waker,
    shutdown: &AtomicBool,
) -> Result<(), inc_ctrl_proto::ClientError> {
    while !shutdown.load(Ordering::Relaxed) {
        let Some(req) = session.next_push(POLL)? else { continue };
        let (reply, verdict) = crossbeam_channel::bounded(1);
        let cmd = match req.push {
            Push::Install(rules) => {
                Command::Install { switch: cfg.switch, rules: Box::new(rules), reply }
            }
            Push::Remove { comm_id } => Command::Remove { switch: cfg.switch, comm_id, reply },
        };
        if commands.send(cmd).is_err() {
            return Ok(()); // event loop gone: shutting down
        }
        waker.wake();
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

fn sleep_unless_shutdown(d: Duration, shutdown: &AtomicBool) {
    let step = Duration::from_millis(50);
    let mut left = d;
    while !left.is_zero() && !shutdown.load(Ordering::Relaxed) {
        let s = left.min(step);
        std::thread::sleep(s);
        left -= s;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use inc_controller::{demo_ranks, Controller, ServiceConfig, Topology};
    use inc_ctrl_proto::ControllerClient;
    use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig};
    use inc_switch_io::memory::MemoryBackend;
    use inc_switch_io::Backend;
    use serde_json::Value;

    use super::*;
    use crate::event_loop::{EventLoop, LogicalSwitch};
    use crate::spec;

    fn stats(tx: &Sender<Command>, waker: &Waker) -> Value {
        let (reply, rx) = crossbeam_channel::bounded(1);
        tx.send(Command::Stats { reply }).unwrap();
        waker.wake();
        rx.recv_timeout(Duration::from_secs(5)).unwrap()
    }

    /// The real controller service and a switch over the memory backend: register, get
    /// rules for a communicator pushed, acknowledge, and drop them on destroy.
    #[test]
    fn registers_installs_acknowledges_and_removes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-4.yaml");
        let topo = Topology::load(path).unwrap();
        let hosts: Vec<_> = topo.hosts.iter().map(|h| h.addr.ip).collect();
        let ctrl = Controller::start(ServiceConfig::insecure(topo.clone()), "127.0.0.1:0").unwrap();
        let addr = ctrl.local_addr().to_string();

        let plans = spec::resolve(&["sw0".parse().unwrap()], &[], Some(&topo)).unwrap();
        let plan = &plans[0];
        let specs = plan.ports.iter().map(|p| p.iface.clone()).collect();
        let (backend, _net) = MemoryBackend::new(specs, 64);
        let ports: Vec<PortConfig> = plan
            .ports
            .iter()
            .map(|p| PortConfig { name: p.port.clone(), ip: p.ip.unwrap(), mac: p.mac.unwrap() })
            .collect();
        let infos = plan
            .ports
            .iter()
            .map(|p| PortInfo { name: p.port.clone(), ip: p.ip, mac: p.mac, takes_gso: false })
            .collect();
        let switch = LogicalSwitch {
            id: plan.id,
            name: plan.name.clone(),
            engine: SwitchEngine::new(SwitchEngineConfig {
                switch_id: plan.id,
                ports,
                ..SwitchEngineConfig::default()
            }),
            port_base: 0,
            port_names: plan.ports.iter().map(|p| p.port.clone()).collect(),
            communicators: BTreeSet::new(),
        };
        let shutdown = Arc::new(AtomicBool::new(false));
        let waker = backend.waker();
        let (tx, rx) = crossbeam_channel::unbounded();
        let el = EventLoop::new(backend, vec![switch], rx, None, shutdown.clone());
        let loop_thread = std::thread::spawn(move || el.run().unwrap());
        let cfg = SessionConfig {
            controller: addr.clone(),
            token: None,
            switch: 0,
            switch_id: plan.id,
            name: plan.name.clone(),
            ports: infos,
        };
        let session = spawn(cfg, tx.clone(), waker.clone(), shutdown.clone()).unwrap();

        // Wait (bounded) until the controller sees the switch.
        let t = Duration::from_secs(5);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ctrl.status().switches.iter().any(|s| s.connected) {
            assert!(std::time::Instant::now() < deadline, "switch never registered");
            std::thread::sleep(Duration::from_millis(20));
        }

        let mut client = ControllerClient::connect(addr.as_str(), t).unwrap();
        let group = client.register_group(None, hosts.clone(), t).unwrap();
        let (comm, endpoints) =
            client.create_communicator(group, demo_ranks(&hosts), None, None, t).unwrap();
        assert_eq!(endpoints.len(), 4);
        let snap = stats(&tx, &waker);
        assert_eq!(snap["switches"][0]["communicators"], serde_json::json!([comm]));

        client.destroy_communicator(comm, t).unwrap();
        // Removal may be acknowledged after the reply to the host: wait, bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stats(&tx, &waker)["switches"][0]["communicators"] != serde_json::json!([]) {
            assert!(std::time::Instant::now() < deadline, "communicator never removed");
            std::thread::sleep(Duration::from_millis(20));
        }

        shutdown.store(true, Ordering::Relaxed);
        waker.wake();
        loop_thread.join().unwrap();
        session.join().unwrap();
        ctrl.stop();
    }
}
