//! The host programs with the seed's arguments: 4 processes of each program through the
//! real controller and switches (1-2-4) in a private network namespace, every datatype
//! and operator, PASS expected.

#[path = "../../inccl/tests/common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Fabric};

fn run_program(fabric: &Fabric, bin: &str, extra: &[&str]) -> Vec<String> {
    let port = free_port();
    let children: Vec<_> = (0..4u16)
        .map(|r| {
            Command::new(bin)
                .args(["4", &format!("127.0.0.1:{port}"), &r.to_string(), "30001", "--iters", "2"])
                .args(extra)
                .env("INCCL_CONTROLLER", &fabric.controller_addr)
                .env("INCCL_LOCAL_IP", fabric.host_ip(r).to_string())
                .env("INCCL_TIMEOUT_MS", "10000")
                .env("INCCL_OP_TIMEOUT_MS", "5000")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    children
        .into_iter()
        .enumerate()
        .map(|(r, mut c)| {
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    c.kill().ok();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success() && stdout.contains("PASS"),
                "{bin} {extra:?} rank {r}: {:?}\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            stdout
        })
        .collect()
}

#[test]
fn programs_pass_for_every_operator_and_datatype() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    for dtype in inccl::DataType::ALL.iter().map(|d| d.to_string()) {
        let dt: inccl::DataType = dtype.parse().unwrap();
        for op in inccl::ReduceOp::reductions().filter(|o| o.applies_to(dt)) {
            let op = op.to_string();
            let out = run_program(
                &fabric,
                env!("CARGO_BIN_EXE_inccl-allreduce"),
                &["--dtype", &dtype, "--op", &op],
            );
            assert!(out[0].contains("allreduce") && out[0].contains("algbw"), "{}", out[0]);
            print!("{}", out[0]);
            if matches!(op.as_str(), "sum" | "max" | "min" | "avg") {
                run_program(
                    &fabric,
                    env!("CARGO_BIN_EXE_inccl-reduce"),
                    &["--dtype", &dtype, "--op", &op, "--root", "3"],
                );
            }
        }
        run_program(
            &fabric,
            env!("CARGO_BIN_EXE_inccl-broadcast"),
            &["--dtype", &dtype, "--root", "2"],
        );
    }
}

#[test]
fn bad_arguments_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_inccl-reduce"))
        .args(["4", "127.0.0.1:1", "0", "16", "--root", "9"])
        .env("INCCL_CONTROLLER", "127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--root 9"));
}
