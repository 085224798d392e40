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

    // Connections per address are bounded.
    let limit = core.config().limits.max_connections_per_address;
    for c in 0..limit as u64 {
        core.open(100 + c, peer(9), t0);
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
