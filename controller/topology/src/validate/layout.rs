//! Links, hosts, subnets, the spanning tree and management addresses.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

use inc_ctrl_proto::EthernetAddress;
use inc_link_spec::PortLinkEmu;

use super::{parse_ifaddr, resolve, Validator, NO_ADDR};
use crate::model::{pos, Host, IfAddr, Link, Switch, TreeNode};
use crate::raw::{RawHost, RawTopology, S};

/// A host that passed validation so far, with what later steps need from the file.
pub(super) struct HostEntry<'r> {
    raw: &'r RawHost,
    pub(super) host: Host,
    at: (usize, usize),
}

/// Union-find root, with path halving.
fn find(uf: &mut [usize], mut x: usize) -> usize {
    while uf[x] != x {
        uf[x] = uf[uf[x]];
        x = uf[x];
    }
    x
}

impl Validator<'_> {
    /// Resolution, port reuse, subnets and cycles; each link with its position.
    pub(super) fn links(
        &mut self,
        raw: &RawTopology,
        switches: &[Switch],
    ) -> Vec<(Link, (usize, usize))> {
        let mut links = Vec::new();
        let mut uf: Vec<usize> = (0..switches.len()).collect();
        for l in &raw.links {
            let el = format!("link {} -- {}", l.a.as_str(), l.b.as_str());
            let [a_to_b, b_to_a] =
                self.emulation(&el, &l.emulate, [("a_to_b", &l.a_to_b), ("b_to_a", &l.b_to_a)]);
            let a = resolve(&l.a, switches).map_err(|m| self.issue(&l.a, &el, m)).ok();
            let b = resolve(&l.b, switches).map_err(|m| self.issue(&l.b, &el, m)).ok();
            let (Some(a), Some(b)) = (a, b) else { continue };
            if a.switch == b.switch {
                self.issue(&l.a, &el, "link connects a switch to itself");
                continue;
            }
            let mut port_ok = true;
            for (r, at) in [(a, &l.a), (b, &l.b)] {
                if let Some(o) = self.used.get(&r).cloned() {
                    self.issue(at, &el, format!("port already used by {o}"));
                    port_ok = false;
                } else {
                    self.used.insert(r, el.clone());
                }
            }
            if !port_ok {
                continue;
            }
            let (aa, ba) =
                (switches[a.switch].ports[a.port].addr, switches[b.switch].ports[b.port].addr);
            if !aa.same_subnet(ba) && !aa.ip.is_unspecified() && !ba.ip.is_unspecified() {
                let msg = format!("endpoints {aa} and {ba} are not in the same subnet");
                self.issue(&l.a, &el, msg);
            }
            let (ra, rb) = (find(&mut uf, a.switch), find(&mut uf, b.switch));
            if ra == rb {
                self.issue(&l.a, &el, "link creates a cycle (the switches must form a tree)");
                continue;
            }
            uf[ra] = rb;
            self.emu.push((a, PortLinkEmu { tx: a_to_b, rx: None }));
            self.emu.push((b, PortLinkEmu { tx: b_to_a, rx: None }));
            links.push((Link { a, b }, pos(&l.a)));
        }
        links
    }

    pub(super) fn hosts<'r>(
        &mut self,
        raw: &'r RawTopology,
        switches: &[Switch],
    ) -> Vec<HostEntry<'r>> {
        let mut hosts = Vec::new();
        for h in &raw.hosts {
            let el = format!("host {}", h.name.as_str());
            let [to_host, from_host] = self.emulation(
                &el,
                &h.emulate,
                [("to_host", &h.to_host), ("from_host", &h.from_host)],
            );
            let addr = parse_ifaddr(&h.ip).unwrap_or_else(|m| {
                self.issue(&h.ip, &el, m);
                NO_ADDR
            });
            self.claim_ip(&h.ip, &el, addr.ip);
            let parsed = self.parse_mac(&h.mac, addr.ip, &el, true);
            let mac = parsed.unwrap_or(None);
            let if_mac = mac.unwrap_or(EthernetAddress::from_ipv4(addr.ip));
            if parsed.is_ok() {
                self.claim_mac(h.mac.as_ref().unwrap_or(&h.ip), &el, if_mac);
            }
            let Ok(attach) =
                resolve(&h.attach, switches).map_err(|m| self.issue(&h.attach, &el, m))
            else {
                continue;
            };
            if let Some(o) = self.used.get(&attach).cloned() {
                let msg = format!("port `{}` already used by {o}", h.attach.as_str());
                self.issue(&h.attach, &el, msg);
                continue;
            }
            self.used.insert(attach, el.clone());
            self.emu.push((attach, PortLinkEmu { tx: to_host, rx: from_host }));
            let paddr = switches[attach.switch].ports[attach.port].addr;
            if !addr.ip.is_unspecified() && !paddr.ip.is_unspecified() && !addr.same_subnet(paddr) {
                let msg = format!(
                    "{addr} is not in the subnet of port `{}` ({paddr})",
                    h.attach.as_str()
                );
                self.issue(&h.ip, &el, msg);
            }
            let host = Host {
                name: h.name.to_string(),
                addr,
                mac,
                if_mac,
                mgmt: Ipv4Addr::UNSPECIFIED,
                attach,
            };
            hosts.push(HostEntry { raw: h, host, at: pos(&h.name) });
        }
        hosts
    }

    /// Every port's subnet belongs to one link, except that host ports of one switch
    /// may share a subnet (a LAN behind that switch).
    pub(super) fn overlapping_subnets(
        &mut self,
        switches: &[Switch],
        links: &[(Link, (usize, usize))],
        hosts: &[HostEntry<'_>],
    ) {
        #[derive(Clone, Copy)]
        struct Seg {
            addr: IfAddr,
            switch: usize,
            host_port: bool,
            at: (usize, usize),
        }
        let mut segs: Vec<(String, Seg)> = Vec::new();
        for (l, at) in links {
            let (sa, sb) = (&switches[l.a.switch], &switches[l.b.switch]);
            let addr = sa.ports[l.a.port].addr;
            let el = format!(
                "link {}:{} -- {}:{}",
                sa.name, sa.ports[l.a.port].name, sb.name, sb.ports[l.b.port].name
            );
            segs.push((el, Seg { addr, switch: l.a.switch, host_port: false, at: *at }));
        }
        for e in hosts {
            let h = &e.host;
            let seg = Seg { addr: h.addr, switch: h.attach.switch, host_port: true, at: e.at };
            segs.push((format!("host {} link", h.name), seg));
        }
        for i in 0..segs.len() {
            for j in 0..i {
                let (a, b) = (segs[i].1, segs[j].1);
                if a.addr.ip.is_unspecified()
                    || b.addr.ip.is_unspecified()
                    || !a.addr.overlaps(b.addr)
                {
                    continue;
                }
                if a.host_port && b.host_port && a.switch == b.switch && a.addr.same_subnet(b.addr)
                {
                    continue;
                }
                let msg = format!(
                    "subnet {}/{} overlaps {} ({}/{})",
                    a.addr.network(),
                    a.addr.prefix,
                    segs[j].0,
                    b.addr.network(),
                    b.addr.prefix
                );
                let el = segs[i].0.clone();
                self.issue_at(a.at, el, msg);
            }
        }
    }

    /// Root, parent/children by breadth-first search (ports sorted, so the tree does
    /// not depend on link order), and reachability.
    pub(super) fn tree(
        &mut self,
        raw: &RawTopology,
        switches: &[Switch],
        links: &[(Link, (usize, usize))],
        hosts: &[HostEntry<'_>],
    ) -> (usize, Vec<TreeNode>) {
        let root = match &raw.root {
            Some(r) => switches.iter().position(|s| s.name == r.as_str()).unwrap_or_else(|| {
                self.issue(r, "root", format!("no switch named `{}`", r.as_str()));
                0
            }),
            None => 0,
        };
        let mut tree: Vec<TreeNode> = (0..switches.len())
            .map(|_| TreeNode { parent: None, children: Vec::new(), hosts: Vec::new(), depth: 0 })
            .collect();
        if !switches.is_empty() {
            let mut adj: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); switches.len()];
            for (l, _) in links {
                adj[l.a.switch].push((l.b.switch, l.a.port, l.b.port));
                adj[l.b.switch].push((l.a.switch, l.b.port, l.a.port));
            }
            let mut seen = vec![false; switches.len()];
            seen[root] = true;
            let mut q = VecDeque::from([root]);
            while let Some(s) = q.pop_front() {
                let mut next = adj[s].clone();
                next.sort();
                for (c, lp, cp) in next {
                    if seen[c] {
                        continue;
                    }
                    seen[c] = true;
                    tree[c].parent = Some((s, cp, lp));
                    tree[c].depth = tree[s].depth + 1;
                    tree[s].children.push((c, lp, cp));
                    q.push_back(c);
                }
            }
            for (i, s) in raw.switches.iter().enumerate() {
                if !seen[i] {
                    let msg =
                        format!("switch is unreachable from the root `{}`", switches[root].name);
                    self.issue(&s.name, format!("switch {}", s.name.as_str()), msg);
                }
            }
        }
        for (i, e) in hosts.iter().enumerate() {
            tree[e.host.attach.switch].hosts.push(i);
        }
        (root, tree)
    }

    /// Explicit management addresses first, then automatic ones: the next free host
    /// addresses after the controller's.
    pub(super) fn management(
        &mut self,
        raw: &RawTopology,
        mgmt_net: IfAddr,
        switches: &mut [Switch],
        hosts: Vec<HostEntry<'_>>,
    ) -> Vec<Host> {
        let mut used: HashMap<Ipv4Addr, String> =
            HashMap::from([(mgmt_net.ip, "controller".to_string())]);
        let sw_mgmt: Vec<Option<Ipv4Addr>> = raw
            .switches
            .iter()
            .map(|s| {
                self.explicit_mgmt(mgmt_net, &mut used, &s.mgmt, &format!("switch {}", *s.name))
            })
            .collect();
        let host_mgmt: Vec<Option<Ipv4Addr>> = hosts
            .iter()
            .map(|e| {
                let el = format!("host {}", *e.raw.name);
                self.explicit_mgmt(mgmt_net, &mut used, &e.raw.mgmt, &el)
            })
            .collect();
        let mut next = u32::from(mgmt_net.ip);
        let mut alloc = |v: &mut Self, at: &S<String>, el: &str| -> Ipv4Addr {
            loop {
                next = next.wrapping_add(1);
                let ip = Ipv4Addr::from(next);
                let host = next & !mgmt_net.mask();
                if !mgmt_net.contains(ip) || host == !mgmt_net.mask() {
                    v.issue(at, el, "management subnet exhausted");
                    return Ipv4Addr::UNSPECIFIED;
                }
                if host != 0 && !used.contains_key(&ip) {
                    used.insert(ip, el.to_string());
                    return ip;
                }
            }
        };
        for (i, s) in raw.switches.iter().enumerate() {
            switches[i].mgmt = sw_mgmt[i]
                .unwrap_or_else(|| alloc(self, &s.name, &format!("switch {}", s.name.as_str())));
        }
        let mut out = Vec::new();
        for (e, explicit) in hosts.into_iter().zip(host_mgmt) {
            let mut h = e.host;
            h.mgmt = explicit.unwrap_or_else(|| {
                alloc(self, &e.raw.name, &format!("host {}", e.raw.name.as_str()))
            });
            out.push(h);
        }
        // The management subnet must not overlap data subnets: hosts route both.
        for h in &out {
            if !h.addr.ip.is_unspecified() && h.addr.overlaps(mgmt_net) {
                let msg = format!(
                    "management subnet {}/{} overlaps the data subnet of host {} ({})",
                    mgmt_net.network(),
                    mgmt_net.prefix,
                    h.name,
                    h.addr
                );
                self.issue(&raw.controller.address, "controller", msg);
            }
        }
        out
    }

    fn explicit_mgmt(
        &mut self,
        mgmt_net: IfAddr,
        used: &mut HashMap<Ipv4Addr, String>,
        m: &Option<S<String>>,
        el: &str,
    ) -> Option<Ipv4Addr> {
        let m = m.as_ref()?;
        let Ok(ip) = m.parse::<Ipv4Addr>() else {
            self.issue(m, el, format!("mgmt `{}` is not an IPv4 address", m.as_str()));
            return None;
        };
        let host = u32::from(ip) & !mgmt_net.mask();
        if !mgmt_net.contains(ip) || host == 0 || host == !mgmt_net.mask() {
            let msg = format!(
                "mgmt {ip} is not a host address of the management subnet {}/{}",
                mgmt_net.network(),
                mgmt_net.prefix
            );
            self.issue(m, el, msg);
            return None;
        }
        if let Some(o) = used.insert(ip, el.to_string()) {
            self.issue(m, el, format!("duplicate management address {ip} (also {o})"));
        }
        Some(ip)
    }
}
