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
