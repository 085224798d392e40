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

/// Every (type, operator) pair of the tables, each program once with `all` (one
/// communicator runs them in turn); every pair's line says PASS.
#[test]
fn programs_pass_for_every_operator_and_datatype() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let pairs = |coll: &str| -> usize {
        let count = |d: &inccl::DataType| {
            inccl::ReduceOp::reductions().filter(|o| o.applies_to(*d)).count()
        };
        match coll {
            "broadcast" | "allgather" => inccl::DataType::ALL.len(),
            _ => inccl::DataType::ALL.iter().map(count).sum(),
        }
    };
    for (bin, coll, extra) in [
        (env!("CARGO_BIN_EXE_inccl-allreduce"), "allreduce", &[][..]),
        (env!("CARGO_BIN_EXE_inccl-reduce"), "reduce", &["--root", "3"][..]),
        (env!("CARGO_BIN_EXE_inccl-broadcast"), "broadcast", &["--root", "2"][..]),
        (env!("CARGO_BIN_EXE_inccl-reducescatter"), "reducescatter", &[][..]),
        (env!("CARGO_BIN_EXE_inccl-allgather"), "allgather", &["--in-place"][..]),
    ] {
        let mut args = vec!["--dtype", "all", "--op", "all"];
        args.extend_from_slice(extra);
        for out in run_program(&fabric, bin, &args) {
            let rows: Vec<&str> =
                out.lines().filter(|l| l.contains(&format!(" {coll} "))).collect();
            assert_eq!(rows.len(), pairs(coll), "{coll}: one line per pair\n{out}");
            assert!(rows.iter().all(|r| r.ends_with("PASS")), "{out}");
        }
    }
}

/// `--sync` (a Barrier before every iteration) and `--warmup` time only the timed
/// iterations and still check every one.
#[test]
fn sync_and_warmup_iterations_pass() {
    let Some(fabric) = Fabric::start("1-2-4.yaml") else { return };
    let bin = env!("CARGO_BIN_EXE_inccl-allreduce");
    for out in run_program(&fabric, bin, &["--sync", "--warmup", "1"]) {
        let row = out.lines().find(|l| l.trim_end().ends_with("PASS")).expect("a result row");
        // Column 8 is the number of timed iterations: --iters 2, the warm-up not counted.
        assert_eq!(row.split_whitespace().nth(7), Some("2"), "{out}");
    }
}

#[test]
fn bad_arguments_are_refused() {
    let refused = |args: &[&str], names: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_inccl-reduce"))
            .args(["4", "127.0.0.1:1", "0", "16"])
            .args(args)
            .env("INCCL_CONTROLLER", "127.0.0.1:1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(names.iter().all(|n| err.contains(n)), "{args:?}: {err}");
    };
    refused(&["--root", "9"], &["--root 9"]);
    refused(&["--dtype", "float16", "--op", "bxor"], &["bxor", "float16"]);
    refused(&["--dtype", "int32,float64", "--op", "band", "--check"], &["band", "float64"]);
    refused(&["--dtype", "int33"], &["int33", "bfloat16"]);
    refused(&["--in-place", "--nonblocking", "2"], &["--in-place", "reduce"]);
}

#[test]
fn check_lists_the_pairs_without_connecting() {
    let out = Command::new(env!("CARGO_BIN_EXE_inccl-allreduce"))
        .args(["4", "127.0.0.1:1", "0", "16", "--dtype", "all", "--op", "band,sum", "--check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // Six integer types with both operators, four float types with SUM only.
    assert!(text.starts_with("16 pairs: int32/band int32/sum float32/sum"), "{text}");
}
