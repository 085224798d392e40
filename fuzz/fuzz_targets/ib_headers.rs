//! Arbitrary bytes through the BTH and extension-header parsers, the INC immediate
//! decoder and the ICRC.
#![no_main]

use inc_wire::{
    icrc, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthPacket, BthRepr, DataType, DethRepr,
    IncImm, Operator, RethRepr,
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
        // Valid iff primitive 0-2, operator code (bits 7:6 ++ 13:12) and datatype code
        // in the tables, and the operator applies to the type; valid ones re-encode.
        let op = Operator::from_code((((imm >> 6) & 3) << 2 | (imm >> 12) & 3) as u8);
        let dt = DataType::from_code(((imm >> 8) & 0xf) as u8);
        let valid =
            (imm >> 14) & 3 != 3 && matches!((op, dt), (Some(o), Some(d)) if o.applies_to(d));
        match IncImm::decode(imm) {
            Ok(i) => {
                assert!(valid, "{imm:#x} decoded");
                assert_eq!(i.encode(), imm);
            }
            Err(e) => assert!(!valid, "{imm:#x}: {e}"),
        }
    }
    let _ = icrc::verify(data);
    let mid = data.len() / 3;
    assert_eq!(icrc::compute_parts(&[&data[..mid], &data[mid..]]), icrc::compute(data));
});
