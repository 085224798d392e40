//! Runs the real `inc-controller serve` on loopback with fake switch clients,
//! concurrent rank-0 clients and misbehaving clients, and checks every reply.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::{read_frame, write_frame};
use inc_ctrl_proto::{
    ClientError, ControllerClient, Envelope, Message, PortInfo, Push, RankEndpoint, SwitchRules,
    SwitchSession, MAX_FRAME,
};

mod common;

const T: Duration = Duration::from_secs(5);
/// Host credential.
const TOKEN: &str = "host-s3cret-0123456789";
/// Switch credential.
const SWITCH_TOKEN: &str = "switch-s3cret-0123456789";

struct Server {
    child: Child,
    addr: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_server(name: &str) -> Server {
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = std::env::temp_dir().join(format!("inc-ctrl-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let token_file = dir.join("token");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&token_file)
        .unwrap()
        .write_all(format!("switch {SWITCH_TOKEN}\nhost {TOKEN}\n").as_bytes())
        .unwrap();
    let topo = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_inc-controller"))
        .args([
            "serve",
            "--token-file",
            token_file.to_str().unwrap(),
            "--frame-timeout",
            "1",
            "--topology",
            topo,
            "--listen",
            "127.0.0.1:0",
            "--ack-timeout",
            "1.5",
            "--seed",
            "5",
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn controller");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").expect("listening line").parse().unwrap();
    Server { child, addr, dir }
}

#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Ack,
    Reject,
    Silent,
}

/// A fake switch: registers, then records every push and answers per `behaviour`.
struct FakeSwitch {
    stop: Arc<AtomicBool>,
    pushes: Arc<Mutex<Vec<Push>>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl FakeSwitch {
    fn start(addr: SocketAddr, id: u32, ports: &[&str], behaviour: Behaviour) -> FakeSwitch {
        let mut s = common::connect_switch(addr, id, ports, SWITCH_TOKEN, T);
        let stop = Arc::new(AtomicBool::new(false));
        let pushes = Arc::new(Mutex::new(Vec::new()));
        let (st, pu) = (stop.clone(), pushes.clone());
        let handle = thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                match s.next_push(Duration::from_millis(50)) {
                    Ok(Some(p)) => {
                        pu.lock().unwrap().push(p.push.clone());
                        match behaviour {
                            Behaviour::Ack => s.ack(p.id).unwrap(),
                            Behaviour::Reject => s.reject(p.id, "out of slots").unwrap(),
                            Behaviour::Silent => {}
                        }
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
        });
        FakeSwitch { stop, pushes, handle: Some(handle) }
    }

    fn installed(&self) -> Vec<SwitchRules> {
        let mut live: Vec<SwitchRules> = Vec::new();
        for p in self.pushes.lock().unwrap().iter() {
            match p {
                Push::Install(r) => {
                    live.retain(|x| x.comm_id != r.comm_id);
                    live.push(r.clone());
                }
                Push::Remove { comm_id } => live.retain(|x| x.comm_id != *comm_id),
            }
        }
        live
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
    }
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn ranks(ips: &[&str], qpn_base: u32) -> Vec<RankEndpoint> {
    ips.iter()
        .enumerate()
        .map(|(i, a)| RankEndpoint {
            rank: i as u16,
            ip: ip(a),
            mac: None,
            qpn: qpn_base + i as u32,
            start_psn: 0xfffff0 + i as u32,
            udp_port: 4791,
        })
        .collect()
}

fn client(addr: SocketAddr) -> ControllerClient {
    ControllerClient::connect(addr, T).unwrap()
}

fn rejected(r: Result<impl std::fmt::Debug, ClientError>) -> String {
    match r {
        Err(ClientError::Rejected(reason)) => reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "condition not reached in time");
        thread::sleep(Duration::from_millis(20));
    }
}

fn raw_request(s: &mut TcpStream, bytes: &[u8]) -> Envelope {
    s.write_all(bytes).unwrap();
    read_frame(s).unwrap()
}

#[test]
fn controller_end_to_end() {
    let srv = start_server("e2e");
    let addr = srv.addr;

    // --- bad clients first; the service must keep serving.
    // A client that stalls mid-frame must not block anyone.
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(&[0, 0]).unwrap();

    // No token.
    let mut anon = client(addr);
    assert!(rejected(anon.status(T)).contains("authentication failed"));
    assert!(
        rejected(anon.register_group(None, vec![ip("10.1.1.21")], T)).contains("authentication")
    );

    // Malformed JSON, unknown version, unknown message: error replies, connection stays.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    let body = br#"{"version":1,"id":9,"body":{"no_such_message":{}}}"#;
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    let r = raw_request(&mut raw, &f);
    assert_eq!(r.id, 9);
    assert!(matches!(&r.body, Message::Error { reason } if reason.contains("malformed")), "{r:?}");
    let body = br#"{"version":77,"id":10,"body":"ping"}"#;
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    let r = raw_request(&mut raw, &f);
    assert_eq!(r.id, 10);
    assert!(matches!(&r.body, Message::Error { reason } if reason.contains("version 77")), "{r:?}");
    let mut f = 5u32.to_be_bytes().to_vec();
    f.extend_from_slice(b"\xff\xfe{]x");
    let r = raw_request(&mut raw, &f);
    assert!(matches!(r.body, Message::Error { .. }));
    write_frame(&mut raw, &Envelope::new(11, Message::Ping)).unwrap();
    let r = read_frame(&mut raw).unwrap();
    assert_eq!((r.id, r.body), (11, Message::Ack));

    // Oversized frame: error reply, then the connection is closed.
    let mut big = TcpStream::connect(addr).unwrap();
    big.set_read_timeout(Some(T)).unwrap();
    let r = raw_request(&mut big, &((MAX_FRAME as u32) + 1).to_be_bytes());
    assert!(matches!(&r.body, Message::Error { reason } if reason.contains("exceeds")), "{r:?}");
    let mut buf = [0u8; 1];
    assert_eq!(big.read(&mut buf).unwrap_or(0), 0, "connection closed after oversized frame");

    // Switches: unknown id, bad token, unknown port.
    let err = SwitchSession::connect(addr, 99, Some(SWITCH_TOKEN.into()), vec![], T).unwrap_err();
    assert!(
        matches!(&err, ClientError::Rejected(r) if r.contains("unknown switch id 99")),
        "{err}"
    );
    let err = SwitchSession::connect(addr, 1, Some("wrong".into()), vec![], T).unwrap_err();
    assert!(matches!(&err, ClientError::Rejected(r) if r.contains("authentication")), "{err}");
    let bad_port = vec![PortInfo {
        name: "eth7".into(),
        ip: None,
        mac: None,
        takes_gso: false,
        rx_rate_bps: None,
    }];
    let err = SwitchSession::connect(addr, 1, Some(SWITCH_TOKEN.into()), bad_port, T).unwrap_err();
    assert!(matches!(&err, ClientError::Rejected(r) if r.contains("no port `eth7`")), "{err}");

    // --- two fake switches (the leaves) and two concurrent rank 0s.
    let leaf1 = FakeSwitch::start(addr, 1, &["up", "h0", "h1"], Behaviour::Ack);
    let leaf2 = FakeSwitch::start(addr, 2, &["up", "h2", "h3"], Behaviour::Ack);

    let job = |hosts: [&'static str; 2], qpn_base: u32| {
        thread::spawn(move || {
            let mut c = client(addr);
            let ips: Vec<Ipv4Addr> = hosts.iter().map(|h| ip(h)).collect();
            let g = c.register_group(Some(TOKEN.into()), ips, T).unwrap();
            let (comm, eps) =
                c.create_communicator(g, ranks(&hosts, qpn_base), None, Some(16), T).unwrap();
            (c, g, comm, eps)
        })
    };
    let a = job(["10.1.1.21", "10.1.1.5"], 0x40);
    let b = job(["10.2.1.7", "10.2.1.12"], 0x80);
    let (mut ca, ga, comm_a, eps_a) = a.join().unwrap();
    let (cb, gb, comm_b, eps_b) = b.join().unwrap();
    assert_ne!(ga, gb);
    assert_ne!(comm_a, comm_b);

    // Replies match what the switches were told.
    let check =
        |sw: &FakeSwitch, comm: u32, eps: &[inc_ctrl_proto::HostEndpoint], switch_id: u32| {
            let rules =
                sw.installed().into_iter().find(|r| r.comm_id == comm).expect("rules installed");
            assert!(rules.is_root(), "a single-leaf communicator is rooted at the leaf");
            assert_eq!(rules.fan_in(), 2);
            assert_eq!((rules.window, rules.slots), (16, 32));
            assert_eq!(eps.len(), 2);
            for (rank, e) in eps.iter().enumerate() {
                assert_eq!(e.rank as usize, rank);
                assert_eq!(e.switch_id, switch_id);
                assert_eq!((e.comm_id, e.mtu, e.window), (comm, 4096, 16));
                let conn = &rules.connections[rules.connection_for_rank(rank as u16).unwrap()];
                assert_eq!(conn.local_qpn, e.switch_qpn);
                assert_eq!(conn.local_start_psn, e.switch_start_psn);
                assert_eq!(conn.peer_qpn, e.host_qpn);
                assert_eq!(conn.peer_start_psn, e.host_start_psn);
                assert_eq!(conn.local_ip, e.switch_ip);
                assert_eq!(&e.gid[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
            }
        };
    check(&leaf1, comm_a, &eps_a, 1);
    check(&leaf2, comm_b, &eps_b, 2);
    assert!(leaf1.installed().iter().all(|r| r.comm_id != comm_b), "leaf1 not involved in B");

    // A second communicator on the same switch uses different QPNs and slots.
    let (comm_a2, eps_a2) = ca
        .create_communicator(ga, ranks(&["10.1.1.21", "10.1.1.5"], 0x50), Some(2048), None, T)
        .unwrap();
    for (x, y) in eps_a.iter().zip(&eps_a2) {
        assert_ne!(x.switch_qpn, y.switch_qpn);
    }
    assert_eq!(eps_a2[0].mtu, 2048, "the requested mtu, not the topology default");

    // Requests the controller must refuse, with reasons.
    let mut cc = client(addr);
    cc.hello(Some(TOKEN.into()), T).unwrap();
    let e = rejected(cc.register_group(None, vec![ip("10.1.1.21"), ip("192.0.2.1")], T));
    assert!(e.contains("rank 1") && e.contains("192.0.2.1"), "{e}");
    let e =
        rejected(ca.create_communicator(ga, ranks(&["10.1.1.21", "10.2.1.7"], 1), None, None, T));
    assert!(e.contains("rank 1") && e.contains("differs"), "{e}");
    let e = rejected(ca.create_communicator(999, vec![], None, None, T));
    assert!(e.contains("unknown group 999"), "{e}");
    let e = rejected(ca.create_communicator(
        ga,
        ranks(&["10.1.1.21", "10.1.1.5"], 1),
        Some(1000),
        None,
        T,
    ));
    assert!(e.contains("mtu 1000"), "{e}");

    // All four hosts need the root switch, which is not connected: clear error.
    let all = ["10.1.1.21", "10.1.1.5", "10.2.1.7", "10.2.1.12"];
    let gall = cc.register_group(None, all.iter().map(|h| ip(h)).collect(), T).unwrap();
    let e = rejected(cc.create_communicator(gall, ranks(&all, 0x90), None, None, T));
    assert!(e.contains("not connected") && e.contains("root (id 0)"), "{e}");

    // A root that rejects, then a root that never answers: bounded, named errors,
    // and the leaves are told to remove what they installed.
    let root = FakeSwitch::start(addr, 0, &["d1", "d2"], Behaviour::Reject);
    let e = rejected(cc.create_communicator(gall, ranks(&all, 0x90), None, None, T));
    assert!(e.contains("switch root (id 0)") && e.contains("out of slots"), "{e}");
    root.stop();
    let root = FakeSwitch::start(addr, 0, &["d1", "d2"], Behaviour::Silent);
    let t0 = Instant::now();
    let e = rejected(cc.create_communicator(gall, ranks(&all, 0x90), None, None, T));
    assert!(e.contains("switch root (id 0)") && e.contains("no acknowledgement"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    wait_until(|| leaf1.installed().len() == 2 && leaf2.installed().len() == 1);
    root.stop();

    // Now a root that works: a 4-rank communicator spans all three switches.
    let root = FakeSwitch::start(addr, 0, &["d1", "d2"], Behaviour::Ack);
    let (comm_all, eps_all) =
        cc.create_communicator(gall, ranks(&all, 0x90), None, None, T).unwrap();
    assert_eq!(eps_all.iter().map(|e| e.switch_id).collect::<Vec<_>>(), vec![1, 1, 2, 2]);
    let rr = root.installed().into_iter().find(|r| r.comm_id == comm_all).unwrap();
    assert!(rr.is_root() && rr.fan_in() == 2);

    // Status shows switches, groups and communicators.
    let st = cc.status(T).unwrap();
    assert!(st.switches.iter().all(|s| s.connected));
    assert_eq!(st.groups.len(), 3);
    assert_eq!(st.communicators.len(), 4);

    // Reconnection: leaf1 comes back and gets every live rule again.
    leaf1.stop();
    let leaf1 = FakeSwitch::start(addr, 1, &["up", "h0", "h1"], Behaviour::Ack);
    wait_until(|| leaf1.installed().len() == 3);
    let mut ids: Vec<u32> = leaf1.installed().iter().map(|r| r.comm_id).collect();
    ids.sort();
    assert_eq!(ids, vec![comm_a, comm_a2, comm_all]);

    // Destroy a communicator and a group.
    ca.destroy_communicator(comm_a2, T).unwrap();
    assert!(leaf1.installed().iter().all(|r| r.comm_id != comm_a2));
    assert!(rejected(ca.destroy_communicator(comm_a2, T)).contains("unknown communicator"));
    cc.destroy_group(gall, T).unwrap();
    wait_until(|| root.installed().is_empty());

    // Rank 0 of B disconnects: its group and communicator go away.
    drop(cb);
    wait_until(|| leaf2.installed().is_empty());
    let st = ca.status(T).unwrap();
    assert_eq!(st.groups.iter().map(|g| g.group_id).collect::<Vec<_>>(), vec![ga]);
    assert_eq!(st.communicators.iter().map(|c| c.comm_id).collect::<Vec<_>>(), vec![comm_a]);

    // The stalled client did not block anything; the CLI status works too.
    drop(stalled);
    let out = Command::new(env!("CARGO_BIN_EXE_inc-controller"))
        .args(["status", "--controller", &addr.to_string(), "--token", TOKEN])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("leaf1") && text.contains("connected from"), "{text}");

    ca.destroy_group(ga, T).unwrap();
    leaf1.stop();
    leaf2.stop();
    root.stop();
}

/// Credentials, roles, ownership, limits and the per-frame deadline, against the real
/// service.
#[test]
fn controller_lets_no_one_in_where_they_do_not_belong() {
    let srv = start_server("security");
    let addr = srv.addr;

    // The host credential does not register switches; the switch credential does not
    // create groups; a wrong token does neither, and three failures close the connection.
    let err = SwitchSession::connect(addr, 1, Some(TOKEN.into()), vec![], T).unwrap_err();
    assert!(matches!(&err, ClientError::Rejected(r) if r.contains("switch credential")), "{err}");
    let mut c = client(addr);
    let e = rejected(c.register_group(Some(SWITCH_TOKEN.into()), vec![ip("10.1.1.21")], T));
    assert!(e.contains("host credential"), "{e}");
    assert!(rejected(c.hello(Some("host-s3cret-012345678".into()), T)).contains("authentication"));
    assert!(rejected(c.status(T)).contains("authentication"));
    assert!(c.status(T).is_err(), "closed after three failed authentications");

    // No takeover of a connected switch.
    let leaf1 = FakeSwitch::start(addr, 1, &["up", "h0", "h1"], Behaviour::Ack);
    let err = SwitchSession::connect(addr, 1, Some(SWITCH_TOKEN.into()), vec![], T).unwrap_err();
    assert!(matches!(&err, ClientError::Rejected(r) if r.contains("already connected")), "{err}");

    // Only the connection that created a group may use or destroy it.
    let mut owner = client(addr);
    let hosts = ["10.1.1.21", "10.1.1.5"];
    let g = owner.register_group(Some(TOKEN.into()), hosts.iter().map(|h| ip(h)).collect(), T);
    let g = g.unwrap();
    let (comm, _) = owner.create_communicator(g, ranks(&hosts, 0x40), None, None, T).unwrap();
    let mut other = client(addr);
    other.hello(Some(TOKEN.into()), T).unwrap();
    assert!(rejected(other.destroy_group(g, T)).contains("another connection"));
    assert!(rejected(other.destroy_communicator(comm, T)).contains("another connection"));
    let e = rejected(other.create_communicator(g, ranks(&hosts, 0x50), None, None, T));
    assert!(e.contains("another connection"), "{e}");

    // Window, mtu and slots are checked against the switch's limits before anything
    // is allocated; the rejection names the switch and the limit.
    let e = rejected(owner.create_communicator(g, ranks(&hosts, 0x60), Some(4096), Some(65536), T));
    assert!(e.contains("leaf1") && e.contains("max_slot_memory"), "{e}");
    let e = rejected(owner.create_communicator(g, ranks(&hosts, 0x60), None, Some(70000), T));
    assert!(e.contains("window 70000"), "{e}");
    let st = owner.status(T).unwrap();
    assert_eq!(st.communicators.len(), 1, "failed requests left nothing behind");

    // Groups per connection are bounded.
    let mut greedy = client(addr);
    greedy.hello(Some(TOKEN.into()), T).unwrap();
    let mut n = 0;
    let e = loop {
        match greedy.register_group(None, vec![ip("10.2.1.7")], T) {
            Ok(_) => n += 1,
            Err(e) => break e.to_string(),
        }
        assert!(n <= 64, "no limit on groups per connection");
    };
    assert!(e.contains("limit 16") && n == 16, "{n}: {e}");

    // A peer that trickles a frame one byte at a time is dropped after the per-frame
    // deadline (1 s here), even though each read succeeds.
    let mut slow = TcpStream::connect(addr).unwrap();
    let frame = inc_ctrl_proto::codec::encode(&Envelope::new(1, Message::Ping)).unwrap();
    let t0 = Instant::now();
    let mut dropped = false;
    for b in &frame {
        if slow.write_all(std::slice::from_ref(b)).is_err() {
            dropped = true;
            break;
        }
        thread::sleep(Duration::from_millis(300));
        if t0.elapsed() > Duration::from_secs(3) {
            break;
        }
    }
    slow.set_read_timeout(Some(T)).unwrap();
    let r = read_frame(&mut slow);
    let timed_out = matches!(&r, Ok(Envelope { body: Message::Error { reason }, .. }) if reason.contains("not completed"));
    assert!(dropped || timed_out, "slow peer not dropped: {r:?}");

    owner.destroy_group(g, T).unwrap();
    wait_until(|| leaf1.installed().is_empty());
    leaf1.stop();
}
