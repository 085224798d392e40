//! `inc-bench --quick` end to end: topology in namespaces, the af_packet switch, the
//! testpmd, kernel-forwarding and OpenMPI references, AllReduce, ReduceScatter and
//! AllGather rows and the overlap measurement; checks that the table, CSV, JSON and SVG
//! plots exist and parse, that every measured row passed its element-by-element check,
//! and that nothing is left behind. Skips when not root or a tool is missing; in CI (CI=true) that fails instead.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use inc_tests::netns::{
    assert_clean, bin_dir, repo_root, skip_reason, unique_prefix, TeardownGuard,
};

/// Split one CSV line, honouring double quotes.
fn csv_fields(line: &str) -> Vec<String> {
    let (mut fields, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    fields.push(cur);
    fields
}

fn check_csv(path: &Path, key_col: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    let header = csv_fields(lines.next().expect("CSV has a header"));
    assert!(header.iter().any(|h| h == key_col), "{}: no {key_col} column", path.display());
    let rows: Vec<Vec<String>> = lines.map(csv_fields).collect();
    for r in &rows {
        assert_eq!(r.len(), header.len(), "{}: ragged row {r:?}", path.display());
    }
    rows
}

#[test]
fn quick_bench_writes_every_output() {
    for tool in ["mpicc", "mpirun", "dpdk-testpmd", "ping"] {
        if !inc_test_support::command_works("sh", &["-c", &format!("command -v {tool}")]) {
            inc_test_support::skip("bench_quick", &format!("{tool} not installed (scripts/setup)"));
            return;
        }
    }
    if let Some(why) =
        skip_reason(&["inccl-allreduce", "inccl-barrier", "inc-bench", "inc-bench-rank"])
    {
        inc_test_support::skip("bench_quick", &why);
        return;
    }
    let prefix = unique_prefix("bq");
    let _guard = TeardownGuard::new(&prefix);
    let out = std::env::temp_dir().join(format!("inc-bench-quick-{prefix}"));
    let _ = std::fs::remove_dir_all(&out);
    let mut child = Command::new(bin_dir().join("inc-bench"))
        .args(["--quick", "--backends", "af_packet,dpdk", "--prefix", &prefix])
        .args(["--collectives", "allreduce,reducescatter,allgather,overlap", "--out"])
        .arg(&out)
        .arg("--bin-dir")
        .arg(bin_dir())
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting inc-bench");
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let res = child.wait_with_output().expect("inc-bench output");
    let transcript = format!(
        "{:?}\n--- stdout\n{}\n--- stderr\n{}",
        res.status,
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
    assert!(res.status.success(), "inc-bench --quick failed\n{transcript}");

    let table = std::fs::read_to_string(out.join("table.txt")).expect("table.txt");
    assert!(table.contains("median(us)") && table.contains("INC time / MPI time"), "{table}");
    assert!(table.contains("== overlap") && table.contains("== bytes per host"), "{table}");
    assert!(table.contains("machine: ") && table.contains("note: scheduling costs"), "{table}");
    let rows = check_csv(&out.join("results.csv"), "median_us");
    let status = |r: &Vec<String>| r.last().cloned().unwrap_or_default();
    let measured: Vec<&Vec<String>> =
        rows.iter().filter(|r| r[0] == "af_packet" || r[0] == "mpi").collect();
    // AllReduce 8 sizes, ReduceScatter and AllGather 7 each (S from 16 B: one int32 per
    // rank), 1-element AllReduce and Barrier, for the switch and for MPI.
    assert_eq!(measured.len(), 48, "{transcript}");
    assert!(measured.iter().all(|r| status(r) == "ok"), "{transcript}");
    for coll in ["reducescatter", "allgather"] {
        for system in ["af_packet", "mpi"] {
            let n = measured.iter().filter(|r| r[0] == system && r[1] == coll).count();
            assert_eq!(n, 7, "{system} {coll}\n{transcript}");
        }
    }
    // A backend the switch binary lacks is reported, not fatal; one it has is measured.
    let dpdk: Vec<&Vec<String>> = rows.iter().filter(|r| r[0] == "dpdk").collect();
    assert!(!dpdk.is_empty(), "no dpdk row\n{transcript}");
    assert!(
        dpdk.iter().all(|r| status(r) == "ok" || status(r).starts_with("not built")),
        "{transcript}"
    );
    let frames = check_csv(&out.join("frame_rates.csv"), "delivered_fps");
    assert_eq!(frames.len(), 2, "{transcript}");
    assert!(frames.iter().all(|r| status(r) == "ok"), "{transcript}");

    let json = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let v: serde_json::Value = serde_json::from_str(&json).expect("results.json parses");
    let ms = v["results"]["measurements"].as_array().expect("measurements");
    for coll in ["allreduce", "reducescatter", "allgather"] {
        let inc = ms
            .iter()
            .find(|m| m["system"] == "af_packet" && m["bytes"] == 65536 && m["collective"] == coll)
            .unwrap_or_else(|| panic!("64 KiB {coll} row"));
        assert_eq!(inc["times_us"].as_array().map(Vec::len), Some(5), "{coll}");
        assert!(inc["switch"]["switches"].as_array().is_some_and(|s| s.len() == 3), "{coll}");
    }
    // The overlap measurement: every part timed in each of its 3 repetitions.
    let overlap = ms
        .iter()
        .find(|m| m["system"] == "af_packet" && m["collective"] == "overlap")
        .expect("overlap measurement");
    assert_eq!(overlap["status"], "ok", "{transcript}");
    for part in
        ["blocking", "nonblocking", "collective", "compute", "overlapped", "idle", "idleoverlapped"]
    {
        assert_eq!(overlap["parts"][part].as_array().map(Vec::len), Some(3), "{part}");
    }
    let summary = v["overlap"].as_array().expect("overlap summary");
    assert!(summary.iter().any(|s| s["system"] == "af_packet" && s["rounds"] == 1), "{json}");
    assert!(v["summary"].as_array().is_some_and(|s| !s.is_empty()));
    // One entry per collective for every backend that ran (dpdk only when built with it)
    // and for MPI (ring AllReduce and AllGather, default ReduceScatter).
    let counted: Vec<(&str, &str)> = v["results"]["host_bytes"]
        .as_array()
        .expect("host_bytes")
        .iter()
        .filter_map(|h| Some((h["system"].as_str()?, h["collective"].as_str()?)))
        .collect();
    for want in [
        ("af_packet", "allreduce"),
        ("mpi-ring", "allreduce"),
        ("af_packet", "reducescatter"),
        ("mpi-default", "reducescatter"),
        ("af_packet", "allgather"),
        ("mpi-ring", "allgather"),
    ] {
        assert!(counted.contains(&want), "{want:?}: {counted:?}");
    }

    for svg in [
        "algbw-allreduce-int32.svg",
        "algbw-reducescatter-int32.svg",
        "algbw-allgather-int32.svg",
        "latency-allreduce-1elem.svg",
        "latency-barrier.svg",
    ] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap_or_else(|e| panic!("{svg}: {e}"));
        assert!(
            text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
            "{svg} is not SVG"
        );
        assert_eq!(text.matches("<svg").count(), text.matches("</svg>").count(), "{svg}");
        assert!(text.contains("af_packet") && text.contains("mpi"), "{svg} lacks a series");
    }
    assert_clean(&prefix);
    let _ = std::fs::remove_dir_all(&out);
}
