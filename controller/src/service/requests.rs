//! What the controller does with each message: switch registration and answers to
//! pushes, and the host requests (groups, communicators, status).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;

use inc_ctrl_proto::codec::{quote, MAX_QUOTED};
use inc_ctrl_proto::{
    Envelope, EthernetAddress, HeldCommunicator, Message, Origin, Peer, PortInfo, RankEndpoint,
};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tracing::{debug, info, warn};

use super::core::{Comm, ConnId, Core, Group, Reporting, Standing};
use super::ops::OpKind;
use crate::auth::Role;
use crate::compiler::{compile_with_macs, port_mac, CommunicatorSpec, Compiled};

/// SHA-256 of a communicator key, lowercase hex (what switches keep and report).
fn key_digest(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A `register_switch` request as received.
pub(super) struct Registration<'a> {
    pub(super) switch_id: u32,
    pub(super) token: Option<&'a str>,
    pub(super) ports: &'a [PortInfo],
    pub(super) topology: Option<&'a str>,
    pub(super) held: Vec<HeldCommunicator>,
    pub(super) more_held: bool,
}

impl Core {
    /// A message on a registered switch's connection.
    pub(super) fn switch_message(&mut self, conn: ConnId, switch_id: u32, env: Envelope) {
        match env.body {
            Message::Ack => self.push_answered(conn, env.id, Ok(())),
            Message::Error { reason } => self.push_answered(conn, env.id, Err(reason)),
            Message::Ping => self.send(conn, env.id, Message::Ack),
            Message::ReportHeld { held, more } => {
                self.report_held(conn, switch_id, env.id, held, more)
            }
            Message::CommunicatorsExpired { comm_ids } => {
                self.communicators_expired(switch_id, &comm_ids);
                self.send(conn, env.id, Message::Ack);
            }
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
            Message::RegisterSwitch { switch_id, token, ports, topology, held, more_held }
                if standing == Standing::New =>
            {
                let reg = Registration {
                    switch_id,
                    token: token.as_deref(),
                    ports: &ports,
                    topology: topology.as_deref(),
                    held,
                    more_held,
                };
                return self.register_switch(conn, id, reg);
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
            Message::DestroyCommunicator { comm_id, key } => {
                match self.destroy_communicator_request(conn, id, comm_id, key.as_deref()) {
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

    fn register_switch(&mut self, conn: ConnId, id: u64, reg: Registration<'_>) {
        let Registration { switch_id, token, ports, topology, held, more_held } = reg;
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
        let ours = topo.fingerprint();
        if let Some(theirs) = topology.filter(|t| *t != ours) {
            let reason = format!(
                "switch {name} (id {switch_id}) runs topology {} but this controller serves {ours} \
                 (file {}): start both from the same topology file",
                quote(theirs, MAX_QUOTED),
                topo.file
            );
            return refuse(self, reason);
        }
        let mut reported = BTreeMap::new();
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
            if let Some(mac) = p.mac {
                if !mac.is_unicast() || mac == EthernetAddress([0; 6]) {
                    let reason = format!(
                        "port `{}`: switch reports MAC {mac}, which is not a unicast address",
                        p.name
                    );
                    return refuse(self, reason);
                }
                reported.insert(p.name.clone(), mac);
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
        // Before the held communicators are judged: rules with a port's old MAC are
        // then changed rules, dropped and re-pushed.
        self.take_port_macs(switch_id, reported);
        let by_name = ports.iter().map(|p| (p.name.clone(), p.clone())).collect();
        self.reported_ports.insert(switch_id, by_name);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.standing = Standing::Switch(switch_id);
            c.auth_deadline = None;
        }
        info!(switch = %name, switch_id, %peer, held = held.len(), more_held, "switch registered");
        let deadline = self.now + self.cfg.hello_timeout;
        self.reporting.insert(switch_id, Reporting { conn, kept: BTreeSet::new(), deadline });
        // A registration that reports nothing gets a plain `ack`, which switches that
        // predate held reports expect (they drop everything and get it re-pushed); to a
        // current switch it means the same as an empty verdict.
        let plain = held.is_empty() && !more_held;
        self.judge_held(conn, id, switch_id, held, more_held, plain);
    }

    /// A switch registered with these port MACs: the rules use them from now on (the
    /// topology's for ports it did not report). If a port's MAC changed (a restarted
    /// container has new ones), the live communicators' rules are changed on both ends
    /// of its links, and its neighbours are re-pushed theirs; the switch itself gets
    /// its own in the re-push that follows its registration. Hosts of communicators
    /// created before keep the switch MAC their endpoint named.
    fn take_port_macs(&mut self, switch_id: u32, reported: BTreeMap<String, EthernetAddress>) {
        let topo = &self.cfg.topology;
        let Some(si) = topo.switch_by_id(switch_id) else { return };
        let sw = &topo.switches[si];
        let (mut by_name, mut by_ip) = (HashMap::new(), HashMap::new());
        let (mut differ, mut renewed) = (Vec::new(), Vec::new());
        let last = self.port_macs.get(&switch_id);
        for (pi, tp) in sw.ports.iter().enumerate() {
            let Some(&mac) = reported.get(&tp.name) else { continue };
            if mac != tp.mac {
                differ.push(format!("{}={mac}", tp.name));
            }
            if let Some(old) = last.and_then(|m| m.get(&tp.name)).filter(|old| **old != mac) {
                renewed.push(format!("{}={old}->{mac}", tp.name));
            }
            let before = port_mac(&self.port_macs, sw, pi);
            if mac != before {
                by_name.insert(tp.name.clone(), mac);
                by_ip.insert(tp.addr.ip, mac);
            }
        }
        if !differ.is_empty() {
            info!(switch = %sw.name, ports = %differ.join(" "), "port MACs differ from the topology; rules use the reported MACs");
        }
        self.port_macs.entry(switch_id).or_default().extend(reported);
        if by_name.is_empty() {
            return;
        }
        let mut neighbours: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        let mut own = 0;
        for (&comm_id, c) in self.comms.iter_mut() {
            for r in c.compiled.rules.iter_mut() {
                let mine = r.switch_id == switch_id;
                for conn in r.connections.iter_mut() {
                    if mine {
                        if let Some(&m) = by_name.get(&conn.port) {
                            conn.local_mac = m;
                            own += 1;
                        }
                    }
                    let peer_is_it =
                        matches!(conn.peer, Peer::Switch { switch_id: s } if s == switch_id);
                    if let Some(&m) = by_ip.get(&conn.peer_ip).filter(|_| peer_is_it) {
                        if conn.peer_mac != Some(m) {
                            conn.peer_mac = Some(m);
                            if !mine {
                                neighbours.entry(r.switch_id).or_default().insert(comm_id);
                            }
                        }
                    }
                }
            }
            for e in c.compiled.endpoints.iter_mut().filter(|e| e.switch_id == switch_id) {
                if let Some(&m) = by_name.get(&e.switch_port) {
                    e.switch_mac = m;
                }
            }
        }
        if !renewed.is_empty() || own > 0 || !neighbours.is_empty() {
            info!(switch = %sw.name, ports = %renewed.join(" "), connections = own, neighbours = neighbours.len(), "port MACs changed since the last registration; live rules follow");
        }
        for (neighbour, comms) in neighbours {
            // One not connected now gets the changed rules when it registers.
            if self.switches.contains_key(&neighbour) {
                info!(
                    switch = %self.switch_label(neighbour),
                    peer = %self.switch_label(switch_id),
                    communicators = comms.len(),
                    "re-pushing rules: a peer's port MAC changed"
                );
                self.queue_repush(neighbour, comms);
            }
        }
    }

    /// The next part of a registering switch's held communicators.
    fn report_held(
        &mut self,
        conn: ConnId,
        switch_id: u32,
        id: u64,
        held: Vec<HeldCommunicator>,
        more: bool,
    ) {
        if !self.reporting.contains_key(&switch_id) {
            let reason = "report_held is only valid right after register_switch with more_held";
            return self.send(conn, id, Message::error(reason));
        }
        self.judge_held(conn, id, switch_id, held, more, false);
    }

    /// Decide on held communicators and answer with the verdict; after the last part,
    /// re-push what the switch lacks and forget adopted parts it no longer has.
    ///
    /// The rule (controller/README.md, "Restart and recovery"):
    /// - a communicator of this controller whose rules the switch holds unchanged is
    ///   kept (owned);
    /// - one of an earlier controller process (another epoch) is adopted when it fits
    ///   the topology and what is in use (QPNs, slots, slot memory) and agrees with
    ///   the parts other switches reported; it is kept as an orphan;
    /// - anything else is dropped by the switch: our own communicators destroyed while
    ///   it was away, changed rules (re-pushed), tombstoned or conflicting ones.
    fn judge_held(
        &mut self,
        conn: ConnId,
        id: u64,
        switch_id: u32,
        held: Vec<HeldCommunicator>,
        more: bool,
        plain_ack: bool,
    ) {
        let (mut owned, mut orphaned, mut dropped) = (Vec::new(), Vec::new(), Vec::new());
        for h in held {
            let comm_id = h.rules.comm_id;
            match self.judge(switch_id, h) {
                Ok(true) => owned.push(comm_id),
                Ok(false) => orphaned.push(comm_id),
                Err(why) => dropped.push(format!("{comm_id}: {why}")),
            }
        }
        let label = self.switch_label(switch_id);
        if !orphaned.is_empty() || !dropped.is_empty() {
            info!(
                switch = %label,
                owned = owned.len(),
                adopted = orphaned.len(),
                dropped = dropped.len(),
                "held communicators reported"
            );
        }
        if !dropped.is_empty() {
            let shown: Vec<&String> = dropped.iter().take(8).collect();
            debug!(switch = %label, ?shown, "held communicators dropped");
        }
        let next = self.now + self.cfg.hello_timeout;
        if let Some(r) = self.reporting.get_mut(&switch_id) {
            r.kept.extend(owned.iter().chain(&orphaned).copied());
            r.deadline = next;
        }
        let reply = if plain_ack { Message::Ack } else { Message::Registered { owned, orphaned } };
        self.send(conn, id, reply);
        if !more {
            let kept = self.reporting.remove(&switch_id).map(|r| r.kept).unwrap_or_default();
            self.report_done(switch_id, &kept);
        }
    }

    /// One held communicator: `Ok(true)` owned, `Ok(false)` adopted, `Err` dropped.
    fn judge(&mut self, switch_id: u32, h: HeldCommunicator) -> Result<bool, String> {
        let HeldCommunicator { rules, origin } = h;
        let origin = origin.unwrap_or_default();
        let comm_id = rules.comm_id;
        if rules.switch_id != switch_id {
            return Err(format!("rules are for switch {}", rules.switch_id));
        }
        match self.comms.get(&comm_id) {
            Some(c) if !c.adopted() => {
                if c.origin == origin && c.compiled.rules.contains(&rules) {
                    Ok(true)
                } else {
                    Err("another communicator has this id (or its rules changed)".into())
                }
            }
            // Reported again (the switch reconnected): still an orphan.
            Some(c) if c.origin == origin && c.compiled.rules.contains(&rules) => Ok(false),
            Some(c) => {
                let first = &c.compiled.rules[0];
                if c.origin != origin
                    || (first.world_size, first.mtu, first.window)
                        != (rules.world_size, rules.mtu, rules.window)
                {
                    return Err("disagrees with the parts other switches reported".into());
                }
                self.alloc.adopt(&self.cfg.topology, &rules)?;
                let c = self.comms.get_mut(&comm_id).expect("present");
                if rules.parent.is_none() {
                    c.compiled.root_switch = switch_id;
                }
                c.compiled.rules.push(rules);
                Ok(false)
            }
            None if origin.epoch == self.epoch => Err("destroyed while the switch was away".into()),
            None if self.tombstones.contains(origin.epoch, comm_id) => {
                Err("destroyed or expired since the restart".into())
            }
            None => {
                self.alloc.adopt(&self.cfg.topology, &rules)?;
                let root_switch = if rules.parent.is_none() { switch_id } else { 0 };
                let compiled =
                    Compiled { comm_id, root_switch, rules: vec![rules], endpoints: Vec::new() };
                self.comms.insert(comm_id, Comm { group_id: 0, compiled, ready: true, origin });
                // New communicators get ids above every adopted one.
                self.next_comm = self.next_comm.max(comm_id.checked_add(1).unwrap_or(1));
                info!(comm_id, switch = %self.switch_label(switch_id), "communicator adopted");
                Ok(false)
            }
        }
    }

    /// A registering switch reported everything it holds (`kept`): re-push our
    /// communicators it lacks (windowed), and give up adopted communicators it held
    /// before but lost (a part is missing: they cannot work any more).
    fn report_done(&mut self, switch_id: u32, kept: &BTreeSet<u32>) {
        let involves = |c: &Comm| c.compiled.rules.iter().any(|r| r.switch_id == switch_id);
        let backlog: BTreeSet<u32> = self
            .comms
            .iter()
            .filter(|(id, c)| !c.adopted() && involves(c) && !kept.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let lost: Vec<u32> = self
            .comms
            .iter()
            .filter(|(id, c)| c.adopted() && involves(c) && !kept.contains(id))
            .map(|(id, _)| *id)
            .collect();
        let label = self.switch_label(switch_id);
        for comm_id in lost {
            info!(comm_id, switch = %label, "adopted communicator lost a part; removing it");
            if let Some(c) = self.comms.get_mut(&comm_id) {
                c.compiled.rules.retain(|r| r.switch_id != switch_id);
            }
            let op =
                self.start_op(None, OpKind::Remove { what: format!("communicator {comm_id}") });
            self.remove_communicator(comm_id, op);
            self.finish_if_done(op);
        }
        if !backlog.is_empty() {
            info!(switch = %label, communicators = backlog.len(), "re-pushing rules");
            self.start_repush(switch_id, backlog);
        }
    }

    /// A switch freed orphaned communicators that stayed idle. An adopted one is
    /// removed everywhere; one a live group owns (the switch orphaned it while it was
    /// disconnected) is installed on that switch again.
    fn communicators_expired(&mut self, switch_id: u32, comm_ids: &[u32]) {
        let label = self.switch_label(switch_id);
        for &comm_id in comm_ids {
            let Some(c) = self.comms.get_mut(&comm_id) else { continue };
            if c.adopted() {
                info!(comm_id, switch = %label, "adopted communicator expired on a switch; removing it");
                // That switch already freed it.
                c.compiled.rules.retain(|r| r.switch_id != switch_id);
                let op =
                    self.start_op(None, OpKind::Remove { what: format!("communicator {comm_id}") });
                self.remove_communicator(comm_id, op);
                self.finish_if_done(op);
            } else if let Some(r) = c.compiled.rules.iter().find(|r| r.switch_id == switch_id) {
                warn!(comm_id, switch = %label, "switch expired a communicator a group owns; installing it again");
                let msg = Message::Install { rules: r.clone(), origin: c.origin.clone() };
                self.push(switch_id, msg, None);
            }
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
        let compiled = compile_with_macs(
            &self.cfg.topology,
            &spec,
            &mut self.alloc,
            self.cfg.seed,
            &self.port_macs,
        )
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
        let reporting: Vec<String> = compiled
            .rules
            .iter()
            .filter(|r| self.reporting.contains_key(&r.switch_id))
            .map(|r| self.switch_label(r.switch_id))
            .collect();
        if !reporting.is_empty() {
            self.alloc.release(comm_id);
            return Err(format!(
                "switch(es) {} registered and are still reporting the communicators they hold; retry in a moment",
                reporting.join(", ")
            ));
        }
        // The key lets rank 0 destroy the communicator from another connection (after
        // this one is lost); switches keep its digest, so a restarted controller that
        // adopts the communicator can check it.
        let key: String = rand::random::<[u8; 16]>().iter().map(|b| format!("{b:02x}")).collect();
        let origin = Origin { epoch: self.epoch, owner_digest: Some(key_digest(&key)) };
        let rules = compiled.rules.clone();
        self.comms
            .insert(comm_id, Comm { group_id, compiled, ready: false, origin: origin.clone() });
        self.groups.get_mut(&group_id).expect("checked").comms.insert(comm_id);
        let op = self.start_op(Some((conn, id)), OpKind::Install { comm_id, group_id, key });
        for r in rules {
            let msg = Message::Install { rules: r.clone(), origin: origin.clone() };
            self.push(r.switch_id, msg, Some(op));
        }
        Ok(())
    }

    fn destroy_communicator_request(
        &mut self,
        conn: ConnId,
        id: u64,
        comm_id: u32,
        key: Option<&str>,
    ) -> Result<(), String> {
        let Some(c) = self.comms.get(&comm_id) else {
            return Err(format!("unknown communicator {comm_id}"));
        };
        let owner = self.groups.get(&c.group_id).is_some_and(|g| g.owner == conn);
        // Digests compared in constant time: the answer's timing says nothing about
        // how much of a guessed key was right.
        let keyed = match (key, &c.origin.owner_digest) {
            (Some(k), Some(d)) => bool::from(key_digest(k).as_bytes().ct_eq(d.as_bytes())),
            _ => false,
        };
        if !owner && !keyed {
            return Err(if c.adopted() {
                format!(
                    "communicator {comm_id} was adopted after a controller restart: destroying it \
                     needs the key its rank 0 got when it was created"
                )
            } else {
                format!("communicator {comm_id} belongs to a group of another connection")
            });
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

    pub(super) fn remove_communicator(&mut self, comm_id: u32, op: u64) {
        let Some(c) = self.comms.remove(&comm_id) else { return };
        self.alloc.release(comm_id);
        if c.adopted() {
            // A switch that reports it later (it was away) drops it.
            self.tombstones.insert(c.origin.epoch, comm_id);
        }
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

    pub(super) fn finish_if_done(&mut self, op: u64) {
        if self.ops.get(&op).is_some_and(|o| o.waiting == 0) {
            self.finish_op(op);
        }
    }
}
