//! Command-line behaviour of the `inc-switch` binary: mistakes are reported with the
//! offending argument named, without touching any interface.

use std::process::Command;

fn inc_switch(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_inc-switch")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_port_of_an_unknown_switch_is_named() {
    let (ok, err) = inc_switch(&[
        "run",
        "--controller",
        "127.0.0.1:1",
        "--switch",
        "1:leaf",
        "--port",
        "spine:p0=veth9,ip=10.0.0.1",
    ]);
    assert!(!ok);
    assert!(err.contains("spine"), "{err}");
}

#[test]
fn a_port_without_address_is_named() {
    let (ok, err) = inc_switch(&[
        "run",
        "--controller",
        "127.0.0.1:1",
        "--switch",
        "1:leaf",
        "--port",
        "leaf:p0=veth9",
    ]);
    assert!(!ok);
    assert!(err.contains("leaf:p0") && err.contains("ip="), "{err}");
}

#[test]
fn an_unknown_topology_switch_names_the_file() {
    let topo = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
    let (ok, err) = inc_switch(&["run", "--topology", topo, "--switch", "spine"]);
    assert!(!ok);
    assert!(err.contains("spine") && err.contains("1-2-4.yaml"), "{err}");
}

#[test]
fn stats_of_a_switch_that_is_not_running_names_the_address() {
    let (ok, err) = inc_switch(&["stats", "127.0.0.1:1"]);
    assert!(!ok);
    assert!(err.contains("127.0.0.1:1"), "{err}");
}
