//! Fuzz the controller protocol decoder: arbitrary bytes through the incremental
//! frame decoder and the body decoder must never panic or over-allocate.
#![no_main]

use inc_ctrl_proto::codec::{decode_body, peek_id, read_frame};
use inc_ctrl_proto::FrameDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut dec = FrameDecoder::new();
    // Split the input in two to exercise partial frames.
    let mid = data.len() / 2;
    dec.extend(&data[..mid]);
    let _ = dec.next_frame();
    dec.extend(&data[mid..]);
    for _ in 0..64 {
        match dec.next_frame() {
            Ok(Some(env)) => {
                // Whatever decodes must re-encode.
                let _ = inc_ctrl_proto::codec::encode(&env).expect("re-encode");
            }
            Ok(None) => break,
            Err(e) if e.is_recoverable() => {}
            Err(_) => break,
        }
    }
    let _ = decode_body(data);
    let _ = peek_id(data);
    let _ = read_frame(&mut std::io::Cursor::new(data));
});
