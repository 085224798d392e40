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
        let (addr, mut psn) = host_side(&net, 0);
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

/// Host `rank`'s side of its connection to switch 0 (port `rank`), as rules and
/// endpoint say, and its first PSN.
fn host_side(net: &Net, rank: usize) -> (inc_protocol::RcAddressing, inc_wire::Psn) {
    let Node::Host(h) = &net.nodes[1 + rank] else { unreachable!() };
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
        psn_ident: false,
    };
    (addr, inc_wire::Psn::new(c.local_start_psn))
}

/// A frame with a bad ICRC is dropped by `handle_frame` and taken by
/// `handle_intact_frame`, whose callers vouch for the bytes; both count it.
#[test]
fn intact_frames_skip_only_the_icrc_check() {
    let mut net = one_switch_two_hosts();
    let (addr, psn) = host_side(&net, 0);
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

/// A Start with data whose slot still holds an older chunk is refused whole (RNR): no
/// collective, no expectation and no contribution stay behind, and the same message
/// resent once the slot is free is taken as Start plus chunk.
#[test]
fn start_with_data_on_a_busy_slot_is_refused_whole() {
    use inc_protocol::coll::{CollOp, CtrlMsg, HEADER_LEN};
    let mut net = one_switch_two_hosts();
    let sides = [host_side(&net, 0), host_side(&net, 1)];
    let Node::Switch(sw) = &mut net.nodes[0] else { unreachable!() };
    let op = CollOp {
        primitive: inc_wire::Primitive::AllReduce,
        operator: Operator::Sum,
        datatype: DataType::Int32,
        root: inc_wire::IncImm::ALL_RANKS,
    };
    // Rank `rank`'s `k`-th request: a Start with data of a 1-element collective `seq` at
    // stream position `start_pos`, contributing 7. Returns the result chunks the switch
    // sends back as (port, value), by port.
    let send = |sw: &mut SwitchEngine, rank: usize, k: u32, seq: u32, start_pos: u64| {
        let msg = CtrlMsg::Start { seq, count: 1, start_pos, chunks: 1, rank: rank as u16 };
        let mut payload = [0u8; HEADER_LEN + 4];
        let imm = msg.emit_start_with_data(&op, &mut payload);
        payload[HEADER_LEN..].copy_from_slice(&7u32.to_be_bytes());
        let (addr, psn) = &sides[rank];
        let mut frame = [0u8; 256];
        let n = addr.emit_send(&mut frame, *psn + k, Some(imm), &payload, None).unwrap();
        sw.handle_frame(Time::ZERO, rank, &frame[..n]);
        let mut results = Vec::new();
        let mut out = [0u8; 2048];
        while let Some(t) = sw.poll_transmit(Time::ZERO, &mut out) {
            // Odd ranks listen on their own UDP port.
            let f = inc_wire::RoceRepr::parse_any_port(&out[..t.len]).unwrap();
            if f.repr.ext.aeth.is_none() && f.repr.ext.imm.is_none() {
                results.push((t.port, u32::from_be_bytes(f.payload.try_into().unwrap())));
            }
        }
        results.sort_unstable();
        results
    };
    let comm = |sw: &SwitchEngine| sw.counters().comms[0].clone();
    // Rank 0 starts collective 0 (position 0, slot 0); rank 1 has not yet.
    assert!(send(sw, 0, 0, 0, 0).is_empty());
    // Rank 0 claims collective 1 at position 8: slot 0 again, still held.
    assert!(send(sw, 0, 1, 1, 8).is_empty());
    let c = comm(sw);
    assert_eq!(c.connections[0].rc.rx_requests, 1, "refused");
    assert_eq!(c.connections[0].rx_data, 1);
    assert_eq!((c.slot_conflicts, c.collectives_started), (1, 1), "no collective created");
    // Rank 1 completes collective 0 with the slot's chunk untouched: 7 + 7 to both.
    assert_eq!(send(sw, 1, 0, 0, 0), [(0, 14), (1, 14)]);
    assert_eq!(comm(sw).collectives_completed, 1);
    // The resent message now applies whole: collective 1 runs at position 8, and rank 1's
    // chunk completes it.
    assert!(send(sw, 0, 1, 1, 8).is_empty());
    let c = comm(sw);
    assert_eq!((c.connections[0].rc.rx_requests, c.connections[0].rx_data), (2, 2));
    assert_eq!(c.collectives_started, 2);
    assert_eq!(send(sw, 1, 1, 1, 8), [(0, 14), (1, 14)]);
    let c = comm(sw);
    assert_eq!((c.collectives_completed, c.slot_conflicts, c.protocol_errors), (2, 1, 0));
}
