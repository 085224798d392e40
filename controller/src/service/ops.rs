//! Rule pushes and the operations that wait for them.
//!
//! Every push to a switch is a request with a deadline (`--ack-timeout`); its answer
//! (`ack` or `error`), the switch's disconnection or the deadline resolves it, and the
//! entry is removed in every case. An operation (install or remove a communicator's
//! rules) finishes when its last push is resolved, and only then answers the host.
//!
//! A switch that registers gets every live communicator re-pushed, at most
//! `Limits::repush_window` unanswered at a time: the next goes out as one is answered,
//! so thousands of communicators neither pile up in its send queue nor crowd out
//! the pushes of new communicators.

use std::collections::BTreeSet;
use std::time::Instant;

use inc_ctrl_proto::codec::quote;
use inc_ctrl_proto::{Message, REJECT_REASON_MAX};
use tracing::{debug, info, warn};

use super::core::{ConnId, Core};

/// A push waiting for the switch's answer.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) conn: ConnId,
    pub(super) switch_id: u32,
    pub(super) op: Option<u64>,
    pub(super) deadline: Instant,
    /// Part of the re-push after the switch registered.
    pub(super) repush: bool,
}

/// The re-push of a switch that registered.
#[derive(Debug, Default)]
pub(super) struct Repush {
    /// Communicators still to push, in id order.
    pub(super) backlog: BTreeSet<u32>,
    /// Re-pushes sent and not answered yet.
    pub(super) outstanding: usize,
}

#[derive(Debug)]
pub(super) enum OpKind {
    /// Rules of a new communicator are being installed.
    Install { comm_id: u32, group_id: u64, key: String },
    /// Rules are being removed (destroy communicator or group); failures are logged.
    Remove { what: String },
}

/// A request whose reply waits for switches.
#[derive(Debug)]
pub(super) struct Op {
    /// Connection and request id to answer, if anyone is waiting.
    pub(super) reply: Option<(ConnId, u64)>,
    pub(super) waiting: usize,
    pub(super) failed: Vec<String>,
    pub(super) kind: OpKind,
}

impl Core {
    /// Start an operation; `reply` counts against the connection's in-flight limit.
    pub(super) fn start_op(&mut self, reply: Option<(ConnId, u64)>, kind: OpKind) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        if let Some((conn, _)) = reply {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.in_flight += 1;
            }
        }
        self.ops.insert(id, Op { reply, waiting: 0, failed: Vec::new(), kind });
        id
    }

    /// Send a push to a registered switch; the answer resolves `op` (if any).
    pub(super) fn push(&mut self, switch_id: u32, msg: Message, op: Option<u64>) {
        self.push_inner(switch_id, msg, op, false);
    }

    fn push_inner(&mut self, switch_id: u32, msg: Message, op: Option<u64>, repush: bool) {
        let Some(&conn) = self.switches.get(&switch_id) else { return };
        let id = self.next_push;
        self.next_push += 1;
        let deadline = self.now + self.cfg.ack_timeout;
        self.pending.insert(id, Pending { conn, switch_id, op, deadline, repush });
        if let Some(o) = op.and_then(|o| self.ops.get_mut(&o)) {
            o.waiting += 1;
        }
        self.send(conn, id, msg);
    }

    /// Start re-pushing a switch's communicators (it just registered).
    pub(super) fn start_repush(&mut self, switch_id: u32, backlog: BTreeSet<u32>) {
        // Merged with one under way: a peer's MAC change may have started one.
        self.queue_repush(switch_id, backlog);
    }

    /// Add communicators to a switch's re-push (their rules changed), starting one if
    /// none is under way.
    pub(super) fn queue_repush(&mut self, switch_id: u32, comms: BTreeSet<u32>) {
        self.repush.entry(switch_id).or_default().backlog.extend(comms);
        self.repush_more(switch_id);
    }

    /// Re-push while fewer than the window are unanswered.
    fn repush_more(&mut self, switch_id: u32) {
        let window = self.cfg.limits.repush_window;
        loop {
            let Some(r) = self.repush.get_mut(&switch_id) else { return };
            if r.outstanding >= window {
                return;
            }
            let Some(comm_id) = r.backlog.pop_first() else {
                if r.outstanding == 0 {
                    self.repush.remove(&switch_id);
                    info!(switch = %self.switch_label(switch_id), "re-push complete");
                }
                return;
            };
            r.outstanding += 1;
            let msg = self.comms.get(&comm_id).and_then(|c| {
                let r = c.compiled.rules.iter().find(|r| r.switch_id == switch_id)?;
                Some(Message::Install { rules: r.clone(), origin: c.origin.clone() })
            });
            match msg {
                Some(m) => self.push_inner(switch_id, m, None, true),
                // Removed meanwhile (removal skips the backlog).
                None => self.repush.get_mut(&switch_id).expect("present").outstanding -= 1,
            }
        }
    }

    /// Take a communicator out of a switch's re-push backlog; false if it was not
    /// waiting there (the switch has it, or is being sent it).
    pub(super) fn unqueue_repush(&mut self, switch_id: u32, comm_id: u32) -> bool {
        self.repush.get_mut(&switch_id).is_some_and(|r| r.backlog.remove(&comm_id))
    }

    /// A switch answered push `id`. Answers to pushes sent to another connection are
    /// ignored: a switch can only acknowledge its own rules. Its reason is cut where
    /// it enters: it travels on into a host's reply and the log.
    pub(super) fn push_answered(&mut self, conn: ConnId, id: u64, result: Result<(), String>) {
        match self.pending.get(&id) {
            Some(p) if p.conn == conn => {
                let p = self.pending.remove(&id).expect("present");
                let result = result
                    .map_err(|reason| format!("rejected: {}", quote(&reason, REJECT_REASON_MAX)));
                self.resolve(p, result);
            }
            _ => debug!(conn, id, "answer to no pending push of this connection"),
        }
    }

    /// Pushes past their deadline fail and are removed.
    pub(super) fn expire_pushes(&mut self) {
        let now = self.now;
        let mut late: Vec<u64> =
            self.pending.iter().filter(|(_, p)| now >= p.deadline).map(|(id, _)| *id).collect();
        late.sort_unstable();
        for id in late {
            let p = self.pending.remove(&id).expect("present");
            self.resolve(p, Err("no acknowledgement in time".into()));
        }
    }

    /// A switch connection is gone: its pushes fail.
    pub(super) fn fail_pushes_of(&mut self, conn: ConnId) {
        let mut ids: Vec<u64> =
            self.pending.iter().filter(|(_, p)| p.conn == conn).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        for id in ids {
            let p = self.pending.remove(&id).expect("present");
            self.resolve(p, Err("disconnected".into()));
        }
    }

    fn resolve(&mut self, p: Pending, result: Result<(), String>) {
        let label = self.switch_label(p.switch_id);
        if p.repush {
            if let Some(r) = self.repush.get_mut(&p.switch_id) {
                r.outstanding -= 1;
            }
            self.repush_more(p.switch_id);
        }
        let Some(op_id) = p.op else {
            if let Err(e) = result {
                let ip = self.conns.get(&p.conn).map(|c| c.peer.ip());
                if ip.is_none_or(|ip| self.may_log(ip)) {
                    warn!(switch = %label, error = %e, "push not confirmed");
                }
            }
            return;
        };
        let Some(op) = self.ops.get_mut(&op_id) else { return };
        op.waiting -= 1;
        if let Err(e) = result {
            op.failed.push(format!("switch {label}: {e}"));
        }
        if op.waiting == 0 {
            self.finish_op(op_id);
        }
    }

    /// Called when an operation's last push is resolved (or when it sent none).
    pub(super) fn finish_op(&mut self, op_id: u64) {
        let Some(op) = self.ops.remove(&op_id) else { return };
        if let Some((conn, _)) = op.reply {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.in_flight -= 1;
            }
        }
        let reply = match op.kind {
            OpKind::Install { comm_id, group_id, key } => {
                self.finish_install(comm_id, group_id, key, op.failed)
            }
            OpKind::Remove { what } => {
                if op.failed.is_empty() {
                    info!(%what, "destroyed");
                } else {
                    // A switch that misses a removal gets a clean slate when it
                    // registers again.
                    warn!(%what, failed = ?op.failed, "destroyed; some switches did not confirm");
                }
                Message::Ack
            }
        };
        if let Some((conn, id)) = op.reply {
            if self.conns.contains_key(&conn) {
                self.send(conn, id, reply);
            }
        }
    }

    fn finish_install(
        &mut self,
        comm_id: u32,
        group_id: u64,
        key: String,
        failed: Vec<String>,
    ) -> Message {
        // The group (and with it the communicator) may have been destroyed meanwhile.
        let alive = self.comms.contains_key(&comm_id);
        if failed.is_empty() && alive {
            let c = self.comms.get_mut(&comm_id).expect("alive");
            c.ready = true;
            info!(
                comm_id,
                group_id,
                switches = c.compiled.rules.len(),
                root_switch = c.compiled.root_switch,
                "communicator installed"
            );
            let mut endpoints = c.compiled.endpoints.clone();
            for e in &mut endpoints {
                let port =
                    self.reported_ports.get(&e.switch_id).and_then(|p| p.get(&e.switch_port));
                e.switch_takes_gso = port.is_some_and(|p| p.takes_gso);
                e.link_rate_bps = port.and_then(|p| p.rx_rate_bps);
            }
            return Message::CommunicatorCreated { comm_id, endpoints, key: Some(key) };
        }
        let Some(c) = self.comms.remove(&comm_id) else {
            // The destroy already told every involved switch to remove the rules, after
            // the install on the same connection.
            return Message::error(format!(
                "group {group_id} was destroyed while communicator {comm_id} was being installed"
            ));
        };
        self.alloc.release(comm_id);
        if let Some(g) = self.groups.get_mut(&group_id) {
            g.comms.remove(&comm_id);
        }
        // Undo on every involved switch connected now (one that registered again
        // meanwhile may have received the rules in its re-push); answers are only logged.
        let involved: BTreeSet<u32> = c.compiled.rules.iter().map(|r| r.switch_id).collect();
        for sid in involved {
            self.push(sid, Message::RemoveCommunicator { comm_id }, None);
        }
        Message::error(format!(
            "communicator not installed within {:?}: {}",
            self.cfg.ack_timeout,
            failed.join("; ")
        ))
    }
}
