//! Plain kernel forwarding in the switch namespaces, for the references that need the
//! hosts to reach each other without the INC switch (OpenMPI over TCP, kernel
//! frame rate): port addresses, host routes, proxy ARP, ip_forward. Everything is
//! undone on drop, leaving the namespaces as `scripts/netns-up` made them.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::netns::Plan;

/// Kernel forwarding switched on; switched off again when dropped.
#[derive(Debug)]
pub struct KernelForwarding {
    undo: Vec<Vec<String>>,
}

fn run(args: &[String]) -> anyhow::Result<()> {
    let out = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn v(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix.min(32))) };
    u32::from(a) & mask == u32::from(b) & mask
}

impl KernelForwarding {
    /// Configure every switch namespace as an IPv4 router between its ports.
    pub fn enable(plan: &Plan) -> anyhow::Result<KernelForwarding> {
        let mut k = KernelForwarding { undo: Vec::new() };
        let link_port = |sw: &str, port: &str| {
            plan.links.iter().any(|l| [&l.a, &l.b].iter().any(|e| e.0 == sw && e.1 == port))
        };
        for s in &plan.switches {
            k.apply(
                v(&[
                    "ip",
                    "netns",
                    "exec",
                    &s.ns,
                    "sysctl",
                    "-qw",
                    "net.ipv4.ip_forward=1",
                    "net.ipv4.conf.all.arp_announce=2",
                ]),
                v(&["ip", "netns", "exec", &s.ns, "sysctl", "-qw", "net.ipv4.ip_forward=0"]),
            )?;
        }
        for p in &plan.ports {
            // Host ports of one switch share a subnet; /32 plus host routes keep them apart.
            let len = if link_port(&p.switch, &p.port) { p.prefix_len } else { 32 };
            let addr = format!("{}/{len}", p.ip);
            k.apply(
                v(&["ip", "-n", &p.ns, "addr", "add", &addr, "dev", &p.ifname]),
                v(&["ip", "-n", &p.ns, "addr", "del", &addr, "dev", &p.ifname]),
            )?;
            if !link_port(&p.switch, &p.port) {
                let key = format!("net.ipv4.conf.{}.proxy_arp", p.ifname);
                k.apply(
                    v(&["ip", "netns", "exec", &p.ns, "sysctl", "-qw", &format!("{key}=1")]),
                    v(&["ip", "netns", "exec", &p.ns, "sysctl", "-qw", &format!("{key}=0")]),
                )?;
            }
        }
        for s in &plan.switches {
            for h in &plan.hosts {
                let dst = format!("{}/32", h.ip);
                let route = if h.switch == s.name {
                    v(&["ip", "-n", &s.ns, "route", "add", &dst, "dev", &h.port])
                } else {
                    let (out, nbr, nbr_port) =
                        plan.next_hop(&s.name, &h.switch).with_context(|| {
                            format!("no path from switch {} to host {}", s.name, h.name)
                        })?;
                    let via = plan.port(&nbr, &nbr_port)?.ip.to_string();
                    v(&["ip", "-n", &s.ns, "route", "add", &dst, "via", &via, "dev", &out])
                };
                k.apply(route, v(&["ip", "-n", &s.ns, "route", "del", &dst]))?;
            }
        }
        for h in &plan.hosts {
            let gw = plan.port(&h.switch, &h.port)?.ip.to_string();
            for o in plan.hosts.iter().filter(|o| !same_subnet(h.ip, o.ip, h.prefix_len)) {
                let dst = format!("{}/32", o.ip);
                k.apply(
                    v(&["ip", "-n", &h.ns, "route", "add", &dst, "via", &gw, "dev", &h.ifname]),
                    v(&["ip", "-n", &h.ns, "route", "del", &dst]),
                )?;
            }
        }
        for a in &plan.hosts {
            for b in plan.hosts.iter().filter(|b| b.name != a.name) {
                let ok = Command::new("ip")
                    .args(["netns", "exec", &a.ns, "ping", "-c1", "-W2", "-q", &b.ip.to_string()])
                    .output()
                    .is_ok_and(|o| o.status.success());
                if !ok {
                    bail!("kernel forwarding: {} cannot ping {} ({})", a.name, b.name, b.ip);
                }
            }
        }
        Ok(k)
    }

    fn apply(&mut self, doit: Vec<String>, undo: Vec<String>) -> anyhow::Result<()> {
        run(&doit)?;
        self.undo.push(undo);
        Ok(())
    }
}

impl Drop for KernelForwarding {
    fn drop(&mut self) {
        for cmd in self.undo.drain(..).rev() {
            let _ = run(&cmd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert!(same_subnet(ip("10.1.1.21"), ip("10.1.1.5"), 24));
        assert!(!same_subnet(ip("10.1.1.21"), ip("10.2.1.7"), 24));
        assert!(same_subnet(ip("1.2.3.4"), ip("9.9.9.9"), 0));
    }
}
