//! The real `inc-controller serve` on loopback under the attacks and bursts of issue
//! [19]: floods before authentication, a connection flood against legitimate clients,
//! a switch re-registering with thousands of communicators, pipelined requests, a
//! large `status`. The controller's RSS, threads and log are read from
//! `/proc/PID/status` and its stderr file and checked against stated bounds; each test
//! prints what it measured (`--nocapture`). `INC_HOSTILE_BIN` runs another build of
//! the controller (to measure an older one).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::{encode, FrameDecoder, MAX_REPLY_FRAME};
use inc_ctrl_proto::{ClientError, ControllerClient, Envelope, Message, Push};

mod common;

const T: Duration = Duration::from_secs(5);
const TOKEN: &str = "host-s3cret-0123456789";
const SWITCH_TOKEN: &str = "switch-s3cret-0123456789";
const MIB: u64 = 1 << 20;

struct Server {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// What `/proc/PID/status` says about the controller.
#[derive(Debug, Clone, Copy)]
struct Usage {
    rss: u64,
    peak_rss: u64,
    threads: u64,
}

impl Server {
    fn start(name: &str) -> Server {
        use std::os::unix::fs::OpenOptionsExt as _;
        let dir = std::env::temp_dir().join(format!("inc-hostile-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token_file)
            .unwrap()
            .write_all(format!("switch {SWITCH_TOKEN}\nhost {TOKEN}\n").as_bytes())
            .unwrap();
        // 1-2-4 with room for tens of thousands of communicators of one rank-0 host on a
        // switch: what each may allocate there is counted (32,128 bytes at mtu 256,
        // window 1 on leaf1), and the shipped limits hold 4,177 per host, 8,355 per
        // switch.
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
        let topo = dir.join("1-2-4.yaml");
        let yaml = fs::read_to_string(shipped).unwrap().replace(
            "    ports:\n",
            "    max_slot_memory: 68719476736\n    max_host_memory: 68719476736\n    ports:\n",
        );
        fs::write(&topo, yaml).unwrap();
        let topo = topo.to_str().unwrap();
        let log = fs::File::create(dir.join("log")).unwrap();
        let bin = std::env::var("INC_HOSTILE_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_inc-controller").into());
        let mut child = Command::new(bin)
            .args(["serve", "--token-file", token_file.to_str().unwrap()])
            .args(["--frame-timeout", "2", "--topology", topo, "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn controller");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr: SocketAddr =
            line.trim().strip_prefix("listening on ").expect("listening line").parse().unwrap();
        Server { child, addr, dir }
    }

    fn usage(&self) -> Usage {
        let s = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |k: &str| -> u64 {
            let l = s.lines().find(|l| l.starts_with(k)).unwrap();
            l.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        Usage {
            rss: field("VmRSS:") << 10,
            peak_rss: field("VmHWM:") << 10,
            threads: field("Threads:"),
        }
    }

    /// Restart the peak RSS (`VmHWM`) from the current RSS, to measure one phase.
    fn reset_peak(&self) {
        fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5").unwrap();
    }

    fn log(&self) -> Vec<u8> {
        fs::read(self.dir.join("log")).unwrap()
    }

    /// Sample the controller's threads every 10 ms until `stop`; returns the most seen.
    fn watch_threads(&self, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
        let path = format!("/proc/{}/status", self.child.id());
        thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(s) = fs::read_to_string(&path) {
                    let l = s.lines().find(|l| l.starts_with("Threads:")).unwrap_or("x 0");
                    max = max.max(l.split_whitespace().nth(1).unwrap().parse().unwrap_or(0));
                }
                thread::sleep(Duration::from_millis(10));
            }
            max
        })
    }
}

/// A frame of 1 MiB less `short` bytes the controller cannot parse, whose unknown
/// message name tries to forge a log line and clear the terminal.
fn bad_frame(short: usize) -> Vec<u8> {
    let name = format!(
        "\n2026-01-01T00:00:00Z  INFO switch registered switch=root\x1b[2J{}",
        "x".repeat((1 << 20) - short)
    );
    let body =
        format!(r#"{{"version":1,"id":7,"body":{}}}"#, serde_json::to_string(&name).unwrap());
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body.as_bytes());
    f
}

/// 80 connections from `addresses` loopback addresses send 5 bad frames each without
/// reading. Returns the peak RSS and the most threads seen; checks that the threads
/// are back to `idle` within 2 s.
fn flood_connections(srv: &Server, frame: &Arc<Vec<u8>>, addresses: u8, idle: u64) -> Usage {
    let stop = Arc::new(AtomicBool::new(false));
    let watch = srv.watch_threads(stop.clone());
    let (t0, log0) = (Instant::now(), srv.log().len());
    let attackers: Vec<_> = (0..80u8)
        .map(|i| {
            let (addr, frame) = (srv.addr, frame.clone());
            let src = Ipv4Addr::new(127, 0, 0, 1 + i % addresses);
            thread::spawn(move || {
                let Ok(mut s) = connect_from(src, addr) else { return };
                s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
                for _ in 0..5 {
                    if s.write_all(&frame).is_err() {
                        return;
                    }
                }
                // Hold the connection a moment without reading.
                thread::sleep(Duration::from_millis(500));
            })
        })
        .collect();
    for a in attackers {
        a.join().unwrap();
    }
    let attack = t0.elapsed();
    // Threads of closed connections end at once.
    let t0 = Instant::now();
    while srv.usage().threads > idle && t0.elapsed() < Duration::from_secs(3) {
        thread::sleep(Duration::from_millis(10));
    }
    let settled = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    let threads = watch.join().unwrap();
    let after = srv.usage();
    eprintln!(
        "80 connections from {addresses} address(es) for {attack:?}: max {threads} threads, peak RSS {} KiB; back to {} threads {settled:?} after they closed; log +{} bytes",
        after.peak_rss >> 10,
        after.threads,
        srv.log().len() - log0
    );
    assert!(after.threads <= idle, "threads left behind: {after:?}");
    Usage { threads, ..after }
}

/// Connect from a given loopback address.
fn connect_from(src: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::from((src, 0)).into())?;
    s.connect_timeout(&to.into(), T)?;
    Ok(s.into())
}

/// Ranks on leaf1 only: their communicators involve leaf1 alone.
fn leaf1_hosts() -> Vec<Ipv4Addr> {
    vec!["10.1.1.21".parse().unwrap(), "10.1.1.5".parse().unwrap()]
}

/// A switch session that answers every push until `stop`; counts installs.
fn run_switch(
    addr: SocketAddr,
    id: u32,
    ports: &[&str],
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicUsize>, thread::JoinHandle<Result<(), ClientError>>) {
    let mut s = common::connect_switch(addr, id, ports, SWITCH_TOKEN, T);
    let installs = Arc::new(AtomicUsize::new(0));
    let n = installs.clone();
    let h = thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            if let Some(p) = s.next_push(Duration::from_millis(20))? {
                if matches!(p.push, Push::Install(_)) {
                    n.fetch_add(1, Ordering::SeqCst);
                }
                s.ack(p.id)?;
            }
        }
        Ok(())
    });
    (installs, h)
}

/// One unauthenticated connection sends 400 bad ~1 MiB frames without reading; 80
/// connections from one address do the same, then 80 from 8 addresses; a connection
/// floods empty frames. Peak RSS stays below 24 MiB for the first (one frame buffer),
/// 40 MiB for the second (8 admitted) and 96 MiB for the third (all 64
/// unauthenticated connections buffering 1 MiB frames at once), threads below 40 and
/// 140, the log grows by at most 128 KiB (warnings: 100 at once, then 20 per second
/// for all addresses) without a raw control character, and every thread of a closed
/// connection ends.
#[test]
fn floods_before_authentication_stay_bounded() {
    let srv = Server::start("floods");
    thread::sleep(Duration::from_millis(100));
    let idle = srv.usage();
    let log0 = srv.log().len();
    // Short enough that an error reply quoting it whole fits in a frame.
    let frame = Arc::new(bad_frame(4096));

    // 400 bad frames on one connection that never reads.
    let t0 = Instant::now();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_write_timeout(Some(T)).unwrap();
    let mut sent = 0;
    for _ in 0..400 {
        if s.write_all(&frame).is_err() {
            break;
        }
        sent += 1;
    }
    drop(s);
    let one = srv.usage();
    eprintln!(
        "400 bad 1 MiB frames: {sent} sent in {:?}; {one:?} (idle {idle:?}); log +{} bytes",
        t0.elapsed(),
        srv.log().len() - log0
    );
    srv.reset_peak();

    // 80 connections from one address, then from 8, each sending bad frames without
    // reading.
    let one_address = flood_connections(&srv, &frame, 1, idle.threads);
    srv.reset_peak();
    let eight_addresses = flood_connections(&srv, &frame, 8, idle.threads);

    // Empty frames: each is an error reply and a warning, without reading.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    let empties = vec![0u8; 4 * 100_000];
    let _ = s.write_all(&empties);
    drop(s);
    thread::sleep(Duration::from_millis(200));

    let log = srv.log();
    let grown = (log.len() - log0) as u64;
    let end = srv.usage();
    eprintln!("log grew {grown} bytes; {end:?}");
    // A near-1 MiB unknown message is answered, briefly.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(&bad_frame(200)).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut dec = FrameDecoder::new();
    let mut buf = [0u8; 4096];
    let reply = loop {
        if let Some(env) = dec.next_frame().unwrap() {
            break env;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed without a reply");
        dec.extend(&buf[..n]);
    };
    let Message::Error { reason } = &reply.body else { panic!("{reply:?}") };
    assert!(reply.id == 7 && reason.len() < 512, "{} bytes", reason.len());
    drop(s);

    assert!(one.peak_rss < 24 * MIB, "peak RSS {one:?}");
    assert!(one_address.peak_rss < 40 * MIB, "{one_address:?}");
    assert!(eight_addresses.peak_rss < 96 * MIB, "{eight_addresses:?}");
    assert!(one_address.threads <= 40, "{one_address:?}");
    assert!(eight_addresses.threads <= 140, "{eight_addresses:?}");
    assert!(grown < 128 << 10, "log grew {grown} bytes");
    let text = String::from_utf8_lossy(&log);
    assert!(!log.contains(&0x1b), "raw ESC in the log");
    assert!(text.lines().all(|l| !l.starts_with("2026-01-01T00:00:00Z")), "forged line in the log");
    assert!(text.contains("suppressed"), "no suppressed summary:\n{text}");
}

/// 300 unauthenticated connections held from 40 addresses, renewed as the controller
/// closes them: a switch still re-registers and a new rank 0 still creates its group,
/// each within a second, and the controller stays below 200 threads and 64 MiB.
#[test]
fn legitimate_clients_get_in_during_a_connection_flood() {
    let srv = Server::start("lockout");
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicUsize::new(0));
    let flood = {
        let (stop, held, addr) = (stop.clone(), held.clone(), srv.addr);
        thread::spawn(move || {
            let mut conns: std::collections::VecDeque<TcpStream> = Default::default();
            let mut i = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let src = Ipv4Addr::new(127, 0, 0, 2 + (i % 40) as u8);
                i += 1;
                if let Ok(s) = connect_from(src, addr) {
                    conns.push_back(s);
                }
                if conns.len() > 300 {
                    conns.pop_front();
                }
                held.store(conns.len(), Ordering::SeqCst);
                if conns.len() >= 300 {
                    thread::sleep(Duration::from_millis(2));
                }
            }
        })
    };
    while held.load(Ordering::SeqCst) < 300 {
        thread::sleep(Duration::from_millis(10));
    }
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let t0 = Instant::now();
        let sw_stop = Arc::new(AtomicBool::new(false));
        let (_, h) = run_switch(srv.addr, 1, &["up", "h0", "h1"], sw_stop.clone());
        let t_switch = t0.elapsed();
        let t0 = Instant::now();
        let mut c = ControllerClient::connect(srv.addr, T).unwrap();
        let g = c.register_group(Some(TOKEN.into()), leaf1_hosts(), T).unwrap();
        c.create_communicator(g, inc_controller::demo_ranks(&leaf1_hosts()), Some(256), Some(1), T)
            .unwrap();
        let t_rank0 = t0.elapsed();
        worst = worst.max(t_switch).max(t_rank0);
        sw_stop.store(true, Ordering::SeqCst);
        h.join().unwrap().unwrap();
        drop(c);
    }
    let usage = srv.usage();
    stop.store(true, Ordering::SeqCst);
    flood.join().unwrap();
    eprintln!("under a 300-connection flood: worst time to serve {worst:?}; {usage:?}");
    assert!(worst < Duration::from_secs(1), "{worst:?}");
    assert!(usage.threads < 200 && usage.peak_rss < 64 * MIB, "{usage:?}");
}

/// A switch holding 5,000 communicators (`INC_HOSTILE_COMMS` to change) re-registers
/// and gets all of them without being closed; `status` lists them; a host pipelining
/// 20,000 requests (and 1,400 written before reading any reply) gets every reply, and
/// 20 pipelined `status` it does not read grow the controller by a few replies at most.
#[test]
fn bursts_are_served_by_flow_control() {
    let n: usize = std::env::var("INC_HOSTILE_COMMS").map_or(5_000, |v| v.parse().unwrap());
    let srv = Server::start("bursts");
    let stop = Arc::new(AtomicBool::new(false));
    let (_, sw) = run_switch(srv.addr, 1, &["up", "h0", "h1"], stop.clone());

    // Pipelined pings, read concurrently: flow control, no close.
    let mut s = TcpStream::connect(srv.addr).unwrap();
    let mut hello =
        encode(&Envelope::new(1, Message::Hello { token: Some(TOKEN.into()) })).unwrap();
    for id in 2..20_002u64 {
        hello.extend(encode(&Envelope::new(id, Message::Ping)).unwrap());
    }
    let mut w = s.try_clone().unwrap();
    let writer = thread::spawn(move || w.write_all(&hello).unwrap());
    s.set_read_timeout(Some(T)).unwrap();
    let mut dec = FrameDecoder::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut next = 1;
    while next < 20_002 {
        while let Some(env) = dec.next_frame().unwrap() {
            assert_eq!((env.id, &env.body), (next, &Message::Ack));
            next += 1;
        }
        if next < 20_002 {
            let k = s.read(&mut buf).unwrap();
            assert!(k > 0, "closed after {next} replies");
            dec.extend(&buf[..k]);
        }
    }
    writer.join().unwrap();
    // 1,400 written before reading any reply.
    let mut batch = Vec::new();
    for id in 0..1_400u64 {
        batch.extend(encode(&Envelope::new(100_000 + id, Message::Ping)).unwrap());
    }
    s.write_all(&batch).unwrap();
    let mut got = 0;
    while got < 1_400 {
        while dec.next_frame().unwrap().is_some() {
            got += 1;
        }
        if got < 1_400 {
            let k = s.read(&mut buf).unwrap();
            assert!(k > 0, "closed after {got} replies");
            dec.extend(&buf[..k]);
        }
    }

    // n communicators on leaf1, 1,024 per host connection (16 groups of 64).
    let t0 = Instant::now();
    let mut owners = Vec::new();
    let mut made = 0;
    while made < n {
        let mut c = ControllerClient::connect(srv.addr, T).unwrap();
        c.hello(Some(TOKEN.into()), T).unwrap();
        'groups: for _ in 0..16 {
            let g = c.register_group(None, leaf1_hosts(), T).unwrap();
            for _ in 0..64 {
                if made == n {
                    break 'groups;
                }
                c.create_communicator(
                    g,
                    inc_controller::demo_ranks(&leaf1_hosts()),
                    Some(256),
                    Some(1),
                    T,
                )
                .unwrap();
                made += 1;
            }
        }
        owners.push(c);
    }
    eprintln!("{n} communicators created in {:?}", t0.elapsed());

    // leaf1 restarts: all of them again, on one connection.
    stop.store(true, Ordering::SeqCst);
    sw.join().unwrap().unwrap();
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (installs, sw) = run_switch(srv.addr, 1, &["up", "h0", "h1"], stop.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while installs.load(Ordering::SeqCst) < n {
        assert!(!sw.is_finished(), "switch connection closed");
        assert!(Instant::now() < deadline, "{} of {n} re-pushed", installs.load(Ordering::SeqCst));
        thread::sleep(Duration::from_millis(5));
    }
    let t_repush = t0.elapsed();

    // status of all of them; then 20 pipelined, not read for a while: the controller
    // holds at most its reply budget plus one reply.
    let t0 = Instant::now();
    let st = owners[0].status(Duration::from_secs(30)).unwrap();
    let t_status = t0.elapsed();
    assert_eq!(st.communicators.len(), n);
    let size = encode_size(&st) as u64;
    let base = srv.usage();
    let mut s = TcpStream::connect(srv.addr).unwrap();
    let mut reqs = encode(&Envelope::new(1, Message::Hello { token: Some(TOKEN.into()) })).unwrap();
    for id in 2..22u64 {
        reqs.extend(encode(&Envelope::new(id, Message::Status)).unwrap());
    }
    s.write_all(&reqs).unwrap();
    thread::sleep(Duration::from_millis(500));
    let held = srv.usage();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut dec = FrameDecoder::with_limit(MAX_REPLY_FRAME);
    let mut got = 0;
    while got < 21 {
        while dec.next_frame().unwrap().is_some() {
            got += 1;
        }
        if got < 21 {
            let k = s.read(&mut buf).unwrap();
            assert!(k > 0, "closed after {got} replies");
            dec.extend(&buf[..k]);
        }
    }
    eprintln!(
        "re-push of {n} in {t_repush:?}; status of {size} bytes in {t_status:?}; 20 unread status replies: {held:?}, before them {base:?}"
    );
    // The reply being written, the one queued, their encoding: a few replies' worth.
    assert!(held.rss < base.rss + 16 * MIB + 4 * size, "{held:?} vs {base:?}");
    stop.store(true, Ordering::SeqCst);
    sw.join().unwrap().unwrap();
}

fn encode_size(st: &inc_ctrl_proto::StatusReport) -> usize {
    serde_json::to_vec(st).unwrap().len()
}
