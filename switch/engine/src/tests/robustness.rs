//! Garbage, bad rules and hostile peers: counted or refused, never a panic.

use super::*;

#[test]
fn arp_for_port_ip_is_answered() {
    let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
    let net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
    let Node::Switch(e) = net.nodes.into_iter().next().unwrap() else { unreachable!() };
    let mut e = *e;
    let mut frame = [0u8; 42];
    let req = ArpRepr {
        operation: ArpOperation::Request,
        source_hardware_addr: mac_of(host_ip(1)),
        source_protocol_addr: host_ip(1),
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: port_ip(0, 1),
    };
    EthernetRepr {
        src_addr: mac_of(host_ip(1)),
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: EtherType::Arp,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut frame[..]));
    req.emit(&mut ArpPacket::new_unchecked(&mut frame[14..]));
    e.handle_frame(Time::ZERO, 1, &frame);
    let mut buf = [0u8; 128];
    let t = e.poll_transmit(Time::ZERO, &mut buf).unwrap();
    assert_eq!(t.port, 1);
    let reply = ArpRepr::parse(&ArpPacket::new_checked(&buf[14..42]).unwrap()).unwrap();
    assert_eq!(reply.operation, ArpOperation::Reply);
    assert_eq!(reply.source_hardware_addr, mac_of(port_ip(0, 1)));
    // Garbage is counted, never a panic.
    e.handle_frame(Time::ZERO, 0, &[0u8; 10]);
    e.handle_frame(Time::ZERO, 5, &frame);
    let c = e.counters();
    assert_eq!(c.drops.malformed, 1);
    assert_eq!(c.drops.bad_port, 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    #[test]
    fn handle_frame_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200), port in 0usize..3) {
        let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
        let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
        if let Node::Switch(e) = &mut net.nodes[0] {
            e.handle_frame(Time::ZERO, port, &bytes);
            let mut buf = [0u8; 512];
            while e.poll_transmit(Time::ZERO, &mut buf).is_some() {}
        }
    }
}

#[test]
fn reject_bad_rules() {
    let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
    let mut net = build(&t, SwitchEngineConfig::default(), 0.0, 1);
    let Node::Switch(e) = &mut net.nodes[0] else { unreachable!() };
    let rules = SwitchRules {
        comm_id: 9,
        switch_id: 0,
        world_size: 1,
        mtu: 256,
        window: 4,
        slots: 8,
        parent: None,
        connections: vec![],
    };
    let mut bad = rules.clone();
    bad.slots = 7;
    assert!(matches!(e.install(&bad, Time::ZERO), Err(EngineError::InvalidRules { .. })));
    let mut bad = rules.clone();
    bad.switch_id = 3;
    assert!(matches!(e.install(&bad, Time::ZERO), Err(EngineError::WrongSwitch { .. })));
    assert!(matches!(e.remove(42), Err(EngineError::UnknownComm(42))));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// A peer on a valid RC connection sending arbitrary messages (valid PSNs, random
    /// immediates, control headers with random fields, random payload sizes): the
    /// switch never panics and keeps answering.
    #[test]
    fn arbitrary_messages_on_a_valid_connection_never_panic(
        msgs in proptest::collection::vec(
            (proptest::prelude::any::<Option<u32>>(), 0u8..4, proptest::prelude::any::<[u64; 3]>(), 0usize..300),
            1..40,
        ),
    ) {
        let mut net = one_switch_two_hosts();
        let (addr, mut psn) = host0_side(&net);
        let Node::Switch(sw) = &mut net.nodes[0] else { unreachable!() };
        let mut frame = vec![0u8; 2048];
        let mut out = vec![0u8; 2048];
        let op = inc_protocol::coll::CollOp { primitive: inc_wire::Primitive::AllReduce, operator: Operator::Sum, datatype: DataType::Int32, root: 0xFFFF };
        for (i, (imm, kind, f, len)) in msgs.into_iter().enumerate() {
            let mut payload = vec![0x5Au8; len];
            let imm = match (imm, kind) {
                (Some(x), 0) => Some(x),
                (_, 1) => {
                    let m = inc_protocol::coll::CtrlMsg::Start { seq: (f[0] % 3) as u32, count: f[1] % 1000, start_pos: f[2] % 50, chunks: f[1] % 7, rank: 0 };
                    payload = m.to_bytes().to_vec();
                    Some(op.imm(m.kind()))
                }
                (_, 2) => {
                    let m = inc_protocol::coll::CtrlMsg::Progress { seq: (f[0] % 3) as u32, completed: f[1] };
                    payload = m.to_bytes().to_vec();
                    Some(op.imm(m.kind()))
                }
                _ => None,
            };
            let n = addr.emit_send(&mut frame, psn, imm, &payload, None).unwrap();
            psn = psn.next();
            let now = Time::from_nanos(i as u64 * 1000);
            sw.handle_frame(now, 0, &frame[..n]);
            sw.handle_timeout(now);
            while sw.poll_transmit(now, &mut out).is_some() {}
        }
    }
}

fn one_switch_two_hosts() -> Net {
    let t = TreeSpec { parents: vec![None], hosts: vec![0, 0], mtu: 256, window: 4 };
    build(&t, SwitchEngineConfig::default(), 0.0, 1)
}

/// Host 0's side of its connection to switch 0, as rules and endpoint say, and its
/// first PSN.
fn host0_side(net: &Net) -> (inc_protocol::RcAddressing, inc_wire::Psn) {
    let Node::Host(h) = &net.nodes[1] else { unreachable!() };
    let c = h.engine.config();
    let addr = inc_protocol::RcAddressing {
        local_mac: c.local_mac,
        local_ip: c.local_ip,
        local_udp_port: c.local_udp_port,
        local_qpn: c.local_qpn,
        peer_mac: Some(c.switch_mac),
        peer_ip: c.switch_ip,
        peer_udp_port: 4791,
        peer_qpn: c.switch_qpn,
    };
    (addr, inc_wire::Psn::new(c.local_start_psn))
}

/// A frame with a bad ICRC is dropped by `handle_frame` and taken by
/// `handle_intact_frame`, whose callers vouch for the bytes; both count it.
#[test]
fn intact_frames_skip_only_the_icrc_check() {
    let mut net = one_switch_two_hosts();
    let (addr, psn) = host0_side(&net);
    let Node::Switch(sw) = &mut net.nodes[0] else { unreachable!() };
    let mut frame = vec![0u8; 512];
    let n = addr.emit_send(&mut frame, psn, None, &[1, 2, 3, 4], None).unwrap();
    frame[n - 1] ^= 0xff;
    sw.handle_frame(Time::ZERO, 0, &frame[..n]);
    let c = sw.counters();
    assert_eq!((c.rx_frames, c.rx_intact_frames, c.drops.bad_icrc), (1, 0, 1));
    sw.handle_intact_frame(Time::ZERO, 0, &frame[..n]);
    let c = sw.counters();
    assert_eq!((c.rx_frames, c.rx_intact_frames, c.drops.bad_icrc), (2, 1, 1));
    assert_eq!(c.comms[0].connections[0].rc.rx_requests, 1, "taken as the next request");
}
