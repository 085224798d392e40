//! The core driven directly with bytes and times: no sockets, no threads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use inc_ctrl_proto::codec::encode;
use inc_ctrl_proto::{Envelope, HeldCommunicator, Message, PortInfo};

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
    core.receive(conn, &frame(1, registration(ports, Vec::new())), now);
    let (r, closed) = replies(core, conn);
    assert_eq!(r.len(), 1);
    // Nothing held: a plain ack, as switches that predate held reports expect.
    assert_eq!(r[0].body, Message::Ack, "{r:?}");
    assert!(!closed);
}

/// `register_switch` of switch 0 (the only switch of 1-4) holding `held`.
fn registration(ports: Vec<PortInfo>, held: Vec<HeldCommunicator>) -> Message {
    Message::RegisterSwitch {
        switch_id: 0,
        token: Some(SWITCH.into()),
        ports,
        topology: None,
        held,
        more_held: false,
    }
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
    assert!(matches!(push.body, Message::Install { .. }));
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
    // Port h1 takes whole GSO frames (an AF_PACKET switch on a veth) and port h0's
    // link emulation limits what arrives to 5 Mb/s: only the rank behind each hears so.
    let port = |name: &str, takes_gso, rx_rate_bps| PortInfo {
        name: name.into(),
        ip: None,
        mac: None,
        takes_gso,
        rx_rate_bps,
    };
    let ports = vec![port("h0", false, Some(5_000_000)), port("h1", true, None)];
    register_switch_with(&mut core, 1, t0, ports);
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
    let told: Vec<_> = endpoints
        .iter()
        .map(|e| (e.switch_port.as_str(), e.switch_takes_gso, e.link_rate_bps))
        .collect();
    assert_eq!(
        told,
        [
            ("h0", false, Some(5_000_000)),
            ("h1", true, None),
            ("h2", false, None),
            ("h3", false, None)
        ]
    );
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
        s.max_host_memory = u64::MAX;
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
    core.receive(3, &frame(1, registration(vec![], vec![])), t0);
    let window = core.config().limits.repush_window;
    let mut out = pushes(&mut core, 3);
    assert_eq!(out.remove(0).1, Message::Ack);
    assert_eq!(out.len(), window, "one window of re-pushes");
    // The last communicator goes while it waits: no install, no remove for it.
    let last = *core.comms.keys().last().unwrap();
    let destroy = Message::DestroyCommunicator { comm_id: last, key: None };
    core.receive(2, &frame(99_999, destroy), t0);
    assert!(pushes(&mut core, 3).is_empty(), "nothing sent for a communicator not re-pushed yet");
    let mut installed = 0;
    while !out.is_empty() {
        let mut next = Vec::new();
        for (id, body) in out {
            assert!(matches!(body, Message::Install { .. }), "{body:?}");
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

/// Create one communicator of the four hosts in `group_id` (window 1) on host
/// connection 2, the switch (connection `switch`) acknowledging: its id, key and what
/// the switch was told, as the switch would report it holding it.
fn create_one(
    core: &mut Core,
    t0: Instant,
    switch: u64,
    group_id: u64,
) -> (u32, String, HeldCommunicator) {
    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    let req = Message::CreateCommunicator {
        group_id,
        ranks: demo_ranks(&hosts),
        mtu: None,
        window: Some(1),
    };
    core.receive(2, &frame(500, req), t0);
    let (id, push) = pushes(core, switch).remove(0);
    let Message::Install { rules, origin } = push else { panic!("{push:?}") };
    core.receive(switch, &frame(id, Message::Ack), t0);
    let (r, _) = replies(core, 2);
    let Message::CommunicatorCreated { comm_id, key: Some(key), .. } = &r[0].body else {
        panic!("{r:?}")
    };
    (*comm_id, key.clone(), HeldCommunicator { rules, origin: Some(origin) })
}

/// A new group of the four hosts on host connection 2 of `core`.
fn new_group(core: &mut Core, t0: Instant) -> u64 {
    core.open(2, peer(3), t0);
    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    let reg = Message::RegisterGroup { token: Some(HOST.into()), world_size: 4, hosts };
    core.receive(2, &frame(1, reg), t0);
    let (r, _) = replies(core, 2);
    let Message::GroupCreated { group_id } = r[0].body else { panic!("{r:?}") };
    group_id
}

/// A controller restarted with the same topology: the switch reports the communicators
/// of the dead controller, which are adopted (accounted, in the status); new ones get
/// other ids and QPNs; rank 0 destroys an adopted one with its key (only with it); one
/// the switch reports expired is removed; and a communicator destroyed here is not
/// brought back by a later report.
#[test]
fn a_restarted_controller_adopts_held_communicators() {
    let (mut old, t0, group_id) = big_core(16);
    let (c1, key1, h1) = create_one(&mut old, t0, 1, group_id);
    let (c2, _key2, h2) = create_one(&mut old, t0, 1, group_id);
    let cfg = old.config().clone();
    drop(old);

    // The new controller process: another epoch, nothing known.
    let mut core = Core::new(cfg, t0);
    core.open(1, peer(2), t0);
    core.receive(1, &frame(1, registration(vec![], vec![h1.clone(), h2.clone()])), t0);
    let (r, _) = replies(&mut core, 1);
    assert_eq!(r[0].body, Message::Registered { owned: vec![], orphaned: vec![c1, c2] });
    let st = core.status();
    assert_eq!(
        st.communicators.iter().map(|c| (c.comm_id, c.adopted)).collect::<Vec<_>>(),
        [(c1, true), (c2, true)]
    );
    assert_eq!(st.switches[0].communicators, [c1, c2]);

    // A new communicator: an id above the adopted ones, QPNs they do not use.
    let g = new_group(&mut core, t0);
    let (c3, _, h3) = create_one(&mut core, t0, 1, g);
    assert!(c3 > c2, "{c3}");
    let qpns = |h: &HeldCommunicator| -> Vec<u32> {
        h.rules.connections.iter().map(|c| c.local_qpn).collect()
    };
    for q in qpns(&h3) {
        assert!(!qpns(&h1).contains(&q) && !qpns(&h2).contains(&q), "QPN {q:#x} reused");
    }

    // Destroying an adopted communicator needs its key.
    let destroy = |key: Option<&str>| Message::DestroyCommunicator {
        comm_id: c1,
        key: key.map(str::to_string),
    };
    core.receive(2, &frame(7, destroy(None)), t0);
    let (r, _) = replies(&mut core, 2);
    assert!(matches!(&r[0].body, Message::Error { reason } if reason.contains("key")), "{r:?}");
    core.receive(2, &frame(8, destroy(Some(&"0".repeat(32)))), t0);
    assert!(matches!(replies(&mut core, 2).0[0].body, Message::Error { .. }));
    core.receive(2, &frame(9, destroy(Some(&key1))), t0);
    let (id, push) = pushes(&mut core, 1).remove(0);
    assert_eq!(push, Message::RemoveCommunicator { comm_id: c1 });
    core.receive(1, &frame(id, Message::Ack), t0);
    assert_eq!(replies(&mut core, 2).0[0].body, Message::Ack);

    // The switch freed c2 after its idle timeout: removed here, nothing pushed back.
    core.receive(1, &frame(10, Message::CommunicatorsExpired { comm_ids: vec![c2] }), t0);
    assert_eq!(pushes(&mut core, 1), [(10, Message::Ack)]);
    let ids: Vec<u32> = core.status().communicators.iter().map(|c| c.comm_id).collect();
    assert_eq!(ids, [c3]);

    // The switch registers again (it reconnected) still holding c1 (say the removal was
    // lost): c1 is dropped (tombstone), c3 is ours and kept, nothing re-pushed.
    core.closed(1, t0);
    core.take_outputs();
    core.open(3, peer(2), t0);
    core.receive(3, &frame(1, registration(vec![], vec![h1, h3])), t0);
    assert_eq!(
        pushes(&mut core, 3),
        [(1, Message::Registered { owned: vec![c3], orphaned: vec![] })]
    );
}

/// What a registering switch holds is judged: ours unchanged is kept without a
/// re-push; ours changed or destroyed meanwhile is dropped (and re-pushed if live); a
/// switch started with another topology file is refused, naming both.
#[test]
fn held_communicators_are_judged_and_other_topologies_refused() {
    let (mut core, t0, group_id) = big_core(16);
    let (c1, _, h1) = create_one(&mut core, t0, 1, group_id);
    let (c2, _, h2) = create_one(&mut core, t0, 1, group_id);
    let (c3, _, mut h3) = create_one(&mut core, t0, 1, group_id);
    core.receive(2, &frame(60, Message::DestroyCommunicator { comm_id: c2, key: None }), t0);
    let (id, _) = pushes(&mut core, 1).remove(0);
    core.receive(1, &frame(id, Message::Ack), t0);
    core.take_outputs();
    h3.rules.connections[0].local_start_psn ^= 1;
    core.closed(1, t0);
    core.take_outputs();

    core.open(3, peer(2), t0);
    core.receive(3, &frame(1, registration(vec![], vec![h1, h2, h3])), t0);
    let out = pushes(&mut core, 3);
    assert_eq!(out[0].1, Message::Registered { owned: vec![c1], orphaned: vec![] });
    let repushed: Vec<u32> = out[1..]
        .iter()
        .map(|(_, m)| match m {
            Message::Install { rules, .. } => rules.comm_id,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(repushed, [c3], "only the changed one is re-pushed");

    // Another topology: refused with both fingerprints named.
    core.closed(3, t0);
    core.take_outputs();
    core.open(4, peer(2), t0);
    let mut reg = registration(vec![], vec![]);
    if let Message::RegisterSwitch { topology, .. } = &mut reg {
        *topology = Some("other/0123456789abcdef".into());
    }
    core.receive(4, &frame(1, reg), t0);
    let (r, _) = replies(&mut core, 4);
    let ours = core.config().topology.fingerprint();
    assert!(
        matches!(&r[0].body, Message::Error { reason } if reason.contains("other/0123456789abcdef") && reason.contains(&ours)),
        "{r:?}"
    );
    assert!(!core.status().switches[0].connected);
}

/// A switch reporting in parts: nothing is re-pushed and no communicator involving it
/// is created until its last part; an adopted part it no longer holds when it
/// registers again makes the communicator go.
#[test]
fn held_reports_in_parts_and_lost_adopted_parts() {
    let (mut old, t0, group_id) = big_core(16);
    let (c1, _, h1) = create_one(&mut old, t0, 1, group_id);
    let (c2, _, h2) = create_one(&mut old, t0, 1, group_id);
    let cfg = old.config().clone();
    let mut core = Core::new(cfg, t0);
    core.open(1, peer(2), t0);
    let mut reg = registration(vec![], vec![h1]);
    if let Message::RegisterSwitch { more_held, .. } = &mut reg {
        *more_held = true;
    }
    core.receive(1, &frame(1, reg), t0);
    assert_eq!(
        replies(&mut core, 1).0[0].body,
        Message::Registered { owned: vec![], orphaned: vec![c1] }
    );
    // Meanwhile a host cannot create a communicator on it.
    let g = new_group(&mut core, t0);
    let hosts: Vec<_> = core.config().topology.hosts.iter().map(|h| h.addr.ip).collect();
    let req = Message::CreateCommunicator {
        group_id: g,
        ranks: demo_ranks(&hosts),
        mtu: None,
        window: Some(1),
    };
    core.receive(2, &frame(3, req), t0);
    let (r, _) = replies(&mut core, 2);
    assert!(
        matches!(&r[0].body, Message::Error { reason } if reason.contains("still reporting")),
        "{r:?}"
    );
    core.receive(1, &frame(2, Message::ReportHeld { held: vec![h2], more: false }), t0);
    assert_eq!(
        pushes(&mut core, 1),
        [(2, Message::Registered { owned: vec![], orphaned: vec![c2] })]
    );
    let (c3, _, h3) = create_one(&mut core, t0, 1, g);

    // Registered again without c2 (it expired while disconnected): c2 goes.
    core.closed(1, t0);
    core.take_outputs();
    core.open(4, peer(2), t0);
    core.receive(4, &frame(1, registration(vec![], vec![h3])), t0);
    assert_eq!(
        pushes(&mut core, 4),
        [(1, Message::Registered { owned: vec![c3], orphaned: vec![] })]
    );
    core.receive(4, &frame(5, Message::ReportHeld { held: vec![], more: false }), t0);
    assert!(
        matches!(&replies(&mut core, 4).0[0].body, Message::Error { .. }),
        "no report in progress"
    );
    let ids: Vec<u32> = core.status().communicators.iter().map(|c| c.comm_id).collect();
    assert_eq!(ids, [c3], "c1 and c2 were adopted parts the switch no longer holds");
}

/// A restarted controller adopting 5,000 communicators a switch reports in parts:
/// all adopted and accounted, every reply within a request frame; prints the time.
#[test]
fn a_restarted_controller_adopts_thousands_of_communicators() {
    let (mut old, t0, group_id) = big_core(10_000);
    let mut held = Vec::new();
    for _ in 0..5_000 {
        held.push(create_one(&mut old, t0, 1, group_id).2);
    }
    let cfg = old.config().clone();
    drop(old);
    let mut core = Core::new(cfg, t0);
    let start = std::time::Instant::now();
    core.open(1, peer(2), t0);
    let parts: Vec<Vec<HeldCommunicator>> = held.chunks(500).map(<[_]>::to_vec).collect();
    let mut adopted = 0;
    for (i, part) in parts.iter().enumerate() {
        let more = i + 1 < parts.len();
        let msg = if i == 0 {
            let mut m = registration(vec![], part.clone());
            if let Message::RegisterSwitch { more_held, .. } = &mut m {
                *more_held = more;
            }
            m
        } else {
            Message::ReportHeld { held: part.clone(), more }
        };
        let bytes = frame(i as u64 + 1, msg);
        assert!(bytes.len() < inc_ctrl_proto::MAX_FRAME, "{}", bytes.len());
        core.receive(1, &bytes, t0);
        let (r, closed) = replies(&mut core, 1);
        let Message::Registered { orphaned, .. } = &r[0].body else { panic!("{r:?}") };
        assert!(!closed);
        adopted += orphaned.len();
    }
    let took = start.elapsed();
    assert_eq!(adopted, 5_000);
    assert_eq!(core.status().communicators.len(), 5_000);
    assert_eq!(core.alloc.live_qpns(0), 5_000 * 4);
    println!("5,000 held communicators adopted in {took:?}");
}

/// A switch that announces more held communicators and sends nothing more is closed
/// when the next part does not come within the hello timeout (it blocks nothing longer).
#[test]
fn a_held_report_that_stalls_is_closed() {
    let (mut core, t0) = core();
    core.open(1, peer(2), t0);
    let mut reg = registration(vec![], vec![]);
    if let Message::RegisterSwitch { more_held, .. } = &mut reg {
        *more_held = true;
    }
    core.receive(1, &frame(1, reg), t0);
    core.take_outputs();
    let limit = t0 + core.config().hello_timeout;
    assert_eq!(core.next_deadline(), Some(limit));
    core.tick(limit - Duration::from_millis(1));
    assert!(!replies(&mut core, 1).1);
    core.tick(limit);
    let (r, closed) = replies(&mut core, 1);
    assert!(closed, "{r:?}");
    assert!(
        matches!(&r[0].body, Message::Error { reason } if reason.contains("did not come within")),
        "{r:?}"
    );
    assert!(core.reporting.is_empty() && !core.status().switches[0].connected);
}
