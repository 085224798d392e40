//! `--link-emu [SWITCH:PORT=]SPEC`: which ports emulate what, in which direction.

use std::path::Path;
use std::str::FromStr;

use anyhow::{anyhow, bail};
use inc_switch_io::link_emu::{Impairments, PortLinkEmu};
use inc_topology::Topology;

use crate::spec::SwitchPlan;

/// Which direction of a port's link a spec applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The whole link, each direction emulated once in the fabric: frames the switch
    /// sends, plus frames it receives when the far end is a host (hosts have no
    /// emulator; the far end of a switch link emulates its own sending).
    Link,
    /// Frames the switch sends.
    Tx,
    /// Frames the switch receives.
    Rx,
    /// Both.
    Both,
}

/// One `--link-emu` argument.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkEmuArg {
    /// `(switch id or name, port)`, or every port.
    pub target: Option<(String, String)>,
    /// Direction (`dir=` in the spec; default [`Direction::Link`]).
    pub dir: Direction,
    /// The impairment items, checked, without `dir=`.
    pub spec: String,
}

impl FromStr for LinkEmuArg {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        // A port selector has a `:` before the first `=`; spec keys never do.
        let (target, rest) = match s.split_once('=') {
            Some((head, rest)) if head.contains(':') => {
                let (sw, port) = head.split_once(':').unwrap_or_default();
                if sw.is_empty() || port.is_empty() {
                    bail!("--link-emu `{s}`: expected [SWITCH:PORT=]KEY=VALUE,...");
                }
                (Some((sw.to_string(), port.to_string())), rest)
            }
            _ => (None, s),
        };
        let mut dir = Direction::Link;
        let mut items = Vec::new();
        for item in rest.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.strip_prefix("dir=") {
                Some("link") => dir = Direction::Link,
                Some("tx") => dir = Direction::Tx,
                Some("rx") => dir = Direction::Rx,
                Some("both") => dir = Direction::Both,
                Some(d) => bail!("--link-emu `{s}`: dir={d}: expected link, tx, rx or both"),
                None => items.push(item),
            }
        }
        let spec = items.join(",");
        spec.parse::<Impairments>().map_err(|e| anyhow!("--link-emu `{s}`: {e}"))?;
        Ok(LinkEmuArg { target, dir, spec })
    }
}

/// Per plan, per port, the emulation the arguments ask for. Arguments
/// apply in order, each refining what earlier ones set on the same port and direction.
/// Host-facing ports are known from the topology at `topology` (if given).
pub fn resolve(
    args: &[LinkEmuArg],
    plans: &[SwitchPlan],
    topology: Option<&Path>,
) -> anyhow::Result<Vec<Vec<PortLinkEmu>>> {
    if args.is_empty() {
        return Ok(plans.iter().map(|p| vec![PortLinkEmu::default(); p.ports.len()]).collect());
    }
    let topo = match topology {
        Some(p) => Some(Topology::load(p).map_err(|e| anyhow!("{e}"))?),
        None => None,
    };
    let host_facing = |switch: &str, port: &str| {
        topo.as_ref().is_some_and(|t| {
            t.hosts.iter().any(|h| {
                let s = &t.switches[h.attach.switch];
                s.name == switch && s.ports[h.attach.port].name == port
            })
        })
    };
    for a in args {
        if let Some((sw, port)) = &a.target {
            let ok = plans.iter().any(|p| {
                (p.name == *sw || p.id.to_string() == *sw)
                    && p.ports.iter().any(|q| q.port == *port)
            });
            if !ok {
                bail!("--link-emu {sw}:{port}: this process runs no such switch port");
            }
        }
    }
    let mut out = Vec::new();
    for plan in plans {
        let mut ports = Vec::new();
        for port in &plan.ports {
            let mut emu = PortLinkEmu::default();
            for a in args {
                let applies = match &a.target {
                    None => true,
                    Some((sw, p)) => {
                        (plan.name == *sw || plan.id.to_string() == *sw) && port.port == *p
                    }
                };
                if !applies {
                    continue;
                }
                let (tx, rx) = match a.dir {
                    Direction::Link => (true, host_facing(&plan.name, &port.port)),
                    Direction::Tx => (true, false),
                    Direction::Rx => (false, true),
                    Direction::Both => (true, true),
                };
                for (on, slot) in [(tx, &mut emu.tx), (rx, &mut emu.rx)] {
                    if on {
                        slot.get_or_insert_with(Impairments::default)
                            .apply(&a.spec)
                            .map_err(|e| anyhow!("--link-emu: {e}"))?;
                    }
                }
            }
            ports.push(emu);
        }
        out.push(ports);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{resolve as resolve_plans, SwitchArg};

    #[test]
    fn parses_targets_and_directions() {
        let a: LinkEmuArg = "loss=1%,seed=3".parse().unwrap();
        assert_eq!((a.target, a.dir, a.spec.as_str()), (None, Direction::Link, "loss=1%,seed=3"));
        let a: LinkEmuArg = "leaf1:up=delay=2ms,dir=rx".parse().unwrap();
        assert_eq!(a.target, Some(("leaf1".into(), "up".into())));
        assert_eq!((a.dir, a.spec.as_str()), (Direction::Rx, "delay=2ms"));
        for bad in ["loss=7", "dir=up", ":p=loss=1%", "leaf1:=loss=1%", "nonsense"] {
            assert!(bad.parse::<LinkEmuArg>().is_err(), "{bad}");
        }
    }

    #[test]
    fn link_direction_covers_host_ports_both_ways() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
        let topo = Topology::load(path).unwrap();
        let sw: Vec<SwitchArg> = vec!["leaf1".parse().unwrap()];
        let plans = resolve_plans(&sw, &[], Some(&topo)).unwrap();
        let args: Vec<LinkEmuArg> =
            ["loss=1%", "leaf1:h1=delay=1ms,dir=tx"].iter().map(|s| s.parse().unwrap()).collect();
        let emu = resolve(&args, &plans, Some(Path::new(path))).unwrap().remove(0);
        // Ports of leaf1: up (to root), h0, h1 (hosts).
        assert_eq!(emu.len(), 3);
        assert!(emu[0].tx.is_some() && emu[0].rx.is_none());
        assert!(emu[1].tx.is_some() && emu[1].rx.is_some());
        let h1_tx = emu[2].tx.as_ref().unwrap();
        assert!((h1_tx.loss - 0.01).abs() < 1e-12);
        assert_eq!(h1_tx.delay, std::time::Duration::from_millis(1));
        assert!(emu[2].rx.as_ref().unwrap().delay.is_zero());
        let e = resolve(&["root:d1=loss=1%".parse().unwrap()], &plans, None).unwrap_err();
        assert!(e.to_string().contains("root:d1"), "{e}");
    }
}
