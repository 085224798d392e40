//! Blocking clients: [`ControllerClient`] for hosts (rank 0, tools) and
//! [`SwitchSession`] for switches. Std sockets with timeouts; every wait is bounded.

use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::codec::{quote, write_frame, CodecError, FrameDecoder, MAX_REPLY_FRAME};
use crate::{Envelope, HostEndpoint, Message, PortInfo, RankEndpoint, StatusReport, SwitchRules};

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
    fn connect<A: ToSocketAddrs>(addr: A, timeout: Duration) -> Result<Conn, ClientError> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|source| ClientError::Connect { addr: "<unresolved>".into(), source })?
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
        let id = self.next_id;
        self.next_id += 1;
        self.send(id, msg)?;
        let deadline = Instant::now() + timeout;
        loop {
            match self.recv(deadline)? {
                None => return Err(ClientError::Timeout(timeout)),
                // Replies to requests that timed out earlier are skipped.
                Some(env) if env.id != id => continue,
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
    pub fn connect<A: ToSocketAddrs>(addr: A, timeout: Duration) -> Result<Self, ClientError> {
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
        match self.request(Message::CreateCommunicator { group_id, ranks, mtu, window }, timeout)? {
            Message::CommunicatorCreated { comm_id, endpoints } => Ok((comm_id, endpoints)),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Destroy a communicator.
    pub fn destroy_communicator(
        &mut self,
        comm_id: u32,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        match self.request(Message::DestroyCommunicator { comm_id }, timeout)? {
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
}

/// Switch side of the controller connection: connect, register, then receive pushes
/// and acknowledge them. Rules only ever arrive through this session, which is how a
/// switch accepts rules only from its controller connection.
#[derive(Debug)]
pub struct SwitchSession {
    conn: Conn,
    switch_id: u32,
}

impl SwitchSession {
    /// Connect and register. Fails if the controller rejects the registration.
    pub fn connect<A: ToSocketAddrs>(
        addr: A,
        switch_id: u32,
        token: Option<String>,
        ports: Vec<PortInfo>,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let mut conn = Conn::connect(addr, timeout)?;
        match conn.request(Message::RegisterSwitch { switch_id, token, ports }, timeout)? {
            Message::Ack => Ok(SwitchSession { conn, switch_id }),
            other => Err(ClientError::Unexpected(other.kind())),
        }
    }

    /// Switch id this session registered.
    pub fn switch_id(&self) -> u32 {
        self.switch_id
    }

    /// Wait up to `timeout` for the next push; `Ok(None)` on timeout. Pings are
    /// answered here. An error means the controller connection is gone: reconnect.
    pub fn next_push(&mut self, timeout: Duration) -> Result<Option<PushRequest>, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(env) = self.conn.recv(deadline)? else { return Ok(None) };
            match env.body {
                Message::InstallCommunicator(rules) => {
                    return Ok(Some(PushRequest { id: env.id, push: Push::Install(rules) }))
                }
                Message::RemoveCommunicator { comm_id } => {
                    return Ok(Some(PushRequest { id: env.id, push: Push::Remove { comm_id } }))
                }
                Message::Ping => self.conn.send(env.id, Message::Ack)?,
                // Stray replies carry nothing the switch needs.
                Message::Ack | Message::Error { .. } => {}
                other => {
                    let reason = format!("switch does not handle `{}`", other.kind());
                    self.conn.send(env.id, Message::error(reason))?;
                }
            }
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
