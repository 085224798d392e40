//! Faults on real processes in network namespaces (1-2-4 tree, af_packet switches, one
//! process per switch, userspace RoCEv2 hosts): lossy links, local send errors, garbage
//! into a running switch, a switch and a host killed mid-collective. Each test prints
//! what it measured. Skipped when not root or without `ip netns`; when CI=true a skip
//! is a failure. Run serially with the other end-to-end tests (scripts/nextest.toml).
//!
//! `INC_FAULTS_ITERS=N` times N iterations per loss-table cell (the report prints the
//! median); CI uses 1 to stay within a few minutes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use inc_tests::deploy::{Deployment, HostOutcome};
use inc_tests::inject::{make, Garbage, Injector, Sniffed, Sniffer, Target};
use inc_tests::netns::{assert_clean, skip_reason, unique_prefix};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const T124: &str = "topologies/1-2-4.yaml";
/// 16 MiB of INT32.
const COUNT_16M: u64 = 4 << 20;
const PROGRAMS: [&str; 3] = ["inccl-allreduce", "inccl-reduce", "inccl-broadcast"];
/// Op timeout of the hosts in the kill tests: the bound the errors must respect.
const OP_TIMEOUT_MS: u64 = 3000;

/// True if the tests can run; otherwise skips (listed by `scripts/test`) or, under CI,
/// fails.
fn can_run(tag: &str, tools: &[&str]) -> bool {
    let missing_tool = tools
        .iter()
        .find(|t| !inc_test_support::command_works("sh", &["-c", &format!("command -v {t}")]));
    let why =
        skip_reason(&PROGRAMS).or_else(|| missing_tool.map(|t| format!("`{t}` is not installed")));
    match why {
        None => true,
        Some(why) => {
            inc_test_support::skip(&format!("e2e_faults::{tag}"), &why);
            false
        }
    }
}

fn switch_names(d: &Deployment) -> Vec<String> {
    d.plan.switches.iter().map(|s| s.name.clone()).collect()
}

/// Sum of one link emulation counter over every port and direction of every switch.
fn emu_total(d: &Deployment, counter: &str) -> u64 {
    d.link_emu_counters().values().map(|c| c[counter].as_u64().unwrap_or(0)).sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn lossy_links_keep_collectives_exact() {
    if !can_run("loss", &[]) {
        return;
    }
    let iters: u32 =
        std::env::var("INC_FAULTS_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let iters_arg = iters.to_string();
    let levels = ["0", "0.1%", "1%", "5%"];
    let collectives: [(&str, &str, &[&str]); 3] = [
        ("allreduce", "inccl-allreduce", &[]),
        ("reduce", "inccl-reduce", &["--root", "2"]),
        ("broadcast", "inccl-broadcast", &["--root", "1"]),
    ];
    // level -> collective -> slowest rank's median time (ms)
    let mut times: Vec<Vec<f64>> = Vec::new();
    let mut losses = Vec::new();
    for (li, level) in levels.iter().enumerate() {
        let prefix = unique_prefix(&format!("l{li}"));
        let emu = format!("loss={level},seed={}", 11 + li);
        let d = Deployment::up(&prefix, T124, &[emu.as_str()]);
        let mut row = Vec::new();
        for (ci, (name, program, extra)) in collectives.iter().enumerate() {
            let mut args = extra.to_vec();
            args.extend(["--iters", iters_arg.as_str()]);
            let run = d.start_hosts(ci as u16, program, COUNT_16M, &args, &[]);
            let out = run.wait(Duration::from_secs(180));
            d.assert_all_pass(&format!("{name} with loss {level}"), &out);
            let slowest = out.iter().filter_map(HostOutcome::time_us).fold(0.0, f64::max);
            assert!(slowest > 0.0, "no time reported for {name}");
            row.push(slowest / 1000.0);
        }
        let (lost, offered) = (emu_total(&d, "lost"), emu_total(&d, "offered"));
        if *level != "0" {
            assert!(lost > 0, "loss {level}: the switches emulated no loss");
        }
        losses.push((lost, offered));
        times.push(row);
        drop(d);
        assert_clean(&prefix);
    }
    println!(
        "\nloss on every link (both directions), 16 MiB INT32 on 1-2-4, slowest rank, \
         median of {iters} iteration(s):"
    );
    println!(
        "{:>6} | {:>16} | {:>16} | {:>16} | {:>22}",
        "loss", "allreduce ms", "reduce ms", "broadcast ms", "frames lost/offered"
    );
    for (li, level) in levels.iter().enumerate() {
        let cells: Vec<String> = (0..3)
            .map(|ci| format!("{:>8.0} ({:>4.2}x)", times[li][ci], times[li][ci] / times[0][ci]))
            .collect();
        let (lost, offered) = losses[li];
        println!(
            "{:>6} | {:>16} | {:>16} | {:>16} | {:>22}",
            level,
            cells[0],
            cells[1],
            cells[2],
            format!("{lost}/{offered}")
        );
    }
    let slowdowns: Vec<f64> = (0..3).map(|ci| times[3][ci] / times[0][ci]).collect();
    println!("median slowdown at 5%: {:.2}x", median(slowdowns));
}

/// Per switch, per port and direction with link emulation: (lost, offered).
fn emu_ports(d: &Deployment) -> BTreeMap<(String, String, String), (u64, u64)> {
    d.link_emu_counters()
        .into_iter()
        .filter_map(|((sw, port, dir), c)| {
            Some(((sw, port, dir.to_string()), (c["lost"].as_u64()?, c["offered"].as_u64()?)))
        })
        .collect()
}

#[test]
fn loss_on_one_yaml_link_drops_on_that_link_only() {
    if !can_run("yaml-link", &[]) {
        return;
    }
    // 1-2-4 with `emulate:` on root -- leaf1 only, written next to the test's logs.
    let text = std::fs::read_to_string(inc_tests::netns::repo_root().join(T124)).unwrap();
    let lossy = r#"{ a: "root:d1", b: "leaf1:up", emulate: "loss=2%,seed=21" }"#;
    let text = text.replace(r#"{ a: "root:d1", b: "leaf1:up" }"#, lossy);
    assert!(text.contains("emulate"), "1-2-4.yaml no longer has the root:d1 -- leaf1:up link");
    let prefix = unique_prefix("yl");
    let dir = std::env::temp_dir().join(format!("inc-yaml-link-{prefix}"));
    std::fs::create_dir_all(&dir).unwrap();
    let topo = dir.join("1-2-4-lossy.yaml");
    std::fs::write(&topo, text).unwrap();
    let d = Deployment::up(&prefix, topo.to_str().unwrap(), &[]);
    for (ci, (program, extra)) in
        [("inccl-allreduce", &[][..]), ("inccl-broadcast", &["--root", "3"][..])].iter().enumerate()
    {
        let out =
            d.start_hosts(ci as u16, program, COUNT_16M, extra, &[]).wait(Duration::from_secs(180));
        d.assert_all_pass(&format!("{program} with loss on root -- leaf1"), &out);
    }
    let ports = emu_ports(&d);
    println!("\nloss=2% on link root:d1 -- leaf1:up only (from the topology), lost/offered:");
    for ((sw, port, dir), (lost, offered)) in &ports {
        println!("  {sw}:{port} {dir}: {lost}/{offered}");
    }
    // Exactly the two ends of that link emulate (each its sending direction), and lose.
    let keys: Vec<String> = ports.keys().map(|(s, p, d)| format!("{s}:{p}:{d}")).collect();
    assert_eq!(keys, ["leaf1:up:tx", "root:d1:tx"], "emulating ports");
    for (k, (lost, offered)) in &ports {
        assert!(*offered > 1000 && *lost > 0, "{k:?}: lost {lost} of {offered}");
    }
    drop(d);
    assert_clean(&prefix);
    let _ = std::fs::remove_dir_all(&dir);
}

fn nft_dropped(d: &Deployment, ns: &str, table: &str) -> u64 {
    let out = d.exec_in(ns, &["nft", "list", "table", "inet", table]);
    out.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in nft output:\n{out}"))
}

#[test]
fn firewall_drops_on_host_output_are_recovered() {
    if !can_run("nft", &["nft"]) {
        return;
    }
    let prefix = unique_prefix("nf");
    let d = Deployment::up(&prefix, T124, &[]);
    let table = "incfault";
    let hosts: Vec<String> = d.plan.hosts.iter().map(|h| h.ns.clone()).collect();
    for ns in &hosts {
        d.exec_in(ns, &["nft", "add", "table", "inet", table]);
        d.exec_in(
            ns,
            &[
                "nft",
                "add",
                "chain",
                "inet",
                table,
                "out",
                "{ type filter hook output priority 0 ; }",
            ],
        );
        // 2% of the RoCEv2 datagrams the host sends: sendmmsg fails with EPERM.
        d.exec_in(
            ns,
            &[
                "nft", "add", "rule", "inet", table, "out", "udp", "dport", "4791", "numgen",
                "random", "mod", "100", "<", "2", "counter", "drop",
            ],
        );
    }
    let t0 = Instant::now();
    let out =
        d.start_hosts(0, "inccl-allreduce", COUNT_16M, &[], &[]).wait(Duration::from_secs(180));
    d.assert_all_pass("allreduce with 2% of host output dropped", &out);
    let dropped: Vec<u64> = hosts.iter().map(|ns| nft_dropped(&d, ns, table)).collect();
    println!(
        "nftables dropped {dropped:?} datagrams on the hosts' output (EPERM); AllReduce of \
         16 MiB exact in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(dropped.iter().all(|&n| n > 0), "the firewall dropped nothing: {dropped:?}");
    drop(d);
    assert_clean(&prefix);
}

fn drops(stats: &Value) -> BTreeMap<String, u64> {
    stats["switches"][0]["engine"]["drops"]
        .as_object()
        .expect("drop counters")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
        .collect()
}

fn port_io(stats: &Value, port: &str, counter: &str) -> u64 {
    stats["switches"][0]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == port)
        .and_then(|p| p["io"][counter].as_u64())
        .unwrap_or_else(|| panic!("no io counter {counter} on port {port}"))
}

fn delta(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0))).collect()
}

/// Wait until switch `name` has a communicator installed and return its counters.
fn wait_for_comm(d: &Deployment, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = d.stats(name);
        if s["switches"][0]["engine"]["comms"].as_array().is_some_and(|c| !c.is_empty()) {
            return s;
        }
        assert!(Instant::now() < deadline, "no communicator on {name}:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn garbage_into_a_running_switch_is_dropped_and_counted() {
    if !can_run("garbage", &[]) {
        return;
    }
    let prefix = unique_prefix("gb");
    let d = Deployment::up(&prefix, T124, &[]);
    let (h0, h1) = (d.plan.hosts[0].clone(), d.plan.hosts[1].clone());
    let leaf = h0.switch.clone();
    // Long enough to outlast the paced garbage and the flood (about 1 s on a quiet
    // machine): a spoofed frame for a QPN that is already gone counts as unknown_qpn.
    let run = d.start_hosts(0, "inccl-allreduce", COUNT_16M, &["--iters", "20"], &[]);
    let stats = wait_for_comm(&d, &leaf);
    let comm = &stats["switches"][0]["engine"]["comms"][0];
    let conns = comm["connections"].as_array().expect("connections");
    let installed: Vec<u32> =
        conns.iter().filter_map(|c| c["local_qpn"].as_u64()).map(|q| q as u32).collect();
    let known_qpn = conns
        .iter()
        .find(|c| c["peer"]["host"]["rank"] == 0)
        .and_then(|c| c["local_qpn"].as_u64())
        .expect("connection of rank 0") as u32;
    let port = d.plan.port(&leaf, &h0.port).expect("h0's switch port in the plan").clone();
    let target = Target {
        port_mac: port.mac.0,
        port_ip: port.ip,
        host_mac: h0.mac.0,
        host_ip: h0.ip,
        spoof_ip: h1.ip,
        known_qpn,
        installed,
    };
    // Other hosts and the far end of the leaf's uplink would see a forwarded frame.
    let mut sniffers: Vec<Sniffer> =
        d.plan.hosts[1..].iter().map(|h| Sniffer::open(&h.ns, &h.ifname)).collect();
    let up = d.plan.ports.iter().find(|p| p.switch == leaf && p.port == "up").expect("uplink");
    let (root_ns, root_if) = d.plan.peer_of(&up.ns, &up.ifname).expect("uplink peer").clone();
    sniffers.push(Sniffer::open(&root_ns, &root_if));
    let mut inj = Injector::open(&h0.ns, &h0.ifname);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut buf = vec![0u8; 2048];

    // Paced: every frame should reach the switch, and then the counts match exactly. The
    // AllReduce shares the port's receive ring (64 slots, one per frame), so a switch
    // process kept off the CPU on a loaded machine can let it overflow (22 of 2,000 frames
    // once in CI, 40-70 beside three busy loops): a frame lost there is counted by the
    // ring, not by reason, and may as well have been the AllReduce's.
    let before = d.stats(&leaf);
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_kind: BTreeMap<Garbage, u64> = BTreeMap::new();
    for kind in Garbage::ALL {
        for i in 0..400 {
            let (len, reason) = make(kind, &target, &mut rng, &mut buf);
            inj.send(&buf[..len]);
            *expected.entry(reason.to_string()).or_default() += 1;
            *by_kind.entry(kind).or_default() += 1;
            if i % 32 == 31 {
                inj.flush();
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    inj.flush();
    std::thread::sleep(Duration::from_millis(300));
    let paced = d.stats(&leaf);
    let paced_drops = delta(&drops(&paced), &drops(&before));
    let ring_lost =
        port_io(&paced, &h0.port, "rx_dropped") - port_io(&before, &h0.port, "rx_dropped");

    // Flood: as fast as the injector goes, every kind mixed.
    let flood_start = Instant::now();
    let mut flood_expected: BTreeMap<String, u64> = BTreeMap::new();
    let flood = 100_000;
    for _ in 0..flood {
        let kind = Garbage::ALL[rng.gen_range(0..Garbage::ALL.len())];
        let (len, reason) = make(kind, &target, &mut rng, &mut buf);
        inj.send(&buf[..len]);
        *flood_expected.entry(reason.to_string()).or_default() += 1;
    }
    inj.flush();
    let flood_secs = flood_start.elapsed().as_secs_f64();
    let not_sent = inj.tx_dropped();
    let comms_after_flood =
        d.stats(&leaf)["switches"][0]["engine"]["comms"].as_array().map_or(0, Vec::len);
    assert!(
        comms_after_flood > 0,
        "the collective ended before the flood did (the expected counts assume it ran): \
         make it longer"
    );

    let out = run.wait(Duration::from_secs(180));
    d.assert_all_pass("allreduce under garbage", &out);
    std::thread::sleep(Duration::from_millis(300));
    let sniffed: Vec<Sniffed> = sniffers.into_iter().map(Sniffer::stop).collect();
    let after = d.stats(&leaf);
    let flood_drops = delta(&drops(&after), &drops(&paced));
    let flood_ring_lost =
        port_io(&after, &h0.port, "rx_dropped") - port_io(&paced, &h0.port, "rx_dropped");

    println!("\ngarbage into switch {leaf} port {} while a 20 x 16 MiB AllReduce ran:", h0.port);
    println!("  paced, by kind: {by_kind:?}");
    println!("  paced, expected drops by reason: {expected:?}");
    println!("  paced, counted drops by reason:  {paced_drops:?} (ring overflow {ring_lost})");
    println!(
        "  flood of {flood} frames in {flood_secs:.2} s ({:.0}/s, {not_sent} not sent): \
         expected {flood_expected:?}",
        flood as f64 / flood_secs
    );
    println!("  flood, counted: {flood_drops:?} (ring overflow {flood_ring_lost})");
    println!("  seen on the other hosts' links and the uplink's far end: {sniffed:?}");
    println!("  every rank's result exact");

    // Exact when the ring lost nothing; otherwise no reason over, and every frame
    // not counted by reason lost in the ring.
    for (reason, n) in &paced_drops {
        let want = expected.get(reason).copied().unwrap_or(0);
        if ring_lost == 0 {
            assert_eq!(*n, want, "paced garbage: drop reason {reason}");
        } else {
            assert!(*n <= want, "paced garbage: {n} drops for {reason}, {want} sent");
        }
    }
    let paced_sent: u64 = expected.values().sum();
    let paced_counted: u64 = paced_drops.values().sum();
    assert!(
        paced_counted + ring_lost >= paced_sent,
        "paced garbage: {paced_sent} sent, {paced_counted} counted, {ring_lost} lost in the ring"
    );
    let counted: u64 = flood_drops.values().sum();
    let sent: u64 = flood - not_sent;
    assert!(counted <= sent, "more drops ({counted}) than frames sent ({sent})");
    assert!(
        counted + flood_ring_lost >= sent,
        "flood: {sent} sent, {counted} counted, {flood_ring_lost} lost in the ring"
    );
    for (reason, n) in &flood_drops {
        let want = flood_expected.get(reason).copied().unwrap_or(0);
        assert!(*n <= want, "flood: {n} drops for {reason}, at most {want} expected");
    }
    for s in sniffed {
        assert!(s.frames > 0, "a sniffer saw nothing (is it on the right interface?)");
        assert_eq!(s.marked, 0, "an injected frame was forwarded");
    }
    drop(d);
    assert_clean(&prefix);
}

/// Kill-to-exit time of every rank of `out`, in seconds, given the kill offset.
fn exit_delays(out: &[HostOutcome], killed_at: Duration) -> Vec<(usize, f64)> {
    out.iter()
        .filter(|o| o.status.is_some())
        .map(|o| (o.rank, o.exited_after.saturating_sub(killed_at).as_secs_f64()))
        .collect()
}

fn bounded_errors(d: &Deployment, what: &str, out: &[HostOutcome], killed_at: Duration) {
    let bound = Duration::from_millis(OP_TIMEOUT_MS) * 3;
    for o in out.iter().filter(|o| o.status.is_some()) {
        assert!(!o.passed(), "{what}: rank {} passed?\n{}", o.rank, o.output);
        let waited = o.exited_after.saturating_sub(killed_at);
        assert!(
            waited <= bound,
            "{what}: rank {} took {waited:?} to fail (bound {bound:?}):\n{}",
            o.rank,
            o.output
        );
        let named =
            ["PSN", "port", "switch", "link", "connection"].iter().any(|w| o.output.contains(w));
        assert!(
            named,
            "{what}: rank {} error names no PSN or link:\n{}\n{}",
            o.rank,
            o.output,
            d.logs()
        );
    }
}

const LONG_RUN: [&str; 2] = ["--iters", "50"];

#[test]
fn a_killed_switch_gives_bounded_errors_and_a_restart_recovers() {
    if !can_run("kill-switch", &[]) {
        return;
    }
    let prefix = unique_prefix("ks");
    let mut d = Deployment::up(&prefix, T124, &[]);
    let victim = d.plan.hosts.last().expect("hosts").switch.clone();
    let timeout = OP_TIMEOUT_MS.to_string();
    let env = [("INCCL_OP_TIMEOUT_MS", timeout.as_str())];
    let run = d.start_hosts(0, "inccl-allreduce", COUNT_16M, &LONG_RUN, &env);
    wait_for_comm(&d, &victim);
    std::thread::sleep(Duration::from_millis(500));
    d.kill_switch(&victim);
    let killed_at = run.started().elapsed();
    let out = run.wait(Duration::from_secs(60));
    let delays = exit_delays(&out, killed_at);
    println!(
        "\nswitch {victim} killed mid-AllReduce: rank -> seconds from kill to error {delays:?}"
    );
    for o in &out {
        let line = o.output.lines().find(|l| l.contains("error")).unwrap_or("");
        println!("  rank {}: {line}", o.rank);
    }
    assert_eq!(delays.len(), out.len(), "every rank must exit by itself");
    bounded_errors(&d, "switch killed", &out, killed_at);

    d.start_switch(&victim);
    d.wait_registered(&victim);
    let out = d.start_hosts(1, "inccl-allreduce", 1 << 20, &[], &[]).wait(Duration::from_secs(120));
    d.assert_all_pass("allreduce after the switch restarted", &out);
    println!("after restarting {victim}: a new communicator passes");
    drop(d);
    assert_clean(&prefix);
}

#[test]
fn a_killed_host_gives_bounded_errors_and_the_switches_free_its_state() {
    if !can_run("kill-host", &[]) {
        return;
    }
    let prefix = unique_prefix("kh");
    let d = Deployment::up(&prefix, T124, &[]);
    let timeout = OP_TIMEOUT_MS.to_string();
    let env = [("INCCL_OP_TIMEOUT_MS", timeout.as_str())];
    let mut run = d.start_hosts(0, "inccl-allreduce", COUNT_16M, &LONG_RUN, &env);
    let victim = d.plan.hosts.len() - 1;
    wait_for_comm(&d, &d.plan.hosts[victim].switch);
    std::thread::sleep(Duration::from_millis(500));
    let held: Vec<u64> = switch_names(&d)
        .iter()
        .map(|s| {
            d.stats(s)["switches"][0]["engine"]["comms"][0]["memory_bytes"].as_u64().unwrap_or(0)
        })
        .collect();
    let t_kill = Instant::now();
    run.kill(victim);
    let killed_at = run.started().elapsed();
    let out = run.wait(Duration::from_secs(60));
    let delays = exit_delays(&out, killed_at);
    println!(
        "\nhost rank {victim} killed mid-AllReduce: rank -> seconds from kill to error {delays:?}"
    );
    for o in out.iter().filter(|o| o.status.is_some()) {
        let line = o.output.lines().find(|l| l.contains("error")).unwrap_or("");
        println!("  rank {}: {line}", o.rank);
    }
    assert_eq!(delays.len(), out.len() - 1, "every surviving rank must exit by itself");
    bounded_errors(&d, "host killed", &out, killed_at);

    // Rank 0 exited, so the controller destroys the group and its communicator.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left: Vec<(String, Value)> = switch_names(&d)
            .into_iter()
            .map(|s| {
                let st = d.stats(&s);
                (s, st["switches"][0]["engine"]["comms"].clone())
            })
            .filter(|(_, c)| c.as_array().is_some_and(|a| !a.is_empty()))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "switches still hold communicators: {left:?}\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "switches held {held:?} bytes for the communicator; all freed {:.2} s after the kill",
        t_kill.elapsed().as_secs_f64()
    );
    drop(d);
    assert_clean(&prefix);
}
