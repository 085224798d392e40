//! Arbitrary bytes as a whole RoCEv2 frame: parsing never panics, and a frame that
//! parses re-emits to the same header and payload bytes.
#![no_main]

use inc_wire::RoceRepr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = RoceRepr::parse(data) else { return };
    // Re-emitting pads the payload minimally; an input with less pad than that may
    // not fit IPv4's 64 KiB any more.
    if f.repr.frame_len() > 14 + 65535 {
        return;
    }
    let mut out = vec![0u8; f.repr.frame_len()];
    let n = f.repr.emit(&mut out, |p| p.copy_from_slice(f.payload)).expect("re-emit parsed frame");
    assert_eq!(n, f.repr.frame_len());
    // Everything from the BTH on, apart from pad bytes and the ICRC, must round-trip
    // (the input's IPv4 flags, reserved bits and pad contents may differ).
    let payload_at = f.repr.payload_offset();
    assert_eq!(&out[payload_at..payload_at + f.payload.len()], f.payload);
    let again = RoceRepr::parse(&out).expect("parse emitted frame");
    assert!(again.icrc_ok);
    assert_eq!(again.payload, f.payload);
});
