//! What the controller does with each message: switch registration and answers to
//! pushes, and the host requests (groups, communicators, status).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use inc_ctrl_proto::codec::{quote, MAX_QUOTED};
use inc_ctrl_proto::{Envelope, Message, PortInfo, RankEndpoint};
use tracing::{debug, info, warn};

use super::core::{Comm, ConnId, Core, Group, Standing};
use super::ops::OpKind;
use crate::auth::Role;
use crate::compiler::{compile, CommunicatorSpec};

impl Core {
    /// A message on a registered switch's connection.
    pub(super) fn switch_message(&mut self, conn: ConnId, switch_id: u32, env: Envelope) {
        match env.body {
            Message::Ack => self.push_answered(conn, env.id, Ok(())),
            Message::Error { reason } => self.push_answered(conn, env.id, Err(reason)),
            Message::Ping => self.send(conn, env.id, Message::Ack),
            other => {
                if let Some(ip) = self.conns.get(&conn).map(|c| c.peer.ip()) {
                    if self.may_log(ip) {
                        warn!(switch_id, kind = other.kind(), "unexpected message from switch");
                    }
                }
                let reason = format!("`{}` is not valid on a switch connection", other.kind());
                self.send(conn, env.id, Message::error(reason));
            }
        }
    }

    /// A message on a connection that is not a switch's.
    pub(super) fn host_request(&mut self, conn: ConnId, env: Envelope) {
        let Some(c) = self.conns.get(&conn) else { return };
        let (standing, peer) = (c.standing, c.peer);
        let authed = standing == Standing::Host || !self.cfg.auth.is_required();
        let id = env.id;
        let kind = env.body.kind();
        if !self.cfg.auth.is_required()
            && standing == Standing::New
            && !matches!(env.body, Message::RegisterSwitch { .. })
        {
            // Without credentials, the first request makes a connection a host's.
            self.authenticated(conn);
        }
        let reply = match env.body {
            Message::RegisterSwitch { switch_id, token, ports } if standing == Standing::New => {
                return self.register_switch(conn, id, switch_id, token.as_deref(), &ports);
            }
            Message::Ping => Message::Ack,
            Message::Hello { token } => match self.role_of(token.as_deref(), Role::Host) {
                Some(Role::Host) => {
                    self.authenticated(conn);
                    Message::Ack
                }
                _ => return self.auth_failed(conn, id, "hosts need the host credential"),
            },
            Message::RegisterGroup { token, world_size, hosts } => {
                if !authed {
                    if self.role_of(token.as_deref(), Role::Host) != Some(Role::Host) {
                        return self.auth_failed(
                            conn,
                            id,
                            "creating groups needs the host credential",
                        );
                    }
                    self.authenticated(conn);
                }
                match self.register_group(conn, world_size, hosts) {
                    Ok(group_id) => Message::GroupCreated { group_id },
                    Err(e) => Message::error(e),
                }
            }
            _ if !authed => {
                return self.auth_failed(
                    conn,
                    id,
                    "authenticate first (hello with the host credential)",
                )
            }
            Message::CreateCommunicator { group_id, ranks, mtu, window } => {
                match self.create_communicator(conn, id, group_id, ranks, mtu, window) {
                    Ok(()) => return, // answered when the switches have answered
                    Err(e) => Message::error(e),
                }
            }
            Message::DestroyCommunicator { comm_id } => {
                match self.destroy_communicator_request(conn, id, comm_id) {
                    Ok(()) => return,
                    Err(e) => Message::error(e),
                }
            }
            Message::DestroyGroup { group_id } => match self.owned_group(conn, group_id) {
                Ok(()) => {
                    if self
                        .conns
                        .get(&conn)
                        .is_some_and(|c| c.in_flight >= self.cfg.limits.max_requests_in_flight)
                    {
                        Message::error(self.in_flight_error())
                    } else {
                        self.destroy_group(group_id, Some((conn, id)));
                        return;
                    }
                }
                Err(e) => Message::error(e),
            },
            Message::Status => Message::StatusReport(self.status()),
            Message::RegisterSwitch { .. } => {
                Message::error("register_switch must be the first message of a connection")
            }
            other => {
                Message::error(format!("`{}` is not a request the controller serves", other.kind()))
            }
        };
        match &reply {
            Message::Error { reason } => {
                if self.may_log(peer.ip()) {
                    warn!(%peer, id, kind, %reason, "request refused");
                }
            }
            _ => debug!(%peer, id, kind, "request served"),
        }
        self.send(conn, id, reply);
    }

    fn authenticated(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.standing = Standing::Host;
            c.auth_deadline = None;
        }
    }

    fn in_flight_error(&self) -> String {
        format!(
            "too many requests waiting for switches on this connection (limit {})",
            self.cfg.limits.max_requests_in_flight
        )
    }

    fn register_switch(
        &mut self,
        conn: ConnId,
        id: u64,
        switch_id: u32,
        token: Option<&str>,
        ports: &[PortInfo],
    ) {
        if self.role_of(token, Role::Switch) != Some(Role::Switch) {
            return self.auth_failed(conn, id, "registering a switch needs the switch credential");
        }
        let peer = self.conns[&conn].peer;
        let topo = &self.cfg.topology;
        let refuse = |core: &mut Core, reason: String| {
            if core.may_log(peer.ip()) {
                warn!(%peer, switch_id, %reason, "switch registration refused");
            }
            core.send(conn, id, Message::error(reason));
        };
        let Some(si) = topo.switch_by_id(switch_id) else {
            let reason = format!("unknown switch id {switch_id}: not in topology `{}`", topo.name);
            return refuse(self, reason);
        };
        let sw = &topo.switches[si];
        let name = sw.name.clone();
        for p in ports {
            let Some(tp) = sw.ports.iter().find(|tp| tp.name == p.name) else {
                let reason = format!(
                    "switch {} (id {switch_id}) has no port `{}` in the topology",
                    sw.name,
                    quote(&p.name, MAX_QUOTED)
                );
                return refuse(self, reason);
            };
            if let Some(ip) = p.ip.filter(|ip| *ip != tp.addr.ip) {
                let reason = format!(
                    "port `{}`: switch reports IP {ip}, topology says {}",
                    p.name, tp.addr.ip
                );
                return refuse(self, reason);
            }
            if let Some(mac) = p.mac.filter(|m| *m != tp.mac) {
                warn!(switch = %sw.name, port = %p.name, %mac, topology_mac = %tp.mac, "port MAC differs from topology; rules use the topology MAC");
            }
        }
        // No takeover: a switch is served by one authenticated connection at a time. A
        // restarted switch gets in once the old connection is seen closed.
        if let Some(other) = self.switches.get(&switch_id).and_then(|c| self.conns.get(c)) {
            let reason = format!(
                "switch {name} (id {switch_id}) is already connected from {}; a second registration is refused",
                other.peer
            );
            return refuse(self, reason);
        }
        self.switches.insert(switch_id, conn);
        let gso = ports.iter().filter(|p| p.takes_gso).map(|p| p.name.clone()).collect();
        self.gso_ports.insert(switch_id, gso);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.standing = Standing::Switch(switch_id);
            c.auth_deadline = None;
        }
        info!(switch = %name, switch_id, %peer, "switch registered");
        self.send(conn, id, Message::Ack);
        // Re-push live rules: a switch drops what it had when it registers.
        let backlog: BTreeSet<u32> = self
            .comms
            .iter()
            .filter(|(_, c)| c.compiled.rules.iter().any(|r| r.switch_id == switch_id))
            .map(|(id, _)| *id)
            .collect();
        if !backlog.is_empty() {
            info!(switch = %name, communicators = backlog.len(), "re-pushing rules");
            self.start_repush(switch_id, backlog);
        }
    }

    fn register_group(
        &mut self,
        conn: ConnId,
        world_size: u16,
        hosts: Vec<Ipv4Addr>,
    ) -> Result<u64, String> {
        let topo = &self.cfg.topology;
        let limit = self.cfg.limits.max_groups_per_connection;
        if self.groups.values().filter(|g| g.owner == conn).count() >= limit {
            return Err(format!("this connection already has {limit} groups (limit {limit})"));
        }
        if world_size == 0 || usize::from(world_size) != hosts.len() {
            return Err(format!(
                "world_size {world_size} does not match {} host addresses",
                hosts.len()
            ));
        }
        if world_size == u16::MAX {
            return Err("world_size 65535 is reserved".into());
        }
        for (rank, ip) in hosts.iter().enumerate() {
            if topo.host_by_ip(*ip).is_none() {
                return Err(format!(
                    "rank {rank}: host IP {ip} is not a host of topology `{}`",
                    topo.name
                ));
            }
            if let Some(first) = hosts[..rank].iter().position(|o| o == ip) {
                return Err(format!("ranks {first} and {rank} both use host {ip}"));
            }
        }
        let id = self.next_group;
        self.next_group += 1;
        self.groups.insert(id, Group { world_size, hosts, owner: conn, comms: BTreeSet::new() });
        info!(group_id = id, world_size, "group registered");
        Ok(id)
    }

    /// Only the connection that registered a group may use or destroy it.
    fn owned_group(&self, conn: ConnId, group_id: u64) -> Result<(), String> {
        match self.groups.get(&group_id) {
            None => Err(format!("unknown group {group_id}")),
            Some(g) if g.owner != conn => {
                Err(format!("group {group_id} belongs to another connection"))
            }
            Some(_) => Ok(()),
        }
    }

    fn create_communicator(
        &mut self,
        conn: ConnId,
        id: u64,
        group_id: u64,
        ranks: Vec<RankEndpoint>,
        mtu: Option<u16>,
        window: Option<u32>,
    ) -> Result<(), String> {
        self.owned_group(conn, group_id)?;
        let limits = &self.cfg.limits;
        if self.conns.get(&conn).is_some_and(|c| c.in_flight >= limits.max_requests_in_flight) {
            return Err(self.in_flight_error());
        }
        let g = &self.groups[&group_id];
        if g.comms.len() >= limits.max_communicators_per_group {
            return Err(format!(
                "group {group_id} already has {} communicators (limit {})",
                g.comms.len(),
                limits.max_communicators_per_group
            ));
        }
        if ranks.len() != usize::from(g.world_size) {
            return Err(format!(
                "group {group_id} has {} ranks, request lists {}",
                g.world_size,
                ranks.len()
            ));
        }
        for r in &ranks {
            match g.hosts.get(usize::from(r.rank)) {
                None => {
                    return Err(format!(
                        "rank {} is outside the group (world size {})",
                        r.rank, g.world_size
                    ))
                }
                Some(ip) if *ip != r.ip => {
                    return Err(format!(
                        "rank {}: IP {} differs from the group's {ip}",
                        r.rank, r.ip
                    ))
                }
                Some(_) => {}
            }
        }
        let comm_id = loop {
            let c = self.next_comm;
            self.next_comm = self.next_comm.checked_add(1).unwrap_or(1);
            if !self.comms.contains_key(&c) {
                break c;
            }
        };
        let spec = CommunicatorSpec { comm_id, ranks, mtu, window };
        // Compiling checks the request against every switch's limits before it
        // allocates anything.
        let compiled = compile(&self.cfg.topology, &spec, &mut self.alloc, self.cfg.seed)
            .map_err(|e| e.to_string())?;
        let missing: Vec<String> = compiled
            .rules
            .iter()
            .filter(|r| !self.switches.contains_key(&r.switch_id))
            .map(|r| self.switch_label(r.switch_id))
            .collect();
        if !missing.is_empty() {
            self.alloc.release(comm_id);
            return Err(format!("switch(es) not connected: {}", missing.join(", ")));
        }
        let rules = compiled.rules.clone();
        self.comms.insert(comm_id, Comm { group_id, compiled, ready: false });
        self.groups.get_mut(&group_id).expect("checked").comms.insert(comm_id);
        let op = self.start_op(Some((conn, id)), OpKind::Install { comm_id, group_id });
        for r in rules {
            self.push(r.switch_id, Message::InstallCommunicator(r), Some(op));
        }
        Ok(())
    }

    fn destroy_communicator_request(
        &mut self,
        conn: ConnId,
        id: u64,
        comm_id: u32,
    ) -> Result<(), String> {
        let Some(c) = self.comms.get(&comm_id) else {
            return Err(format!("unknown communicator {comm_id}"));
        };
        if self.groups.get(&c.group_id).is_none_or(|g| g.owner != conn) {
            return Err(format!("communicator {comm_id} belongs to a group of another connection"));
        }
        if self
            .conns
            .get(&conn)
            .is_some_and(|c| c.in_flight >= self.cfg.limits.max_requests_in_flight)
        {
            return Err(self.in_flight_error());
        }
        let op = self
            .start_op(Some((conn, id)), OpKind::Remove { what: format!("communicator {comm_id}") });
        self.remove_communicator(comm_id, op);
        self.finish_if_done(op);
        Ok(())
    }

    /// Destroy a group and its communicators; `reply` is answered once every switch
    /// confirmed (or failed to).
    pub(super) fn destroy_group(&mut self, group_id: u64, reply: Option<(ConnId, u64)>) {
        // Out in one step, so no status report or new communicator sees it half gone.
        let Some(group) = self.groups.remove(&group_id) else { return };
        let op = self.start_op(reply, OpKind::Remove { what: format!("group {group_id}") });
        for comm_id in group.comms {
            self.remove_communicator(comm_id, op);
        }
        self.finish_if_done(op);
    }

    fn remove_communicator(&mut self, comm_id: u32, op: u64) {
        let Some(c) = self.comms.remove(&comm_id) else { return };
        self.alloc.release(comm_id);
        if let Some(g) = self.groups.get_mut(&c.group_id) {
            g.comms.remove(&comm_id);
        }
        for r in &c.compiled.rules {
            // A switch still waiting for the re-push of it never had it.
            if !self.unqueue_repush(r.switch_id, comm_id) {
                self.push(r.switch_id, Message::RemoveCommunicator { comm_id }, Some(op));
            }
        }
    }

    fn finish_if_done(&mut self, op: u64) {
        if self.ops.get(&op).is_some_and(|o| o.waiting == 0) {
            self.finish_op(op);
        }
    }
}
