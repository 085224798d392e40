//! What the controller's service tests share: a switch registering over the real
//! protocol.

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use inc_ctrl_proto::{ClientError, PortInfo, SwitchSession};

/// Registers switch `id` with `ports` (names only) presenting `token`. A switch that
/// just disconnected stays registered until the controller sees the close (no
/// takeover), so "already connected" is retried until `timeout`.
pub fn connect_switch(
    addr: SocketAddr,
    id: u32,
    ports: &[&str],
    token: &str,
    timeout: Duration,
) -> SwitchSession {
    let ports: Vec<PortInfo> = ports
        .iter()
        .map(|p| PortInfo {
            name: p.to_string(),
            ip: None,
            mac: None,
            takes_gso: false,
            rx_rate_bps: None,
        })
        .collect();
    let deadline = Instant::now() + timeout;
    loop {
        match SwitchSession::connect(addr, id, Some(token.into()), ports.clone(), timeout) {
            Ok(s) => return s,
            Err(ClientError::Rejected(r))
                if r.contains("already connected") && Instant::now() < deadline =>
            {
                thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("register switch {id}: {e}"),
        }
    }
}
