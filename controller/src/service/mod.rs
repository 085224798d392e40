//! The controller service: the sans-IO [`Core`] with TCP around it.
//!
//! One reader and one writer thread per connection and one timer thread. Readers hand
//! received bytes to the core one frame at a time; the core's outputs are encoded into
//! per-connection queues bounded in bytes that the writers drain. A reader stops
//! reading while its connection's queue holds more than `Limits::reply_budget_bytes`
//! (flow control: a peer that does not read its replies only stalls itself), and a
//! connection closes at once: its socket is shut down, both threads end, and only
//! then is its place in the limits released. The core lock is never held while
//! touching a socket.

mod core;
mod loglimit;
mod ops;
mod requests;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::{encode_with_limit, MAX_REPLY_FRAME};
use inc_ctrl_proto::{Envelope, Message, StatusReport};
use inc_topology::Topology;
use tracing::{debug, info, warn};

pub use self::core::{ConnId, Core, Output};
use crate::auth::Auth;

/// Resource bounds of the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; when full, an unauthenticated one is closed to
    /// make room for a new one, and without one the new one is refused.
    pub max_connections: usize,
    /// Connections from one IP address at once, counting closed ones whose threads
    /// have not ended yet.
    pub max_connections_per_address: usize,
    /// Connections that have not authenticated (nor registered a switch) at once;
    /// the rest of `max_connections` is kept for switches and authenticated hosts.
    pub max_unauthenticated: usize,
    /// Unauthenticated connections from one IP address at once.
    pub max_unauthenticated_per_address: usize,
    /// Closed connections still ending (threads, buffers) on top of
    /// `max_connections` before new connections are refused.
    pub max_closing: usize,
    /// Groups one connection may hold.
    pub max_groups_per_connection: usize,
    /// Communicators one group may hold.
    pub max_communicators_per_group: usize,
    /// Requests of one connection waiting for switches at once.
    pub max_requests_in_flight: usize,
    /// Failed authentications before the connection is closed.
    pub max_auth_failures: u32,
    /// Bytes queued for a connection above which its next frame is not read until
    /// the peer has read its replies.
    pub reply_budget_bytes: usize,
    /// Bytes queued for a connection above which it counts as not reading and is
    /// closed (reachable only by pushes to a switch that does not read them).
    pub max_queued_bytes: usize,
    /// Re-pushes unanswered at once when a switch registers.
    pub repush_window: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_connections_per_address: 64,
            max_unauthenticated: 64,
            max_unauthenticated_per_address: 8,
            max_closing: 64,
            max_groups_per_connection: 16,
            max_communicators_per_group: 64,
            max_requests_in_flight: 4,
            max_auth_failures: 3,
            reply_budget_bytes: 256 << 10,
            max_queued_bytes: 64 << 20,
            repush_window: 64,
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
            hello_timeout: Duration::from_secs(5),
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

/// Listen backlog: room for a burst of every connection the limits allow (std's
/// `TcpListener` uses 128); the kernel caps it at `net.core.somaxconn`.
const LISTEN_BACKLOG: i32 = 1024;

/// Bytes one `read` takes from a socket.
const READ_CHUNK: usize = 16 << 10;

/// How long a closing connection's last frames (e.g. why it is closed) may take to
/// go out before the socket is shut down regardless.
const CLOSE_GRACE: Duration = Duration::from_millis(200);

/// How often a writer waiting for the socket checks whether its connection closed.
const WRITE_POLL: Duration = Duration::from_millis(50);

/// Frames encoded for a connection, waiting for its writer.
#[derive(Debug, Default)]
struct Queue {
    frames: VecDeque<Vec<u8>>,
    /// Bytes queued, including the frame being written.
    bytes: usize,
    /// No more frames: the writer sends what is queued within [`CLOSE_GRACE`], then
    /// shuts the socket down.
    closing: bool,
}

/// A connection's I/O state shared by its reader, its writer and whoever executes
/// the core's outputs.
#[derive(Debug)]
struct ConnIo {
    queue: Mutex<Queue>,
    /// Signalled when frames are queued, written, or the connection closes.
    changed: Condvar,
}

impl ConnIo {
    /// Stop the connection: the writer sends what is queued (within [`CLOSE_GRACE`])
    /// and shuts the socket down, which ends the reader.
    fn close(&self) {
        lock(&self.queue).closing = true;
        self.changed.notify_all();
    }

    fn closing(&self) -> bool {
        lock(&self.queue).closing
    }
}

#[derive(Debug)]
struct Shared {
    core: Mutex<Core>,
    /// Taken before the core lock is released and held while its outputs are queued,
    /// so frames reach each connection in the order the core produced them.
    exec: Mutex<()>,
    conns: Mutex<HashMap<ConnId, Arc<ConnIo>>>,
    next_conn: AtomicU64,
    stop: AtomicBool,
    reply_budget: usize,
    max_queued: usize,
    write_timeout: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicked connection thread must not take the whole service down.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Run `f` on the core at the current time, then carry out what it asked for.
    fn with_core<R>(&self, f: impl FnOnce(&mut Core, Instant) -> R) -> R {
        let (r, outputs, exec) = {
            let mut core = lock(&self.core);
            let r = f(&mut core, Instant::now());
            (r, core.take_outputs(), lock(&self.exec))
        };
        self.execute(outputs);
        drop(exec);
        r
    }

    fn execute(&self, outputs: Vec<Output>) {
        for o in outputs {
            match o {
                Output::Send { conn, envelope } => {
                    let Some(io) = lock(&self.conns).get(&conn).cloned() else { continue };
                    let frame = match encode_with_limit(&envelope, MAX_REPLY_FRAME) {
                        Ok(f) => f,
                        Err(e) => {
                            // Only the controller's own state can make a frame this large.
                            warn!(conn, error = %e, "reply cannot be encoded");
                            let msg = Message::error(format!("reply not sent: {e}"));
                            match encode_with_limit(
                                &Envelope::new(envelope.id, msg),
                                MAX_REPLY_FRAME,
                            ) {
                                Ok(f) => f,
                                Err(_) => continue,
                            }
                        }
                    };
                    let mut q = lock(&io.queue);
                    if q.closing {
                        continue;
                    }
                    if q.bytes > self.max_queued {
                        drop(q);
                        warn!(
                            conn,
                            limit = self.max_queued,
                            "peer does not read what it is sent; closing"
                        );
                        io.close();
                        lock(&self.conns).remove(&conn);
                        continue;
                    }
                    q.bytes += frame.len();
                    q.frames.push_back(frame);
                    io.changed.notify_all();
                }
                Output::Close { conn, reason } => {
                    debug!(conn, %reason, "closing after queued frames");
                    if let Some(io) = lock(&self.conns).remove(&conn) {
                        io.close();
                    }
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

/// A listener with [`LISTEN_BACKLOG`].
fn listen(addr: &str) -> io::Result<TcpListener> {
    use std::net::ToSocketAddrs as _;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addr.to_socket_addrs()? {
        let bind = || -> io::Result<TcpListener> {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(a),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            // As std does: a restarted controller binds while old connections linger.
            s.set_reuse_address(true)?;
            s.bind(&a.into())?;
            s.listen(LISTEN_BACKLOG)?;
            Ok(s.into())
        };
        match bind() {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl Controller {
    /// Listen on `addr` and serve in background threads.
    pub fn start(cfg: ServiceConfig, addr: &str) -> Result<Controller, ServiceError> {
        let bind_err = |source| ServiceError::Bind { addr: addr.to_string(), source };
        let listener = listen(addr).map_err(bind_err)?;
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
            reply_budget: cfg.limits.reply_budget_bytes,
            max_queued: cfg.limits.max_queued_bytes,
            write_timeout: cfg.frame_timeout,
            core: Mutex::new(Core::new(cfg, Instant::now())),
            exec: Mutex::new(()),
            conns: Mutex::new(HashMap::new()),
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

    /// Stop accepting connections and close every connection (their threads end on
    /// their own), as if the process had ended: the address is free again.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        let open: Vec<Arc<ConnIo>> = lock(&self.shared.conns).drain().map(|(_, io)| io).collect();
        for io in open {
            io.close();
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

/// Set up a connection: the core's verdict, then its writer and reader.
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
    let io = Arc::new(ConnIo { queue: Mutex::new(Queue::default()), changed: Condvar::new() });
    lock(&shared.conns).insert(conn, io.clone());
    shared.with_core(|core, now| core.open(conn, peer, now));
    if !lock(&shared.conns).contains_key(&conn) {
        // Refused: the reason goes out if the socket takes it now, no thread waits.
        let frames = std::mem::take(&mut lock(&io.queue).frames);
        for f in frames {
            if send_now(&stream, &f).ok() != Some(f.len()) {
                break;
            }
        }
        let _ = stream.shutdown(Shutdown::Both);
        return Ok(());
    }
    let s = shared.clone();
    let spawned = thread::Builder::new()
        .name(format!("ctrl-conn-{conn}"))
        .spawn(move || connection(&s, conn, stream, io));
    if let Err(e) = spawned {
        shared.with_core(|core, now| {
            core.closed(conn, now);
            core.released(conn);
        });
        lock(&shared.conns).remove(&conn);
        return Err(e);
    }
    Ok(())
}

/// A connection's life: its writer runs beside this thread, which reads; when either
/// ends, the socket is shut down, the other ends too, and the core is told.
fn connection(shared: &Shared, conn: ConnId, stream: TcpStream, io: Arc<ConnIo>) {
    let writer = {
        let (io, stream) = (io.clone(), stream.try_clone());
        let write_timeout = shared.write_timeout;
        thread::Builder::new().name(format!("ctrl-write-{conn}")).spawn(move || {
            if let Ok(stream) = stream {
                write_loop(&io, stream, write_timeout);
            }
        })
    };
    match writer {
        Ok(w) => {
            read_loop(shared, conn, stream, &io);
            // The writer sends what is queued (within CLOSE_GRACE) and shuts down.
            io.close();
            let _ = w.join();
        }
        Err(e) => warn!(conn, error = %e, "cannot start a writer thread"),
    }
    lock(&shared.conns).remove(&conn);
    drop(io);
    shared.with_core(|core, now| {
        core.closed(conn, now);
        core.released(conn);
    });
}

fn read_loop(shared: &Shared, conn: ConnId, mut stream: TcpStream, io: &ConnIo) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => shared.with_core(|core, now| core.buffer(conn, &buf[..n], now)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                debug!(conn, error = %e, "read failed");
                return;
            }
        }
        // One frame at a time, each only once the replies queued so far fit the budget.
        loop {
            {
                let mut q = lock(&io.queue);
                while q.bytes > shared.reply_budget && !q.closing {
                    q = io.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                if q.closing {
                    return;
                }
            }
            if !shared.with_core(|core, now| core.next_frame(conn, now)) {
                break;
            }
        }
    }
}

fn write_loop(io: &ConnIo, stream: TcpStream, write_timeout: Duration) {
    // Ends when the connection closes (what is queued then has CLOSE_GRACE to go
    // out) or a write fails (a peer that reads nothing for the write timeout).
    loop {
        let frame = {
            let mut q = lock(&io.queue);
            while q.frames.is_empty() && !q.closing {
                q = io.changed.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            match q.frames.pop_front() {
                Some(f) => f,
                None => break, // closing, all sent
            }
        };
        let res = write_frame_bytes(io, &stream, &frame, write_timeout);
        let mut q = lock(&io.queue);
        q.bytes -= frame.len();
        io.changed.notify_all();
        if let Err(e) = res {
            debug!(error = %e, "write failed");
            q.closing = true;
            q.frames.clear();
            q.bytes = 0;
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Write one frame without ever blocking in the kernel, so the writer notices a
/// close: fails once no byte went out for `timeout`, or for [`CLOSE_GRACE`] after the
/// connection started closing.
fn write_frame_bytes(
    io: &ConnIo,
    stream: &TcpStream,
    mut frame: &[u8],
    timeout: Duration,
) -> io::Result<()> {
    use std::os::fd::AsFd as _;
    let mut progress = Instant::now();
    let mut closing_since: Option<Instant> = None;
    while !frame.is_empty() {
        match send_now(stream, frame) {
            Ok(n) => {
                frame = &frame[n..];
                progress = Instant::now();
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        if io.closing() {
            let since = *closing_since.get_or_insert(now);
            if now >= since + CLOSE_GRACE {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "closing"));
            }
        }
        if now >= progress + timeout {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "peer does not read"));
        }
        let mut fds = [nix::poll::PollFd::new(stream.as_fd(), nix::poll::PollFlags::POLLOUT)];
        let wait =
            nix::poll::PollTimeout::try_from(WRITE_POLL).unwrap_or(nix::poll::PollTimeout::ZERO);
        let _ = nix::poll::poll(&mut fds, wait);
    }
    Ok(())
}

/// `send` that never waits (the socket stays blocking for the reader).
fn send_now(stream: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::AsRawFd as _;
    send(stream.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL)
        .map_err(io::Error::from)
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
