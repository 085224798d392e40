//! Arbitrary bytes through the BTH and extension-header parsers, the INC immediate
//! decoder and the ICRC.
#![no_main]

use inc_wire::{
    icrc, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthPacket, BthRepr, DethRepr, IncImm, RethRepr,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = BthPacket::new_checked(data) {
        let r = BthRepr::parse(&p).expect("BTH parse cannot fail on 12 bytes");
        let mut b = [0u8; 12];
        r.emit(&mut BthPacket::new_unchecked(&mut b[..])).expect("re-emit BTH");
        assert_eq!(BthRepr::parse(&BthPacket::new_unchecked(&b[..])), Ok(r));
    }
    if let Ok(a) = AethRepr::parse(data) {
        let mut b = [0u8; 4];
        a.emit(&mut b).expect("re-emit AETH");
        assert_eq!(AethRepr::parse(&b), Ok(a));
    }
    let _ = RethRepr::parse(data);
    let _ = DethRepr::parse(data);
    let _ = AtomicEthRepr::parse(data);
    let _ = AtomicAckEthRepr::parse(data);
    if let Some(b) = data.get(..4) {
        let imm = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if let Ok(i) = IncImm::decode(imm) {
            assert_eq!(i.encode(), imm);
        }
    }
    let _ = icrc::verify(data);
    let mid = data.len() / 3;
    assert_eq!(icrc::compute_parts(&[&data[..mid], &data[mid..]]), icrc::compute(data));
});
