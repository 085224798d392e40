//! Stats endpoint: `--stats-listen ADDR` serves one JSON snapshot per TCP connection;
//! `inc-switch stats ADDR` fetches and prints it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use crossbeam_channel::Sender;
use inc_switch_io::Waker;
use tracing::{debug, warn};

use crate::event_loop::Command;

/// Bind `addr` and serve snapshots from the event loop on a background thread.
pub fn serve(addr: &str, commands: Sender<Command>, waker: Waker) -> anyhow::Result<String> {
    let listener =
        TcpListener::bind(addr).with_context(|| format!("cannot listen for stats on {addr}"))?;
    let local = listener.local_addr()?.to_string();
    std::thread::Builder::new().name("stats".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let (reply, snapshot) = crossbeam_channel::bounded(1);
            if commands.send(Command::Stats { reply }).is_err() {
                return; // event loop gone
            }
            waker.wake();
            let body = match snapshot.recv_timeout(Duration::from_secs(5)) {
                Ok(v) => serde_json::to_string(&v).unwrap_or_default(),
                Err(_) => r#"{"error":"event loop did not answer within 5 s"}"#.to_string(),
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
