//! `inc-controller gen tree` end to end: the file it writes passes `inc-controller
//! check`, and bad shapes are refused naming the option.

use std::process::Command;

fn controller(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_inc-controller")).args(args).output().unwrap()
}

#[test]
fn generated_tree_passes_check() {
    let dir = std::env::temp_dir().join(format!("inc-gen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.yaml");
    let f = file.to_str().unwrap();
    let out = controller(&[
        "gen",
        "tree",
        "--fanout",
        "4,4",
        "--hosts-per-leaf",
        "16",
        "--emulate",
        "hosts:delay=1us",
        "-o",
        f,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("21 switches, 20 links, 256 hosts"));
    let check = controller(&["check", f]);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success() && text.contains("256 hosts, root `root`"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_shapes_are_refused() {
    for (args, want) in [
        (&["--fanout", "2,0"][..], "fan-out of level 2 is 0"),
        (&["--emulate", "hosts"][..], "expected LEVEL:SPEC"),
        (&["--emulate", "x:delay=1ms"][..], "level `x`"),
        (&["--emulate", "hosts:bogus=1"][..], "unknown key `bogus`"),
        (&["--hosts-per-leaf", "0"][..], "no hosts"),
    ] {
        let mut a = vec!["gen", "tree"];
        a.extend_from_slice(args);
        let out = controller(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
}
