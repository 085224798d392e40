//! The controller's sans-IO core: every decision of the service, driven by calls that
//! carry bytes and the current time, answered through [`Output`]s. No sockets,
//! threads or clocks in here; [`super::Controller`] does the I/O around it and the
//! tests and the fuzz target drive it directly.
//!
//! - connections: admission (limits per address and in total, room kept for the
//!   authenticated), the authentication deadline, the per-frame deadline, framing
//!   errors (this file);
//! - requests: switch registration, groups, communicators and their rule pushes
//!   ([`super::requests`]);
//! - operations waiting for switch acknowledgements and their deadlines
//!   ([`super::ops`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use inc_ctrl_proto::codec::{decode_body, peek_id, FrameBuffer};
use inc_ctrl_proto::{
    CommunicatorStatus, Envelope, GroupStatus, Message, Origin, PortInfo, StatusReport,
    SwitchStatus,
};
use tracing::{debug, info, warn};

use super::loglimit::LogLimiter;
use super::ops::{Op, Pending, Repush};
use super::ServiceConfig;
use crate::auth::Role;
use crate::compiler::{Allocator, Compiled, PortMacs};

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
    /// Owning group; 0 for a communicator adopted from an earlier controller.
    pub(super) group_id: u64,
    /// Rules by switch. For an adopted communicator: the parts switches reported so
    /// far (`endpoints` empty).
    pub(super) compiled: Compiled,
    /// Every switch acknowledged the rules.
    pub(super) ready: bool,
    /// Which controller created it and the digest of its key.
    pub(super) origin: Origin,
}

impl Comm {
    /// Adopted after a controller restart: no group, no owner connection.
    pub(super) fn adopted(&self) -> bool {
        self.group_id == 0
    }
}

/// A registered switch still reporting the communicators it holds.
#[derive(Debug)]
pub(super) struct Reporting {
    /// Its connection.
    pub(super) conn: ConnId,
    /// Ids kept so far (owned or adopted).
    pub(super) kept: BTreeSet<u32>,
    /// The next part must arrive by then (`hello_timeout` after the last reply), or
    /// the connection is closed.
    pub(super) deadline: Instant,
}

/// Communicators of earlier controllers that were destroyed or expired here, so a
/// switch reporting one later does not bring it back. Oldest forgotten first.
#[derive(Debug, Default)]
pub(super) struct Tombstones {
    set: BTreeSet<(u64, u32)>,
    order: VecDeque<(u64, u32)>,
}

impl Tombstones {
    /// Entries kept.
    const CAP: usize = 1 << 16;

    pub(super) fn insert(&mut self, epoch: u64, comm_id: u32) {
        if self.set.insert((epoch, comm_id)) {
            self.order.push_back((epoch, comm_id));
            if self.order.len() > Self::CAP {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    pub(super) fn contains(&self, epoch: u64, comm_id: u32) -> bool {
        self.set.contains(&(epoch, comm_id))
    }
}

/// The controller's state and decisions.
#[derive(Debug)]
pub struct Core {
    pub(super) cfg: ServiceConfig,
    pub(super) conns: HashMap<ConnId, Conn>,
    /// Address of every connection whose resources (threads, buffers) the I/O layer
    /// has not released yet, open or closed: what the limits count.
    slots: HashMap<ConnId, IpAddr>,
    /// Peer-caused warnings written, per address.
    logs: LogLimiter,
    /// Registered switches by topology id.
    pub(super) switches: HashMap<u32, ConnId>,
    /// Ports of each switch as it last registered them, by name.
    pub(super) reported_ports: HashMap<u32, HashMap<String, PortInfo>>,
    /// MACs switches reported for their ports at their last registration: what the
    /// rules use in place of the topology's.
    pub(super) port_macs: PortMacs,
    pub(super) groups: BTreeMap<u64, Group>,
    pub(super) comms: BTreeMap<u32, Comm>,
    pub(super) alloc: Allocator,
    /// Rule pushes waiting for the switch's answer, by push (request) id.
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) ops: HashMap<u64, Op>,
    /// Switches that registered and are being re-pushed their communicators.
    pub(super) repush: HashMap<u32, Repush>,
    /// Switches that registered and are still reporting held communicators. No
    /// communicator involving them is created meanwhile.
    pub(super) reporting: HashMap<u32, Reporting>,
    /// This controller process's incarnation (random): stamped on the communicators
    /// it creates ([`Origin::epoch`]).
    pub(super) epoch: u64,
    /// Destroyed or expired communicators of earlier controllers.
    pub(super) tombstones: Tombstones,
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
            slots: HashMap::new(),
            logs: LogLimiter::new(now),
            switches: HashMap::new(),
            reported_ports: HashMap::new(),
            port_macs: PortMacs::new(),
            groups: BTreeMap::new(),
            comms: BTreeMap::new(),
            alloc: Allocator::new(),
            pending: HashMap::new(),
            ops: HashMap::new(),
            repush: HashMap::new(),
            reporting: HashMap::new(),
            // Never 0: that is the epoch of rules whose origin is unknown.
            epoch: rand::random::<u64>().max(1),
            tombstones: Tombstones::default(),
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

    /// A new connection from `peer`. Refused (error frame, then close) when its
    /// address already has as many connections (or unauthenticated ones) as allowed.
    /// When the service is full, or holds as many unauthenticated connections as
    /// allowed, the oldest unauthenticated connection of the address holding the most
    /// of them is closed to make room: the unauthenticated cannot lock out a switch or
    /// rank 0, whose first message authenticates them.
    pub fn open(&mut self, conn: ConnId, peer: SocketAddr, now: Instant) {
        self.now = now;
        let ip = peer.ip();
        let limits = &self.cfg.limits;
        let from_ip = self.slots.values().filter(|a| **a == ip).count();
        let mut unauth: HashMap<IpAddr, Vec<ConnId>> = HashMap::new();
        for (id, c) in &self.conns {
            if c.standing == Standing::New {
                unauth.entry(c.peer.ip()).or_default().push(*id);
            }
        }
        let unauth_total: usize = unauth.values().map(Vec::len).sum();
        let refuse = if from_ip >= limits.max_connections_per_address {
            Some(format!(
                "too many connections from {ip} (limit {} per address)",
                limits.max_connections_per_address
            ))
        } else if unauth.get(&ip).map_or(0, Vec::len) >= limits.max_unauthenticated_per_address {
            Some(format!(
                "too many unauthenticated connections from {ip} (limit {} per address)",
                limits.max_unauthenticated_per_address
            ))
        } else if self.slots.len() >= limits.max_connections + limits.max_closing {
            // Connections closed a moment ago whose threads are still ending.
            Some(format!("too many connections (limit {})", limits.max_connections))
        } else {
            None
        };
        let full = self.conns.len() >= limits.max_connections
            || unauth_total >= limits.max_unauthenticated;
        let victim = unauth
            .values()
            .max_by_key(|ids| (ids.len(), std::cmp::Reverse(ids.iter().min().copied())))
            .and_then(|ids| ids.iter().min().copied());
        let refuse = refuse.or_else(|| match (full, victim) {
            (true, None) => {
                Some(format!("too many connections (limit {})", limits.max_connections))
            }
            _ => None,
        });
        if let Some(reason) = refuse {
            if self.may_log(ip) {
                warn!(%peer, %reason, "connection refused");
            }
            self.send(conn, 0, Message::error(reason.clone()));
            self.out.push(Output::Close { conn, reason });
            return;
        }
        if let (true, Some(v)) = (full, victim) {
            let reason = "closed to make room: the service is full and this connection had not authenticated".to_string();
            if let Some(p) = self.conns.get(&v).map(|c| c.peer) {
                if self.may_log(p.ip()) {
                    warn!(peer = %p, "unauthenticated connection closed to make room");
                }
            }
            self.send(v, 0, Message::error(reason.clone()));
            self.close(v, reason);
        }
        self.slots.insert(conn, ip);
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

    /// The I/O layer has released everything a connection held (its threads ended,
    /// its buffers are freed): its place in the limits is free again.
    pub fn released(&mut self, conn: ConnId) {
        self.slots.remove(&conn);
    }

    /// Whether a warning caused by a peer at `ip` may be logged now (rate limit per
    /// address, see [`LogLimiter`]).
    pub(super) fn may_log(&mut self, ip: IpAddr) -> bool {
        self.logs.allow(ip, self.now)
    }

    /// Bytes received on a connection: buffered, then every complete frame handled.
    pub fn receive(&mut self, conn: ConnId, data: &[u8], now: Instant) {
        self.buffer(conn, data, now);
        while self.next_frame(conn, now) {}
    }

    /// Bytes received on a connection, only buffered: [`Core::next_frame`] handles
    /// them one frame at a time, so the I/O layer can stop between frames while the
    /// peer does not read its replies (flow control).
    pub fn buffer(&mut self, conn: ConnId, data: &[u8], now: Instant) {
        self.now = now;
        let Some(c) = self.conns.get_mut(&conn) else { return };
        c.frames.extend(data);
        if c.frames.buffered() > 0 && c.frame_started.is_none() {
            c.frame_started = Some(now);
        }
    }

    /// Handle the next complete buffered frame of a connection; false when there is
    /// none (more bytes are needed, or the connection is closed).
    pub fn next_frame(&mut self, conn: ConnId, now: Instant) -> bool {
        self.now = now;
        let Some(c) = self.conns.get_mut(&conn) else { return false };
        match c.frames.next_body() {
            Ok(Some(body)) => {
                // The deadline covers one frame: it restarts when a frame completes.
                c.frame_started = (c.frames.buffered() > 0).then_some(now);
                self.frame(conn, &body);
                true
            }
            Ok(None) => false,
            Err(e) => {
                // The stream cannot be resynchronised after a bad length.
                let peer = c.peer;
                if self.may_log(peer.ip()) {
                    warn!(%peer, error = %e, "bad frame, closing connection");
                }
                self.send(conn, 0, Message::error(e.to_string()));
                self.close(conn, e.to_string());
                false
            }
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
        let hello = self.cfg.hello_timeout;
        for r in self.reporting.values().filter(|r| now >= r.deadline) {
            late.push((
                r.conn,
                format!("the next part of the held communicators did not come within {hello:?}"),
            ));
        }
        late.sort();
        late.dedup_by_key(|(id, _)| *id);
        for (id, reason) in late {
            if let Some(ip) = self.conns.get(&id).map(|c| c.peer.ip()) {
                if self.may_log(ip) {
                    warn!(peer = %ip, conn = id, %reason, "closing connection");
                }
            }
            self.send(id, 0, Message::error(reason.clone()));
            self.close(id, reason);
        }
        self.expire_pushes();
        self.logs.tick(now);
    }

    /// The earliest time [`Core::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Instant> {
        let conns = self.conns.values().flat_map(|c| {
            [c.frame_started.map(|t| t + self.cfg.frame_timeout), c.auth_deadline]
                .into_iter()
                .flatten()
        });
        conns
            .chain(self.reporting.values().map(|r| r.deadline))
            .chain(self.pending.values().map(|p| p.deadline))
            .chain(self.logs.next_deadline())
            .min()
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Connections whose resources are not released yet (open or closing).
    pub fn slots(&self) -> usize {
        self.slots.len()
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
        if let Standing::Switch(id) = c.standing {
            if self.switches.get(&id) == Some(&conn) {
                self.switches.remove(&id);
                self.repush.remove(&id);
                self.reporting.remove(&id);
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
                // The codec quotes at most a short, escaped prefix of the input.
                if let Some(ip) = self.conns.get(&conn).map(|c| c.peer.ip()) {
                    if self.may_log(ip) {
                        warn!(peer = %ip, conn, id, error = %e, "bad message");
                    }
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
        let (failures, peer) = (c.auth_failures, c.peer);
        if self.may_log(peer.ip()) {
            warn!(%peer, failures, "authentication failed");
        }
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
                mtu: c.compiled.rules.first().map_or(0, |r| r.mtu),
                window: c.compiled.rules.first().map_or(0, |r| r.window),
                adopted: c.adopted(),
            })
            .collect();
        StatusReport { topology: topo.name.clone(), switches, groups, communicators }
    }
}
