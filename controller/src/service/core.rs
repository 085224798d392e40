//! The controller's sans-IO core: every decision of the service, driven by calls that
//! carry bytes and the current time, answered through [`Output`]s. No sockets,
//! threads or clocks in here; [`super::Controller`] does the I/O around it and the
//! tests and the fuzz target drive it directly.
//!
//! - connections: limits per address and in total, the authentication deadline, the
//!   per-frame deadline, framing errors (this file);
//! - requests: switch registration, groups, communicators and their rule pushes
//!   ([`super::requests`]);
//! - operations waiting for switch acknowledgements and their deadlines
//!   ([`super::ops`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use inc_ctrl_proto::codec::{decode_body, peek_id, FrameBuffer};
use inc_ctrl_proto::{
    CommunicatorStatus, Envelope, GroupStatus, Message, StatusReport, SwitchStatus,
};
use tracing::{debug, info, warn};

use super::ops::{Op, Pending};
use super::ServiceConfig;
use crate::auth::Role;
use crate::compiler::{Allocator, Compiled};

/// Identifies a connection for the lifetime of the core (never reused).
pub type ConnId = u64;

/// What the I/O layer must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Write a frame to a connection.
    Send {
        /// Connection.
        conn: ConnId,
        /// Frame to write.
        envelope: Envelope,
    },
    /// Close a connection after writing what was queued for it; the core has already
    /// forgotten it.
    Close {
        /// Connection.
        conn: ConnId,
        /// Why, for logs.
        reason: String,
    },
}

/// What a connection has proven so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Standing {
    /// Nothing yet (a host that has not authenticated, or a fresh connection).
    New,
    /// Authenticated with the host credential (or any connection with `--insecure`
    /// that did not register a switch).
    Host,
    /// Registered this switch.
    Switch(u32),
}

#[derive(Debug)]
pub(super) struct Conn {
    pub(super) peer: SocketAddr,
    frames: FrameBuffer,
    /// When the first byte of the incomplete frame in `frames` arrived.
    frame_started: Option<Instant>,
    /// A connection that has not authenticated by then is closed.
    pub(super) auth_deadline: Option<Instant>,
    pub(super) standing: Standing,
    pub(super) auth_failures: u32,
    /// Requests of this connection whose reply waits for switches.
    pub(super) in_flight: usize,
}

#[derive(Debug)]
pub(super) struct Group {
    pub(super) world_size: u16,
    pub(super) hosts: Vec<Ipv4Addr>,
    pub(super) owner: ConnId,
    pub(super) comms: BTreeSet<u32>,
}

#[derive(Debug)]
pub(super) struct Comm {
    pub(super) group_id: u64,
    pub(super) compiled: Compiled,
    /// Every switch acknowledged the rules.
    pub(super) ready: bool,
}

/// The controller's state and decisions.
#[derive(Debug)]
pub struct Core {
    pub(super) cfg: ServiceConfig,
    pub(super) conns: HashMap<ConnId, Conn>,
    per_ip: HashMap<IpAddr, usize>,
    /// Registered switches by topology id.
    pub(super) switches: HashMap<u32, ConnId>,
    /// Ports of each switch, as last registered, that take whole UDP GSO frames.
    pub(super) gso_ports: HashMap<u32, BTreeSet<String>>,
    pub(super) groups: BTreeMap<u64, Group>,
    pub(super) comms: BTreeMap<u32, Comm>,
    pub(super) alloc: Allocator,
    /// Rule pushes waiting for the switch's answer, by push (request) id.
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) ops: HashMap<u64, Op>,
    pub(super) next_group: u64,
    pub(super) next_comm: u32,
    pub(super) next_push: u64,
    pub(super) next_op: u64,
    /// Time of the event being handled (every entry point passes it in).
    pub(super) now: Instant,
    out: Vec<Output>,
}

impl Core {
    /// A core with no connections.
    pub fn new(cfg: ServiceConfig, now: Instant) -> Self {
        Core {
            cfg,
            conns: HashMap::new(),
            per_ip: HashMap::new(),
            switches: HashMap::new(),
            gso_ports: HashMap::new(),
            groups: BTreeMap::new(),
            comms: BTreeMap::new(),
            alloc: Allocator::new(),
            pending: HashMap::new(),
            ops: HashMap::new(),
            next_group: 1,
            next_comm: 1,
            // Push ids live in the id space of requests the controller sends; starting
            // high keeps them apart from small client ids in captures and logs.
            next_push: 1 << 32,
            next_op: 1,
            now,
            out: Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServiceConfig {
        &self.cfg
    }

    /// Outputs produced since the last call, in order.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.out)
    }

    /// A new connection from `peer`. Refused (error frame, then close) when the
    /// service or this address already has as many connections as allowed.
    pub fn open(&mut self, conn: ConnId, peer: SocketAddr, now: Instant) {
        self.now = now;
        let limits = &self.cfg.limits;
        let from_ip = self.per_ip.get(&peer.ip()).copied().unwrap_or(0);
        let refuse = if self.conns.len() >= limits.max_connections {
            Some(format!("too many connections (limit {})", limits.max_connections))
        } else if from_ip >= limits.max_connections_per_address {
            Some(format!(
                "too many connections from {} (limit {} per address)",
                peer.ip(),
                limits.max_connections_per_address
            ))
        } else {
            None
        };
        if let Some(reason) = refuse {
            warn!(%peer, %reason, "connection refused");
            self.send(conn, 0, Message::error(reason.clone()));
            self.out.push(Output::Close { conn, reason });
            return;
        }
        *self.per_ip.entry(peer.ip()).or_default() += 1;
        self.conns.insert(
            conn,
            Conn {
                peer,
                frames: FrameBuffer::new(),
                frame_started: None,
                auth_deadline: Some(now + self.cfg.hello_timeout),
                standing: Standing::New,
                auth_failures: 0,
                in_flight: 0,
            },
        );
        debug!(%peer, conn, "connection accepted");
    }

    /// Bytes received on a connection.
    pub fn receive(&mut self, conn: ConnId, data: &[u8], now: Instant) {
        self.now = now;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.frames.extend(data);
        let mut completed = false;
        loop {
            let Some(c) = self.conns.get_mut(&conn) else { return };
            match c.frames.next_body() {
                Ok(Some(body)) => {
                    completed = true;
                    self.frame(conn, &body);
                }
                Ok(None) => break,
                Err(e) => {
                    // The stream cannot be resynchronised after a bad length.
                    warn!(peer = %c.peer, error = %e, "bad frame, closing connection");
                    self.send(conn, 0, Message::error(e.to_string()));
                    self.close(conn, e.to_string());
                    return;
                }
            }
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            // The deadline covers one frame: it restarts when a frame completes.
            c.frame_started = match c.frames.buffered() {
                0 => None,
                _ if completed => Some(now),
                _ => c.frame_started.or(Some(now)),
            };
        }
    }

    /// The connection is gone (closed by the peer or failed). Its switch
    /// registration ends; its groups and their communicators are destroyed.
    pub fn closed(&mut self, conn: ConnId, now: Instant) {
        self.now = now;
        self.forget(conn);
    }

    /// Enforce deadlines: frames that stall, connections that do not authenticate,
    /// pushes that are not acknowledged in time.
    pub fn tick(&mut self, now: Instant) {
        self.now = now;
        let frame_timeout = self.cfg.frame_timeout;
        let mut late: Vec<(ConnId, String)> = Vec::new();
        for (id, c) in &self.conns {
            if c.frame_started.is_some_and(|t| now >= t + frame_timeout) {
                late.push((*id, format!("a frame was not completed within {frame_timeout:?}")));
            } else if c.auth_deadline.is_some_and(|t| now >= t) {
                late.push((*id, format!("no authentication within {:?}", self.cfg.hello_timeout)));
            }
        }
        late.sort();
        for (id, reason) in late {
            if let Some(c) = self.conns.get(&id) {
                warn!(peer = %c.peer, %reason, "closing connection");
            }
            self.send(id, 0, Message::error(reason.clone()));
            self.close(id, reason);
        }
        self.expire_pushes();
    }

    /// The earliest time [`Core::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let conns = self.conns.values().flat_map(|c| {
            [c.frame_started.map(|t| t + self.cfg.frame_timeout), c.auth_deadline]
                .into_iter()
                .flatten()
        });
        conns.chain(self.pending.values().map(|p| p.deadline)).min()
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Pushes waiting for an acknowledgement.
    pub fn pending_pushes(&self) -> usize {
        self.pending.len()
    }

    /// Close a connection from inside the core (limits, protocol errors).
    pub(super) fn close(&mut self, conn: ConnId, reason: String) {
        if self.conns.contains_key(&conn) {
            self.out.push(Output::Close { conn, reason });
            self.forget(conn);
        }
    }

    fn forget(&mut self, conn: ConnId) {
        let Some(c) = self.conns.remove(&conn) else { return };
        if let Some(n) = self.per_ip.get_mut(&c.peer.ip()) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&c.peer.ip());
            }
        }
        if let Standing::Switch(id) = c.standing {
            if self.switches.get(&id) == Some(&conn) {
                self.switches.remove(&id);
                info!(switch_id = id, peer = %c.peer, "switch disconnected");
            }
            self.fail_pushes_of(conn);
        }
        // Groups live as long as the connection that registered them.
        let owned: Vec<u64> =
            self.groups.iter().filter(|(_, g)| g.owner == conn).map(|(id, _)| *id).collect();
        for g in owned {
            info!(group_id = g, peer = %c.peer, "owner disconnected, destroying group");
            self.destroy_group(g, None);
        }
        debug!(peer = %c.peer, conn, "connection closed");
    }

    /// One complete frame body from a connection.
    fn frame(&mut self, conn: ConnId, body: &[u8]) {
        let env = match decode_body(body) {
            Ok(env) => env,
            Err(e) => {
                let id = e.request_id().or_else(|| peek_id(body)).unwrap_or(0);
                if let Some(c) = self.conns.get(&conn) {
                    warn!(peer = %c.peer, id, error = %e, "bad message");
                }
                self.send(conn, id, Message::error(e.to_string()));
                return;
            }
        };
        let Some(c) = self.conns.get(&conn) else { return };
        match c.standing {
            Standing::Switch(switch_id) => self.switch_message(conn, switch_id, env),
            Standing::New | Standing::Host => self.host_request(conn, env),
        }
    }

    /// Queue a frame for a connection.
    pub(super) fn send(&mut self, conn: ConnId, id: u64, body: Message) {
        self.out.push(Output::Send { conn, envelope: Envelope::new(id, body) });
    }

    /// The role a token grants on this service; `None` when it grants none.
    /// With `--insecure` every token grants `wanted`.
    pub(super) fn role_of(&self, token: Option<&str>, wanted: Role) -> Option<Role> {
        if self.cfg.auth.is_required() {
            self.cfg.auth.role_of(token)
        } else {
            Some(wanted)
        }
    }

    /// Count a failed authentication; too many close the connection.
    pub(super) fn auth_failed(&mut self, conn: ConnId, id: u64, reason: &str) {
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.auth_failures += 1;
        let failures = c.auth_failures;
        warn!(peer = %c.peer, failures, "authentication failed");
        self.send(conn, id, Message::error(format!("authentication failed: {reason}")));
        if failures >= self.cfg.limits.max_auth_failures {
            self.close(conn, format!("{failures} failed authentications"));
        }
    }

    /// Name of a switch for messages: `leaf1 (id 1)`.
    pub(super) fn switch_label(&self, id: u32) -> String {
        let topo = &self.cfg.topology;
        match topo.switch_by_id(id) {
            Some(i) => format!("{} (id {id})", topo.switches[i].name),
            None => format!("? (id {id})"),
        }
    }

    /// The controller's state.
    pub fn status(&self) -> StatusReport {
        let topo = &self.cfg.topology;
        let switches = topo
            .switches
            .iter()
            .map(|s| {
                let conn = self.switches.get(&s.id).and_then(|c| self.conns.get(c));
                SwitchStatus {
                    switch_id: s.id,
                    name: s.name.clone(),
                    connected: conn.is_some(),
                    peer: conn.map(|c| c.peer.to_string()),
                    communicators: self
                        .comms
                        .iter()
                        .filter(|(_, c)| c.compiled.rules.iter().any(|r| r.switch_id == s.id))
                        .map(|(id, _)| *id)
                        .collect(),
                }
            })
            .collect();
        let groups = self
            .groups
            .iter()
            .map(|(id, g)| GroupStatus {
                group_id: *id,
                world_size: g.world_size,
                hosts: g.hosts.clone(),
                communicators: g.comms.iter().copied().collect(),
            })
            .collect();
        let communicators = self
            .comms
            .iter()
            .filter(|(_, c)| c.ready)
            .map(|(id, c)| CommunicatorStatus {
                comm_id: *id,
                group_id: c.group_id,
                switches: c.compiled.rules.iter().map(|r| r.switch_id).collect(),
                root_switch: c.compiled.root_switch,
                mtu: c.compiled.endpoints.first().map_or(0, |e| e.mtu),
                window: c.compiled.endpoints.first().map_or(0, |e| e.window),
            })
            .collect();
        StatusReport { topology: topo.name.clone(), switches, groups, communicators }
    }
}
