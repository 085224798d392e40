//! The controller service: a TCP server with one thread per connection.
//!
//! Switches register and stay connected; the controller pushes rules to them and
//! waits for their acknowledgements. Rank 0s register groups and communicators.
//! The state lock is never held while waiting on the network.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Read};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::{decode_body, peek_id, write_frame, CodecError, MAX_FRAME};
use inc_ctrl_proto::{
    CommunicatorStatus, Envelope, GroupStatus, Message, PortInfo, RankEndpoint, StatusReport,
    SwitchStatus,
};
use tracing::{debug, info, warn};

use crate::compiler::{compile, Allocator, CommunicatorSpec, Compiled};
use inc_topology::Topology;

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Validated topology.
    pub topology: Topology,
    /// Shared token required from switches and hosts, if set.
    pub token: Option<String>,
    /// How long to wait for switch acknowledgements.
    pub ack_timeout: Duration,
    /// How long a peer may stall in the middle of a frame.
    pub frame_timeout: Duration,
    /// How long a new connection may take to send its first message.
    pub hello_timeout: Duration,
    /// Connections served at once; more are refused.
    pub max_connections: usize,
    /// Seed of start PSNs (random per process by default).
    pub seed: u64,
}

impl ServiceConfig {
    /// Defaults for a topology.
    pub fn new(topology: Topology) -> Self {
        ServiceConfig {
            topology,
            token: None,
            ack_timeout: Duration::from_secs(5),
            frame_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(30),
            max_connections: 256,
            seed: rand::random(),
        }
    }
}

/// Errors starting the service.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Could not listen.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: io::Error,
    },
}

type AckResult = Result<(), String>;

#[derive(Debug)]
struct SwitchConn {
    conn_id: u64,
    peer: SocketAddr,
    writer: Arc<Mutex<TcpStream>>,
    pending: Arc<Mutex<HashMap<u64, Sender<AckResult>>>>,
}

#[derive(Debug)]
struct Group {
    world_size: u16,
    hosts: Vec<Ipv4Addr>,
    owner: u64,
    comms: BTreeSet<u32>,
}

#[derive(Debug)]
struct Comm {
    group_id: u64,
    compiled: Compiled,
    ready: bool,
}

#[derive(Debug, Default)]
struct State {
    switches: HashMap<u32, Arc<SwitchConn>>,
    groups: BTreeMap<u64, Group>,
    comms: BTreeMap<u32, Comm>,
    alloc: Allocator,
    next_group: u64,
    next_comm: u32,
}

#[derive(Debug)]
struct Shared {
    cfg: ServiceConfig,
    state: Mutex<State>,
    next_push: AtomicU64,
    next_conn: AtomicU64,
    connections: AtomicUsize,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicked connection thread must not take the whole service down.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running controller.
#[derive(Debug)]
pub struct Controller {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl Controller {
    /// Listen on `addr` and serve in background threads.
    pub fn start(cfg: ServiceConfig, addr: &str) -> Result<Controller, ServiceError> {
        let listener = TcpListener::bind(addr)
            .map_err(|source| ServiceError::Bind { addr: addr.to_string(), source })?;
        let local = listener
            .local_addr()
            .map_err(|source| ServiceError::Bind { addr: addr.to_string(), source })?;
        let shared = Arc::new(Shared {
            cfg,
            state: Mutex::new(State { next_group: 1, next_comm: 1, ..State::default() }),
            next_push: AtomicU64::new(1 << 32),
            next_conn: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        info!(
            addr = %local,
            topology = %shared.cfg.topology.name,
            switches = shared.cfg.topology.switches.len(),
            hosts = shared.cfg.topology.hosts.len(),
            auth = shared.cfg.token.is_some(),
            "controller listening"
        );
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("ctrl-accept".into())
            .spawn(move || accept_loop(s, listener))
            .expect("spawn accept thread");
        Ok(Controller { shared, addr: local, accept: Some(accept) })
    }

    /// Address the service listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Current state.
    pub fn status(&self) -> StatusReport {
        status_report(&self.shared)
    }

    /// Block until the accept loop ends (i.e. forever, unless stopped).
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    /// Stop accepting connections.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept failed");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let peer = stream.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= shared.cfg.max_connections {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            warn!(%peer, "too many connections, refusing");
            let mut s = stream;
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = write_frame(&mut s, &Envelope::new(0, Message::error("too many connections")));
            continue;
        }
        let s = shared.clone();
        let conn_id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
        let spawned =
            thread::Builder::new().name(format!("ctrl-conn-{conn_id}")).spawn(move || {
                serve_connection(&s, stream, peer, conn_id);
                s.connections.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            warn!(error = %e, "cannot spawn connection thread");
        }
    }
}

/// Read one frame body. Waits up to `idle` (None = forever) for the first byte, then
/// at most `stall` for the rest, so a peer that stops mid-frame cannot pin a thread.
fn read_body(
    stream: &mut TcpStream,
    idle: Option<Duration>,
    stall: Duration,
) -> Result<Vec<u8>, CodecError> {
    stream.set_read_timeout(idle)?;
    let mut len = [0u8; 4];
    let n = loop {
        match stream.read(&mut len[..1]) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    };
    if n == 0 {
        return Err(CodecError::Closed);
    }
    stream.set_read_timeout(Some(stall))?;
    stream.read_exact(&mut len[1..])?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(CodecError::TooLarge { len, max: MAX_FRAME });
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(body)
}

fn send(w: &Mutex<TcpStream>, id: u64, body: Message) -> Result<(), CodecError> {
    write_frame(&mut *lock(w), &Envelope::new(id, body))
}

/// Outcome of reading one request.
enum Incoming {
    Msg(Envelope),
    /// Bad frame answered with an error; keep serving.
    Skip,
    /// Connection is done.
    Close,
}

fn next_request(
    stream: &mut TcpStream,
    writer: &Mutex<TcpStream>,
    idle: Option<Duration>,
    stall: Duration,
    peer: SocketAddr,
) -> Incoming {
    let body = match read_body(stream, idle, stall) {
        Ok(b) => b,
        Err(CodecError::Closed) => return Incoming::Close,
        Err(e @ CodecError::TooLarge { .. }) => {
            warn!(%peer, error = %e, "oversized frame, closing connection");
            let _ = send(writer, 0, Message::error(e.to_string()));
            return Incoming::Close;
        }
        Err(e) => {
            if e.is_timeout() {
                warn!(%peer, "peer stalled, closing connection");
            } else {
                debug!(%peer, error = %e, "read failed, closing connection");
            }
            return Incoming::Close;
        }
    };
    match decode_body(&body) {
        Ok(env) => Incoming::Msg(env),
        Err(e) => {
            let id = e.request_id().or_else(|| peek_id(&body)).unwrap_or(0);
            warn!(%peer, id, error = %e, "bad message");
            if send(writer, id, Message::error(e.to_string())).is_err() {
                return Incoming::Close;
            }
            Incoming::Skip
        }
    }
}

fn token_ok(shared: &Shared, given: &Option<String>) -> bool {
    match &shared.cfg.token {
        None => true,
        Some(want) => given.as_deref().is_some_and(|g| {
            // Length-independent comparison keeps timing from leaking the prefix.
            g.len() == want.len()
                && g.bytes().zip(want.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
        }),
    }
}

fn serve_connection(shared: &Arc<Shared>, mut stream: TcpStream, peer: SocketAddr, conn_id: u64) {
    let _ = stream.set_nodelay(true);
    // Idle switch and rank-0 connections read without a timeout; keepalive notices a
    // peer that vanished without closing (about 25 s).
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&ka);
    let _ = stream.set_write_timeout(Some(shared.cfg.frame_timeout));
    let writer = match stream.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(e) => {
            warn!(%peer, error = %e, "cannot clone socket");
            return;
        }
    };
    debug!(%peer, conn_id, "connection accepted");
    let first = loop {
        match next_request(
            &mut stream,
            &writer,
            Some(shared.cfg.hello_timeout),
            shared.cfg.frame_timeout,
            peer,
        ) {
            Incoming::Msg(env) => break env,
            Incoming::Skip => continue,
            Incoming::Close => return,
        }
    };
    if let Message::RegisterSwitch { switch_id, token, ports } = first.body {
        serve_switch(shared, stream, writer, peer, conn_id, first.id, switch_id, token, ports);
    } else {
        serve_host(shared, stream, writer, peer, conn_id, first);
    }
}

// ------------------------------------------------------------------ switches

#[allow(clippy::too_many_arguments)]
fn serve_switch(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    writer: Arc<Mutex<TcpStream>>,
    peer: SocketAddr,
    conn_id: u64,
    req_id: u64,
    switch_id: u32,
    token: Option<String>,
    ports: Vec<PortInfo>,
) {
    let topo = &shared.cfg.topology;
    let reject = |reason: String| {
        warn!(%peer, switch_id, %reason, "switch registration refused");
        let _ = send(&writer, req_id, Message::error(reason));
    };
    if !token_ok(shared, &token) {
        return reject("authentication failed: bad or missing token".into());
    }
    let Some(si) = topo.switch_by_id(switch_id) else {
        return reject(format!("unknown switch id {switch_id}: not in topology `{}`", topo.name));
    };
    let sw = &topo.switches[si];
    for p in &ports {
        let Some(tp) = sw.ports.iter().find(|tp| tp.name == p.name) else {
            return reject(format!(
                "switch {} (id {switch_id}) has no port `{}` in the topology",
                sw.name, p.name
            ));
        };
        if let Some(ip) = p.ip {
            if ip != tp.addr.ip {
                return reject(format!(
                    "port `{}`: switch reports IP {ip}, topology says {}",
                    p.name, tp.addr.ip
                ));
            }
        }
        if let Some(mac) = p.mac {
            if mac != tp.mac {
                warn!(switch = %sw.name, port = %p.name, %mac, topology_mac = %tp.mac, "port MAC differs from topology; rules use the topology MAC");
            }
        }
    }
    let pending = Arc::new(Mutex::new(HashMap::new()));
    let conn =
        Arc::new(SwitchConn { conn_id, peer, writer: writer.clone(), pending: pending.clone() });
    let old = lock(&shared.state).switches.insert(switch_id, conn.clone());
    if let Some(old) = old {
        info!(switch = %sw.name, switch_id, old_peer = %old.peer, %peer, "switch reconnected, replacing old connection");
        let _ = lock(&old.writer).shutdown(Shutdown::Both);
    } else {
        info!(switch = %sw.name, switch_id, %peer, "switch registered");
    }
    if send(&writer, req_id, Message::Ack).is_err() {
        drop_switch(shared, switch_id, &conn);
        return;
    }
    // Re-push live rules (the switch drops what it had when it registers).
    let to_push: Vec<_> = lock(&shared.state)
        .comms
        .values()
        .filter_map(|c| c.compiled.rules.iter().find(|r| r.switch_id == switch_id).cloned())
        .collect();
    if !to_push.is_empty() {
        let s = shared.clone();
        let c = conn.clone();
        let name = sw.name.clone();
        thread::spawn(move || {
            let n = to_push.len();
            let waits: Vec<_> = to_push
                .into_iter()
                .map(|r| (r.comm_id, push(&s, &c, Message::InstallCommunicator(r))))
                .collect();
            let deadline = Instant::now() + s.cfg.ack_timeout;
            let failed: Vec<String> = waits
                .into_iter()
                .filter_map(|(id, rx)| {
                    wait_ack(rx, deadline).err().map(|e| format!("comm {id}: {e}"))
                })
                .collect();
            if failed.is_empty() {
                info!(switch = %name, communicators = n, "rules re-pushed after registration");
            } else {
                warn!(switch = %name, ?failed, "re-push incomplete");
            }
        });
    }
    // Read replies (and the odd ping) until the switch goes away.
    loop {
        match next_request(&mut stream, &writer, None, shared.cfg.frame_timeout, peer) {
            Incoming::Close => break,
            Incoming::Skip => continue,
            Incoming::Msg(env) => match env.body {
                Message::Ack | Message::Error { .. } => {
                    let res = match env.body {
                        Message::Error { reason } => Err(reason),
                        _ => Ok(()),
                    };
                    match lock(&pending).remove(&env.id) {
                        Some(tx) => {
                            let _ = tx.send(res);
                        }
                        None => debug!(switch_id, id = env.id, "reply to no pending push"),
                    }
                }
                Message::Ping => {
                    if send(&writer, env.id, Message::Ack).is_err() {
                        break;
                    }
                }
                other => {
                    warn!(switch_id, kind = other.kind(), "unexpected message from switch");
                    let reason = format!("`{}` is not valid on a switch connection", other.kind());
                    if send(&writer, env.id, Message::error(reason)).is_err() {
                        break;
                    }
                }
            },
        }
    }
    drop_switch(shared, switch_id, &conn);
}

fn drop_switch(shared: &Shared, switch_id: u32, conn: &SwitchConn) {
    // Waiters see their sender dropped and report a disconnect.
    lock(&conn.pending).clear();
    let mut st = lock(&shared.state);
    if st.switches.get(&switch_id).is_some_and(|c| c.conn_id == conn.conn_id) {
        st.switches.remove(&switch_id);
        info!(switch_id, peer = %conn.peer, "switch disconnected");
    }
}

/// Send a push; the receiver yields the switch's answer.
fn push(shared: &Shared, conn: &SwitchConn, msg: Message) -> Receiver<AckResult> {
    let id = shared.next_push.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel();
    lock(&conn.pending).insert(id, tx);
    if let Err(e) = send(&conn.writer, id, msg) {
        if let Some(tx) = lock(&conn.pending).remove(&id) {
            let _ = tx.send(Err(format!("send failed: {e}")));
        }
    }
    rx
}

fn wait_ack(rx: Receiver<AckResult>, deadline: Instant) -> AckResult {
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(r) => r.map_err(|reason| format!("rejected: {reason}")),
        Err(RecvTimeoutError::Timeout) => Err("no acknowledgement in time".into()),
        Err(RecvTimeoutError::Disconnected) => Err("disconnected".into()),
    }
}

// ------------------------------------------------------------------ hosts

fn serve_host(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    writer: Arc<Mutex<TcpStream>>,
    peer: SocketAddr,
    conn_id: u64,
    first: Envelope,
) {
    let mut authed = shared.cfg.token.is_none();
    let mut next = Some(first);
    loop {
        let env = match next.take() {
            Some(e) => e,
            None => {
                match next_request(&mut stream, &writer, None, shared.cfg.frame_timeout, peer) {
                    Incoming::Msg(e) => e,
                    Incoming::Skip => continue,
                    Incoming::Close => break,
                }
            }
        };
        let kind = env.body.kind();
        let reply = handle_host(shared, conn_id, &mut authed, env.body);
        match &reply {
            Message::Error { reason } => warn!(%peer, id = env.id, kind, %reason, "request failed"),
            _ => debug!(%peer, id = env.id, kind, "request served"),
        }
        if send(&writer, env.id, reply).is_err() {
            break;
        }
    }
    // Groups live as long as the connection that registered them.
    let owned: Vec<u64> = lock(&shared.state)
        .groups
        .iter()
        .filter(|(_, g)| g.owner == conn_id)
        .map(|(id, _)| *id)
        .collect();
    for g in owned {
        info!(group_id = g, %peer, "owner disconnected, destroying group");
        let _ = destroy_group(shared, g);
    }
}

fn handle_host(shared: &Arc<Shared>, conn_id: u64, authed: &mut bool, msg: Message) -> Message {
    let auth_fail = || Message::error("authentication failed: bad or missing token");
    match msg {
        Message::Hello { token } => {
            if token_ok(shared, &token) {
                *authed = true;
                Message::Ack
            } else {
                auth_fail()
            }
        }
        Message::Ping => Message::Ack,
        Message::RegisterGroup { token, world_size, hosts } => {
            if !token_ok(shared, &token) && !*authed {
                return auth_fail();
            }
            *authed = true;
            match register_group(shared, conn_id, world_size, hosts) {
                Ok(group_id) => Message::GroupCreated { group_id },
                Err(e) => Message::error(e),
            }
        }
        _ if !*authed => auth_fail(),
        Message::CreateCommunicator { group_id, ranks, mtu, window } => {
            match create_communicator(shared, group_id, ranks, mtu, window) {
                Ok(c) => {
                    Message::CommunicatorCreated { comm_id: c.comm_id, endpoints: c.endpoints }
                }
                Err(e) => Message::error(e),
            }
        }
        Message::DestroyCommunicator { comm_id } => match destroy_communicator(shared, comm_id) {
            Ok(()) => Message::Ack,
            Err(e) => Message::error(e),
        },
        Message::DestroyGroup { group_id } => match destroy_group(shared, group_id) {
            Ok(()) => Message::Ack,
            Err(e) => Message::error(e),
        },
        Message::Status => Message::StatusReport(status_report(shared)),
        Message::RegisterSwitch { .. } => {
            Message::error("register_switch must be the first message of a connection")
        }
        other => {
            Message::error(format!("`{}` is not a request the controller serves", other.kind()))
        }
    }
}

fn register_group(
    shared: &Shared,
    conn_id: u64,
    world_size: u16,
    hosts: Vec<Ipv4Addr>,
) -> Result<u64, String> {
    let topo = &shared.cfg.topology;
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
    let mut st = lock(&shared.state);
    let id = st.next_group;
    st.next_group += 1;
    st.groups.insert(id, Group { world_size, hosts, owner: conn_id, comms: BTreeSet::new() });
    info!(group_id = id, world_size, "group registered");
    Ok(id)
}

fn create_communicator(
    shared: &Shared,
    group_id: u64,
    ranks: Vec<RankEndpoint>,
    mtu: Option<u16>,
    window: Option<u32>,
) -> Result<Compiled, String> {
    let topo = &shared.cfg.topology;
    // Compile and reserve under the lock; push without it.
    let (compiled, targets) = {
        let mut st = lock(&shared.state);
        let g = st.groups.get(&group_id).ok_or_else(|| format!("unknown group {group_id}"))?;
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
            let id = st.next_comm;
            st.next_comm = st.next_comm.checked_add(1).unwrap_or(1);
            if !st.comms.contains_key(&id) {
                break id;
            }
        };
        let spec = CommunicatorSpec { comm_id, ranks, mtu, window };
        let compiled =
            compile(topo, &spec, &mut st.alloc, shared.cfg.seed).map_err(|e| e.to_string())?;
        let mut targets = Vec::new();
        let mut missing = Vec::new();
        for r in &compiled.rules {
            match st.switches.get(&r.switch_id) {
                Some(c) => targets.push((c.clone(), r.clone())),
                None => {
                    let name = topo
                        .switch_by_id(r.switch_id)
                        .map(|i| topo.switches[i].name.as_str())
                        .unwrap_or("?");
                    missing.push(format!("{name} (id {})", r.switch_id));
                }
            }
        }
        if !missing.is_empty() {
            st.alloc.release(comm_id);
            return Err(format!("switch(es) not connected: {}", missing.join(", ")));
        }
        st.comms.insert(comm_id, Comm { group_id, compiled: compiled.clone(), ready: false });
        st.groups.get_mut(&group_id).expect("checked").comms.insert(comm_id);
        (compiled, targets)
    };
    let comm_id = compiled.comm_id;
    let waits: Vec<_> = targets
        .iter()
        .map(|(c, r)| {
            (r.switch_id, c.clone(), push(shared, c, Message::InstallCommunicator(r.clone())))
        })
        .collect();
    let deadline = Instant::now() + shared.cfg.ack_timeout;
    let mut failed = Vec::new();
    let mut acked = Vec::new();
    for (sid, c, rx) in waits {
        match wait_ack(rx, deadline) {
            Ok(()) => acked.push(c),
            Err(e) => {
                let name = topo
                    .switch_by_id(sid)
                    .map(|i| topo.switches[i].name.clone())
                    .unwrap_or_default();
                failed.push(format!("switch {name} (id {sid}): {e}"));
            }
        }
    }
    let mut st = lock(&shared.state);
    // The group may have been destroyed while we waited.
    let alive = st.comms.contains_key(&comm_id);
    if failed.is_empty() && alive {
        st.comms.get_mut(&comm_id).expect("alive").ready = true;
        info!(
            comm_id,
            group_id,
            switches = targets.len(),
            root_switch = compiled.root_switch,
            "communicator installed"
        );
        return Ok(compiled);
    }
    if alive {
        st.comms.remove(&comm_id);
        st.alloc.release(comm_id);
        if let Some(g) = st.groups.get_mut(&group_id) {
            g.comms.remove(&comm_id);
        }
    }
    // Undo on every involved switch connected now (a switch that reconnected meanwhile
    // may have received the rules through the re-push); answers do not matter.
    let undo: Vec<Arc<SwitchConn>> = compiled
        .rules
        .iter()
        .filter_map(|r| st.switches.get(&r.switch_id).cloned())
        .chain(acked)
        .collect();
    drop(st);
    let mut seen = BTreeSet::new();
    for c in undo {
        if seen.insert(c.conn_id) {
            let _ = push(shared, &c, Message::RemoveCommunicator { comm_id });
        }
    }
    if !alive {
        return Err(format!(
            "group {group_id} was destroyed while communicator {comm_id} was being installed"
        ));
    }
    Err(format!(
        "communicator not installed within {:?}: {}",
        shared.cfg.ack_timeout,
        failed.join("; ")
    ))
}

fn destroy_communicator(shared: &Shared, comm_id: u32) -> Result<(), String> {
    let targets: Vec<Arc<SwitchConn>> = {
        let mut st = lock(&shared.state);
        let c =
            st.comms.remove(&comm_id).ok_or_else(|| format!("unknown communicator {comm_id}"))?;
        st.alloc.release(comm_id);
        if let Some(g) = st.groups.get_mut(&c.group_id) {
            g.comms.remove(&comm_id);
        }
        c.compiled.rules.iter().filter_map(|r| st.switches.get(&r.switch_id).cloned()).collect()
    };
    let waits: Vec<_> =
        targets.iter().map(|c| push(shared, c, Message::RemoveCommunicator { comm_id })).collect();
    let deadline = Instant::now() + shared.cfg.ack_timeout;
    for rx in waits {
        // A switch that misses the removal gets a clean slate when it re-registers.
        if let Err(e) = wait_ack(rx, deadline) {
            warn!(comm_id, error = %e, "switch did not confirm removal");
        }
    }
    info!(comm_id, "communicator destroyed");
    Ok(())
}

fn destroy_group(shared: &Shared, group_id: u64) -> Result<(), String> {
    // Take the group out first, in one step, so no status report (or new communicator)
    // sees a group that is half torn down.
    let group = lock(&shared.state)
        .groups
        .remove(&group_id)
        .ok_or_else(|| format!("unknown group {group_id}"))?;
    for c in group.comms {
        let _ = destroy_communicator(shared, c);
    }
    info!(group_id, "group destroyed");
    Ok(())
}

fn status_report(shared: &Shared) -> StatusReport {
    let topo = &shared.cfg.topology;
    let st = lock(&shared.state);
    StatusReport {
        topology: topo.name.clone(),
        switches: topo
            .switches
            .iter()
            .map(|s| {
                let conn = st.switches.get(&s.id);
                SwitchStatus {
                    switch_id: s.id,
                    name: s.name.clone(),
                    connected: conn.is_some(),
                    peer: conn.map(|c| c.peer.to_string()),
                    communicators: st
                        .comms
                        .iter()
                        .filter(|(_, c)| c.compiled.rules.iter().any(|r| r.switch_id == s.id))
                        .map(|(id, _)| *id)
                        .collect(),
                }
            })
            .collect(),
        groups: st
            .groups
            .iter()
            .map(|(id, g)| GroupStatus {
                group_id: *id,
                world_size: g.world_size,
                hosts: g.hosts.clone(),
                communicators: g.comms.iter().copied().collect(),
            })
            .collect(),
        communicators: st
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
            .collect(),
    }
}
