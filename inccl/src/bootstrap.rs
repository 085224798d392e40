//! Group bootstrap over TCP on the management network (the seed's flow, section 6).
//!
//! Ranks ≠ 0 connect to rank 0 at the master address and introduce themselves; rank 0
//! registers the group with the controller. For each communicator every rank sends
//! its QP parameters to rank 0, rank 0 asks the controller, hands each rank its
//! endpoint, and a barrier confirms that every QP is up. Every wait is bounded by the
//! group timeout and a timeout names the ranks that did not show up.
//!
//! Framing: the controller protocol's (`inc_ctrl_proto::codec`: 4-byte big-endian
//! length + JSON), carrying [`BootMsg`]s.
//!
//! **Without a controller.** The group lives at the controller as long as rank 0's
//! connection that registered it. Collectives never need the controller; destroying
//! does, and must not fail a job whose results are all in: when that connection is
//! lost (the controller died or restarted), rank 0 destroys a communicator over a new
//! connection with the communicator's key (a restarted controller adopted it from the
//! switches), and if that fails too it logs a warning and succeeds: everything local is
//! freed, and the switches free their state once idle (`inc-switch
//! --orphan-idle-timeout`). Destroying the group then succeeds with a warning as well.
//! Creating a communicator fails, naming the controller address, within the group
//! timeout.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::{self, CodecError, FrameBuffer};
use inc_ctrl_proto::{ClientError, ControllerClient, HostEndpoint, RankEndpoint};
use serde::{Deserialize, Serialize};
use tracing::{debug, info, warn};

use crate::config::GroupConfig;
use crate::error::{Error, Result};

/// Bound of a single controller request (creation waits for every switch).
const CONTROLLER_TIMEOUT: Duration = Duration::from_secs(30);

/// Bootstrap messages between rank 0 and the other ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BootMsg {
    /// Rank → rank 0: first message.
    Hello { rank: u16, world_size: u16, ip: Ipv4Addr },
    /// Rank 0 → rank: the group exists.
    Welcome { group_id: u64 },
    /// Rank 0 → rank: setup failed; the rank reports `reason`.
    Abort { reason: String },
    /// Rank → rank 0: QP parameters for communicator number `tag` of the group.
    Join { tag: u32, endpoint: RankEndpoint },
    /// Rank 0 → rank: connection parameters from the controller.
    Endpoint { tag: u32, endpoint: HostEndpoint },
    /// Barrier arrival (rank → rank 0).
    Arrive { tag: u32, phase: Phase },
    /// Barrier release (rank 0 → rank).
    Release { tag: u32, phase: Phase },
}

/// What a bootstrap barrier is for (part of the message, so phases never mix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// Every rank's QP is up.
    QpUp,
    /// Communicator destruction.
    Destroy,
}

/// One framed TCP connection with a receive buffer, so a timeout never splits a frame.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    peer: String,
    frames: FrameBuffer,
}

impl Conn {
    fn new(stream: TcpStream) -> Self {
        stream.set_nodelay(true).ok();
        let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
        Conn { stream, peer, frames: FrameBuffer::new() }
    }

    fn send(&mut self, msg: &BootMsg) -> io::Result<()> {
        let frame = codec::encode(msg).map_err(io::Error::other)?;
        self.stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        self.stream.write_all(&frame)
    }

    fn take_frame(&mut self) -> io::Result<Option<BootMsg>> {
        let body = match self.frames.next_body() {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(None),
            Err(CodecError::TooLarge { len, .. }) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bootstrap frame of {len} bytes from {} is too large", self.peer),
                ))
            }
            Err(e) => return Err(io::Error::other(e)),
        };
        serde_json::from_slice(&body).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("malformed bootstrap message from {}: {e}", self.peer),
            )
        })
    }

    /// Next message before `deadline`: `Ok(None)` on timeout, `UnexpectedEof` if closed.
    fn recv(&mut self, deadline: Instant) -> io::Result<Option<BootMsg>> {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(m) = self.take_frame()? {
                return Ok(Some(m));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"))
                }
                Ok(n) => self.frames.extend(&chunk[..n]),
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
                {
                    return Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// True if the peer closed the connection or it failed (does not consume data).
    fn is_dead(&self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        let mut b = [0u8; 1];
        let dead = match self.stream.peek(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        };
        self.stream.set_nonblocking(false).ok();
        dead
    }
}

/// Rank 0's link to the controller.
#[derive(Debug)]
struct ControllerLink {
    /// The connection that registered the group (the group lives as long as it).
    client: ControllerClient,
    /// Controller address, for messages and to reconnect.
    addr: String,
    /// Host credential.
    token: Option<String>,
    /// Bound of each controller wait: the group timeout, at most [`CONTROLLER_TIMEOUT`].
    timeout: Duration,
    /// Why `client` is unusable, once it failed: the group is gone at the controller.
    lost: Option<String>,
    /// Keys of the communicators created, to destroy them from another connection.
    keys: HashMap<u32, String>,
    /// A connection opened to destroy communicators after `client` was lost.
    spare: Option<ControllerClient>,
    /// Why opening `spare` failed (not tried again: destroys stay quick).
    unreachable: Option<String>,
}

/// True if the controller answered (the connection works); false if the connection
/// failed or timed out.
fn answered(e: &ClientError) -> bool {
    matches!(e, ClientError::Rejected(_) | ClientError::Unexpected(_))
}

impl ControllerLink {
    fn error(&self, source: ClientError) -> Error {
        Error::Controller { addr: self.addr.clone(), source }
    }

    /// Remember that the group's connection failed with `e` (if it did).
    fn note(&mut self, e: &ClientError) {
        if !answered(e) && self.lost.is_none() {
            warn!(controller = %self.addr, error = %e, "the controller connection that registered the group is lost");
            self.lost = Some(e.to_string());
        }
    }

    /// Destroy `comm_id` over a new connection with its key, after the group's own
    /// connection was lost.
    fn destroy_elsewhere(&mut self, comm_id: u32) -> std::result::Result<(), String> {
        if let Some(why) = &self.unreachable {
            return Err(why.clone());
        }
        if self.spare.is_none() {
            let connect = |timeout| -> std::result::Result<ControllerClient, ClientError> {
                let mut c = ControllerClient::connect(self.addr.as_str(), timeout)?;
                c.hello(self.token.clone(), timeout)?;
                Ok(c)
            };
            match connect(self.timeout.min(Duration::from_secs(10))) {
                Ok(c) => self.spare = Some(c),
                Err(e) => {
                    let why = format!("reconnecting: {e}");
                    self.unreachable = Some(why.clone());
                    return Err(why);
                }
            }
        }
        let key = self.keys.get(&comm_id).cloned();
        let spare = self.spare.as_mut().expect("connected");
        match spare.destroy_communicator_with_key(comm_id, key, self.timeout) {
            Ok(()) => Ok(()),
            Err(e) => {
                if !answered(&e) {
                    self.spare = None;
                }
                Err(e.to_string())
            }
        }
    }
}

#[derive(Debug)]
enum Role {
    /// Rank 0: one connection per other rank (index = rank, slot 0 unused) and the
    /// controller session that keeps the group alive.
    Root { peers: Vec<Option<Conn>>, ctl: Box<ControllerLink> },
    /// Other ranks: the connection to rank 0.
    Leaf { root: Conn },
}

/// The bootstrap state of one rank of a group.
#[derive(Debug)]
pub(crate) struct Bootstrap {
    rank: u16,
    world_size: u16,
    timeout: Duration,
    group_id: u64,
    role: Option<Role>,
}

fn list(ranks: &[u16]) -> String {
    let v: Vec<String> = ranks.iter().map(u16::to_string).collect();
    format!("[{}]", v.join(", "))
}

fn resolve(endpoint: &str) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = endpoint
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("resolving master address {endpoint}"), e))?
        .collect();
    if addrs.is_empty() {
        return Err(Error::Config(format!("master address {endpoint} resolves to nothing")));
    }
    Ok(addrs)
}

impl Bootstrap {
    /// Run the group bootstrap for this rank (blocking, bounded by `cfg.timeout`).
    pub(crate) fn create(cfg: &GroupConfig, data_ip: Ipv4Addr) -> Result<Self> {
        cfg.validate()?;
        if cfg.world_size == 1 {
            // A lone rank still registers the group so the controller knows the host.
            let ctl = connect_controller(cfg)?;
            let mut b = Bootstrap {
                rank: 0,
                world_size: 1,
                timeout: cfg.timeout,
                group_id: 0,
                role: Some(Role::Root { peers: vec![None], ctl }),
            };
            b.group_id = b.register_group(cfg, vec![data_ip])?;
            return Ok(b);
        }
        if cfg.rank == 0 {
            Self::create_root(cfg, data_ip)
        } else {
            Self::create_leaf(cfg, data_ip)
        }
    }

    fn create_root(cfg: &GroupConfig, data_ip: Ipv4Addr) -> Result<Self> {
        let endpoint = cfg.master_endpoint();
        let listener = bind_listener(&endpoint)?;
        let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(endpoint.clone());
        info!(%local, world_size = cfg.world_size, "rank 0 waiting for ranks");
        let deadline = Instant::now() + cfg.timeout;
        let n = usize::from(cfg.world_size);
        let mut peers: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
        let mut hosts = vec![Ipv4Addr::UNSPECIFIED; n];
        hosts[0] = data_ip;
        let mut joined = 1;
        while joined < n {
            let now = Instant::now();
            if now >= deadline || !wait_readable(&listener, deadline - now)? {
                let missing: Vec<u16> =
                    (1..cfg.world_size).filter(|r| peers[usize::from(*r)].is_none()).collect();
                let what = format!("ranks {} to connect to {local}", list(&missing));
                abort_all(
                    &mut peers,
                    &format!("rank 0 timed out waiting for ranks {}", list(&missing)),
                );
                return Err(Error::Timeout { rank: 0, waited: cfg.timeout, what });
            }
            let (stream, from) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(Error::io(format!("accepting on {local}"), e)),
            };
            stream.set_nonblocking(false).ok();
            let mut conn = Conn::new(stream);
            // A connection that does not introduce itself quickly is dropped, not waited on.
            let hello_deadline = deadline.min(Instant::now() + Duration::from_secs(5));
            let hello = match conn.recv(hello_deadline) {
                Ok(Some(m)) => m,
                Ok(None) => {
                    warn!(%from, "bootstrap connection sent no hello; dropped");
                    continue;
                }
                Err(e) => {
                    warn!(%from, error = %e, "bootstrap connection failed before hello; dropped");
                    continue;
                }
            };
            let BootMsg::Hello { rank, world_size, ip } = hello else {
                warn!(%from, "bootstrap connection did not start with hello; dropped");
                continue;
            };
            let reject = if world_size != cfg.world_size {
                Some(format!(
                    "rank {rank} from {from} uses world size {world_size}, rank 0 uses {}",
                    cfg.world_size
                ))
            } else if rank == 0 || rank >= cfg.world_size {
                Some(format!(
                    "rank {rank} from {from} is out of range: world size {} has ranks 1..{} besides rank 0",
                    cfg.world_size,
                    cfg.world_size - 1
                ))
            } else {
                peers[usize::from(rank)].as_ref().map(|other| {
                    format!("rank {rank} from {from} is already taken by {}", other.peer)
                })
            };
            if let Some(reason) = reject {
                warn!(%reason, "rejecting rank");
                conn.send(&BootMsg::Abort { reason }).ok();
                continue;
            }
            debug!(rank, %from, %ip, "rank joined");
            hosts[usize::from(rank)] = ip;
            peers[usize::from(rank)] = Some(conn);
            joined += 1;
        }
        drop(listener);
        let ctl = match connect_controller(cfg) {
            Ok(c) => c,
            Err(e) => {
                abort_all(&mut peers, &e.to_string());
                return Err(e);
            }
        };
        let mut b = Bootstrap {
            rank: 0,
            world_size: cfg.world_size,
            timeout: cfg.timeout,
            group_id: 0,
            role: Some(Role::Root { peers, ctl }),
        };
        let group_id = match b.register_group(cfg, hosts) {
            Ok(g) => g,
            Err(e) => {
                b.abort(&e.to_string());
                return Err(e);
            }
        };
        b.group_id = group_id;
        b.send_all(|_| BootMsg::Welcome { group_id })?;
        info!(group_id, "group created");
        Ok(b)
    }

    fn create_leaf(cfg: &GroupConfig, data_ip: Ipv4Addr) -> Result<Self> {
        let endpoint = cfg.master_endpoint();
        let addrs = resolve(&endpoint)?;
        let deadline = Instant::now() + cfg.timeout;
        // Rank 0 may start later than us: retry until the deadline.
        let stream = 'connect: loop {
            let mut last: Option<io::Error> = None;
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                let t = left.clamp(Duration::from_millis(1), Duration::from_secs(2));
                match TcpStream::connect_timeout(a, t) {
                    // With rank 0 not listening yet and its port in the ephemeral range,
                    // a retry can draw that very port as its source and connect to
                    // itself (TCP simultaneous open): it would read its own Hello.
                    Ok(s) if is_self_connection(&s) => {
                        last = Some(io::Error::other("connected to itself, not to rank 0"));
                    }
                    Ok(s) => break 'connect s,
                    Err(e) => last = Some(e),
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    rank: cfg.rank,
                    waited: cfg.timeout,
                    what: format!(
                        "rank 0 at {endpoint} (last error: {})",
                        last.map(|e| e.to_string()).unwrap_or_else(|| "none".into())
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut root = Conn::new(stream);
        root.send(&BootMsg::Hello { rank: cfg.rank, world_size: cfg.world_size, ip: data_ip })
            .map_err(|e| {
                Error::io(format!("rank {}: sending hello to rank 0 at {endpoint}", cfg.rank), e)
            })?;
        let mut b = Bootstrap {
            rank: cfg.rank,
            world_size: cfg.world_size,
            timeout: cfg.timeout,
            group_id: 0,
            role: Some(Role::Leaf { root }),
        };
        let what = format!("rank 0 at {endpoint} to create the group");
        match b.leaf_recv(deadline, &what)? {
            BootMsg::Welcome { group_id } => b.group_id = group_id,
            other => return Err(b.unexpected(&other, "welcome")),
        }
        info!(group_id = b.group_id, rank = cfg.rank, "joined group");
        Ok(b)
    }

    fn register_group(&mut self, cfg: &GroupConfig, hosts: Vec<Ipv4Addr>) -> Result<u64> {
        let Some(Role::Root { ctl, .. }) = &mut self.role else {
            unreachable!("register_group on rank 0 only")
        };
        let timeout = ctl.timeout;
        ctl.client.register_group(cfg.token.clone(), hosts, timeout).map_err(|e| ctl.error(e))
    }

    pub(crate) fn rank(&self) -> u16 {
        self.rank
    }

    pub(crate) fn world_size(&self) -> u16 {
        self.world_size
    }

    pub(crate) fn group_id(&self) -> u64 {
        self.group_id
    }

    fn role(&mut self) -> Result<&mut Role> {
        self.role.as_mut().ok_or_else(|| {
            Error::Unusable("group", "it was destroyed or its bootstrap failed".into())
        })
    }

    fn unexpected(&self, msg: &BootMsg, wanted: &str) -> Error {
        match msg {
            BootMsg::Abort { reason } => Error::Aborted { rank: self.rank, reason: reason.clone() },
            other => Error::Peer {
                rank: self.rank,
                reason: format!("protocol error: expected {wanted} from rank 0, got {other:?}"),
            },
        }
    }

    /// Leaf: next message from rank 0, turning timeouts, closes and aborts into errors.
    fn leaf_recv(&mut self, deadline: Instant, what: &str) -> Result<BootMsg> {
        let (rank, timeout) = (self.rank, self.timeout);
        let Role::Leaf { root } = self.role()? else { unreachable!("leaf only") };
        match root.recv(deadline) {
            Ok(Some(BootMsg::Abort { reason })) => Err(Error::Aborted { rank, reason }),
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(Error::Timeout { rank, waited: timeout, what: what.to_string() }),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(Error::Peer {
                rank,
                reason: format!(
                    "rank 0 ({}) closed the bootstrap connection while waiting for {what}",
                    root.peer
                ),
            }),
            Err(e) => Err(Error::io(format!("rank {rank}: bootstrap connection to rank 0"), e)),
        }
    }

    /// Root: receive one message from every other rank (any order per rank; bounded).
    /// Returns them indexed by rank; errors name every rank that did not answer.
    fn root_gather(&mut self, what: &str) -> Result<Vec<Option<BootMsg>>> {
        let (timeout, n) = (self.timeout, usize::from(self.world_size));
        let deadline = Instant::now() + timeout;
        let Role::Root { peers, .. } = self.role()? else { unreachable!("root only") };
        let mut out: Vec<Option<BootMsg>> = (0..n).map(|_| None).collect();
        let mut missing = Vec::new();
        let mut closed = Vec::new();
        for (r, slot) in peers.iter_mut().enumerate().skip(1) {
            let conn = slot.as_mut().expect("every rank joined");
            // After the deadline, only what already arrived counts.
            let d = deadline.max(Instant::now() + Duration::from_millis(1));
            match conn.recv(d) {
                Ok(Some(m)) => out[r] = Some(m),
                Ok(None) => missing.push(r as u16),
                Err(_) => closed.push(r as u16),
            }
        }
        if !missing.is_empty() || !closed.is_empty() {
            let mut what_failed = Vec::new();
            if !closed.is_empty() {
                what_failed.push(format!("ranks {} disconnected", list(&closed)));
            }
            if !missing.is_empty() {
                what_failed
                    .push(format!("ranks {} did not answer within {timeout:?}", list(&missing)));
            }
            let reason = format!("{what}: {}", what_failed.join("; "));
            self.abort(&reason);
            return Err(if closed.is_empty() {
                Error::Timeout {
                    rank: 0,
                    waited: timeout,
                    what: format!("ranks {} ({what})", list(&missing)),
                }
            } else {
                Error::Peer { rank: 0, reason }
            });
        }
        Ok(out)
    }

    fn send_all(&mut self, mut msg: impl FnMut(u16) -> BootMsg) -> Result<()> {
        let Role::Root { peers, .. } = self.role()? else { unreachable!("root only") };
        let mut failed = Vec::new();
        for (r, slot) in peers.iter_mut().enumerate().skip(1) {
            let conn = slot.as_mut().expect("every rank joined");
            if conn.send(&msg(r as u16)).is_err() {
                failed.push(r as u16);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Error::Peer {
                rank: 0,
                reason: format!("ranks {} disconnected from the bootstrap", list(&failed)),
            })
        }
    }

    /// Root: tell every rank that setup failed (best effort).
    fn abort(&mut self, reason: &str) {
        if let Some(Role::Root { peers, .. }) = &mut self.role {
            abort_all(peers, reason);
        }
    }

    /// Collective: exchange QP parameters through rank 0 and the controller.
    pub(crate) fn create_communicator(
        &mut self,
        tag: u32,
        mine: RankEndpoint,
        mtu: Option<u16>,
        window: Option<u32>,
    ) -> Result<HostEndpoint> {
        if self.rank != 0 {
            let rank = self.rank;
            let Role::Leaf { root } = self.role()? else { unreachable!("leaf") };
            root.send(&BootMsg::Join { tag, endpoint: mine }).map_err(|e| {
                Error::io(format!("rank {rank}: sending QP parameters to rank 0"), e)
            })?;
            let deadline = Instant::now() + self.timeout;
            return match self
                .leaf_recv(deadline, "rank 0 to return the communicator's endpoints")?
            {
                BootMsg::Endpoint { tag: t, endpoint } if t == tag => Ok(endpoint),
                other => Err(self.unexpected(&other, "endpoint")),
            };
        }
        let mut ranks = vec![mine];
        for (r, m) in self.root_gather("collecting QP parameters")?.into_iter().enumerate().skip(1)
        {
            match m {
                Some(BootMsg::Join { tag: t, endpoint })
                    if t == tag && usize::from(endpoint.rank) == r =>
                {
                    ranks.push(endpoint)
                }
                other => {
                    let reason = format!("rank {r} sent {other:?} instead of its QP parameters for communicator #{tag}");
                    self.abort(&reason);
                    return Err(Error::Peer { rank: 0, reason });
                }
            }
        }
        let group_id = self.group_id;
        let Role::Root { ctl, .. } = self.role()? else { unreachable!("root") };
        let created = match &ctl.lost {
            // The group died with that connection: fail now, naming the controller.
            Some(why) => Err(ctl.error(ClientError::Rejected(format!(
                "group {group_id} ended when its controller connection was lost ({why}); \
                 its communicators keep working, new ones need a new group"
            )))),
            None => {
                let timeout = ctl.timeout;
                let r = ctl.client.create_communicator_keyed(group_id, ranks, mtu, window, timeout);
                if let Err(e) = &r {
                    ctl.note(e);
                }
                r.map_err(|e| ctl.error(e))
            }
        };
        let (comm_id, mut endpoints) = match created {
            Ok(c) => {
                if let Some(key) = c.key {
                    ctl.keys.insert(c.comm_id, key);
                }
                (c.comm_id, c.endpoints)
            }
            Err(e) => {
                self.abort(&e.to_string());
                return Err(e);
            }
        };
        if endpoints.len() != usize::from(self.world_size)
            || endpoints.iter().enumerate().any(|(i, e)| usize::from(e.rank) != i)
        {
            let reason = format!(
                "controller returned {} endpoints for communicator {comm_id}, not one per rank 0..{}",
                endpoints.len(),
                self.world_size - 1
            );
            self.abort(&reason);
            return Err(Error::Peer { rank: 0, reason });
        }
        let others = endpoints.split_off(1);
        let mut others = others.into_iter();
        self.send_all(|_| BootMsg::Endpoint {
            tag,
            endpoint: others.next().expect("one per rank"),
        })?;
        Ok(endpoints.pop().expect("rank 0's endpoint"))
    }

    /// Collective barrier through rank 0.
    pub(crate) fn barrier(&mut self, tag: u32, phase: Phase) -> Result<()> {
        if self.world_size == 1 {
            return Ok(());
        }
        if self.rank != 0 {
            let rank = self.rank;
            let Role::Leaf { root } = self.role()? else { unreachable!("leaf") };
            root.send(&BootMsg::Arrive { tag, phase })
                .map_err(|e| Error::io(format!("rank {rank}: bootstrap barrier"), e))?;
            let deadline = Instant::now() + self.timeout;
            return match self
                .leaf_recv(deadline, &format!("rank 0 to release the {phase:?} barrier"))?
            {
                BootMsg::Release { tag: t, phase: p } if t == tag && p == phase => Ok(()),
                other => Err(self.unexpected(&other, "barrier release")),
            };
        }
        for (r, m) in
            self.root_gather(&format!("{phase:?} barrier"))?.into_iter().enumerate().skip(1)
        {
            if m != Some(BootMsg::Arrive { tag, phase }) {
                let reason =
                    format!("rank {r} sent {m:?} instead of arriving at the {phase:?} barrier");
                self.abort(&reason);
                return Err(Error::Peer { rank: 0, reason });
            }
        }
        self.send_all(|_| BootMsg::Release { tag, phase })
    }

    /// Rank 0: remove a communicator from the controller. When the controller cannot
    /// be told (the group's connection is lost and a new one fails too), this logs a
    /// warning and succeeds: the switches free the communicator once it is idle.
    pub(crate) fn destroy_communicator(&mut self, comm_id: u32) -> Result<()> {
        let Some(Role::Root { ctl, .. }) = &mut self.role else { return Ok(()) };
        if ctl.lost.is_none() {
            let timeout = ctl.timeout;
            match ctl.client.destroy_communicator(comm_id, timeout) {
                Ok(()) => {
                    ctl.keys.remove(&comm_id);
                    return Ok(());
                }
                // The controller refused: a real error, as before.
                Err(e) if answered(&e) => return Err(ctl.error(e)),
                Err(e) => ctl.note(&e),
            }
        }
        let why = ctl.lost.clone().unwrap_or_default();
        match ctl.destroy_elsewhere(comm_id) {
            Ok(()) => info!(
                controller = %ctl.addr,
                comm_id,
                "communicator destroyed over a new controller connection (the group's was lost)"
            ),
            Err(e) => warn!(
                controller = %ctl.addr,
                comm_id,
                lost = %why,
                error = %e,
                "the controller could not be told that the communicator is destroyed; \
                 freed here, the switches free it once idle (inc-switch --orphan-idle-timeout)"
            ),
        }
        ctl.keys.remove(&comm_id);
        Ok(())
    }

    /// Ranks whose bootstrap connection is gone (for rank ≠ 0: rank 0 if its is).
    pub(crate) fn dead_peers(&self) -> Vec<u16> {
        match &self.role {
            Some(Role::Root { peers, .. }) => peers
                .iter()
                .enumerate()
                .filter_map(|(r, c)| c.as_ref().filter(|c| c.is_dead()).map(|_| r as u16))
                .collect(),
            Some(Role::Leaf { root }) if root.is_dead() => vec![0],
            _ => Vec::new(),
        }
    }

    /// Tear down: rank 0 destroys the group at the controller; connections close. A
    /// group whose controller connection is lost is gone at the controller already:
    /// that is logged, and the destroy succeeds.
    pub(crate) fn destroy(&mut self) -> Result<()> {
        let Some(Role::Root { mut ctl, .. }) = self.role.take() else { return Ok(()) };
        if ctl.lost.is_none() {
            let timeout = ctl.timeout;
            match ctl.client.destroy_group(self.group_id, timeout) {
                Ok(()) => return Ok(()),
                Err(e) if answered(&e) => return Err(ctl.error(e)),
                Err(e) => ctl.note(&e),
            }
        }
        warn!(
            controller = %ctl.addr,
            group_id = self.group_id,
            lost = ctl.lost.as_deref().unwrap_or(""),
            "group destroyed locally: it ended at the controller with its lost connection"
        );
        Ok(())
    }
}

fn abort_all(peers: &mut [Option<Conn>], reason: &str) {
    for c in peers.iter_mut().flatten() {
        c.send(&BootMsg::Abort { reason: reason.to_string() }).ok();
    }
}

/// Whether `s` is a TCP self-connection (its local and peer addresses are the same).
fn is_self_connection(s: &TcpStream) -> bool {
    matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

fn connect_controller(cfg: &GroupConfig) -> Result<Box<ControllerLink>> {
    let addr = cfg.controller.clone().ok_or_else(|| {
        Error::Config(
            "rank 0 needs the controller address: set INCCL_CONTROLLER=host:port or pass it explicitly"
                .into(),
        )
    })?;
    let timeout = cfg.timeout.min(Duration::from_secs(10));
    let client = ControllerClient::connect(addr.as_str(), timeout)
        .map_err(|source| Error::Controller { addr: addr.clone(), source })?;
    Ok(Box::new(ControllerLink {
        client,
        addr,
        token: cfg.token.clone(),
        timeout: CONTROLLER_TIMEOUT.min(cfg.timeout),
        lost: None,
        keys: HashMap::new(),
        spare: None,
        unreachable: None,
    }))
}

/// Bind rank 0's listener on the master address (any local address if the master
/// address is not one of ours, e.g. a NAT or a name for all addresses).
fn bind_listener(endpoint: &str) -> Result<TcpListener> {
    let addrs = resolve(endpoint)?;
    let mut last = None;
    for a in &addrs {
        match bind_reuse(*a) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {
                let any = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), a.port());
                match bind_reuse(any) {
                    Ok(l) => return Ok(l),
                    Err(e) => last = Some(e),
                }
            }
            Err(e) => last = Some(e),
        }
    }
    Err(Error::io(
        format!("rank 0: listening on master address {endpoint}"),
        last.unwrap_or_else(|| io::Error::other("no address")),
    ))
}

fn bind_reuse(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    // Lets a rank 0 restart right after a previous run left TIME_WAIT connections.
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Wait until `listener` has a connection to accept; false on timeout.
fn wait_readable(listener: &TcpListener, timeout: Duration) -> Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = u16::try_from(timeout.as_millis().max(1)).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(ms)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(Error::io("poll on the bootstrap listener", e.into())),
    }
}

#[cfg(test)]
mod tests {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use nix::sys::socket::{
        bind, connect, getsockname, socket, AddressFamily, SockFlag, SockType, SockaddrIn,
    };

    use super::is_self_connection;

    #[test]
    fn a_self_connection_is_recognised() {
        // A socket bound to a port nobody listens on, connected to that same port: TCP
        // simultaneous open connects it to itself, as a retrying leaf can be.
        let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::empty(), None).unwrap();
        bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
        let me: SockaddrIn = getsockname(fd.as_raw_fd()).unwrap();
        connect(fd.as_raw_fd(), &me).unwrap();
        let s = TcpStream::from(fd);
        assert!(is_self_connection(&s));

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let s = TcpStream::connect(addr).unwrap();
        assert!(!is_self_connection(&s));
    }
}
