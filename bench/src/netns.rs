//! The topology in namespaces: the plan of `inc-controller plan` (parsed), bringing it up
//! and down with the project's scripts, and interface counters.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::procs::run_quiet;

/// The plan's switches, ports and hosts, as the controller's plan reader gives them.
pub use inc_controller::plan::{PlanHost as Host, PlanPort as Port, PlanSwitch as Switch};

/// A switch-to-switch link.
#[derive(Debug, Clone)]
pub struct Link {
    /// (switch, port) of one end.
    pub a: (String, String),
    /// (switch, port) of the other end.
    pub b: (String, String),
}

/// The parsed plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Controller namespace.
    pub ctrl_ns: String,
    /// Controller address ip:port.
    pub ctrl_addr: String,
    /// Switches.
    pub switches: Vec<Switch>,
    /// Ports.
    pub ports: Vec<Port>,
    /// Hosts in rank order.
    pub hosts: Vec<Host>,
    /// Switch-to-switch links.
    pub links: Vec<Link>,
}

impl Plan {
    /// Parse the text of `inc-controller plan` (with the controller's own parser).
    pub fn parse(text: &str) -> anyhow::Result<Plan> {
        let p = inc_controller::plan::ParsedPlan::parse(text)?;
        if p.hosts.len() < 2 {
            bail!("plan has fewer than two hosts");
        }
        let links = p
            .veths
            .iter()
            .filter_map(|v| {
                let (sa, sb) = (p.switch_in(&v.a.0)?, p.switch_in(&v.b.0)?);
                Some(Link { a: (sa.into(), v.a.1.clone()), b: (sb.into(), v.b.1.clone()) })
            })
            .collect();
        Ok(Plan {
            ctrl_ns: p.controller_ns,
            ctrl_addr: p.controller_addr,
            switches: p.switches,
            ports: p.ports,
            hosts: p.hosts,
            links,
        })
    }

    /// The port `switch:port`.
    pub fn port(&self, switch: &str, port: &str) -> anyhow::Result<&Port> {
        self.ports
            .iter()
            .find(|p| p.switch == switch && p.port == port)
            .with_context(|| format!("plan has no port {switch}:{port}"))
    }

    /// Next hop from switch `from` towards switch `to`: (local port, neighbour switch,
    /// neighbour's port). None if `from == to` or unreachable.
    pub fn next_hop(&self, from: &str, to: &str) -> Option<(String, String, String)> {
        if from == to {
            return None;
        }
        // Breadth-first search from `to`, so each switch learns its first hop towards it.
        let mut towards: HashMap<&str, (String, String, String)> = HashMap::new();
        let mut queue = VecDeque::from([to]);
        let mut seen = vec![to];
        while let Some(s) = queue.pop_front() {
            for l in &self.links {
                for (here, there) in [(&l.a, &l.b), (&l.b, &l.a)] {
                    if there.0 == s && !seen.contains(&here.0.as_str()) {
                        seen.push(&here.0);
                        towards.insert(&here.0, (here.1.clone(), there.0.clone(), there.1.clone()));
                        queue.push_back(&here.0);
                    }
                }
            }
        }
        towards.remove(from)
    }

    /// Switches and (in, out) ports on the path from host `a` to host `b`.
    pub fn path(&self, a: &Host, b: &Host) -> anyhow::Result<Vec<(String, String, String)>> {
        let mut hops = Vec::new();
        let (mut at, mut in_port) = (a.switch.clone(), a.port.clone());
        while at != b.switch {
            let (out, next, next_in) = self
                .next_hop(&at, &b.switch)
                .with_context(|| format!("no path from switch {at} to {}", b.switch))?;
            hops.push((at.clone(), in_port, out));
            at = next;
            in_port = next_in;
        }
        hops.push((at, in_port, b.port.clone()));
        Ok(hops)
    }
}

/// Brought-up namespaces of a prefix; removed (with any process left in them) on drop.
#[derive(Debug)]
pub struct Netns {
    root: PathBuf,
    prefix: String,
}

impl Netns {
    /// `scripts/netns-up TOPOLOGY --prefix P`, log in `log`.
    /// With the hosts' veths as the kernel makes them (TX checksum offload on).
    pub fn up(root: &Path, topology: &Path, prefix: &str, log: &Path) -> anyhow::Result<Netns> {
        let guard = Netns { root: root.to_path_buf(), prefix: prefix.to_string() };
        run_quiet(
            Command::new(root.join("scripts/netns-up"))
                .arg(topology)
                .args(["--prefix", prefix])
                .env("INC_HOST_TX_OFFLOAD", "on"),
            log,
        )
        .context("scripts/netns-up failed")?;
        Ok(guard)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new(self.root.join("scripts/netns-down"))
            .args(["--prefix", &self.prefix, "--kill"])
            .output();
    }
}

/// Turns TX checksum offload on the hosts' data interfaces on or off (`ethtool -K`).
pub fn set_host_tx_offload(plan: &Plan, on: bool) -> anyhow::Result<()> {
    let state = if on { "on" } else { "off" };
    for h in &plan.hosts {
        let cmd = ["ip", "netns", "exec", &h.ns, "ethtool", "-K", &h.ifname, "tx", state];
        crate::procs::run_checked(&cmd.map(String::from))?;
    }
    Ok(())
}

/// Interface counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IfCounters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
}

impl IfCounters {
    /// `self - before`.
    pub fn since(self, before: IfCounters) -> IfCounters {
        IfCounters {
            rx_bytes: self.rx_bytes.saturating_sub(before.rx_bytes),
            tx_bytes: self.tx_bytes.saturating_sub(before.tx_bytes),
            rx_packets: self.rx_packets.saturating_sub(before.rx_packets),
            tx_packets: self.tx_packets.saturating_sub(before.tx_packets),
        }
    }
}

/// Counters of `ifname` in namespace `ns` (`ip -s -j link`).
pub fn if_counters(ns: &str, ifname: &str) -> anyhow::Result<IfCounters> {
    let out = Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", "dev", ifname])
        .output()
        .with_context(|| format!("cannot run ip for {ns}/{ifname}"))?;
    if !out.status.success() {
        bail!("ip -n {ns} link show {ifname}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("ip -j output for {ns}/{ifname} is not JSON"))?;
    let s = &v[0]["stats64"];
    let n = |dir: &str, k: &str| s[dir][k].as_u64().unwrap_or(0);
    Ok(IfCounters {
        rx_bytes: n("rx", "bytes"),
        tx_bytes: n("tx", "bytes"),
        rx_packets: n("rx", "packets"),
        tx_packets: n("tx", "packets"),
    })
}

/// Counters of every host's data interface, in rank order.
pub fn host_counters(plan: &Plan) -> anyhow::Result<Vec<IfCounters>> {
    plan.hosts.iter().map(|h| if_counters(&h.ns, &h.ifname)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T124: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");

    fn plan() -> Plan {
        let t = inc_controller::topology::Topology::load(T124).unwrap();
        Plan::parse(&inc_controller::plan::render(&t, "x").unwrap()).unwrap()
    }

    #[test]
    fn parses_the_1_2_4_plan() {
        let p = plan();
        assert_eq!(p.switches.len(), 3);
        assert_eq!(p.hosts.len(), 4);
        assert_eq!(p.links.len(), 2);
        assert_eq!(p.ports.len(), 8);
        assert_eq!(p.hosts[0].switch, "leaf1");
        assert_eq!(p.ctrl_ns, "x-ctrl");
    }

    #[test]
    fn paths_cross_the_root() {
        let p = plan();
        let path = p.path(&p.hosts[0], &p.hosts[3]).unwrap();
        let names: Vec<&str> = path.iter().map(|h| h.0.as_str()).collect();
        assert_eq!(names, ["leaf1", "root", "leaf2"]);
        assert_eq!(path[0].1, "h0");
        assert_eq!(path[0].2, "up");
        assert_eq!(path[2].2, "h3");
        assert_eq!(p.path(&p.hosts[0], &p.hosts[1]).unwrap().len(), 1);
    }
}
