//! The pytest suite's network: the in-process test fabric of the Rust tests
//! (`inccl/tests/common`: the real controller service and switch engines of a
//! topology over UDP sockets, every address on `lo` of a private network namespace).
//!
//!     inccl-test-fabric [TOPOLOGY.yaml]     (default topologies/1-2-4.yaml; needs root)
//!
//! Prints one JSON line (`controller`, `hosts`: the ranks' data-plane IPs, `netns`: the
//! namespace to join with setns), then serves until its standard input closes, so it
//! never outlives the test session that started it.

#[path = "../../../inccl/tests/common/mod.rs"]
mod common;

use std::io::Read;

fn main() {
    // An absolute path: `common` resolves relative names against inccl's manifest.
    let topology = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../topologies/1-2-4.yaml").into()
    });
    let Some(fabric) = common::Fabric::start(&topology) else {
        eprintln!("inccl-test-fabric: cannot create a network namespace: run as root");
        std::process::exit(77);
    };
    let hosts: Vec<String> = (0..fabric.topology.hosts.len())
        .map(|r| format!("\"{}\"", fabric.host_ip(r as u16)))
        .collect();
    // The main thread entered the namespace (unshare), so it is /proc/PID/ns/net.
    println!(
        "{{\"controller\": \"{}\", \"hosts\": [{}], \"netns\": \"/proc/{}/ns/net\"}}",
        fabric.controller_addr,
        hosts.join(", "),
        std::process::id()
    );
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink).ok();
    drop(fabric);
}
