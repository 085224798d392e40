//! `--link-emu [SWITCH:PORT=]SPEC`: which ports emulate what, in which direction.

use std::str::FromStr;

use anyhow::{anyhow, bail};
use inc_switch_io::link_emu::{Impairments, PortLinkEmu};
use inc_topology::{PortPeer, PortRef, Topology};

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

/// Per plan, per port, the emulation to apply: the topology's `emulate:` settings of
/// the port's link or host, unless an argument applies to the port, in which case the
/// arguments replace them (the command line overrides the file, per port). Arguments
/// apply in order, each refining what earlier ones set on the same port and direction.
/// Host-facing ports (for [`Direction::Link`]) are known from `topology` (if given).
pub fn resolve(
    args: &[LinkEmuArg],
    plans: &[SwitchPlan],
    topology: Option<&Topology>,
) -> anyhow::Result<Vec<Vec<PortLinkEmu>>> {
    let topo_port = |plan: &SwitchPlan, port: &str| {
        let t = topology?;
        let switch = t.switch_by_id(plan.id)?;
        let port = t.switches[switch].ports.iter().position(|p| p.name == port)?;
        Some((t, PortRef { switch, port }))
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
            let topo = topo_port(plan, &port.port);
            let applying: Vec<&LinkEmuArg> = args
                .iter()
                .filter(|a| match &a.target {
                    None => true,
                    Some((sw, p)) => {
                        (plan.name == *sw || plan.id.to_string() == *sw) && port.port == *p
                    }
                })
                .collect();
            if applying.is_empty() {
                let from_file = topo.map(|(t, r)| t.switches[r.switch].ports[r.port].emu.clone());
                ports.push(from_file.unwrap_or_default());
                continue;
            }
            let host_facing =
                topo.is_some_and(|(t, r)| matches!(t.port_peer(r), Some(PortPeer::Host(_))));
            let mut emu = PortLinkEmu::default();
            for a in applying {
                let (tx, rx) = match a.dir {
                    Direction::Link => (true, host_facing),
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
        let emu = resolve(&args, &plans, Some(&topo)).unwrap().remove(0);
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

    /// 1-2-4 with loss on root -- leaf1 (delay towards the root only) and on host h2's
    /// link (from the host only).
    fn lossy_1_2_4() -> Topology {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let text = text
            .replace(
                r#"{ a: "root:d1", b: "leaf1:up" }"#,
                r#"{ a: "root:d1", b: "leaf1:up", emulate: "loss=1%", b_to_a: "delay=1ms" }"#,
            )
            .replace(r#"attach: "leaf2:h2" }"#, r#"attach: "leaf2:h2", from_host: "loss=2%" }"#);
        Topology::parse("lossy.yaml", &text).unwrap()
    }

    #[test]
    fn topology_settings_reach_the_right_ports_and_directions() {
        let topo = lossy_1_2_4();
        // All switches in one process, then one process per switch: the same settings.
        let all: Vec<SwitchArg> = ["root", "leaf1", "leaf2"].map(|s| s.parse().unwrap()).into();
        let plans = resolve_plans(&all, &[], Some(&topo)).unwrap();
        let together = resolve(&[], &plans, Some(&topo)).unwrap();
        for (i, name) in ["root", "leaf1", "leaf2"].iter().enumerate() {
            let one = resolve_plans(&[name.parse().unwrap()], &[], Some(&topo)).unwrap();
            assert_eq!(resolve(&[], &one, Some(&topo)).unwrap()[0], together[i], "{name}");
        }
        let loss = |i: &Option<Impairments>| i.as_ref().map(|i| i.loss);
        let [root, leaf1, leaf2] = [&together[0], &together[1], &together[2]];
        // root:d1 sends root -> leaf1: loss only; leaf1:up sends towards the root: + delay.
        assert_eq!((loss(&root[0].tx), loss(&root[0].rx)), (Some(0.01), None));
        let up = leaf1[0].tx.as_ref().unwrap();
        assert_eq!((up.loss, up.delay), (0.01, std::time::Duration::from_millis(1)));
        assert!(leaf1[0].rx.is_none());
        // leaf2:h2 receives from its host with loss; sends unimpaired.
        assert_eq!((loss(&leaf2[1].tx), loss(&leaf2[1].rx)), (None, Some(0.02)));
        // Nothing else.
        let impaired: usize = together.iter().flatten().filter(|p| !p.is_noop()).count();
        assert_eq!(impaired, 3);
    }

    #[test]
    fn command_line_overrides_the_topology_per_port() {
        let topo = lossy_1_2_4();
        let sw: Vec<SwitchArg> = vec!["leaf1".parse().unwrap()];
        let plans = resolve_plans(&sw, &[], Some(&topo)).unwrap();
        let args = ["leaf1:up=dup=1%,dir=tx".parse().unwrap()];
        let emu = resolve(&args, &plans, Some(&topo)).unwrap().remove(0);
        let up = emu[0].tx.as_ref().unwrap();
        assert_eq!((up.loss, up.duplicate), (0.0, 0.01), "the file's loss and delay are replaced");
        assert!(up.delay.is_zero());
        // A command-line setting for every port replaces the file everywhere.
        let emu = resolve(&["delay=3ms".parse().unwrap()], &plans, Some(&topo)).unwrap().remove(0);
        assert!(emu.iter().all(|p| p.tx.as_ref().is_some_and(|t| t.loss == 0.0)));
    }
}
