//! The `inc-sim` command: formats, the ring comparison, errors that name the culprit.

use std::path::PathBuf;
use std::process::Command;

fn topology(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../topologies").join(name);
    p.to_string_lossy().into_owned()
}

fn inc_sim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_inc-sim")).args(args).output().expect("runs");
    let text = |b: Vec<u8>| String::from_utf8(b).expect("UTF-8");
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[test]
fn json_has_the_results_the_bound_and_the_ring() {
    let t = topology("1-2-4.yaml");
    let (ok, out, err) =
        inc_sim(&["--topology", &t, "--size", "128K", "--format", "json", "--compare", "ring"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["hosts"], 4);
    assert_eq!(v["bytes"], 128 << 10);
    assert_eq!(v["verified_ranks"], 4);
    assert_eq!(v["retransmissions"], 0);
    let time = v["time_ns"].as_f64().unwrap();
    let bound = v["analytic"]["in_network_ns"].as_f64().unwrap();
    let ring = v["analytic"]["ring_ns"].as_f64().unwrap();
    assert!((time / bound - 1.0).abs() < 0.02, "{time} vs {bound}");
    assert!(ring > time, "INC beats the ring on 1-2-4: {ring} vs {time}");
    assert!(v["busiest"].as_array().unwrap().len() == 5);
    assert!(v["events_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn csv_and_table_print_the_same_run() {
    let t = topology("3-level.yaml");
    let common = ["--topology", &t, "--size", "64K", "--collective", "broadcast", "--root", "8"];
    let (ok, csv, err) =
        inc_sim(&[&common[..], &["--format", "csv", "--compare", "ring"]].concat());
    assert!(ok, "{err}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2);
    let head: Vec<&str> = lines[0].split(',').collect();
    let row: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(head.len(), row.len());
    let col = |name: &str| row[head.iter().position(|h| *h == name).unwrap()];
    assert_eq!(col("collective"), "broadcast");
    assert_eq!(col("verified_ranks"), "8");
    let (ok, table, err) = inc_sim(&common);
    assert!(ok, "{err}");
    assert!(table.contains("checked                    8      of 8 receiving ranks"), "{table}");
    assert!(table.contains(&format!("{:>12} us", col("time_us"))), "{table}\n{csv}");
    assert!(table.contains("events/s"));
}

#[test]
fn bad_arguments_name_what_is_wrong() {
    let t = topology("1-2-4.yaml");
    let (ok, _, err) = inc_sim(&["--topology", &t, "--dtype", "float64", "--size", "1001"]);
    assert!(!ok);
    assert!(err.contains("1001 bytes") && err.contains("float64"), "{err}");
    let (ok, _, err) = inc_sim(&["--topology", "/nonexistent.yaml"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent.yaml"), "{err}");
    let (ok, _, err) = inc_sim(&["--topology", &t, "--link-rate", "fast"]);
    assert!(!ok);
    assert!(err.contains("--link-rate fast"), "{err}");
    let (ok, _, err) = inc_sim(&["--topology", &t, "--collective", "reduce", "--root", "9"]);
    assert!(!ok);
    assert!(err.contains("root rank 9"), "{err}");
}
