//! Plain kernel forwarding in the switch namespaces, for the references that need the
//! hosts to reach each other without the INC switch (OpenMPI over TCP, kernel
//! frame rate): port addresses, host routes, proxy ARP, ip_forward. Everything is
//! undone on drop, leaving the namespaces as `scripts/netns-up` made them.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::netns::Plan;
use crate::procs::run_checked;

/// Kernel forwarding switched on; switched off again when dropped.
#[derive(Debug)]
pub struct KernelForwarding {
    undo: Vec<Vec<String>>,
}

fn v(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// nftables table of the switch-port ingress drops (`NETNS_SWITCH_PORT_TABLE` in
/// `scripts/lib/netns.sh`).
const PORT_DROP_TABLE: &str = "inc_switch_ports";

/// Chain of one switch port's ingress drop, as `netns_switch_port_no_kernel_rx` names it.
fn port_drop_chain(ifname: &str) -> String {
    let safe: String = ifname
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    format!("port_{safe}")
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
            k.let_kernel_receive(plan, &s.ns)?;
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

    /// `scripts/netns-up` drops every frame of a switch port at nftables ingress (behind
    /// the switch's packet sockets) so the kernel does not also process it; forwarding
    /// needs those frames, so the drop rules go while this lasts.
    fn let_kernel_receive(&mut self, plan: &Plan, ns: &str) -> anyhow::Result<()> {
        let has_table = Command::new("ip")
            .args(["netns", "exec", ns, "nft", "list", "table", "netdev", PORT_DROP_TABLE])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_table {
            return Ok(());
        }
        let restore: Vec<String> = plan
            .ports
            .iter()
            .filter(|p| p.ns == ns)
            .map(|p| {
                format!("add rule netdev {PORT_DROP_TABLE} {} drop", port_drop_chain(&p.ifname))
            })
            .collect();
        self.apply(
            v(&["ip", "netns", "exec", ns, "nft", "flush", "table", "netdev", PORT_DROP_TABLE]),
            v(&["ip", "netns", "exec", ns, "nft", &restore.join("; ")]),
        )
    }

    fn apply(&mut self, doit: Vec<String>, undo: Vec<String>) -> anyhow::Result<()> {
        run_checked(&doit)?;
        self.undo.push(undo);
        Ok(())
    }
}

impl Drop for KernelForwarding {
    fn drop(&mut self) {
        for cmd in self.undo.drain(..).rev() {
            let _ = run_checked(&cmd);
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

    #[test]
    fn port_drop_chains_are_named_as_netns_up_names_them() {
        assert_eq!(port_drop_chain("h0"), "port_h0");
        assert_eq!(port_drop_chain("up-1.x"), "port_up_1_x");
    }
}
