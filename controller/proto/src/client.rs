//! Blocking clients: [`ControllerClient`] for hosts (rank 0, tools) and
//! [`SwitchSession`] for switches. Std sockets with timeouts; every wait is bounded.

use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use crate::codec::{quote, write_frame, CodecError, FrameDecoder, MAX_REPLY_FRAME};
use crate::{
    Envelope, HeldCommunicator, HostEndpoint, Message, Origin, PortInfo, RankEndpoint,
    StatusReport, SwitchRules,
};

/// Client-side errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Could not resolve or reach the controller.
    #[error("cannot connect to controller {addr}: {source}")]
    Connect {
        /// Address tried.
        addr: String,
        /// Cause.
        source: io::Error,
    },
    /// No reply within the timeout.
    #[error("timed out after {0:?} waiting for the controller")]
    Timeout(Duration),
    /// The controller answered with an error.
    #[error("controller rejected the request: {0}")]
    Rejected(String),
    /// The controller answered with an unexpected message.
    #[error("unexpected reply `{0}`")]
    Unexpected(&'static str),
    /// Framing or socket failure; the connection is unusable afterwards.
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// A framed connection with a buffer, so a timeout never splits a frame.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    dec: FrameDecoder,
    next_id: u64,
}

impl Conn {
    fn connect<A: ToSocketAddrs + std::fmt::Display>(
        addr: A,
        timeout: Duration,
    ) -> Result<Conn, ClientError> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|source| ClientError::Connect { addr: addr.to_string(), source })?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for a in &addrs {
            match TcpStream::connect_timeout(a, timeout) {
                Ok(stream) => {
                    stream.set_nodelay(true).ok();
                    stream
                        .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
                        .map_err(CodecError::from)?;
                    // The controller's replies may exceed the request limit (`status`).
                    let dec = FrameDecoder::with_limit(MAX_REPLY_FRAME);
                    return Ok(Conn { stream, dec, next_id: 1 });
                }
                Err(e) => last = e,
            }
        }
        let addr = addrs.first().map(|a| a.to_string()).unwrap_or_default();
        Err(ClientError::Connect { addr, source: last })
    }

    fn send(&mut self, id: u64, body: Message) -> Result<(), ClientError> {
        write_frame(&mut self.stream, &Envelope::new(id, body))?;
        Ok(())
    }

    /// Next envelope before `deadline`; `Ok(None)` on timeout.
    fn recv(&mut self, deadline: Instant) -> Result<Option<Envelope>, ClientError> {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match self.dec.next_frame() {
                Ok(Some(env)) => return Ok(Some(env)),
                Ok(None) => {}
                Err(e) => return Err(e.into()),
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(deadline - now)).map_err(CodecError::from)?;
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(CodecError::Closed.into()),
                Ok(n) => self.dec.extend(&buf[..n]),
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
                {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CodecError::from(e).into()),
            }
        }
    }

    fn request(&mut self, msg: Message, timeout: Duration) -> Result<Message, ClientError> {
        self.request_keeping(msg, timeout, |_| false)
    }

    /// [`Conn::request`] that hands envelopes for which `keep` returns true (requests
    /// of the other side arriving meanwhile) to `keep` instead of skipping them.
    fn request_keeping(
        &mut self,
        msg: Message,
        timeout: Duration,
        mut keep: impl FnMut(&Envelope) -> bool,
    ) -> Result<Message, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(id, msg)?;
        let deadline = Instant::now() + timeout;
        loop {
            match self.recv(deadline)? {
                None => return Err(ClientError::Timeout(timeout)),
                // Replies to requests that timed out earlier are skipped.
                Some(env) if env.id != id => {
                    keep(&env);
                }
                Some(env) => {
                    return match env.body {
                        Message::Error { reason } => Err(ClientError::Rejected(reason)),
                        other => Ok(other),
                    }
                }
            }
        }
    }
}

/// A communicator as created by the controller.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedCommunicator {
    /// Communicator id.
    pub comm_id: u32,
    /// Each rank's endpoint, by rank.
    pub endpoints: Vec<HostEndpoint>,
    /// The key that destroys it from another connection (see
    /// [`ControllerClient::destroy_communicator_with_key`]).
    pub key: Option<String>,
}

/// Blocking request/reply client for hosts and tools.
///
/// Groups registered through a client live as long as its connection: keep the
/// client for the lifetime of the group.
#[derive(Debug)]
pub struct ControllerClient {
    conn: Conn,
}

impl ControllerClient {
    /// Connect to the controller.
    pub fn connect<A: ToSocketAddrs + std::fmt::Display>(
        addr: A,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        Ok(ControllerClient { conn: Conn::connect(addr, timeout)? })
    }

    /// Send a request and wait for its reply. An `Error` reply becomes
    /// [`ClientError::Rejected`].
    pub fn request(&mut self, msg: Message, timeout: Duration) -> Result<Message, ClientError> {
        self.conn.request(msg, timeout)
    }

    /// Authenticate the connection.
    pub fn hello(&mut self, token: Option<String>, timeout: Duration) -> Result<(), ClientError> {
        match self.request(Message::Hello { token }, timeout)? {
            Message::Ack => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Register a group; returns its id.
    pub fn register_group(
        &mut self,
        token: Option<String>,
        hosts: Vec<Ipv4Addr>,
        timeout: Duration,
    ) -> Result<u64, ClientError> {
        let world_size = hosts.len() as u16;
        match self.request(Message::RegisterGroup { token, world_size, hosts }, timeout)? {
            Message::GroupCreated { group_id } => Ok(group_id),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Create a communicator; returns its id and each rank's endpoint (by rank).
    pub fn create_communicator(
        &mut self,
        group_id: u64,
        ranks: Vec<RankEndpoint>,
        mtu: Option<u16>,
        window: Option<u32>,
        timeout: Duration,
    ) -> Result<(u32, Vec<HostEndpoint>), ClientError> {
        self.create_communicator_keyed(group_id, ranks, mtu, window, timeout)
            .map(|c| (c.comm_id, c.endpoints))
    }

    /// [`Self::create_communicator`], also returning the communicator's key.
    pub fn create_communicator_keyed(
        &mut self,
        group_id: u64,
        ranks: Vec<RankEndpoint>,
        mtu: Option<u16>,
        window: Option<u32>,
        timeout: Duration,
    ) -> Result<CreatedCommunicator, ClientError> {
        match self.request(Message::CreateCommunicator { group_id, ranks, mtu, window }, timeout)? {
            Message::CommunicatorCreated { comm_id, endpoints, key } => {
                Ok(CreatedCommunicator { comm_id, endpoints, key })
            }
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Destroy a communicator of a group this connection registered.
    pub fn destroy_communicator(
        &mut self,
        comm_id: u32,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        self.destroy_communicator_with_key(comm_id, None, timeout)
    }

    /// Destroy a communicator, proving ownership with its key (from
    /// [`Self::create_communicator_keyed`]) when this is not the connection that
    /// created it.
    pub fn destroy_communicator_with_key(
        &mut self,
        comm_id: u32,
        key: Option<String>,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        match self.request(Message::DestroyCommunicator { comm_id, key }, timeout)? {
            Message::Ack => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Destroy a group and its communicators.
    pub fn destroy_group(&mut self, group_id: u64, timeout: Duration) -> Result<(), ClientError> {
        match self.request(Message::DestroyGroup { group_id }, timeout)? {
            Message::Ack => Ok(()),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Controller state.
    pub fn status(&mut self, timeout: Duration) -> Result<StatusReport, ClientError> {
        match self.request(Message::Status, timeout)? {
            Message::StatusReport(r) => Ok(r),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }
}

/// Longest reason a switch sends with a rejected push.
pub const REJECT_REASON_MAX: usize = 512;

/// Encoded bytes of held communicators per registration message (the controller
/// takes requests of at most [`crate::MAX_FRAME`], 1 MiB).
pub const HELD_CHUNK_BYTES: usize = 256 << 10;

/// A rule push received by a switch.
#[derive(Debug, Clone, PartialEq)]
pub enum Push {
    /// Install (or replace) a communicator's rules.
    Install(SwitchRules),
    /// Remove a communicator.
    Remove {
        /// Communicator id.
        comm_id: u32,
    },
}

/// A push with the request id to acknowledge.
#[derive(Debug, Clone, PartialEq)]
pub struct PushRequest {
    /// Id to pass to [`SwitchSession::ack`] / [`SwitchSession::reject`].
    pub id: u64,
    /// The push.
    pub push: Push,
    /// Origin of installed rules (to keep and report when registering again).
    pub origin: Option<Origin>,
}

/// What a switch tells the controller when it registers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Registration {
    /// Topology switch id.
    pub switch_id: u32,
    /// Switch credential.
    pub token: Option<String>,
    /// Data-plane ports.
    pub ports: Vec<PortInfo>,
    /// Fingerprint of the switch's topology file, if it has one.
    pub topology: Option<String>,
    /// Communicators the switch holds.
    pub held: Vec<HeldCommunicator>,
}

/// The controller's verdict on the held communicators of a [`Registration`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Keep: a live group owns them.
    pub owned: Vec<u32>,
    /// Keep as orphans (adopted from an earlier controller; free them when idle).
    pub orphaned: Vec<u32>,
    /// The controller answered `ack` (it predates held reports): drop everything held;
    /// it re-pushes what is live.
    pub legacy: bool,
}

/// Switch side of the controller connection: connect, register, then receive pushes
/// and acknowledge them. Rules only ever arrive through this session, which is how a
/// switch accepts rules only from its controller connection.
#[derive(Debug)]
pub struct SwitchSession {
    conn: Conn,
    switch_id: u32,
    /// Pushes that arrived while the session waited for a reply.
    stashed: VecDeque<Envelope>,
}

fn is_push(env: &Envelope) -> bool {
    matches!(
        env.body,
        Message::InstallCommunicator(_)
            | Message::Install { .. }
            | Message::RemoveCommunicator { .. }
            | Message::Ping
    )
}

/// Split held communicators into parts of at most [`HELD_CHUNK_BYTES`] encoded (at
/// least one communicator per part).
fn held_parts(held: Vec<HeldCommunicator>) -> Vec<Vec<HeldCommunicator>> {
    let mut parts: Vec<Vec<HeldCommunicator>> = Vec::new();
    let mut bytes = 0;
    for h in held {
        let len = serde_json::to_vec(&h).map_or(HELD_CHUNK_BYTES, |v| v.len() + 1);
        match parts.last_mut() {
            Some(p) if bytes + len <= HELD_CHUNK_BYTES => {
                bytes += len;
                p.push(h);
            }
            _ => {
                bytes = len;
                parts.push(vec![h]);
            }
        }
    }
    parts
}

impl SwitchSession {
    /// Connect and register, holding nothing. Fails if the controller rejects the
    /// registration.
    pub fn connect<A: ToSocketAddrs + std::fmt::Display>(
        addr: A,
        switch_id: u32,
        token: Option<String>,
        ports: Vec<PortInfo>,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let reg = Registration { switch_id, token, ports, ..Registration::default() };
        Self::register(addr, reg, timeout).map(|(s, _)| s)
    }

    /// Connect, register and report the held communicators (in parts of at most
    /// [`HELD_CHUNK_BYTES`]; `timeout` bounds each step). Pushes that arrive meanwhile
    /// are kept for [`Self::next_push`], so the caller applies the verdict first.
    pub fn register<A: ToSocketAddrs + std::fmt::Display>(
        addr: A,
        reg: Registration,
        timeout: Duration,
    ) -> Result<(Self, Verdict), ClientError> {
        let conn = Conn::connect(addr, timeout)?;
        let mut s = SwitchSession { conn, switch_id: reg.switch_id, stashed: VecDeque::new() };
        let mut parts = held_parts(reg.held).into_iter();
        let first = parts.next().unwrap_or_default();
        let mut more = !parts.as_slice().is_empty();
        let msg = Message::RegisterSwitch {
            switch_id: reg.switch_id,
            token: reg.token,
            ports: reg.ports,
            topology: reg.topology,
            held: first,
            more_held: more,
        };
        let mut verdict = Verdict::default();
        let mut reply = s.request(msg, timeout)?;
        loop {
            match reply {
                Message::Ack => {
                    verdict.legacy = true;
                    return Ok((s, verdict));
                }
                Message::Registered { owned, orphaned } => {
                    verdict.owned.extend(owned);
                    verdict.orphaned.extend(orphaned);
                }
                other => return Err(ClientError::Unexpected(other.kind())),
            }
            let Some(held) = parts.next() else { return Ok((s, verdict)) };
            more = !parts.as_slice().is_empty();
            reply = s.request(Message::ReportHeld { held, more }, timeout)?;
        }
    }

    fn request(&mut self, msg: Message, timeout: Duration) -> Result<Message, ClientError> {
        let stashed = &mut self.stashed;
        self.conn.request_keeping(msg, timeout, |env| {
            if is_push(env) {
                stashed.push_back(env.clone());
            }
            true
        })
    }

    /// Switch id this session registered.
    pub fn switch_id(&self) -> u32 {
        self.switch_id
    }

    /// Tell the controller that orphaned communicators were freed (their idle timeout
    /// expired). Does not wait: the controller's `ack` is skipped by [`Self::next_push`].
    pub fn notify_expired(&mut self, comm_ids: Vec<u32>) -> Result<(), ClientError> {
        let id = self.conn.next_id;
        self.conn.next_id += 1;
        self.conn.send(id, Message::CommunicatorsExpired { comm_ids })
    }

    /// Wait up to `timeout` for the next push; `Ok(None)` on timeout. Pings are
    /// answered here. An error means the controller connection is gone: reconnect.
    pub fn next_push(&mut self, timeout: Duration) -> Result<Option<PushRequest>, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let env = match self.stashed.pop_front() {
                Some(env) => env,
                None => {
                    let Some(env) = self.conn.recv(deadline)? else { return Ok(None) };
                    env
                }
            };
            let (id, push, origin) = match env.body {
                Message::InstallCommunicator(rules) => (env.id, Push::Install(rules), None),
                Message::Install { rules, origin } => (env.id, Push::Install(rules), Some(origin)),
                Message::RemoveCommunicator { comm_id } => (env.id, Push::Remove { comm_id }, None),
                Message::Ping => {
                    self.conn.send(env.id, Message::Ack)?;
                    continue;
                }
                // Stray replies carry nothing the switch needs.
                Message::Ack | Message::Error { .. } | Message::Registered { .. } => continue,
                other => {
                    let reason = format!("switch does not handle `{}`", other.kind());
                    self.conn.send(env.id, Message::error(reason))?;
                    continue;
                }
            };
            return Ok(Some(PushRequest { id, push, origin }));
        }
    }

    /// Acknowledge a push.
    pub fn ack(&mut self, id: u64) -> Result<(), ClientError> {
        self.conn.send(id, Message::Ack)
    }

    /// Refuse a push with a reason (the controller fails the operation). The reason is
    /// cut to [`REJECT_REASON_MAX`] bytes: it travels on into the host's error reply.
    pub fn reject(&mut self, id: u64, reason: impl Into<String>) -> Result<(), ClientError> {
        self.conn.send(id, Message::error(quote(&reason.into(), REJECT_REASON_MAX)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(comm_id: u32, conns: usize) -> HeldCommunicator {
        let c = crate::ConnectionRule {
            port: "p1".into(),
            local_ip: "10.1.1.1".parse().unwrap(),
            local_mac: crate::EthernetAddress([2, 0, 10, 1, 1, 1]),
            local_qpn: 16,
            local_udp_port: 0xC010,
            local_start_psn: 0xfffff0,
            peer: crate::Peer::Host { rank: 0 },
            peer_ip: "10.1.1.21".parse().unwrap(),
            peer_mac: None,
            peer_qpn: 17,
            peer_udp_port: 4791,
            peer_start_psn: 5,
            ranks: vec![0],
        };
        HeldCommunicator {
            rules: SwitchRules {
                comm_id,
                switch_id: 0,
                world_size: 2,
                mtu: 1024,
                window: 64,
                slots: 128,
                parent: None,
                connections: vec![c; conns],
            },
            origin: Some(Origin { epoch: 7, owner_digest: Some("ab".repeat(32)) }),
        }
    }

    /// Thousands of held communicators go out in parts that each fit a request frame,
    /// in order, none lost.
    #[test]
    fn held_communicators_are_reported_in_parts_below_the_frame_limit() {
        let all: Vec<HeldCommunicator> = (1..=5000).map(|i| held(i, 3)).collect();
        let parts = held_parts(all.clone());
        assert!(parts.len() > 1, "{}", parts.len());
        let ids: Vec<u32> = parts.iter().flatten().map(|h| h.rules.comm_id).collect();
        assert_eq!(ids, (1..=5000).collect::<Vec<_>>());
        for p in &parts {
            let msg = Message::ReportHeld { held: p.clone(), more: true };
            let frame = crate::codec::encode(&Envelope::new(u64::MAX, msg)).unwrap();
            assert!(frame.len() < crate::MAX_FRAME / 2, "{}", frame.len());
        }
        assert!(held_parts(Vec::new()).is_empty());
    }
}
