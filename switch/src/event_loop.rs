//! The switch event loop: one thread drives every logical switch of the process over
//! one backend. Wait for receive readiness, a command or the earliest engine timeout;
//! receive a batch → `handle_frame`; due timers → `handle_timeout`; drain
//! `poll_transmit` straight into backend transmit buffers; flush.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use inc_ctrl_proto::{HeldCommunicator, Origin, SwitchRules, Verdict};
use inc_protocol::{Outgoing, Time};
use inc_switch_engine::SwitchEngine;
use inc_switch_io::Backend;
use serde::Serialize;
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::capture::Capture;

/// Frames handed over per receive batch before timers and transmit get a turn.
const RX_BUDGET: usize = 256;

/// A request to the event loop from another thread (controller session, stats server).
#[derive(Debug)]
pub enum Command {
    /// Install (or replace) a communicator on switch `switch` (index).
    Install {
        /// Logical switch index.
        switch: usize,
        /// Rules pushed by the controller.
        rules: Box<SwitchRules>,
        /// Where they come from (kept, reported when registering again).
        origin: Option<Origin>,
        /// Outcome, to acknowledge or reject the push.
        reply: Sender<Result<(), String>>,
    },
    /// Remove a communicator (one the switch does not hold counts as removed).
    Remove {
        /// Logical switch index.
        switch: usize,
        /// Communicator id.
        comm_id: u32,
        /// Outcome.
        reply: Sender<Result<(), String>>,
    },
    /// The switch registered with a controller that does not judge held
    /// communicators: drop every communicator it held.
    Reset {
        /// Logical switch index.
        switch: usize,
    },
    /// What the switch holds, to report when it registers.
    Held {
        /// Logical switch index.
        switch: usize,
        /// The held communicators.
        reply: Sender<Vec<HeldCommunicator>>,
    },
    /// The controller's verdict on the held communicators `reported`: keep the owned
    /// ones, keep the orphaned ones as orphans, drop the rest.
    Verdict {
        /// Logical switch index.
        switch: usize,
        /// The communicators that were reported.
        reported: Vec<u32>,
        /// The verdict.
        verdict: Verdict,
    },
    /// The controller connection is lost: every communicator is an orphan until a
    /// controller vouches for it again.
    Orphan {
        /// Logical switch index.
        switch: usize,
    },
    /// Free orphans idle for `idle` (no frame received on any of their connections);
    /// replies with their ids.
    Sweep {
        /// Logical switch index.
        switch: usize,
        /// The orphan idle timeout.
        idle: Duration,
        /// Ids freed.
        reply: Sender<Vec<u32>>,
    },
    /// Snapshot of every counter.
    Stats {
        /// Where to send the snapshot.
        reply: Sender<Value>,
    },
}

/// One logical switch of the topology.
#[derive(Debug)]
pub struct LogicalSwitch {
    /// Topology id.
    pub id: u32,
    /// Topology name.
    pub name: String,
    /// The sans-IO engine.
    pub engine: SwitchEngine,
    /// Backend port index of this switch's port 0; its ports are contiguous.
    pub port_base: usize,
    /// Port names, in engine order.
    pub port_names: Vec<String>,
    /// Installed communicators.
    pub communicators: BTreeMap<u32, Held>,
    /// Orphans among them, shared with the controller session (which sweeps them
    /// while there are any).
    pub orphans: Arc<AtomicUsize>,
    /// Orphans freed after their idle timeout, since start.
    pub orphans_expired: u64,
}

impl LogicalSwitch {
    /// A switch with nothing installed.
    pub fn new(
        id: u32,
        name: String,
        engine: SwitchEngine,
        port_base: usize,
        port_names: Vec<String>,
    ) -> Self {
        LogicalSwitch {
            id,
            name,
            engine,
            port_base,
            port_names,
            communicators: BTreeMap::new(),
            orphans: Arc::new(AtomicUsize::new(0)),
            orphans_expired: 0,
        }
    }

    /// Frames received on each communicator's connections so far.
    fn activity(&self) -> HashMap<u32, u64> {
        let counters = self.engine.counters();
        counters
            .comms
            .iter()
            .map(|c| (c.comm_id, c.connections.iter().map(|k| k.rx_data + k.rx_control).sum()))
            .collect()
    }

    /// Make `comm_id` an orphan (its idle clock starts now) or take it back.
    fn set_orphan(&mut self, comm_id: u32, orphan: bool, activity: &HashMap<u32, u64>) {
        if let Some(h) = self.communicators.get_mut(&comm_id) {
            if orphan && !h.orphaned {
                h.last_active = Instant::now();
                h.activity = activity.get(&comm_id).copied().unwrap_or(0);
            }
            h.orphaned = orphan;
        }
    }

    fn count_orphans(&self) {
        let n = self.communicators.values().filter(|h| h.orphaned).count();
        self.orphans.store(n, Ordering::Relaxed);
    }

    fn drop_comm(&mut self, comm_id: u32, why: &str) {
        if self.communicators.remove(&comm_id).is_some() {
            if let Err(e) = self.engine.remove(comm_id) {
                warn!(switch = %self.name, comm = comm_id, error = %e, "remove failed");
            }
            info!(switch = %self.name, comm = comm_id, "communicator removed: {why}");
        }
    }
}

/// A communicator a switch holds.
#[derive(Debug)]
pub struct Held {
    /// Its rules.
    pub rules: SwitchRules,
    /// Where they came from.
    pub origin: Option<Origin>,
    /// No controller vouches for it (the connection is lost, or a restarted controller
    /// adopted it without an owner): freed when idle for the orphan timeout.
    pub orphaned: bool,
    /// When a frame was last seen on it (checked at sweeps).
    pub last_active: Instant,
    /// Frames received on its connections at the last check.
    pub activity: u64,
}

/// Counters of the loop itself.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct LoopCounters {
    /// Loop iterations.
    pub iterations: u64,
    /// Times the loop blocked in the backend.
    pub waits: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Engine timer expiries handled.
    pub timeouts: u64,
    /// Commands processed.
    pub commands: u64,
    /// Frames on a port no switch owns (should stay 0).
    pub unowned_frames: u64,
    /// Idle turns that found a frame while busy-polling, instead of sleeping.
    pub busy_poll_hits: u64,
}

/// How a busy poll ended.
enum Polled {
    /// A frame is waiting.
    Frame,
    /// A command came or shutdown was asked for.
    Interrupted,
    /// The bound passed: sleep.
    Nothing,
}

/// The event loop over backend `B`.
#[derive(Debug)]
pub struct EventLoop<B: Backend> {
    backend: B,
    switches: Vec<LogicalSwitch>,
    /// Backend port -> (switch index, engine port, frames arrive intact).
    port_map: Vec<Option<(usize, usize, bool)>>,
    commands: Receiver<Command>,
    capture: Option<Capture>,
    shutdown: Arc<AtomicBool>,
    start: Instant,
    busy_poll: Duration,
    counters: LoopCounters,
}

impl<B: Backend> EventLoop<B> {
    /// A loop over `backend` serving `switches` (whose port ranges must lie inside the
    /// backend's ports).
    pub fn new(
        backend: B,
        switches: Vec<LogicalSwitch>,
        commands: Receiver<Command>,
        capture: Option<Capture>,
        shutdown: Arc<AtomicBool>,
    ) -> Self {
        let mut port_map = vec![None; backend.ports().len()];
        for (si, s) in switches.iter().enumerate() {
            for lp in 0..s.port_names.len() {
                let port = s.port_base + lp;
                port_map[port] = Some((si, lp, backend.rx_intact(port)));
            }
        }
        EventLoop {
            backend,
            switches,
            port_map,
            commands,
            capture,
            shutdown,
            start: Instant::now(),
            busy_poll: Duration::ZERO,
            counters: LoopCounters::default(),
        }
    }

    /// Before sleeping, poll the backend for up to `d` (less if a timer falls due
    /// sooner), giving the CPU to other runnable threads between checks. On a machine
    /// whose cores also run the hosts, a switch that sleeps pays a wake-up for every
    /// frame a host sends, and each host one for its result: for small collectives that
    /// is most of the time. Zero (the default) never busy-polls; backends that cannot
    /// tell cheaply whether a frame waits ([`Backend::rx_ready`]) are never busy-polled.
    pub fn with_busy_poll(mut self, d: Duration) -> Self {
        self.busy_poll = d;
        self
    }

    fn now(&self) -> Time {
        Time::from_nanos(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Run until the shutdown flag is set; returns the final counter snapshot.
    pub fn run(mut self) -> anyhow::Result<Value> {
        while !self.shutdown.load(Ordering::Relaxed) {
            self.turn()?;
        }
        if let Some(c) = self.capture.as_mut() {
            c.finish();
        }
        Ok(self.snapshot())
    }

    /// One iteration: commands, receive, timers, transmit, then block if idle.
    pub fn turn(&mut self) -> anyhow::Result<()> {
        self.counters.iterations += 1;
        while let Ok(cmd) = self.commands.try_recv() {
            self.counters.commands += 1;
            self.command(cmd);
        }

        let now = self.now();
        let received = {
            let EventLoop { backend, switches, port_map, capture, counters, .. } = self;
            backend.recv_batch(RX_BUDGET, &mut |port, frame| {
                if let Some(c) = capture.as_mut() {
                    c.frame(frame);
                }
                match port_map.get(port).copied().flatten() {
                    Some((s, lp, false)) => switches[s].engine.handle_frame(now, lp, frame),
                    Some((s, lp, true)) => switches[s].engine.handle_intact_frame(now, lp, frame),
                    None => counters.unowned_frames += 1,
                }
            })?
        };
        self.counters.rx_frames += received as u64;

        let now = self.now();
        for s in &mut self.switches {
            if s.engine.poll_timeout().is_some_and(|t| t <= now) {
                s.engine.handle_timeout(now);
                self.counters.timeouts += 1;
            }
        }
        self.transmit(now)?;
        self.events();

        if received >= RX_BUDGET {
            return Ok(()); // more frames are waiting: no sleep
        }
        let next = self.switches.iter().filter_map(|s| s.engine.poll_timeout()).min();
        let now = self.now();
        let timeout = match next {
            Some(t) if t <= now => return Ok(()),
            Some(t) => Some(t - now),
            None => None,
        };
        match self.busy_poll(timeout) {
            Polled::Frame => {
                self.counters.busy_poll_hits += 1;
                return Ok(());
            }
            Polled::Interrupted => return Ok(()),
            Polled::Nothing => {}
        }
        self.counters.waits += 1;
        self.backend.wait(timeout)?;
        Ok(())
    }

    /// Busy-polls for a received frame (see [`Self::with_busy_poll`]).
    fn busy_poll(&self, timeout: Option<Duration>) -> Polled {
        if self.busy_poll.is_zero() {
            return Polled::Nothing;
        }
        let limit = timeout.map_or(self.busy_poll, |t| t.min(self.busy_poll));
        let t0 = Instant::now();
        loop {
            match self.backend.rx_ready() {
                None => return Polled::Nothing,
                Some(true) => return Polled::Frame,
                Some(false) => {}
            }
            if !self.commands.is_empty() || self.shutdown.load(Ordering::Relaxed) {
                return Polled::Interrupted;
            }
            if t0.elapsed() >= limit {
                return Polled::Nothing;
            }
            std::thread::yield_now();
        }
    }

    /// Drain every engine's transmit queue into the backend and flush: requests as
    /// their send queues hold them, the rest written into backend buffers.
    fn transmit(&mut self, now: Time) -> anyhow::Result<()> {
        let EventLoop { backend, switches, capture, counters, .. } = self;
        for s in switches.iter_mut() {
            loop {
                if backend.tx_buffer().is_none() {
                    backend.flush()?;
                }
                let Some(buf) = backend.tx_buffer() else { break };
                let Some(t) = s.engine.poll_transmit_frame(now, buf) else { break };
                let port = s.port_base + t.port;
                match t.frame {
                    Outgoing::Written(len) => {
                        if let Some(c) = capture.as_mut() {
                            c.frame(&buf[..len]);
                        }
                        backend.commit_tx(port, len);
                    }
                    Outgoing::Queued(frame) => {
                        if let Some(c) = capture.as_mut() {
                            c.frame(&frame);
                        }
                        backend.commit_frame(port, frame);
                    }
                }
                counters.tx_frames += 1;
            }
        }
        backend.flush()?;
        Ok(())
    }

    /// Log engine events (rare: connection failures, operation mismatches).
    fn events(&mut self) {
        for s in &mut self.switches {
            while let Some(ev) = s.engine.poll_event() {
                info!(switch = %s.name, event = ?ev, "switch event");
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        let held_before = self.held();
        self.command_inner(cmd);
        if self.held() < held_before {
            // Removed communicators freed their slot pools and send queues: give the
            // pages back (glibc would keep them), so the process shrinks to what the
            // communicators left need.
            inc_switch_io::alloc::release_free_memory();
        }
    }

    /// Communicators held over all switches of this loop.
    fn held(&self) -> usize {
        self.switches.iter().map(|s| s.communicators.len()).sum()
    }

    fn command_inner(&mut self, cmd: Command) {
        let now = self.now();
        match cmd {
            Command::Install { switch, rules, origin, reply } => {
                let s = &mut self.switches[switch];
                let res = if rules.switch_id != s.id {
                    Err(format!(
                        "rules for switch {} pushed to switch {} ({})",
                        rules.switch_id, s.id, s.name
                    ))
                } else {
                    s.engine.install(&rules, now).map_err(|e| e.to_string())
                };
                match &res {
                    Ok(()) => {
                        for c in &rules.connections {
                            let host = matches!(c.peer, inc_ctrl_proto::Peer::Host { .. });
                            let port = s.port_names.iter().position(|n| *n == c.port);
                            if let (true, Some(lp)) = (host, port) {
                                self.backend.set_host_port(s.port_base + lp);
                            }
                        }
                        let held = Held {
                            rules: (*rules).clone(),
                            origin,
                            orphaned: false,
                            last_active: Instant::now(),
                            activity: 0,
                        };
                        s.communicators.insert(rules.comm_id, held);
                        s.count_orphans();
                        info!(switch = %s.name, comm = rules.comm_id, "communicator installed");
                    }
                    Err(e) => {
                        warn!(switch = %s.name, comm = rules.comm_id, error = %e, "install refused")
                    }
                }
                let _ = reply.send(res);
            }
            Command::Remove { switch, comm_id, reply } => {
                let s = &mut self.switches[switch];
                // Not held (freed as an idle orphan, or never installed): removed already.
                let res = match s.communicators.remove(&comm_id) {
                    Some(_) => s.engine.remove(comm_id).map_err(|e| e.to_string()),
                    None => Ok(()),
                };
                s.count_orphans();
                info!(switch = %s.name, comm = comm_id, ok = res.is_ok(), "communicator removed");
                let _ = reply.send(res);
            }
            Command::Reset { switch } => {
                let s = &mut self.switches[switch];
                let held: Vec<u32> = s.communicators.keys().copied().collect();
                for comm in held {
                    s.drop_comm(comm, "the controller re-pushes what is live");
                }
                s.count_orphans();
            }
            Command::Held { switch, reply } => {
                let s = &self.switches[switch];
                let held = s
                    .communicators
                    .values()
                    .map(|h| HeldCommunicator { rules: h.rules.clone(), origin: h.origin.clone() })
                    .collect();
                let _ = reply.send(held);
            }
            Command::Verdict { switch, reported, verdict } => {
                let s = &mut self.switches[switch];
                let activity = s.activity();
                for comm in reported {
                    if verdict.owned.contains(&comm) {
                        s.set_orphan(comm, false, &activity);
                    } else if verdict.orphaned.contains(&comm) {
                        s.set_orphan(comm, true, &activity);
                    } else {
                        s.drop_comm(comm, "the controller does not keep it");
                    }
                }
                s.count_orphans();
            }
            Command::Orphan { switch } => {
                let s = &mut self.switches[switch];
                let activity = s.activity();
                let held: Vec<u32> = s.communicators.keys().copied().collect();
                for comm in held {
                    s.set_orphan(comm, true, &activity);
                }
                s.count_orphans();
            }
            Command::Sweep { switch, idle, reply } => {
                let s = &mut self.switches[switch];
                let activity = s.activity();
                let now = Instant::now();
                let mut expired = Vec::new();
                for (id, h) in &mut s.communicators {
                    let a = activity.get(id).copied().unwrap_or(0);
                    if a != h.activity {
                        h.activity = a;
                        h.last_active = now;
                    }
                    if h.orphaned && now.duration_since(h.last_active) >= idle {
                        expired.push(*id);
                    }
                }
                for comm in &expired {
                    s.drop_comm(
                        *comm,
                        &format!("orphan idle for --orphan-idle-timeout ({idle:?})"),
                    );
                    s.orphans_expired += 1;
                }
                s.count_orphans();
                let _ = reply.send(expired);
            }
            Command::Stats { reply } => {
                let _ = reply.send(self.snapshot());
            }
        }
    }

    /// Every counter as JSON: loop, backend ports, engines.
    pub fn snapshot(&mut self) -> Value {
        let uptime = self.start.elapsed();
        let mut switches = Vec::new();
        for s in &self.switches {
            let mut ports = Vec::new();
            for (lp, name) in s.port_names.iter().enumerate() {
                let gp = s.port_base + lp;
                let desc = &self.backend.ports()[gp];
                let iface = desc.spec.label();
                let mac = inc_wire::EthernetAddress(desc.mac).to_string();
                let c = self.backend.port_counters(gp);
                let detail = self.backend.port_detail(gp);
                let mut port = json!({
                    "name": name, "iface": iface, "mac": mac, "io": c, "detail": detail,
                });
                if let Some(emu) = self.backend.link_emu_stats(gp) {
                    port["link_emu"] = serde_json::to_value(emu).unwrap_or(Value::Null);
                }
                ports.push(port);
            }
            let engine = s.engine.counters();
            switches.push(json!({
                "switch_id": s.id,
                "name": s.name,
                "communicators": s.communicators.keys().collect::<Vec<_>>(),
                "orphans": {
                    "held": s.communicators.values().filter(|h| h.orphaned).count(),
                    "expired": s.orphans_expired,
                },
                "slot_memory_bytes": engine.memory_bytes(),
                "ports": ports,
                "engine": serde_json::to_value(engine).unwrap_or(Value::Null),
            }));
        }
        json!({
            "backend": self.backend.name(),
            "uptime_s": uptime.as_secs_f64(),
            "loop": self.counters,
            "capture_frames": self.capture.as_ref().map(Capture::frames),
            "switches": switches,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use inc_switch_engine::{PortConfig, SwitchEngineConfig};
    use inc_switch_io::memory::{MemoryBackend, MemoryNet};
    use inc_wire::EthernetAddress;

    use super::*;

    const PORT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x11];
    const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x99];

    fn arp_request(target: Ipv4Addr, sender: Ipv4Addr) -> Vec<u8> {
        let mut f = Vec::with_capacity(42);
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&HOST_MAC);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
        f.extend_from_slice(&HOST_MAC);
        f.extend_from_slice(&sender.octets());
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&target.octets());
        f
    }

    type Started =
        (MemoryNet, Sender<Command>, Arc<AtomicBool>, Waker, std::thread::JoinHandle<Value>);

    /// Two logical switches (one port each) over one memory backend, loop on a thread.
    fn start() -> Started {
        start_polling(Duration::ZERO)
    }

    /// [`start`] with `busy_poll`.
    fn start_polling(busy_poll: Duration) -> Started {
        let specs = vec!["a0".parse().unwrap(), "b0".parse().unwrap()];
        let (backend, net) = MemoryBackend::new(specs, 64);
        let switches = (0..2u32)
            .map(|i| {
                let engine = SwitchEngine::new(SwitchEngineConfig {
                    switch_id: i + 1,
                    ports: vec![PortConfig {
                        name: "p0".into(),
                        ip: Ipv4Addr::new(10, 0, i as u8, 1),
                        mac: EthernetAddress(PORT_MAC),
                    }],
                    ..SwitchEngineConfig::default()
                });
                LogicalSwitch::new(
                    i + 1,
                    format!("s{}", i + 1),
                    engine,
                    i as usize,
                    vec!["p0".into()],
                )
            })
            .collect();
        let (tx, rx) = crossbeam_channel::unbounded();
        let shutdown = Arc::new(AtomicBool::new(false));
        let waker = backend.waker();
        let el =
            EventLoop::new(backend, switches, rx, None, shutdown.clone()).with_busy_poll(busy_poll);
        let h = std::thread::spawn(move || el.run().unwrap());
        (net, tx, shutdown, waker, h)
    }

    /// A loop that busy-polls takes frames without sleeping, and still answers a
    /// command and the shutdown flag at once however long its poll bound.
    #[test]
    fn busy_polling_loop_takes_frames_without_sleeping() {
        let (net, tx, shutdown, waker, h) = start_polling(Duration::from_secs(3600));
        for sender in [7, 8] {
            let arp = arp_request(Ipv4Addr::new(10, 0, 1, 1), Ipv4Addr::new(10, 0, 1, sender));
            net.inject(1, &arp);
            net.recv_timeout(Duration::from_secs(5)).expect("ARP reply");
        }
        let (rtx, rrx) = crossbeam_channel::bounded(1);
        tx.send(Command::Stats { reply: rtx }).unwrap();
        let snap = rrx.recv_timeout(Duration::from_secs(5)).expect("stats while polling");
        assert_eq!(snap["loop"]["waits"], 0, "never slept");
        assert!(snap["loop"]["busy_poll_hits"].as_u64().unwrap() >= 1, "{}", snap["loop"]);
        shutdown.store(true, Ordering::Relaxed);
        let t = Instant::now();
        h.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "shutdown while polling");
        drop(waker);
    }

    use inc_switch_io::Waker;

    #[test]
    fn answers_arp_on_the_right_logical_switch_and_stops_on_flag() {
        let (net, tx, shutdown, waker, h) = start();
        // Port 1 belongs to switch s2, whose port IP is 10.0.1.1.
        net.inject(1, &arp_request(Ipv4Addr::new(10, 0, 1, 1), Ipv4Addr::new(10, 0, 1, 7)));
        let (port, reply) = net.recv_timeout(Duration::from_secs(5)).expect("ARP reply");
        assert_eq!(port, 1);
        assert_eq!(&reply[..6], &HOST_MAC);
        assert_eq!(&reply[20..22], &[0, 2], "ARP reply opcode");
        assert_eq!(&reply[22..28], &PORT_MAC);
        assert_eq!(&reply[28..32], &[10, 0, 1, 1]);
        // Not ours: no answer.
        net.inject(0, &arp_request(Ipv4Addr::new(10, 0, 1, 1), Ipv4Addr::new(10, 0, 0, 7)));
        assert!(net.recv_timeout(Duration::from_millis(200)).is_none());

        let (rtx, rrx) = crossbeam_channel::bounded(1);
        tx.send(Command::Stats { reply: rtx }).unwrap();
        waker.wake();
        let snap = rrx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(snap["loop"]["rx_frames"], 2);
        assert_eq!(snap["loop"]["tx_frames"], 1);
        assert_eq!(snap["switches"][1]["ports"][0]["io"]["tx_packets"], 1);

        shutdown.store(true, Ordering::Relaxed);
        waker.wake();
        let last = h.join().unwrap();
        assert_eq!(last["backend"], "memory");
    }

    #[test]
    fn rules_for_another_switch_are_refused_with_both_ids() {
        let (_net, tx, shutdown, waker, h) = start();
        let rules = SwitchRules {
            comm_id: 5,
            switch_id: 9,
            world_size: 1,
            mtu: 1024,
            window: 4,
            slots: 8,
            parent: None,
            connections: Vec::new(),
        };
        let (rtx, rrx) = crossbeam_channel::bounded(1);
        let install =
            Command::Install { switch: 0, rules: Box::new(rules), origin: None, reply: rtx };
        tx.send(install).unwrap();
        waker.wake();
        let err = rrx.recv_timeout(Duration::from_secs(5)).unwrap().unwrap_err();
        assert!(err.contains("switch 9") && err.contains("switch 1"), "{err}");
        shutdown.store(true, Ordering::Relaxed);
        waker.wake();
        h.join().unwrap();
    }
}
