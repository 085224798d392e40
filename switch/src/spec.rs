//! Switch and port mapping from the command line:
//! `--switch ID[:NAME]` and `--port SWITCH:PORT=[NETNS/]IFNAME[,ip=A.B.C.D][,mac=MAC]`.

use std::net::Ipv4Addr;
use std::str::FromStr;

use anyhow::{anyhow, bail};
use inc_ctrl_proto::EthernetAddress;
use inc_switch_io::PortSpec;
use inc_topology::Topology;

/// `--switch ID[:NAME][@NETNS]` or `NAME[@NETNS]` (name resolved by `--topology`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchArg {
    /// Topology id, if given.
    pub id: Option<u32>,
    /// Topology name (defaults to the id).
    pub name: String,
    /// Namespace of the switch's interfaces when its ports come from the topology.
    pub netns: Option<String>,
}

impl FromStr for SwitchArg {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (head, netns) = match s.split_once('@') {
            Some((h, ns)) if !ns.is_empty() && !ns.contains('/') => (h, Some(ns.to_string())),
            Some(_) => bail!("--switch `{s}`: bad namespace after `@`"),
            None => (s, None),
        };
        let (id, name) = match head.split_once(':') {
            Some((id, name)) => {
                let id = id
                    .parse()
                    .map_err(|_| anyhow!("--switch `{s}`: expected ID:NAME with a numeric ID"))?;
                (Some(id), name.to_string())
            }
            None => (head.parse().ok(), head.to_string()),
        };
        if name.is_empty() {
            bail!("--switch `{s}`: empty name");
        }
        Ok(SwitchArg { id, name, netns })
    }
}

/// `--port SWITCH:PORT=[NETNS/]IFNAME[,ip=A.B.C.D][,mac=MAC]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortArg {
    /// Switch id or name.
    pub switch: String,
    /// Port name as in the topology.
    pub port: String,
    /// Interface.
    pub iface: PortSpec,
    /// Address the switch serves on the port.
    pub ip: Option<Ipv4Addr>,
    /// MAC the switch uses on the port (default: the interface's).
    pub mac: Option<EthernetAddress>,
}

impl FromStr for PortArg {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        let usage = "expected SWITCH:PORT=[NETNS/]IFNAME[,ip=A.B.C.D][,mac=aa:bb:cc:dd:ee:ff]";
        let (lhs, rhs) = s.split_once('=').ok_or_else(|| anyhow!("--port `{s}`: {usage}"))?;
        let (switch, port) = lhs.split_once(':').ok_or_else(|| anyhow!("--port `{s}`: {usage}"))?;
        if switch.is_empty() || port.is_empty() {
            bail!("--port `{s}`: {usage}");
        }
        let mut parts = rhs.split(',');
        let iface: PortSpec =
            parts.next().unwrap_or_default().parse().map_err(|e| anyhow!("--port `{s}`: {e}"))?;
        let (mut ip, mut mac) = (None, None);
        for opt in parts {
            match opt.split_once('=') {
                Some(("ip", v)) => {
                    ip = Some(v.parse().map_err(|_| anyhow!("--port `{s}`: bad ip `{v}`"))?)
                }
                Some(("mac", v)) => {
                    mac = Some(v.parse().map_err(|_| anyhow!("--port `{s}`: bad mac `{v}`"))?)
                }
                _ => bail!("--port `{s}`: unknown option `{opt}`; {usage}"),
            }
        }
        Ok(PortArg { switch: switch.into(), port: port.into(), iface, ip, mac })
    }
}

/// A logical switch with its ports, resolved from the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchPlan {
    /// Topology id.
    pub id: u32,
    /// Name.
    pub name: String,
    /// Ports in engine order.
    pub ports: Vec<PortArg>,
}

/// Group `--port`s under their `--switch`es (matched by id or name) and fill ids,
/// addresses and MACs from `topology` where the arguments leave them out. A switch
/// without any `--port` takes all its ports from the topology, each on the interface
/// named like the port, in the switch's `@NETNS` (or the current namespace).
pub fn resolve(
    switches: &[SwitchArg],
    ports: &[PortArg],
    topology: Option<&Topology>,
) -> anyhow::Result<Vec<SwitchPlan>> {
    if switches.is_empty() {
        bail!("no --switch given");
    }
    let mut plans: Vec<SwitchPlan> = Vec::new();
    let mut topo_sw = Vec::new();
    for s in switches {
        let found = match topology {
            Some(t) => {
                let i = t
                    .switch_by_name(&s.name)
                    .or_else(|| s.id.and_then(|id| t.switch_by_id(id)))
                    .ok_or_else(|| anyhow!("--switch {}: no such switch in {}", s.name, t.file))?;
                Some(&t.switches[i])
            }
            None => None,
        };
        let (id, name) = match (found, s.id) {
            (Some(ts), _) => (ts.id, ts.name.clone()),
            (None, Some(id)) => (id, s.name.clone()),
            (None, None) => bail!("--switch {}: give a numeric ID or --topology", s.name),
        };
        if plans.iter().any(|p| p.id == id || p.name == name) {
            bail!("--switch {id}:{name} given twice");
        }
        plans.push(SwitchPlan { id, name, ports: Vec::new() });
        topo_sw.push(found);
    }
    for p in ports {
        let Some(k) = plans.iter().position(|s| s.name == p.switch || s.id.to_string() == p.switch)
        else {
            bail!("--port {}:{}: no --switch with id or name `{}`", p.switch, p.port, p.switch);
        };
        let plan = &mut plans[k];
        if plan.ports.iter().any(|q| q.port == p.port) {
            bail!("--port {}:{} given twice", p.switch, p.port);
        }
        let mut p = p.clone();
        if let Some(ts) = topo_sw[k] {
            let tp = ts.ports.iter().find(|tp| tp.name == p.port).ok_or_else(|| {
                anyhow!(
                    "--port {}:{}: switch {} has no port `{}` in the topology",
                    p.switch,
                    p.port,
                    ts.name,
                    p.port
                )
            })?;
            p.ip = p.ip.or(Some(tp.addr.ip));
            p.mac = p.mac.or(Some(tp.mac));
        }
        if p.ip.is_none() {
            bail!("--port {}:{}: no address; add `,ip=A.B.C.D` or --topology", p.switch, p.port);
        }
        plan.ports.push(p);
    }
    for ((plan, ts), arg) in plans.iter_mut().zip(&topo_sw).zip(switches) {
        if let (true, Some(ts)) = (plan.ports.is_empty(), ts) {
            for tp in &ts.ports {
                plan.ports.push(PortArg {
                    switch: plan.name.clone(),
                    port: tp.name.clone(),
                    iface: PortSpec { netns: arg.netns.clone(), ifname: tp.name.clone() },
                    ip: Some(tp.addr.ip),
                    mac: Some(tp.mac),
                });
            }
        }
    }
    if let Some(s) = plans.iter().find(|s| s.ports.is_empty()) {
        bail!("--switch {}:{} has no --port", s.id, s.name);
    }
    Ok(plans)
}

/// The interface of every port of `plans` that a host of `topology` is attached to
/// (see `AfPacketConfig::host_ports`).
pub fn host_facing_ports(plans: &[SwitchPlan], topology: Option<&Topology>) -> Vec<PortSpec> {
    let Some(t) = topology else { return Vec::new() };
    t.hosts.iter().filter_map(|h| plan_iface(plans, t, &h.attach)).collect()
}

/// The two interfaces of every link (in `topology`) that joins two switches of `plans`,
/// i.e. both ends are served by this process (see `--internal-links` and
/// `AfPacketConfig::gso_links`).
pub fn internal_link_pairs(
    plans: &[SwitchPlan],
    topology: Option<&Topology>,
) -> Vec<(PortSpec, PortSpec)> {
    let Some(t) = topology else { return Vec::new() };
    let iface = |r| plan_iface(plans, t, r);
    t.links.iter().filter_map(|l| Some((iface(&l.a)?, iface(&l.b)?))).collect()
}

/// The interface serving topology port `r`, if its switch is one of `plans`.
fn plan_iface(plans: &[SwitchPlan], t: &Topology, r: &inc_topology::PortRef) -> Option<PortSpec> {
    let sw = t.switches.get(r.switch)?;
    let port = sw.ports.get(r.port)?;
    let plan = plans.iter().find(|p| p.name == sw.name)?;
    plan.ports.iter().find(|p| p.port == port.name).map(|p| p.iface.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports_and_switches() {
        let p: PortArg = "s1:p0=inc-s1/p0,ip=10.0.0.1,mac=02:00:00:00:00:01".parse().unwrap();
        assert_eq!(p.switch, "s1");
        assert_eq!(p.port, "p0");
        assert_eq!(p.iface.netns.as_deref(), Some("inc-s1"));
        assert_eq!(p.ip, Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert!(p.mac.is_some());
        let p: PortArg = "1:p1=veth3".parse().unwrap();
        assert_eq!((p.iface.netns, p.ip), (None, None));
        for bad in ["s1p0=x", "s1:p0", ":p0=x", "s1:p0=x,ip=300.0.0.1", "s1:p0=x,foo=1"] {
            assert!(bad.parse::<PortArg>().is_err(), "{bad}");
        }
        let s: SwitchArg = "3:leaf1".parse().unwrap();
        assert_eq!(s, SwitchArg { id: Some(3), name: "leaf1".into(), netns: None });
        assert_eq!("7".parse::<SwitchArg>().unwrap().name, "7");
        let s: SwitchArg = "leaf1@p-leaf1".parse().unwrap();
        assert_eq!(s, SwitchArg { id: None, name: "leaf1".into(), netns: Some("p-leaf1".into()) });
        assert!("x:leaf".parse::<SwitchArg>().is_err());
        assert!("leaf@".parse::<SwitchArg>().is_err());
    }

    #[test]
    fn resolve_groups_ports_and_names_mistakes() {
        let sw: Vec<SwitchArg> = vec!["1:root".parse().unwrap(), "2:leaf".parse().unwrap()];
        let ports: Vec<PortArg> =
            ["root:a=x,ip=10.0.0.1", "2:b=y,ip=10.0.1.1", "leaf:c=z,ip=10.0.2.1"]
                .iter()
                .map(|s| s.parse().unwrap())
                .collect();
        let plans = resolve(&sw, &ports, None).unwrap();
        assert_eq!(plans[0].ports.len(), 1);
        assert_eq!(plans[1].ports.iter().map(|p| p.port.as_str()).collect::<Vec<_>>(), ["b", "c"]);

        let e = resolve(&sw, &["nope:a=x,ip=1.1.1.1".parse().unwrap()], None).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let e = resolve(&sw, &ports[..1], None).unwrap_err();
        assert!(e.to_string().contains("leaf"), "{e}");
        let e = resolve(&sw, &["root:a=x".parse().unwrap()], None).unwrap_err();
        assert!(e.to_string().contains("root:a"), "{e}");
    }

    #[test]
    fn topology_fills_ids_addresses_and_ports() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
        let topo = Topology::load(path).unwrap();
        let sw: Vec<SwitchArg> = vec!["leaf1@ns-l1".parse().unwrap(), "root".parse().unwrap()];
        let ports: Vec<PortArg> = vec!["root:d1=ns-r/d1".parse().unwrap()];
        let plans = resolve(&sw, &ports, Some(&topo)).unwrap();
        assert_eq!((plans[0].id, plans[0].name.as_str()), (1, "leaf1"));
        let names: Vec<&str> = plans[0].ports.iter().map(|p| p.port.as_str()).collect();
        assert_eq!(names, ["up", "h0", "h1"]);
        assert_eq!(plans[0].ports[1].iface.label(), "ns-l1/h0");
        assert_eq!(plans[0].ports[1].ip, Some("10.1.1.1".parse().unwrap()));
        assert_eq!(plans[1].ports.len(), 1);
        assert_eq!(plans[1].ports[0].ip, Some("172.16.0.1".parse().unwrap()));
        let e = resolve(&["spine".parse().unwrap()], &[], Some(&topo)).unwrap_err();
        assert!(e.to_string().contains("spine"), "{e}");
        let e = resolve(&sw, &["root:zz=x".parse().unwrap()], Some(&topo)).unwrap_err();
        assert!(e.to_string().contains("zz"), "{e}");
    }
}
