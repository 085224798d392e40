//! The core driven directly with bytes and times: no sockets, no threads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::encode;
use inc_ctrl_proto::{Envelope, Message, PortInfo};

use super::{Core, Output, ServiceConfig};
use crate::auth::{Auth, Credentials};
use crate::demo_ranks;

const SWITCH: &str = "switch-credential-0123456789";
const HOST: &str = "host-credential-0123456789";

fn core() -> (Core, Instant) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-4.yaml");
    let topo = inc_topology::Topology::load(path).unwrap();
    let mut cfg = ServiceConfig::new(topo, Auth::required(&Credentials::new(SWITCH, HOST)));
    cfg.seed = 1;
    let now = Instant::now();
    (Core::new(cfg, now), now)
}

fn peer(last: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, last], 40000))
}

fn frame(id: u64, body: Message) -> Vec<u8> {
    encode(&Envelope::new(id, body)).unwrap()
}

/// Replies sent to `conn`, and whether it was closed.
fn replies(core: &mut Core, conn: u64) -> (Vec<Envelope>, bool) {
    let mut sent = Vec::new();
    let mut closed = false;
    for o in core.take_outputs() {
        match o {
            Output::Send { conn: c, envelope } if c == conn => sent.push(envelope),
            Output::Close { conn: c, .. } if c == conn => closed = true,
            _ => {}
        }
    }
    (sent, closed)
}

fn register_switch(core: &mut Core, conn: u64, now: Instant) {
    register_switch_with(core, conn, now, Vec::new());
}

fn register_switch_with(core: &mut Core, conn: u64, now: Instant, ports: Vec<PortInfo>) {
    core.open(conn, peer(2), now);
    let msg = Message::RegisterSwitch { switch_id: 0, token: Some(SWITCH.into()), ports };
    core.receive(conn, &frame(1, msg), now);
    let (r, closed) = replies(core, conn);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].body, Message::Ack, "{r:?}");
    assert!(!closed);
}

#[test]
fn create_waits_for_the_switch_and_times_out_cleanly() {
    let (mut core, t0) = core();
    register_switch(&mut core, 1, t0);
    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    core.open(2, peer(3), t0);
    let reg = Message::RegisterGroup {
        token: Some(HOST.into()),
        world_size: hosts.len() as u16,
        hosts: hosts.clone(),
    };
    core.receive(2, &frame(5, reg), t0);
    let (r, _) = replies(&mut core, 2);
    let Message::GroupCreated { group_id } = r[0].body else { panic!("{r:?}") };

    // Byte by byte: nothing happens until the frame is complete.
    let req = frame(
        6,
        Message::CreateCommunicator {
            group_id,
            ranks: demo_ranks(&hosts),
            mtu: None,
            window: None,
        },
    );
    for b in &req[..req.len() - 1] {
        core.receive(2, std::slice::from_ref(b), t0);
    }
    assert!(core.take_outputs().is_empty());
    core.receive(2, &req[req.len() - 1..], t0);
    let outs = core.take_outputs();
    let push = match &outs[..] {
        [Output::Send { conn: 1, envelope }] => envelope.clone(),
        other => panic!("expected one push to the switch, got {other:?}"),
    };
    assert!(matches!(push.body, Message::InstallCommunicator(_)));
    assert_eq!(core.pending_pushes(), 1);

    // The switch stays silent: at the deadline the push is dropped and the host told.
    let late = t0 + core.config().ack_timeout;
    assert_eq!(core.next_deadline(), Some(late));
    core.tick(late - Duration::from_millis(1));
    assert!(core.take_outputs().is_empty());
    core.tick(late);
    // The timed-out push is gone; the undo (remove the rules) is the only one left.
    assert_eq!(core.pending_pushes(), 1, "timed-out push removed, undo pending");
    let outs = core.take_outputs();
    let host_reply = outs.iter().find_map(|o| match o {
        Output::Send { conn: 2, envelope } => Some(envelope.clone()),
        _ => None,
    });
    let host_reply = host_reply.expect("host answered");
    assert_eq!(host_reply.id, 6);
    assert!(
        matches!(&host_reply.body, Message::Error { reason } if reason.contains("no acknowledgement")),
        "{host_reply:?}"
    );
    // The undo push went out, and a late ack of the original push is ignored.
    core.receive(1, &frame(push.id, Message::Ack), late);
    assert!(core.status().communicators.is_empty());
    core.tick(late + core.config().ack_timeout);
    assert_eq!(core.pending_pushes(), 0, "unanswered undo removed at its deadline");

    // The owner leaves: its group goes.
    core.closed(2, late);
    assert!(core.status().groups.is_empty());
}

#[test]
fn an_acknowledged_install_answers_the_host() {
    let (mut core, t0) = core();
    // Port h1 takes whole GSO frames (an AF_PACKET switch on a veth): only the rank
    // behind it hears so.
    let port =
        |name: &str, takes_gso| PortInfo { name: name.into(), ip: None, mac: None, takes_gso };
    register_switch_with(&mut core, 1, t0, vec![port("h0", false), port("h1", true)]);
    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    core.open(2, peer(3), t0);
    core.receive(2, &frame(1, Message::Hello { token: Some(HOST.into()) }), t0);
    let reg = Message::RegisterGroup { token: None, world_size: 4, hosts: hosts.clone() };
    core.receive(2, &frame(2, reg), t0);
    let (r, _) = replies(&mut core, 2);
    let Message::GroupCreated { group_id } = r[1].body else { panic!("{r:?}") };
    let req = Message::CreateCommunicator {
        group_id,
        ranks: demo_ranks(&hosts),
        mtu: None,
        window: Some(8),
    };
    core.receive(2, &frame(3, req), t0);
    let push = core.take_outputs().into_iter().find_map(|o| match o {
        Output::Send { conn: 1, envelope } => Some(envelope),
        _ => None,
    });
    let push = push.unwrap();
    // Another connection cannot acknowledge the switch's push.
    core.open(3, peer(4), t0);
    core.receive(3, &frame(push.id, Message::Ack), t0);
    assert_eq!(core.pending_pushes(), 1);
    core.take_outputs();
    core.receive(1, &frame(push.id, Message::Ack), t0);
    let (r, _) = replies(&mut core, 2);
    let Message::CommunicatorCreated { endpoints, .. } = &r[0].body else { panic!("{r:?}") };
    let gso: Vec<_> =
        endpoints.iter().map(|e| (e.switch_port.as_str(), e.switch_takes_gso)).collect();
    assert_eq!(gso, [("h0", false), ("h1", true), ("h2", false), ("h3", false)]);
    assert_eq!(core.status().communicators.len(), 1);
}

#[test]
fn authentication_and_framing_deadlines() {
    let (mut core, t0) = core();
    // Never authenticates: closed at the hello deadline.
    core.open(1, peer(2), t0);
    core.receive(1, &frame(1, Message::Ping), t0);
    core.take_outputs();
    let hello = core.config().hello_timeout;
    core.tick(t0 + hello);
    assert!(replies(&mut core, 1).1, "unauthenticated connection closed");

    // A frame that trickles in is dropped at the per-frame deadline.
    core.open(2, peer(2), t0);
    core.receive(2, &frame(1, Message::Hello { token: Some(HOST.into()) }), t0);
    core.take_outputs();
    let f = frame(2, Message::Ping);
    let ft = core.config().frame_timeout;
    let step = ft / 4;
    for (i, b) in f.iter().take(4).enumerate() {
        core.receive(2, std::slice::from_ref(b), t0 + step * i as u32);
        core.tick(t0 + step * i as u32);
    }
    core.tick(t0 + ft);
    assert!(replies(&mut core, 2).1, "slow frame closed");

    // Oversized length: error reply, closed.
    core.open(3, peer(2), t0);
    core.receive(3, &u32::MAX.to_be_bytes(), t0);
    let (r, closed) = replies(&mut core, 3);
    assert!(
        closed && matches!(&r[0].body, Message::Error { reason } if reason.contains("exceeds"))
    );

    // Connections per address are bounded, authenticated or not.
    let limit = core.config().limits.max_connections_per_address;
    for c in 0..limit as u64 {
        core.open(100 + c, peer(9), t0);
        core.receive(100 + c, &frame(1, Message::Hello { token: Some(HOST.into()) }), t0);
    }
    core.take_outputs();
    core.open(999, peer(9), t0);
    let (r, closed) = replies(&mut core, 999);
    assert!(
        closed && matches!(&r[0].body, Message::Error { reason } if reason.contains("per address"))
    );
}

#[test]
fn arbitrary_bytes_never_panic() {
    use proptest::prelude::*;
    proptest!(ProptestConfig::with_cases(300), |(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16))| {
        let (mut core, t0) = core();
        core.open(1, peer(2), t0);
        for (i, c) in chunks.iter().enumerate() {
            core.receive(1, c, t0 + Duration::from_millis(i as u64));
        }
        core.tick(t0 + Duration::from_secs(60));
        core.closed(1, t0 + Duration::from_secs(61));
        prop_assert_eq!(core.connections(), 0);
    });
}

/// A core whose switch takes any number of communicators and whose groups hold
/// `per_group`, with the switch (conn 1) and an authenticated host (conn 2) that owns
/// one group of the four hosts; returns the group id.
fn big_core(per_group: usize) -> (Core, Instant, u64) {
    let (core, t0) = core();
    let mut cfg = core.config().clone();
    for s in &mut cfg.topology.switches {
        s.max_slots = u32::MAX;
        s.max_slot_memory = u64::MAX;
    }
    cfg.limits.max_communicators_per_group = per_group;
    let mut core = Core::new(cfg, t0);
    register_switch(&mut core, 1, t0);
    core.open(2, peer(3), t0);
    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    let reg = Message::RegisterGroup { token: Some(HOST.into()), world_size: 4, hosts };
    core.receive(2, &frame(1, reg), t0);
    let (r, _) = replies(&mut core, 2);
    let Message::GroupCreated { group_id } = r[0].body else { panic!("{r:?}") };
    (core, t0, group_id)
}

/// Create `n` communicators in `group_id`, the switch acknowledging each push.
fn create_many(core: &mut Core, t0: Instant, group_id: u64, n: usize) {
    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    let ranks = demo_ranks(&hosts);
    for i in 0..n {
        let req = Message::CreateCommunicator {
            group_id,
            ranks: ranks.clone(),
            mtu: None,
            window: Some(1),
        };
        core.receive(2, &frame(10 + i as u64, req), t0);
        let push = core.take_outputs().into_iter().find_map(|o| match o {
            Output::Send { conn: 1, envelope } => Some(envelope.id),
            _ => None,
        });
        core.receive(1, &frame(push.expect("pushed"), Message::Ack), t0);
        let (r, _) = replies(core, 2);
        assert!(matches!(r[0].body, Message::CommunicatorCreated { .. }), "{r:?}");
    }
}

/// Pushes (install, remove) sent to `conn` since the last call, by id.
fn pushes(core: &mut Core, conn: u64) -> Vec<(u64, Message)> {
    core.take_outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Send { conn: c, envelope } if c == conn => Some((envelope.id, envelope.body)),
            _ => None,
        })
        .collect()
}

/// A switch that registers again with 5,000 communicators gets them 64 at a time as it
/// answers, all of them, and is never closed; one removed while waiting is skipped.
#[test]
fn a_switch_with_thousands_of_communicators_is_repushed_in_windows() {
    let (mut core, t0, group_id) = big_core(10_000);
    create_many(&mut core, t0, group_id, 5_000);
    core.closed(1, t0);
    core.take_outputs();
    core.open(3, peer(2), t0);
    let msg = Message::RegisterSwitch { switch_id: 0, token: Some(SWITCH.into()), ports: vec![] };
    core.receive(3, &frame(1, msg), t0);
    let window = core.config().limits.repush_window;
    let mut out = pushes(&mut core, 3);
    assert_eq!(out.remove(0).1, Message::Ack);
    assert_eq!(out.len(), window, "one window of re-pushes");
    // The last communicator goes while it waits: no install, no remove for it.
    let last = *core.comms.keys().last().unwrap();
    core.receive(2, &frame(99_999, Message::DestroyCommunicator { comm_id: last }), t0);
    assert!(pushes(&mut core, 3).is_empty(), "nothing sent for a communicator not re-pushed yet");
    let mut installed = 0;
    while !out.is_empty() {
        let mut next = Vec::new();
        for (id, body) in out {
            assert!(matches!(body, Message::InstallCommunicator(_)), "{body:?}");
            installed += 1;
            core.receive(3, &frame(id, Message::Ack), t0);
            next.extend(pushes(&mut core, 3));
        }
        assert!(core.pending_pushes() <= window);
        out = next;
    }
    assert_eq!(installed, 4_999);
    assert!(core.repush.is_empty() && core.connections() == 2);
}

/// `status` of 50,000 communicators: a reply above the request frame limit, within
/// what clients accept, and decoded by a client's decoder.
#[test]
fn status_of_fifty_thousand_communicators_reaches_the_client() {
    use inc_ctrl_proto::codec::{encode_with_limit, FrameDecoder, MAX_FRAME, MAX_REPLY_FRAME};
    let (mut core, t0, group_id) = big_core(50_000);
    create_many(&mut core, t0, group_id, 50_000);
    core.receive(2, &frame(7, Message::Status), t0);
    let (r, _) = replies(&mut core, 2);
    let bytes = encode_with_limit(&r[0], MAX_REPLY_FRAME).unwrap();
    assert!(bytes.len() > MAX_FRAME, "{} bytes", bytes.len());
    let mut dec = FrameDecoder::with_limit(MAX_REPLY_FRAME);
    dec.extend(&bytes);
    let Some(Envelope { body: Message::StatusReport(s), .. }) = dec.next_frame().unwrap() else {
        panic!("not a status report")
    };
    assert_eq!(s.communicators.len(), 50_000);
}

/// Peer text comes back only as a short escaped prefix: a near-1 MiB unknown message
/// is answered, and a switch's long rejection reaches the host cut.
#[test]
fn long_peer_text_is_quoted_short() {
    let (mut core, t0, group_id) = big_core(4);
    let name = format!("\n\x1b[31mfake{}", "x".repeat((1 << 20) - 64));
    let body =
        format!(r#"{{"version":1,"id":3,"body":{}}}"#, serde_json::to_string(&name).unwrap());
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(body.as_bytes());
    assert!(f.len() <= (1 << 20) + 4);
    core.receive(2, &f, t0);
    let (r, closed) = replies(&mut core, 2);
    let Message::Error { reason } = &r[0].body else { panic!("{r:?}") };
    assert!(!closed && r[0].id == 3 && reason.len() < 512, "{closed} {r:.200?}");
    assert!(!reason.contains('\n') && !reason.contains('\x1b'), "{reason}");

    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    let req = Message::CreateCommunicator {
        group_id,
        ranks: demo_ranks(&hosts),
        mtu: None,
        window: None,
    };
    core.receive(2, &frame(4, req), t0);
    let (id, _) = pushes(&mut core, 1).remove(0);
    core.receive(1, &frame(id, Message::error("y".repeat(900_000))), t0);
    let (r, closed) = replies(&mut core, 2);
    let Message::Error { reason } = &r[0].body else { panic!("{r:?}") };
    assert!(!closed && reason.len() < 2048 && reason.contains("900000 bytes"), "{}", reason.len());
}

/// Unauthenticated connections are capped per address and in total; when the pool is
/// full the oldest of the address holding the most makes room, authenticated ones are
/// never closed for it, and a closed connection counts until it is released.
#[test]
fn the_unauthenticated_cannot_lock_anyone_out() {
    let (mut core, t0) = core();
    let limits = core.config().limits.clone();
    register_switch(&mut core, 1, t0);
    // One address: capped at its share.
    for c in 0..limits.max_unauthenticated_per_address as u64 {
        core.open(100 + c, peer(9), t0);
    }
    core.take_outputs();
    core.open(199, peer(9), t0);
    let (r, closed) = replies(&mut core, 199);
    assert!(
        closed
            && matches!(&r[0].body, Message::Error { reason } if reason.contains("unauthenticated"))
    );
    // Many addresses fill the pool; each newcomer then closes the oldest of the most
    // loaded address, never the switch.
    let mut conn = 1000;
    for a in 10..10 + (limits.max_unauthenticated / limits.max_unauthenticated_per_address) as u8 {
        for _ in 0..limits.max_unauthenticated_per_address {
            core.open(conn, peer(a), t0);
            conn += 1;
        }
    }
    let evicted = core.take_outputs().iter().filter(|o| matches!(o, Output::Close { .. })).count();
    assert_eq!(evicted, limits.max_unauthenticated_per_address);
    assert_eq!(core.connections(), 1 + limits.max_unauthenticated);
    core.open(5000, peer(200), t0);
    let outs = core.take_outputs();
    let closed: Vec<u64> = outs
        .iter()
        .filter_map(|o| match o {
            Output::Close { conn, .. } => Some(*conn),
            _ => None,
        })
        .collect();
    assert!(closed.len() == 1 && closed[0] >= 1000, "one unauthenticated made room: {closed:?}");
    core.receive(5000, &frame(1, Message::Hello { token: Some(HOST.into()) }), t0);
    assert_eq!(replies(&mut core, 5000).0[0].body, Message::Ack);

    // Closed but not released: still counted per address.
    drop(core);
    let (mut core, t0) = self::core();
    let per = limits.max_connections_per_address;
    for c in 0..per as u64 {
        core.open(c, peer(7), t0);
        core.receive(c, &frame(1, Message::Hello { token: Some(HOST.into()) }), t0);
        core.closed(c, t0);
    }
    core.take_outputs();
    core.open(per as u64, peer(7), t0);
    assert!(replies(&mut core, per as u64).1, "refused while the closed ones hold resources");
    core.released(0);
    core.open(per as u64 + 1, peer(7), t0);
    assert!(!replies(&mut core, per as u64 + 1).1);
}
