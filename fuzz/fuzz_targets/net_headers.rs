//! Arbitrary bytes through the Ethernet, ARP, IPv4 and UDP views and parsers.
#![no_main]

use inc_wire::{
    ArpPacket, ArpRepr, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr, UdpPacket, UdpRepr,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = EthernetFrame::new_checked(data) {
        let _ = EthernetRepr::parse(&f);
        let _ = f.payload();
    }
    if let Ok(p) = ArpPacket::new_checked(data) {
        if let Ok(r) = ArpRepr::parse(&p) {
            let mut b = [0u8; 28];
            r.emit(&mut ArpPacket::new_unchecked(&mut b[..]));
            assert_eq!(ArpRepr::parse(&ArpPacket::new_unchecked(&b[..])), Ok(r));
        }
    }
    if let Ok(p) = Ipv4Packet::new_checked(data) {
        let _ = p.payload();
        if let Ok(r) = Ipv4Repr::parse(&p) {
            // Compare representations, not bytes: a checksum of 0xFFFF and one of 0 are
            // both valid, and reserved flag bits are not kept.
            let mut b = data.to_vec();
            r.emit(&mut Ipv4Packet::new_unchecked(&mut b[..])).expect("re-emit IPv4");
            assert_eq!(Ipv4Repr::parse(&Ipv4Packet::new_unchecked(&b[..])), Ok(r));
        }
    }
    if let Ok(p) = UdpPacket::new_checked(data) {
        let _ = p.payload();
        let _ = UdpRepr::parse(&p);
    }
});
