//! Rules use the MACs switches report for their ports, not the topology's (on a Docker
//! overlay only the MACs Docker gave the interfaces cross nodes), on both ends of a
//! switch link, and follow a switch that registers again with other MACs.
//!
//! Drives the sans-IO core directly: no sockets, no threads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use inc_controller::service::{Core, Output, ServiceConfig};
use inc_controller::{demo_ranks, Auth, Credentials, Topology};
use inc_ctrl_proto::codec::encode;
use inc_ctrl_proto::{
    Envelope, EthernetAddress, HostEndpoint, Message, Peer, PortInfo, SwitchRules,
};

const SWITCH: &str = "switch-credential-0123456789";
const HOST: &str = "host-credential-0123456789";

fn frame(id: u64, body: Message) -> Vec<u8> {
    encode(&Envelope::new(id, body)).unwrap()
}

fn peer(last: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, last], 40000))
}

fn mac(last: u8) -> EthernetAddress {
    EthernetAddress([0x02, 0x42, 0xc0, 0xa8, 0x01, last])
}

/// Every frame sent, by connection.
fn sent(core: &mut Core) -> Vec<(u64, Envelope)> {
    core.take_outputs()
        .into_iter()
        .map(|o| match o {
            Output::Send { conn, envelope } => (conn, envelope),
            Output::Close { conn, reason } => panic!("connection {conn} closed: {reason}"),
        })
        .collect()
}

/// Register switch `id` on connection `conn` with these (port, MAC) pairs; its other
/// ports are reported without a MAC.
fn register(core: &mut Core, conn: u64, id: u32, macs: &[(&str, EthernetAddress)], now: Instant) {
    let topo = &core.config().topology;
    let sw = &topo.switches[topo.switch_by_id(id).unwrap()];
    let ports = sw
        .ports
        .iter()
        .map(|p| PortInfo {
            name: p.name.clone(),
            ip: Some(p.addr.ip),
            mac: macs.iter().find(|(n, _)| *n == p.name).map(|(_, m)| *m),
            takes_gso: false,
            rx_rate_bps: None,
        })
        .collect();
    core.open(conn, peer(10 + id as u8), now);
    let reg = Message::RegisterSwitch {
        switch_id: id,
        token: Some(SWITCH.into()),
        ports,
        topology: None,
        held: Vec::new(),
        more_held: false,
    };
    core.receive(conn, &frame(1, reg), now);
}

/// Installs pushed in `frames`, by switch connection; every push is acknowledged.
fn installs(
    core: &mut Core,
    frames: &[(u64, Envelope)],
    now: Instant,
) -> BTreeMap<u64, SwitchRules> {
    let mut out = BTreeMap::new();
    for (conn, env) in frames {
        if let Message::Install { rules, .. } = &env.body {
            assert!(out.insert(*conn, rules.clone()).is_none(), "two installs to {conn}");
            core.receive(*conn, &frame(env.id, Message::Ack), now);
        }
    }
    out
}

fn conn_on<'a>(r: &'a SwitchRules, port: &str) -> &'a inc_ctrl_proto::ConnectionRule {
    r.connections.iter().find(|c| c.port == port).unwrap_or_else(|| panic!("no {port} in {r:?}"))
}

#[test]
fn rules_use_reported_port_macs_on_both_ends_and_follow_a_re_registration() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
    let topo = Topology::load(path).unwrap();
    let topo_mac = |sw: &str, port: &str| {
        let s = topo.switches.iter().find(|s| s.name == sw).unwrap();
        s.ports.iter().find(|p| p.name == port).unwrap().mac
    };
    let (root_d2, leaf2_up, leaf2_h2, leaf1_up) = (
        topo_mac("root", "d2"),
        topo_mac("leaf2", "up"),
        topo_mac("leaf2", "h2"),
        topo_mac("leaf1", "up"),
    );
    let mut cfg = ServiceConfig::new(topo.clone(), Auth::required(&Credentials::new(SWITCH, HOST)));
    cfg.seed = 1;
    let t = Instant::now();
    let mut core = Core::new(cfg, t);

    // root reports nothing (topology MACs); leaf1 reports its topology MACs; leaf2
    // reports Docker-like MACs on its uplink and on h2's port.
    let (docker_up, docker_h2) = (mac(0x21), mac(0x22));
    assert!(docker_up != leaf2_up && docker_h2 != leaf2_h2);
    register(&mut core, 1, 0, &[], t);
    register(&mut core, 2, 1, &[("up", leaf1_up)], t);
    register(&mut core, 3, 2, &[("up", docker_up), ("h2", docker_h2)], t);
    for (conn, env) in sent(&mut core) {
        assert_eq!(env.body, Message::Ack, "registration of connection {conn}");
    }

    // A communicator over all four hosts.
    let hosts: Vec<_> = topo.hosts.iter().map(|h| h.addr.ip).collect();
    core.open(9, peer(9), t);
    let reg =
        Message::RegisterGroup { token: Some(HOST.into()), world_size: 4, hosts: hosts.clone() };
    core.receive(9, &frame(5, reg), t);
    let Message::GroupCreated { group_id } = sent(&mut core)[0].1.body else { panic!() };
    let create = Message::CreateCommunicator {
        group_id,
        ranks: demo_ranks(&hosts),
        mtu: None,
        window: None,
    };
    core.receive(9, &frame(6, create), t);
    let frames = sent(&mut core);
    let rules = installs(&mut core, &frames, t);
    assert_eq!(rules.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);

    // leaf2's own rules carry its reported MACs; its unreported port the topology's.
    assert_eq!(conn_on(&rules[&3], "up").local_mac, docker_up);
    assert_eq!(conn_on(&rules[&3], "up").peer_mac, Some(root_d2));
    assert_eq!(conn_on(&rules[&3], "h2").local_mac, docker_h2);
    assert_eq!(conn_on(&rules[&3], "h3").local_mac, topo_mac("leaf2", "h3"));
    // Its neighbour sends to the reported MAC; the other link is untouched.
    let to_leaf2 = conn_on(&rules[&1], "d2");
    assert_eq!(to_leaf2.peer, Peer::Switch { switch_id: 2 });
    assert_eq!((to_leaf2.local_mac, to_leaf2.peer_mac), (root_d2, Some(docker_up)));
    assert_eq!(conn_on(&rules[&1], "d1").peer_mac, Some(leaf1_up));
    // The hosts on h2 are told the reported MAC of their switch port.
    let created = sent(&mut core);
    let Some(Message::CommunicatorCreated { comm_id, endpoints, .. }) =
        created.iter().find(|(c, _)| *c == 9).map(|(_, e)| e.body.clone())
    else {
        panic!("no communicator created: {created:?}")
    };
    let ep = |rank: u16| -> &HostEndpoint { endpoints.iter().find(|e| e.rank == rank).unwrap() };
    assert_eq!(ep(2).switch_mac, docker_h2);
    assert_eq!(ep(3).switch_mac, topo_mac("leaf2", "h3"));
    assert_eq!(ep(0).switch_mac, topo_mac("leaf1", "h0"));

    // leaf2 restarts (a new container: new MACs) and registers again, holding nothing.
    core.closed(3, t);
    let _ = sent(&mut core);
    let new_up = mac(0x31);
    register(&mut core, 4, 2, &[("up", new_up), ("h2", docker_h2)], t);
    let frames = sent(&mut core);
    assert!(frames.iter().any(|(c, e)| *c == 4 && e.body == Message::Ack), "{frames:?}");
    let rules = installs(&mut core, &frames, t);
    // Re-pushed to leaf2 with its new MAC, and to root (its neighbour) with the new
    // peer MAC; leaf1 is not involved.
    assert_eq!(rules.keys().copied().collect::<Vec<_>>(), [1, 4], "{frames:?}");
    assert!(rules.values().all(|r| r.comm_id == comm_id));
    assert_eq!(conn_on(&rules[&4], "up").local_mac, new_up);
    assert_eq!(conn_on(&rules[&4], "h2").local_mac, docker_h2);
    assert_eq!(conn_on(&rules[&1], "d2").peer_mac, Some(new_up));
    assert_eq!(conn_on(&rules[&1], "d2").local_mac, root_d2);
    assert_eq!(conn_on(&rules[&1], "d1").peer_mac, Some(leaf1_up));

    // The same MACs again: nothing to re-push to root (leaf2 gets its backlog).
    core.closed(4, t);
    let _ = sent(&mut core);
    register(&mut core, 5, 2, &[("up", new_up), ("h2", docker_h2)], t);
    let frames = sent(&mut core);
    let rules = installs(&mut core, &frames, t);
    assert_eq!(rules.keys().copied().collect::<Vec<_>>(), [5], "{frames:?}");

    // A new communicator compiles with the MACs last reported.
    let create = Message::CreateCommunicator {
        group_id,
        ranks: demo_ranks(&hosts),
        mtu: None,
        window: Some(16),
    };
    core.receive(9, &frame(7, create), t);
    let frames = sent(&mut core);
    let rules = installs(&mut core, &frames, t);
    assert_eq!(conn_on(&rules[&1], "d2").peer_mac, Some(new_up));
    assert_eq!(conn_on(&rules[&5], "up").local_mac, new_up);

    // A multicast MAC is refused.
    core.closed(5, t);
    let _ = sent(&mut core);
    register(&mut core, 6, 2, &[("up", EthernetAddress([0x01, 0, 0x5e, 0, 0, 1]))], t);
    let frames = sent(&mut core);
    assert!(
        frames.iter().any(|(c, e)| *c == 6
            && matches!(&e.body, Message::Error { reason } if reason.contains("not a unicast"))),
        "{frames:?}"
    );
}
