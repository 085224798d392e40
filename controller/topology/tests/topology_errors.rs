//! Validation errors name the file, line/column and element.

use inc_topology::Topology;

const GOOD: &str = r#"name: t
controller:
  address: 10.0.0.1:7000
root: a
switches:
  - id: 0
    name: a
    ports:
      - { name: d, ip: 172.16.0.1/30 }
      - { name: h0, ip: 10.1.1.1/24 }
  - id: 1
    name: b
    ports:
      - { name: up, ip: 172.16.0.2/30 }
      - { name: h1, ip: 10.2.1.1/24 }
links:
  - { a: "a:d", b: "b:up" }
hosts:
  - { name: h0, ip: 10.1.1.10/24, attach: "a:h0" }
  - { name: h1, ip: 10.2.1.10/24, mac: "02:aa:00:00:00:01", attach: "b:h1" }
"#;

/// Apply a textual edit to GOOD and return the single-line rendering of all issues.
fn errors(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "edit anchor `{from}` missing");
    let text = GOOD.replacen(from, to, 1);
    match Topology::parse("t.yaml", &text) {
        Ok(_) => panic!("expected an error after replacing `{from}` with `{to}`"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn good_parses() {
    let t = Topology::parse("t.yaml", GOOD).unwrap();
    assert_eq!(t.switches.len(), 2);
    assert_eq!(t.hosts[0].mac.unwrap().to_string(), "02:00:0a:01:01:0a");
    assert_eq!(t.switches[0].mgmt.to_string(), "10.0.0.2");
    assert_eq!(t.hosts[1].mgmt.to_string(), "10.0.0.5");
}

#[test]
fn unknown_field() {
    let e = errors("    name: b\n", "    name: b\n    colour: red\n");
    assert!(e.starts_with("t.yaml:13:"), "{e}");
    assert!(e.contains("colour"), "{e}");
    assert!(e.contains("switches[1]"), "{e}");
}

#[test]
fn yaml_syntax_error_has_position() {
    let e = errors("links:\n", "links: [\n");
    assert!(e.starts_with("t.yaml:"), "{e}");
}

#[test]
fn duplicate_name_ip_mac() {
    let e = errors("name: h1, ip: 10.2.1.10/24", "name: h0, ip: 10.2.1.10/24");
    assert!(
        e.contains("t.yaml:20:") && e.contains("host h0") && e.contains("duplicate name"),
        "{e}"
    );
    let e = errors("ip: 10.2.1.10/24", "ip: 10.2.1.1/24");
    assert!(e.contains("t.yaml:20:") && e.contains("duplicate IP 10.2.1.1"), "{e}");
    let e = errors("02:aa:00:00:00:01", "02:00:0a:01:01:0a");
    assert!(e.contains("duplicate MAC 02:00:0a:01:01:0a"), "{e}");
    let e = errors("  - id: 1\n", "  - id: 0\n");
    assert!(e.contains("duplicate switch id 0"), "{e}");
}

#[test]
fn dangling_links() {
    let e = errors("b: \"b:up\"", "b: \"c:up\"");
    assert!(e.contains("t.yaml:17:") && e.contains("no switch `c`"), "{e}");
    let e = errors("b: \"b:up\"", "b: \"b:nope\"");
    assert!(e.contains("has no port `nope`"), "{e}");
    let e = errors("attach: \"a:h0\"", "attach: \"a:zz\"");
    assert!(e.contains("host h0") && e.contains("no port `zz`"), "{e}");
}

#[test]
fn cycles_and_unreachable() {
    // A second link between a and b closes a cycle.
    let text = GOOD
        .replace(
            "      - { name: h0, ip: 10.1.1.1/24 }",
            "      - { name: h0, ip: 10.1.1.1/24 }\n      - { name: d2, ip: 172.16.1.1/30 }",
        )
        .replace(
            "      - { name: h1, ip: 10.2.1.1/24 }",
            "      - { name: h1, ip: 10.2.1.1/24 }\n      - { name: up2, ip: 172.16.1.2/30 }",
        )
        .replace("links:\n", "links:\n  - { a: \"a:d2\", b: \"b:up2\" }\n");
    let e = Topology::parse("t.yaml", &text).unwrap_err().to_string();
    assert!(e.contains("cycle"), "{e}");
    let e = errors("  - { a: \"a:d\", b: \"b:up\" }\n", "");
    assert!(e.contains("switch b") && e.contains("unreachable from the root"), "{e}");
}

#[test]
fn host_attached_twice() {
    let e = errors("attach: \"b:h1\"", "attach: \"a:h0\"");
    assert!(e.contains("host h1") && e.contains("already used by host h0"), "{e}");
    let e = errors(
        "  - { name: h1, ip: 10.2.1.10/24",
        "  - { name: h0, ip: 10.1.1.10/24, attach: \"a:h0\" }\n  - { name: h1, ip: 10.2.1.10/24",
    );
    assert!(e.contains("host attached twice"), "{e}");
}

#[test]
fn subnets() {
    let e = errors("ip: 172.16.0.2/30", "ip: 172.16.0.6/30");
    assert!(e.contains("not in the same subnet"), "{e}");
    let text = GOOD
        .replace("ip: 10.2.1.1/24 }", "ip: 172.16.0.5/24 }")
        .replace("10.2.1.10/24", "172.16.0.10/24");
    let e = Topology::parse("t.yaml", &text).unwrap_err().to_string();
    assert!(e.contains("host h1 link: subnet 172.16.0.0/24 overlaps link a:d -- b:up"), "{e}");
    let e = errors("ip: 10.1.1.10/24", "ip: 10.9.1.10/24");
    assert!(e.contains("not in the subnet of port"), "{e}");
}

#[test]
fn invalid_addresses() {
    for (from, to, want) in [
        ("ip: 10.1.1.10/24", "ip: 10.1.1.300/24", "invalid IPv4"),
        ("ip: 10.1.1.10/24", "ip: 10.1.1.10", "IP/prefix"),
        ("ip: 10.1.1.10/24", "ip: 10.1.1.255/24", "broadcast"),
        ("ip: 10.1.1.10/24", "ip: 224.0.0.1/24", "unicast"),
        ("address: 10.0.0.1:7000", "address: nowhere", "IPv4:port"),
        ("02:aa:00:00:00:01", "02:aa:00:00:01", "invalid MAC"),
        ("02:aa:00:00:00:01", "01:aa:00:00:00:01", "not a unicast"),
    ] {
        let e = errors(from, to);
        assert!(e.contains(want), "{from} -> {to}: {e}");
        assert!(e.starts_with("t.yaml:"), "{e}");
    }
}

#[test]
fn shipped_topologies_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topologies");
    let mut n = 0;
    for f in std::fs::read_dir(dir).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "yaml") {
            Topology::load(&p).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 3);
}

#[test]
fn optional_fields() {
    let text = GOOD
        .replace("  address: 10.0.0.1:7000\n", "  address: 10.0.0.1:7000\n  mgmt_prefix: 16\ndefaults:\n  mtu: 4096\n  window: 8\n  link_mtu: 4200\n")
        .replace("    name: b\n", "    name: b\n    mgmt: 10.0.9.9\n    max_slots: 64\n")
        .replace("attach: \"a:h0\"", "attach: \"a:h0\", mac: learn, mgmt: 10.0.0.2");
    let t = Topology::parse("t.yaml", &text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((t.defaults.mtu, t.defaults.window, t.defaults.link_mtu), (4096, 8, 4200));
    assert_eq!(t.switches[1].mgmt.to_string(), "10.0.9.9");
    assert_eq!(t.switches[0].mgmt.to_string(), "10.0.0.3", "explicit addresses are skipped");
    assert_eq!(t.hosts[0].mac, None);
    assert_eq!(t.switches[1].max_slots, 64);
}

#[test]
fn link_emulation_resolves_to_ports_and_directions() {
    let text = GOOD
        .replace(
            r#"{ a: "a:d", b: "b:up" }"#,
            r#"{ a: "a:d", b: "b:up", emulate: "loss=1%,seed=5", b_to_a: "delay=2ms" }"#,
        )
        .replace(r#"attach: "a:h0" }"#, r#"attach: "a:h0", from_host: "loss=5%" }"#)
        .replace(r#"attach: "b:h1" }"#, r#"attach: "b:h1", emulate: "dup=1%", to_host: "dup=0" }"#);
    let t = Topology::parse("t.yaml", &text).unwrap();
    let (a, b) = (&t.switches[0].ports, &t.switches[1].ports);
    // a:d sends a -> b: `emulate` only.
    let a_to_b = a[0].emu.tx.as_ref().unwrap();
    assert!((a_to_b.loss - 0.01).abs() < 1e-12 && a_to_b.delay.is_zero() && a_to_b.seed == 5);
    assert!(a[0].emu.rx.is_none(), "the far switch emulates the other direction");
    // b:up sends b -> a: `emulate` refined by `b_to_a`.
    let b_to_a = b[0].emu.tx.as_ref().unwrap();
    assert!((b_to_a.loss - 0.01).abs() < 1e-12);
    assert_eq!(b_to_a.delay, std::time::Duration::from_millis(2));
    assert!(b[0].emu.rx.is_none());
    // Host h0: only frames from the host (received on a:h0) are impaired.
    assert!(a[1].emu.tx.is_none());
    assert!((a[1].emu.rx.as_ref().unwrap().loss - 0.05).abs() < 1e-12);
    // Host h1: both directions from `emulate`, the switch's sending direction reset.
    assert!(b[1].emu.tx.as_ref().unwrap().is_noop());
    assert!((b[1].emu.rx.as_ref().unwrap().duplicate - 0.01).abs() < 1e-12);
    // Without any `emulate:` nothing is impaired.
    let plain = Topology::parse("t.yaml", GOOD).unwrap();
    assert!(plain.switches.iter().flat_map(|s| &s.ports).all(|p| p.emu.is_noop()));
}

#[test]
fn link_emulation_errors_name_line_link_and_key() {
    let e = errors(r#"b: "b:up" }"#, r#"b: "b:up", emulate: "loss=2" }"#);
    assert!(e.starts_with("t.yaml:17:"), "{e}");
    assert!(e.contains("link a:d -- b:up") && e.contains("emulate") && e.contains("loss=2"), "{e}");
    let e = errors(r#"b: "b:up" }"#, r#"b: "b:up", a_to_b: "delay=5parsecs" }"#);
    assert!(e.starts_with("t.yaml:17:") && e.contains("a_to_b") && e.contains("parsecs"), "{e}");
    let e = errors(r#"attach: "a:h0" }"#, r#"attach: "a:h0", to_host: "colour=red" }"#);
    assert!(e.starts_with("t.yaml:19:"), "{e}");
    assert!(e.contains("host h0") && e.contains("to_host") && e.contains("unknown key"), "{e}");
    // Direction keys belong to their element: hosts have no `a_to_b`.
    let e = errors(r#"attach: "a:h0" }"#, r#"attach: "a:h0", a_to_b: "loss=1%" }"#);
    assert!(e.starts_with("t.yaml:19:") && e.contains("a_to_b"), "{e}");
}

#[test]
fn shipped_lossy_example_emulates_where_its_comments_say() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../topologies/1-2-4-lossy.yaml");
    let t = Topology::load(path).unwrap();
    let mut impaired = Vec::new();
    for s in &t.switches {
        for p in &s.ports {
            for (dir, imp) in [("tx", &p.emu.tx), ("rx", &p.emu.rx)] {
                if imp.as_ref().is_some_and(|i| !i.is_noop()) {
                    impaired.push(format!("{}:{}:{dir}", s.name, p.name));
                }
            }
        }
    }
    assert_eq!(impaired, ["root:d1:tx", "leaf1:up:tx", "leaf2:h3:tx", "leaf2:h3:rx"]);
    let up = t.switches[1].ports[0].emu.tx.as_ref().unwrap();
    assert_eq!((up.loss, up.delay), (0.01, std::time::Duration::from_millis(2)));
    assert_eq!(t.switches[2].ports[2].emu.tx.as_ref().unwrap().rate_bps, Some(1_000_000_000));
}

/// The fingerprint a switch registers with: the same for the same model, whatever the
/// file's path; different for a topology that differs (here: the default RoCE MTU).
#[test]
fn fingerprint_names_the_topology_and_tells_files_apart() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let a = Topology::load(format!("{root}/topologies/1-2-4.yaml")).unwrap();
    let text = std::fs::read_to_string(format!("{root}/topologies/1-2-4.yaml")).unwrap();
    let same = Topology::parse("elsewhere.yaml", &format!("# a comment\n{text}")).unwrap();
    let other = Topology::load(format!("{root}/tests/topologies/1-2-4-mtu1024.yaml")).unwrap();
    assert_eq!(a.fingerprint(), same.fingerprint());
    assert!(a.fingerprint().starts_with(&format!("{}/", a.name)), "{}", a.fingerprint());
    assert_ne!(a.fingerprint(), other.fingerprint());
}
