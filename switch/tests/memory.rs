//! Switch memory follows its communicators (issue [19] item 6): a real `inc-switch`
//! process (every switch of 1-2-4, memory backend: no interfaces, no root) grows by at
//! most what the controller accounted for a big communicator (`CommMemory`) and
//! shrinks back to near its idle size once the communicator is destroyed. RSS is read
//! from `/proc/PID/status` of the switch process, so nothing else of the test counts.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inc_controller::compiler::{compile, Allocator, CommunicatorSpec};
use inc_controller::{demo_ranks, Controller, ServiceConfig, Topology};
use inc_ctrl_proto::ControllerClient;
use inc_protocol::Time;
use inc_switch_engine::{PortConfig, SwitchEngine, SwitchEngineConfig};
use inc_topology::CommMemory;

const T: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;

/// The window of the big communicator: with mtu 4096 on 1-2-4 the controller accounts
/// 466 MiB for it over the three switches. `INC_SWITCH_MEMORY_WINDOW` runs another
/// (by hand: 16384 is the case of the issue, about 1.9 GiB accounted).
const WINDOW: u32 = 4096;
/// How far above its idle RSS the switch may stay once the communicator is gone.
const SLACK: u64 = 16 * MIB;

/// Kills the switch process however the test ends.
struct Switch(Child);

impl Drop for Switch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Switch {
    /// `(VmRSS, VmHWM)` in bytes.
    fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap();
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            kib * 1024
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {T:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn window() -> u32 {
    std::env::var("INC_SWITCH_MEMORY_WINDOW").map_or(WINDOW, |w| w.parse().expect("a window"))
}

/// What the engine says it holds for a communicator (slot pools and send-queue frame
/// buffers, `memory_bytes`) stays within what the controller accounts for it
/// (`CommMemory`), for every switch of the shipped trees and a range of mtus and
/// windows.
#[test]
fn the_engine_holds_no_more_than_the_controller_accounts() {
    for name in ["1-4", "1-2-4", "3-level"] {
        let path = format!("{}/../topologies/{name}.yaml", env!("CARGO_MANIFEST_DIR"));
        let mut topo = Topology::load(&path).unwrap();
        for s in &mut topo.switches {
            s.max_slot_memory = u64::MAX;
            s.max_host_memory = u64::MAX;
        }
        let hosts: Vec<_> = topo.hosts.iter().map(|h| h.addr.ip).collect();
        for (k, (mtu, window)) in
            [(256, 1), (1024, 64), (4096, 64), (4096, 1000), (2048, 4096)].into_iter().enumerate()
        {
            let spec = CommunicatorSpec {
                comm_id: k as u32 + 1,
                ranks: demo_ranks(&hosts),
                mtu: Some(mtu),
                window: Some(window),
            };
            let compiled = compile(&topo, &spec, &mut Allocator::new(), 3).unwrap();
            for rules in &compiled.rules {
                let sw = &topo.switches[topo.switch_by_id(rules.switch_id).unwrap()];
                let ports = sw
                    .ports
                    .iter()
                    .map(|p| PortConfig { name: p.name.clone(), ip: p.addr.ip, mac: p.mac })
                    .collect();
                let mut engine = SwitchEngine::new(SwitchEngineConfig {
                    switch_id: sw.id,
                    ports,
                    ..SwitchEngineConfig::default()
                });
                engine.install(rules, Time::ZERO).unwrap();
                let held = engine.counters().memory_bytes();
                let accounted = CommMemory::of_rules(rules).total();
                assert!(
                    held <= accounted,
                    "{name}, switch {}, mtu {mtu}, window {window}: engine holds {held}, accounted {accounted}",
                    sw.name
                );
                engine.remove(rules.comm_id).unwrap();
                assert_eq!(engine.counters().memory_bytes(), 0);
            }
        }
    }
}

#[test]
fn a_big_communicator_is_accounted_and_its_memory_returned() {
    let window = window();
    // 1-2-4 with room for the big communicator (the shipped limits refuse it: 256 MiB).
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../topologies/1-2-4.yaml");
    let yaml = std::fs::read_to_string(shipped).unwrap().replace(
        "    ports:\n",
        "    max_slot_memory: 2147483648\n    max_host_memory: 2147483648\n    ports:\n",
    );
    let dir = std::env::temp_dir().join(format!("inc-switch-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("1-2-4-big.yaml");
    std::fs::write(&file, yaml).unwrap();
    let topo = Topology::load(&file).unwrap();
    assert!(topo.switches.iter().all(|s| s.max_slot_memory == 2 << 30));

    let ctrl = Controller::start(ServiceConfig::insecure(topo.clone()), "127.0.0.1:0").unwrap();
    let addr = ctrl.local_addr().to_string();
    let log = std::fs::File::create(dir.join("switch.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_inc-switch"))
        .args(["run", "--backend", "memory", "--controller", &addr, "--topology"])
        .arg(&file)
        .args(["--switch", "root", "--switch", "leaf1", "--switch", "leaf2"])
        .env_remove(inc_ctrl_proto::TOKEN_ENV)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let switch = Switch(child);
    wait_for("three switches registered", || {
        ctrl.status().switches.iter().filter(|s| s.connected).count() == 3
    });
    std::thread::sleep(Duration::from_millis(200));
    let (idle, _) = switch.rss();

    let hosts: Vec<_> = topo.hosts.iter().map(|h| h.addr.ip).collect();
    let mut client = ControllerClient::connect(addr.as_str(), T).unwrap();
    let group = client.register_group(None, hosts.clone(), T).unwrap();
    let (comm, _) =
        client.create_communicator(group, demo_ranks(&hosts), Some(4096), Some(window), T).unwrap();
    let accounted: u64 = topo
        .switches
        .iter()
        .map(|s| {
            let connections = s.ports.len(); // every port of 1-2-4 carries one connection
            CommMemory::new(4096, window, 2 * u64::from(window), connections).total()
        })
        .sum();
    let (with_comm, _) = switch.rss();

    client.destroy_communicator(comm, T).unwrap();
    // The switch acknowledges the removal, possibly after the reply to the host.
    wait_for("communicator gone", || ctrl.status().communicators.is_empty());
    let mut after = u64::MAX;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        after = switch.rss().0;
        if after <= idle + SLACK {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, peak) = switch.rss();
    println!(
        "switch RSS: idle {} MiB, with the communicator {} MiB (peak {} MiB; accounted {} MiB), after removal {} MiB",
        idle / MIB,
        with_comm / MIB,
        peak / MIB,
        accounted / MIB,
        after / MIB
    );
    assert!(peak - idle <= accounted, "grew by more than accounted: {peak} - {idle} > {accounted}");
    assert!(
        after <= idle + SLACK,
        "RSS {} MiB after removal, idle {} MiB (bound: idle + {} MiB)",
        after / MIB,
        idle / MIB,
        SLACK / MIB
    );
    drop(switch);
    ctrl.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
