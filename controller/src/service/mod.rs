//! The controller service: the sans-IO [`Core`] with TCP around it.
//!
//! One reader and one writer thread per connection and one timer thread. Readers hand
//! received bytes to the core; the core's outputs go to per-connection queues that
//! the writers drain, so a peer that does not read can only block its own writer (a
//! full queue closes it). The core lock is never held while touching a socket.

mod core;
mod ops;
mod requests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::write_frame;
use inc_ctrl_proto::{Envelope, StatusReport};
use inc_topology::Topology;
use tracing::{debug, info, warn};

pub use self::core::{ConnId, Core, Output};
use crate::auth::Auth;

/// Resource bounds of the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more are refused.
    pub max_connections: usize,
    /// Connections from one IP address at once.
    pub max_connections_per_address: usize,
    /// Groups one connection may hold.
    pub max_groups_per_connection: usize,
    /// Communicators one group may hold.
    pub max_communicators_per_group: usize,
    /// Requests of one connection waiting for switches at once.
    pub max_requests_in_flight: usize,
    /// Failed authentications before the connection is closed.
    pub max_auth_failures: u32,
    /// Frames queued for one connection before it counts as not reading and is closed.
    pub max_queued_frames: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_connections_per_address: 64,
            max_groups_per_connection: 16,
            max_communicators_per_group: 64,
            max_requests_in_flight: 4,
            max_auth_failures: 3,
            max_queued_frames: 1024,
        }
    }
}

/// Service settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Validated topology.
    pub topology: Topology,
    /// Credentials required from switches and hosts (or none with `--insecure`).
    pub auth: Auth,
    /// How long to wait for switch acknowledgements.
    pub ack_timeout: Duration,
    /// How long one frame may take to arrive once its first byte did.
    pub frame_timeout: Duration,
    /// How long a new connection may take to authenticate (or register a switch).
    pub hello_timeout: Duration,
    /// Resource bounds.
    pub limits: Limits,
    /// Seed of start PSNs (random per process by default).
    pub seed: u64,
}

impl ServiceConfig {
    /// Defaults for a topology, requiring `auth`.
    pub fn new(topology: Topology, auth: Auth) -> Self {
        ServiceConfig {
            topology,
            auth,
            ack_timeout: Duration::from_secs(5),
            frame_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(30),
            limits: Limits::default(),
            seed: rand::random(),
        }
    }

    /// Defaults for a topology with no authentication (in-process tests).
    pub fn insecure(topology: Topology) -> Self {
        Self::new(topology, Auth::Insecure)
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

/// A connection's outgoing side.
#[derive(Debug)]
struct Outbox {
    queue: SyncSender<Envelope>,
    /// To shut the socket down when the queue overflows.
    socket: TcpStream,
}

#[derive(Debug)]
struct Shared {
    core: Mutex<Core>,
    outboxes: Mutex<HashMap<ConnId, Outbox>>,
    next_conn: AtomicU64,
    stop: AtomicBool,
    max_queued: usize,
    write_timeout: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicked connection thread must not take the whole service down.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Run `f` on the core at the current time, then carry out what it asked for.
    fn with_core(&self, f: impl FnOnce(&mut Core, Instant)) {
        let outputs = {
            let mut core = lock(&self.core);
            f(&mut core, Instant::now());
            core.take_outputs()
        };
        self.execute(outputs);
    }

    fn execute(&self, outputs: Vec<Output>) {
        let mut boxes = lock(&self.outboxes);
        for o in outputs {
            match o {
                Output::Send { conn, envelope } => {
                    let Some(b) = boxes.get(&conn) else { continue };
                    match b.queue.try_send(envelope) {
                        Ok(()) => {}
                        Err(TrySendError::Full(_)) => {
                            warn!(
                                conn,
                                limit = self.max_queued,
                                "peer does not read its replies; closing"
                            );
                            let _ = b.socket.shutdown(Shutdown::Both);
                            boxes.remove(&conn);
                        }
                        Err(TrySendError::Disconnected(_)) => {
                            boxes.remove(&conn);
                        }
                    }
                }
                Output::Close { conn, reason } => {
                    debug!(conn, %reason, "closing after queued frames");
                    // The writer sends what is queued, then shuts the socket down.
                    boxes.remove(&conn);
                }
            }
        }
    }
}

/// A running controller.
#[derive(Debug)]
pub struct Controller {
    shared: Arc<Shared>,
    addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
}

impl Controller {
    /// Listen on `addr` and serve in background threads.
    pub fn start(cfg: ServiceConfig, addr: &str) -> Result<Controller, ServiceError> {
        let bind_err = |source| ServiceError::Bind { addr: addr.to_string(), source };
        let listener = TcpListener::bind(addr).map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        info!(
            addr = %local,
            topology = %cfg.topology.name,
            switches = cfg.topology.switches.len(),
            hosts = cfg.topology.hosts.len(),
            auth = cfg.auth.is_required(),
            "controller listening"
        );
        let shared = Arc::new(Shared {
            max_queued: cfg.limits.max_queued_frames,
            write_timeout: cfg.frame_timeout,
            core: Mutex::new(Core::new(cfg, Instant::now())),
            outboxes: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = thread::Builder::new()
            .name("ctrl-accept".into())
            .spawn(move || accept_loop(&s, &listener))
            .expect("spawn accept thread");
        let s = shared.clone();
        let timer = thread::Builder::new()
            .name("ctrl-timer".into())
            .spawn(move || timer_loop(&s))
            .expect("spawn timer thread");
        Ok(Controller { shared, addr: local, threads: vec![accept, timer] })
    }

    /// Address the service listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Current state.
    pub fn status(&self) -> StatusReport {
        lock(&self.shared.core).status()
    }

    /// Block until the service stops (i.e. forever, unless stopped).
    pub fn wait(mut self) {
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }

    /// Stop accepting connections.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
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
        if let Err(e) = serve(shared, stream) {
            warn!(error = %e, "cannot serve a new connection");
        }
    }
}

/// Set up a connection: its outbox and writer, the core's verdict, its reader.
fn serve(shared: &Arc<Shared>, stream: TcpStream) -> io::Result<()> {
    let peer = stream.peer_addr()?;
    let conn = shared.next_conn.fetch_add(1, Ordering::SeqCst);
    let _ = stream.set_nodelay(true);
    // Idle switch and rank-0 connections read without a timeout; keepalive notices a
    // peer that vanished without closing (about 25 s).
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&ka);
    stream.set_write_timeout(Some(shared.write_timeout))?;
    let (tx, rx) = mpsc::sync_channel(shared.max_queued);
    let writer = stream.try_clone()?;
    lock(&shared.outboxes).insert(conn, Outbox { queue: tx, socket: stream.try_clone()? });
    thread::Builder::new()
        .name(format!("ctrl-write-{conn}"))
        .spawn(move || write_loop(writer, &rx))?;
    shared.with_core(|core, now| core.open(conn, peer, now));
    if !lock(&shared.outboxes).contains_key(&conn) {
        return Ok(()); // refused; the writer sends the reason and closes
    }
    let s = shared.clone();
    let spawned = thread::Builder::new()
        .name(format!("ctrl-read-{conn}"))
        .spawn(move || read_loop(&s, conn, stream));
    if let Err(e) = spawned {
        shared.with_core(|core, now| core.closed(conn, now));
        lock(&shared.outboxes).remove(&conn);
        return Err(e);
    }
    Ok(())
}

fn read_loop(shared: &Shared, conn: ConnId, mut stream: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => shared.with_core(|core, now| core.receive(conn, &buf[..n], now)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                debug!(conn, error = %e, "read failed");
                break;
            }
        }
    }
    shared.with_core(|core, now| core.closed(conn, now));
    lock(&shared.outboxes).remove(&conn);
}

fn write_loop(mut stream: TcpStream, queue: &Receiver<Envelope>) {
    // Ends when the core closes the connection (its outbox is dropped) or a write
    // fails (a peer that stops reading hits the write timeout).
    for env in queue {
        if let Err(e) = write_frame(&mut stream, &env) {
            debug!(error = %e, "write failed");
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

fn timer_loop(shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        let next = lock(&shared.core).next_deadline();
        let now = Instant::now();
        // Wake at the next deadline, and at least every 100 ms to notice a stop and
        // deadlines that appeared meanwhile.
        let nap = next.map_or(Duration::from_millis(100), |t| t.saturating_duration_since(now));
        thread::sleep(nap.min(Duration::from_millis(100)));
        shared.with_core(|core, now| core.tick(now));
    }
}
