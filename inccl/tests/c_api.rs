//! The C ABI: `include/inccl.h` declares every exported function, compiles warning-free,
//! `install.sh` produces a working pkg-config file, and the C program in `hosts/c/`
//! (linked once against the shared and once against the static library) passes with 4
//! ranks through the real controller and switches, and fails cleanly without a
//! controller.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Fabric};

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Directory holding the `libinccl.so`/`.a` cargo built with this test.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap().to_path_buf();
    assert!(deps.join("libinccl.a").exists(), "libinccl.a missing in {}", deps.display());
    deps
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Install into a fresh prefix and build the C program (shared, static).
fn build_c_program(name: &str) -> (PathBuf, PathBuf) {
    // One prefix per test: tests run in parallel.
    let prefix = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("inccl-prefix-{name}"));
    std::fs::remove_dir_all(&prefix).ok();
    run(Command::new("sh")
        .arg(manifest().join("install.sh"))
        .args(["--no-build", "--lib-dir"])
        .arg(lib_dir())
        .arg("--prefix")
        .arg(&prefix));
    let pc = prefix.join("lib/pkgconfig");
    let pkg = |args: &[&str]| -> Vec<String> {
        let out =
            run(Command::new("pkg-config").env("PKG_CONFIG_PATH", &pc).args(args).arg("inccl"));
        String::from_utf8(out.stdout).unwrap().split_whitespace().map(str::to_string).collect()
    };
    let src = manifest().join("../hosts/c/inccl_c_test.c");
    let shared = prefix.join("inccl_c_test_shared");
    run(Command::new("cc")
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O2"])
        .arg(&src)
        .args(pkg(&["--cflags", "--libs"]))
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display()))
        .arg("-o")
        .arg(&shared));
    let libs: Vec<String> = pkg(&["--static", "--libs"])
        .into_iter()
        .filter(|f| !f.starts_with("-L") && f != "-linccl")
        .collect();
    let static_ = prefix.join("inccl_c_test_static");
    run(Command::new("cc")
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-Wall", "-Wextra", "-Werror", "-O2"])
        .arg(&src)
        .args(pkg(&["--cflags"]))
        .arg(prefix.join("lib/libinccl.a"))
        .args(libs)
        .arg("-o")
        .arg(&static_));
    (shared, static_)
}

#[test]
fn header_declares_every_exported_function() {
    let ffi = std::fs::read_to_string(manifest().join("src/ffi.rs")).unwrap();
    let header = std::fs::read_to_string(manifest().join("include/inccl.h")).unwrap();
    let mut n = 0;
    for line in ffi.lines() {
        let Some(rest) = line.split("extern \"C\" fn ").nth(1) else { continue };
        let name = rest.split('(').next().unwrap();
        n += 1;
        assert!(
            header.contains(&format!(" {name}(")) || header.contains(&format!("*{name}(")),
            "{name} missing in inccl.h"
        );
    }
    assert!(n >= 15, "found only {n} exported functions");
    for c in
        ["INCCL_INT32 = 0", "INCCL_FLOAT32 = 1", "INCCL_SUM = 1", "INCCL_MAX = 2", "INCCL_MIN = 3"]
    {
        assert!(header.contains(c), "{c}");
    }
    // The header compiles on its own, as C and as C++.
    let probe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("inccl_probe.c");
    std::fs::write(
        &probe,
        "#include \"inccl.h\"\nint main(void) { return inccl_last_error() == 0; }\n",
    )
    .unwrap();
    run(Command::new("cc")
        .args(["-std=c99", "-pedantic", "-Wall", "-Werror", "-fsyntax-only"])
        .arg("-I")
        .arg(manifest().join("include"))
        .arg(&probe));
}

fn wait_all(children: Vec<(u16, std::process::Child)>, limit: Duration) -> Vec<(u16, Output)> {
    let deadline = Instant::now() + limit;
    let mut outs = Vec::new();
    for (r, mut c) in children {
        loop {
            if c.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() > deadline {
                c.kill().ok();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        outs.push((r, c.wait_with_output().unwrap()));
    }
    outs
}

fn spawn(
    bin: &Path,
    world: u16,
    rank: u16,
    port: u16,
    ip: &str,
    controller: &str,
) -> std::process::Child {
    Command::new(bin)
        .args([&world.to_string(), &format!("127.0.0.1:{port}"), &rank.to_string(), "20000", "1"])
        .env("INCCL_CONTROLLER", controller)
        .env("INCCL_LOCAL_IP", ip)
        .env("INCCL_TIMEOUT_MS", "10000")
        .env("INCCL_OP_TIMEOUT_MS", "5000")
        .env_remove("INCCL_TRANSPORT")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn c_program_passes_with_four_ranks() {
    let (shared, static_) = build_c_program("four");
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let port = free_port();
    // Ranks 0 and 1 use the shared library, ranks 2 and 3 the static one.
    let children: Vec<_> = (0..4u16)
        .map(|r| {
            let bin = if r < 2 { &shared } else { &static_ };
            (r, spawn(bin, 4, r, port, &fabric.host_ip(r).to_string(), &fabric.controller_addr))
        })
        .collect();
    for (r, out) in wait_all(children, Duration::from_secs(60)) {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("ALL PASS"),
            "rank {r}: {:?}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.contains("FAIL"), "rank {r}:\n{stdout}");
    }
}

#[test]
fn c_program_reports_a_missing_controller() {
    let (shared, _) = build_c_program("nocontroller");
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let dead = format!("127.0.0.1:{}", free_port());
    let t = Instant::now();
    let child = spawn(&shared, 1, 0, free_port(), &fabric.host_ip(0).to_string(), &dead);
    let (_, out) = wait_all(vec![(0, child)], Duration::from_secs(20)).pop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("inccl_group_create") && stderr.contains(&dead), "{stderr}");
}
