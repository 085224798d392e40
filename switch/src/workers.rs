//! The data plane on several cores: the logical switches of a process are split over
//! `--workers` threads, each with its own backend (opened on its switches' ports only)
//! and its own event loop. An engine (and so every communicator on it) is driven by
//! exactly one thread; threads share nothing on the packet path. Control sessions and
//! the stats server talk to the worker that owns their switch.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use crossbeam_channel::Sender;
use inc_ctrl_proto::PortInfo;
use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig};
use inc_switch_io::{Backend, PortSpec, Waker};
use inc_wire::EthernetAddress;
use serde_json::Value;
use tracing::info;

use crate::capture::Capture;
use crate::control;
use crate::event_loop::{Command, EventLoop, LogicalSwitch};
use crate::spec::SwitchPlan;
use crate::stats;

/// What every worker shares from the command line.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Controller address.
    pub controller: String,
    /// Controller token.
    pub token: Option<String>,
    /// `--stats-listen`.
    pub stats_listen: Option<String>,
    /// `--capture` (only with one worker).
    pub capture: Option<PathBuf>,
    /// `--link-emu`, per plan, per port.
    pub link_emu: Vec<Vec<inc_switch_io::link_emu::PortLinkEmu>>,
    /// Links carried in memory where a worker serves both ends (`--internal-links`).
    pub in_process_links: Vec<(PortSpec, PortSpec)>,
    /// `--busy-poll-us`.
    pub busy_poll: Duration,
    /// Fingerprint of `--topology`, presented when registering.
    pub topology: Option<String>,
    /// `--orphan-idle-timeout`.
    pub orphan_timeout: Duration,
}

/// Split switches (indices into `plans`) over at most `workers` groups, balancing the
/// number of ports (traffic follows ports); never an empty group.
pub fn split(plans: &[SwitchPlan], workers: usize) -> Vec<Vec<usize>> {
    let n = workers.clamp(1, plans.len().max(1));
    let mut order: Vec<usize> = (0..plans.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(plans[i].ports.len()));
    let mut groups: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); n];
    for i in order {
        let g = groups.iter_mut().min_by_key(|g| g.0).expect("at least one group");
        g.0 += plans[i].ports.len();
        g.1.push(i);
    }
    groups
        .into_iter()
        .map(|(_, mut g)| {
            g.sort_unstable();
            g
        })
        .collect()
}

/// Interfaces of the switches of one group, in port-index order.
pub fn group_specs(plans: &[SwitchPlan], group: &[usize]) -> Vec<PortSpec> {
    group.iter().flat_map(|&i| plans[i].ports.iter().map(|p| p.iface.clone())).collect()
}

/// One worker before it runs.
struct Worker<B: Backend> {
    backend: B,
    switches: Vec<LogicalSwitch>,
    sessions: Vec<control::SessionConfig>,
}

fn build<B: Backend>(
    backend: B,
    plans: &[SwitchPlan],
    group: &[usize],
    shared: &Shared,
) -> anyhow::Result<Worker<B>> {
    let mut switches = Vec::new();
    let mut sessions = Vec::new();
    let mut base = 0;
    for (local, &pi) in group.iter().enumerate() {
        let plan = &plans[pi];
        let mut ports = Vec::new();
        let mut infos = Vec::new();
        for (lp, p) in plan.ports.iter().enumerate() {
            let desc = &backend.ports()[base + lp];
            let mac = p.mac.unwrap_or(EthernetAddress(desc.mac));
            let Some(ip) = p.ip else { bail!("port {}:{} has no address", plan.name, p.port) };
            ports.push(PortConfig { name: p.port.clone(), ip, mac });
            let takes_gso = backend.takes_gso_frames(base + lp);
            let rx_rate_bps = shared.link_emu[pi].get(lp).and_then(|e| e.rx.as_ref()?.rate_bps);
            infos.push(PortInfo {
                name: p.port.clone(),
                ip: Some(ip),
                mac: Some(mac),
                takes_gso,
                rx_rate_bps,
            });
            info!(switch = %plan.name, port = %p.port, iface = %p.iface, %ip, %mac, "port");
        }
        let engine = SwitchEngine::new(SwitchEngineConfig {
            switch_id: plan.id,
            ports,
            ..SwitchEngineConfig::default()
        });
        let port_names = plan.ports.iter().map(|p| p.port.clone()).collect();
        let switch = LogicalSwitch::new(plan.id, plan.name.clone(), engine, base, port_names);
        sessions.push(control::SessionConfig {
            controller: shared.controller.clone(),
            token: shared.token.clone(),
            switch: local,
            switch_id: plan.id,
            name: plan.name.clone(),
            ports: infos,
            topology: shared.topology.clone(),
            orphan_timeout: shared.orphan_timeout,
            orphans: switch.orphans.clone(),
        });
        switches.push(switch);
        base += plan.ports.len();
    }
    Ok(Worker { backend, switches, sessions })
}

/// Run one worker per backend (`backends[i]` serves the switches `groups[i]` of
/// `plans`) until SIGINT/SIGTERM; returns the merged final counters.
pub fn run<B: Backend + 'static>(
    backends: Vec<B>,
    groups: &[Vec<usize>],
    plans: &[SwitchPlan],
    shared: &Shared,
) -> anyhow::Result<Value> {
    assert_eq!(backends.len(), groups.len(), "one backend per worker group");
    let shutdown = Arc::new(AtomicBool::new(false));
    let backend_name = backends.first().map(|b| b.name()).unwrap_or("none");
    let mut workers = Vec::new();
    for (b, g) in backends.into_iter().zip(groups) {
        workers.push(build(b, plans, g, shared)?);
    }
    let channels: Vec<(Sender<Command>, crossbeam_channel::Receiver<Command>)> =
        workers.iter().map(|_| crossbeam_channel::unbounded()).collect();
    let wakers: Vec<Waker> = workers.iter().map(|w| w.backend.waker()).collect();

    // SIGINT/SIGTERM: set the flag and wake every loop, which then return their counters.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    {
        let (flag, wakers) = (shutdown.clone(), wakers.clone());
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            for sig in signals.forever() {
                info!(signal = sig, "shutting down");
                flag.store(true, Ordering::Relaxed);
                wakers.iter().for_each(Waker::wake);
            }
        })?;
    }

    if let Some(addr) = &shared.stats_listen {
        let targets = channels.iter().map(|c| c.0.clone()).zip(wakers.iter().cloned()).collect();
        let local = stats::serve(addr, targets, backend_name)?;
        info!(addr = %local, "stats endpoint");
    }
    let mut capture = shared.capture.as_deref().map(Capture::create).transpose()?;
    let n = workers.len();
    let mut handles = Vec::new();
    for (wi, (w, (tx, rx))) in workers.into_iter().zip(channels).enumerate() {
        for s in w.sessions {
            control::spawn(s, tx.clone(), wakers[wi].clone(), shutdown.clone())?;
        }
        drop(tx);
        let el = EventLoop::new(w.backend, w.switches, rx, capture.take(), shutdown.clone())
            .with_busy_poll(shared.busy_poll);
        let handle = std::thread::Builder::new()
            .name(format!("worker-{wi}"))
            .spawn(move || el.run())
            .context("starting a worker thread")?;
        handles.push(handle);
    }
    info!(backend = backend_name, switches = plans.len(), workers = n, "switch running");
    let mut snaps = Vec::new();
    for h in handles {
        let snap = h.join().map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
        snaps.push(snap);
    }
    Ok(stats::merge(snaps, backend_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::PortArg;

    fn plan(name: &str, ports: usize) -> SwitchPlan {
        SwitchPlan {
            id: 0,
            name: name.into(),
            ports: (0..ports)
                .map(|i| PortArg {
                    switch: name.into(),
                    port: format!("p{i}"),
                    iface: format!("{name}{i}").parse().unwrap(),
                    ip: None,
                    mac: None,
                })
                .collect(),
        }
    }

    #[test]
    fn split_balances_ports_and_never_makes_empty_groups() {
        let plans = vec![plan("root", 2), plan("leaf1", 3), plan("leaf2", 3)];
        assert_eq!(split(&plans, 1), vec![vec![0, 1, 2]]);
        assert_eq!(split(&plans, 2), vec![vec![0, 1], vec![2]]);
        assert_eq!(split(&plans, 3), vec![vec![1], vec![2], vec![0]]);
        assert_eq!(split(&plans, 8).len(), 3);
        let specs = group_specs(&plans, &[0, 2]);
        let names: Vec<String> = specs.iter().map(|s| s.ifname.clone()).collect();
        assert_eq!(names, ["root0", "root1", "leaf20", "leaf21", "leaf22"]);
    }
}
