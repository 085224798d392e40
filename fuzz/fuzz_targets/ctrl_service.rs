//! Fuzz the controller service's message handling: arbitrary bytes from several
//! connections (one registered switch, hosts with and without credentials) into the
//! sans-IO core, with time moving on, must never panic, and every connection the core
//! closes is forgotten.
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use inc_controller::{Auth, Core, Credentials, ServiceConfig, Topology};
use inc_ctrl_proto::codec::encode;
use inc_ctrl_proto::{Envelope, Message};
use libfuzzer_sys::fuzz_target;

const SWITCH: &str = "switch-credential-0123456789";
const HOST: &str = "host-credential-0123456789";

fn topology() -> &'static Topology {
    static T: OnceLock<Topology> = OnceLock::new();
    T.get_or_init(|| {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
        Topology::load(path).expect("shipped topology")
    })
}

fuzz_target!(|data: &[u8]| {
    let creds = Credentials::new(SWITCH, HOST);
    let mut cfg = ServiceConfig::new(topology().clone(), Auth::required(&creds));
    cfg.seed = 1;
    let t0 = Instant::now();
    let mut core = Core::new(cfg, t0);
    // Connection 1 is a registered leaf switch, 2 an authenticated host, 3 a stranger;
    // the input's bytes are spread over them, so replies and pushes interleave.
    for (conn, last) in [(1u64, 2u8), (2, 3), (3, 4)] {
        core.open(conn, SocketAddr::from(([10, 0, 0, last], 4000)), t0);
    }
    let hello = |id, body| encode(&Envelope::new(id, body)).expect("encode");
    core.receive(1, &hello(1, Message::RegisterSwitch { switch_id: 1, token: Some(SWITCH.into()), ports: vec![], topology: None, held: vec![], more_held: false }), t0);
    core.receive(2, &hello(1, Message::Hello { token: Some(HOST.into()) }), t0);
    let mut now = t0;
    for chunk in data.chunks(67) {
        let (&head, rest) = match chunk.split_first() {
            Some(x) => x,
            None => continue,
        };
        now += Duration::from_millis(u64::from(head >> 2) * 50);
        match head & 3 {
            0 => core.receive(1, rest, now),
            1 => core.receive(2, rest, now),
            2 => core.receive(3, rest, now),
            _ => core.tick(now),
        }
        core.take_outputs();
    }
    core.tick(now + Duration::from_secs(120));
    for conn in 1..=3 {
        core.closed(conn, now + Duration::from_secs(121));
    }
    core.take_outputs();
    assert_eq!(core.connections(), 0);
    assert_eq!(core.pending_pushes(), 0);
});
