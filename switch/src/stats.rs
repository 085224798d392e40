//! Stats endpoint: `--stats-listen ADDR` serves one JSON snapshot per TCP connection;
//! `inc-switch stats ADDR` fetches and prints it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use crossbeam_channel::Sender;
use inc_switch_io::Waker;
use serde_json::{json, Value};
use tracing::{debug, warn};

use crate::event_loop::Command;

/// Bind `addr` and serve snapshots of every worker (`targets`: its command channel and
/// waker), merged, on a background thread.
pub fn serve(
    addr: &str,
    targets: Vec<(Sender<Command>, Waker)>,
    backend: &'static str,
) -> anyhow::Result<String> {
    let listener =
        TcpListener::bind(addr).with_context(|| format!("cannot listen for stats on {addr}"))?;
    let local = listener.local_addr()?.to_string();
    std::thread::Builder::new().name("stats".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut pending = Vec::new();
            for (commands, waker) in &targets {
                let (reply, snapshot) = crossbeam_channel::bounded(1);
                if commands.send(Command::Stats { reply }).is_err() {
                    return; // event loop gone
                }
                waker.wake();
                pending.push(snapshot);
            }
            let snaps: Option<Vec<Value>> =
                pending.iter().map(|p| p.recv_timeout(Duration::from_secs(5)).ok()).collect();
            let body = match snaps {
                Some(v) => serde_json::to_string(&merge(v, backend)).unwrap_or_default(),
                None => r#"{"error":"an event loop did not answer within 5 s"}"#.to_string(),
            };
            conn.set_write_timeout(Some(Duration::from_secs(5))).ok();
            if let Err(e) = conn.write_all(body.as_bytes()).and_then(|()| conn.write_all(b"\n")) {
                debug!(error = %e, "stats client went away");
            }
        }
        warn!("stats listener stopped");
    })?;
    Ok(local)
}

/// One snapshot of the process from the workers' snapshots: loop counters summed
/// (and kept per worker under `workers`), switches in id order.
pub fn merge(snaps: Vec<Value>, backend: &str) -> Value {
    if snaps.len() == 1 {
        let mut only = snaps.into_iter().next().unwrap_or(Value::Null);
        only["workers"] = json!([only["loop"].clone()]);
        return only;
    }
    let mut total = serde_json::Map::new();
    let mut switches = Vec::new();
    let mut loops = Vec::new();
    let mut uptime = 0f64;
    let mut capture = Value::Null;
    for s in snaps {
        if let Some(l) = s["loop"].as_object() {
            for (k, v) in l {
                let sum =
                    total.get(k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
                total.insert(k.clone(), json!(sum));
            }
        }
        loops.push(s["loop"].clone());
        uptime = uptime.max(s["uptime_s"].as_f64().unwrap_or(0.0));
        if !s["capture_frames"].is_null() {
            capture = s["capture_frames"].clone();
        }
        if let Some(sw) = s["switches"].as_array() {
            switches.extend(sw.iter().cloned());
        }
    }
    switches.sort_by_key(|s| s["switch_id"].as_u64());
    json!({
        "backend": backend,
        "uptime_s": uptime,
        "loop": total,
        "workers": loops,
        "capture_frames": capture,
        "switches": switches,
    })
}

/// Fetch one snapshot from a running switch.
pub fn fetch(addr: &str) -> anyhow::Result<serde_json::Value> {
    let sa = addr
        .to_socket_addrs()
        .with_context(|| format!("bad stats address {addr}"))?
        .next()
        .with_context(|| format!("stats address {addr} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5))
        .with_context(|| format!("cannot connect to switch stats at {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut body = String::new();
    s.read_to_string(&mut body).with_context(|| format!("reading stats from {addr}"))?;
    serde_json::from_str(&body).with_context(|| format!("stats from {addr} are not JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_sums_loops_and_orders_switches() {
        let a = json!({"loop": {"rx_frames": 3, "tx_frames": 1}, "uptime_s": 1.0,
            "capture_frames": null, "switches": [{"switch_id": 2}]});
        let b = json!({"loop": {"rx_frames": 4, "tx_frames": 2}, "uptime_s": 1.5,
            "capture_frames": null, "switches": [{"switch_id": 0}, {"switch_id": 1}]});
        let m = merge(vec![a, b], "af_xdp");
        assert_eq!(m["loop"]["rx_frames"], 7);
        assert_eq!(m["loop"]["tx_frames"], 3);
        assert_eq!(m["workers"].as_array().unwrap().len(), 2);
        assert_eq!(m["uptime_s"], 1.5);
        let ids: Vec<u64> = m["switches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["switch_id"].as_u64().unwrap())
            .collect();
        assert_eq!(ids, [0, 1, 2]);
        assert_eq!(m["backend"], "af_xdp");
    }
}
