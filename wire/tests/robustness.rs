//! Property tests: emit → parse round trips for random headers and payload lengths
//! (all pad counts), and no parser panics on random or mutated input. These are the
//! bounded, always-on counterpart of the cargo-fuzz targets in `fuzz/`.

use std::net::Ipv4Addr;

use inc_wire::{
    icrc, AethRepr, AethSyndrome, ArpPacket, ArpRepr, AtomicAckEthRepr, AtomicEthRepr, BthPacket,
    BthRepr, DethRepr, EthAddrs, EthernetAddress, EthernetFrame, EthernetRepr, IncImm, Ipv4Packet,
    Ipv4Repr, NakCode, Opcode, Psn, RethRepr, RoceRepr, UdpPacket, UdpRepr,
};
use proptest::prelude::*;

fn opcode() -> impl Strategy<Value = Opcode> {
    prop_oneof![
        4 => proptest::sample::select(Opcode::ALL),
        1 => any::<u8>().prop_map(Opcode::from),
    ]
}

fn syndrome() -> impl Strategy<Value = AethSyndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credits| AethSyndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| AethSyndrome::RnrNak { timer }),
        (0u8..32).prop_map(|c| AethSyndrome::Nak(NakCode::from_code(c))),
    ]
}

prop_compose! {
    fn bth(op: Opcode)(
        solicited in any::<bool>(), mig_req in any::<bool>(), tver in 0u8..16,
        pkey in any::<u16>(), fecn in any::<bool>(), becn in any::<bool>(),
        dest_qp in 0u32..(1 << 24), ack_req in any::<bool>(), psn in any::<u32>(),
    ) -> BthRepr {
        BthRepr { opcode: op, solicited, mig_req, pad_count: 0, tver, pkey, fecn, becn, dest_qp, ack_req, psn: Psn::new(psn) }
    }
}

prop_compose! {
    fn roce()(op in opcode())(
        op in Just(op),
        bth in bth(op),
        src in any::<[u8; 6]>(), dst in any::<[u8; 6]>(),
        ip_src in any::<u32>(), ip_dst in any::<u32>(),
        ip_ident in any::<u16>(), ttl in any::<u8>(), tos in any::<u8>(), dont_frag in any::<bool>(),
        udp_src_port in any::<u16>(),
        reth in (any::<u64>(), any::<u32>(), any::<u32>()),
        aeth in (syndrome(), 0u32..(1 << 24)),
        deth in (any::<u32>(), 0u32..(1 << 24)),
        imm in any::<u32>(),
        atomic in (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        orig in any::<u64>(),
        payload_len in 0usize..1100,
    ) -> RoceRepr {
        let mut r = RoceRepr::new(
            EthAddrs { src: EthernetAddress(src), dst: EthernetAddress(dst) },
            Ipv4Addr::from(ip_src), Ipv4Addr::from(ip_dst), udp_src_port, bth,
        );
        r.ip_ident = ip_ident;
        r.ttl = ttl;
        r.tos = tos;
        r.dont_frag = dont_frag;
        let e = &mut r.ext;
        if op.has_reth() { e.reth = Some(RethRepr { virtual_addr: reth.0, rkey: reth.1, dma_len: reth.2 }); }
        if op.has_aeth() { e.aeth = Some(AethRepr { syndrome: aeth.0, msn: aeth.1 }); }
        if op.has_deth() { e.deth = Some(DethRepr { qkey: deth.0, src_qp: deth.1 }); }
        if op.has_immediate() { e.imm = Some(imm); }
        if op.has_ieth() { e.ieth = Some(!imm); }
        if op.has_atomic_eth() {
            e.atomic = Some(AtomicEthRepr { virtual_addr: atomic.0, rkey: atomic.1, swap_add: atomic.2, compare: atomic.3 });
        }
        if op.has_atomic_ack_eth() { e.atomic_ack = Some(AtomicAckEthRepr { orig_remote_data: orig }); }
        if op.has_payload() { r.payload_len = payload_len; }
        r
    }
}

/// Every parser of untrusted bytes in the crate, results ignored: only panics matter.
fn parse_everything(data: &[u8]) {
    let _ = RoceRepr::parse(data);
    if let Ok(f) = EthernetFrame::new_checked(data) {
        let _ = EthernetRepr::parse(&f);
    }
    if let Ok(p) = ArpPacket::new_checked(data) {
        let _ = ArpRepr::parse(&p);
    }
    if let Ok(p) = Ipv4Packet::new_checked(data) {
        let _ = Ipv4Repr::parse(&p);
        let _ = p.payload();
    }
    if let Ok(p) = UdpPacket::new_checked(data) {
        let _ = UdpRepr::parse(&p);
        let _ = p.payload();
    }
    if let Ok(p) = BthPacket::new_checked(data) {
        let _ = BthRepr::parse(&p);
    }
    let _ = AethRepr::parse(data);
    let _ = RethRepr::parse(data);
    let _ = DethRepr::parse(data);
    let _ = AtomicEthRepr::parse(data);
    let _ = AtomicAckEthRepr::parse(data);
    let _ = icrc::verify(data);
    if data.len() >= 4 {
        let _ = IncImm::decode(u32::from_be_bytes([data[0], data[1], data[2], data[3]]));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8192, ..ProptestConfig::default() })]

    #[test]
    fn emit_parse_round_trip(repr in roce(), seed in any::<u8>()) {
        let mut buf = vec![0xa5u8; repr.frame_len() + 7];
        let payload: Vec<u8> = (0..repr.payload_len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        let n = repr.emit(&mut buf, |p| p.copy_from_slice(&payload)).unwrap();
        prop_assert_eq!(n, repr.frame_len());
        prop_assert_eq!(n % 2, 0); // pad keeps BTH..ICRC a multiple of 4
        let f = RoceRepr::parse(&buf[..n]).unwrap();
        prop_assert!(f.icrc_ok);
        prop_assert_eq!(f.payload, &payload[..]);
        let pad = (4 - repr.payload_len % 4) % 4;
        prop_assert_eq!(usize::from(f.repr.bth.pad_count), pad);
        let expected = RoceRepr { bth: BthRepr { pad_count: pad as u8, ..repr.bth }, ..repr };
        prop_assert_eq!(f.repr, expected);
        // Trailing Ethernet padding after the IPv4 packet is ignored.
        let g = RoceRepr::parse(&buf[..n + 7]).unwrap();
        prop_assert_eq!(g.repr, expected);
        prop_assert!(g.icrc_ok);
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        parse_everything(&data);
    }

    #[test]
    fn mutated_frames_never_panic(
        repr in roce(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut buf = vec![0u8; repr.frame_len()];
        let n = repr.emit(&mut buf, |p| p.fill(0x11)).unwrap();
        for (at, v) in &edits {
            let i = at.index(n);
            buf[i] = *v;
        }
        parse_everything(&buf);
        parse_everything(&buf[..cut.index(n + 1)]);
        // A changed byte the ICRC covers is detected, never silently accepted.
        if let Ok(f) = RoceRepr::parse(&buf) {
            let emitted_again = {
                let mut b2 = vec![0u8; f.repr.frame_len()];
                f.repr.emit(&mut b2, |p| p.copy_from_slice(f.payload)).ok().map(|_| b2)
            };
            if f.icrc_ok {
                if let Some(b2) = emitted_again {
                    // Accepted frames re-emit to the same covered bytes.
                    prop_assert_eq!(&b2[14 + 20 + 8 + 12..], &buf[14 + 20 + 8 + 12..b2.len()]);
                }
            }
        }
    }
}
