//! ICRC and frame-builder throughput: `cargo bench -p inc-wire --bench icrc`.
//!
//! Prints MB/s (10^6 bytes of IP packet per second) for 1 KB and 4 KB payloads, best
//! of several rounds because these machines are shared and noisy.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

use inc_wire::reduce::combine_be;
use inc_wire::{
    icrc, BthRepr, DataType, EthAddrs, EthernetAddress, Opcode, Operator, Psn, RoceRepr,
};

mod common;
use common::best_per_call;

fn frame(payload_len: usize) -> (RoceRepr, Vec<u8>) {
    let mut r = RoceRepr::new(
        EthAddrs {
            src: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst: EthernetAddress([2, 0, 0, 0, 0, 2]),
        },
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        49152,
        BthRepr::new(Opcode::RcSendOnly, 0x11, Psn::new(1)),
    );
    r.payload_len = payload_len;
    let mut buf = vec![0u8; r.frame_len()];
    r.emit(&mut buf, |p| p.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8)).unwrap();
    (r, buf)
}

fn report(what: &str, bytes: usize, per_call: Duration) {
    let mbps = bytes as f64 / per_call.as_secs_f64() / 1e6;
    let mpps = 1.0 / per_call.as_secs_f64() / 1e6;
    println!(
        "{what:<40} {bytes:>5} B  {mbps:>9.0} MB/s  {mpps:>6.2} Mpkt/s  {:>6} ns",
        per_call.as_nanos()
    );
}

fn main() {
    let budget = Duration::from_millis(500);
    for payload in [1024, 4096] {
        let (repr, buf) = frame(payload);
        let ip = &buf[14..];
        let covered = &ip[..ip.len() - icrc::ICRC_LEN];
        let t = best_per_call(budget, || {
            black_box(icrc::compute(black_box(covered)));
        });
        report(&format!("icrc::compute ({payload} B payload)"), covered.len(), t);

        let t = best_per_call(budget, || {
            black_box(RoceRepr::parse(black_box(&buf)).unwrap().icrc_ok);
        });
        report(&format!("RoceRepr::parse + verify ({payload} B)"), buf.len(), t);

        let mut out = vec![0u8; repr.frame_len()];
        let t = best_per_call(budget, || {
            black_box(repr.emit(black_box(&mut out), |p| p.fill(7)).unwrap());
        });
        report(&format!("RoceRepr::emit ({payload} B)"), buf.len(), t);

        let mut acc = vec![1u8; payload];
        let other = vec![2u8; payload];
        let t = best_per_call(budget, || {
            black_box(combine_be(Operator::Sum, DataType::Float32, black_box(&mut acc), &other));
        });
        report(&format!("combine_be f32 SUM ({payload} B)"), payload, t);
        let t = best_per_call(budget, || {
            black_box(combine_be(Operator::Sum, DataType::Int32, black_box(&mut acc), &other));
        });
        report(&format!("combine_be i32 SUM ({payload} B)"), payload, t);
    }
}
