//! The switch engine under structured input: valid RoCEv2 (correct ICRC) for installed
//! QPNs, plausible PSNs and INC immediates, hostile variants and timer runs, so libFuzzer
//! reaches the communicator state machine (random bytes never pass the ICRC). The
//! generator and its invariant checks are shared with the proptest
//! `tests/tests/engine_structured.rs`: this includes `tests/src/engine_input.rs`.
#![no_main]

#[path = "../../tests/src/engine_input.rs"]
mod engine_input;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    engine_input::run(data);
});
