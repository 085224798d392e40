//! Frame-rate references on the INC data path (first host -> last host, through every
//! switch namespace on the way), with frames of the INC data size: dpdk-testpmd
//! io-forwarding in each switch namespace, and the kernel's own IPv4 forwarding. The
//! generator is dpdk-testpmd txonly in the first host; frames are counted on the last
//! host's interface.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::kernel::KernelForwarding;
use crate::model::FrameRate;
use crate::netns::{if_counters, Plan};
use crate::procs::{check_interrupted, cpu_seconds, in_ns, tail, Proc};

fn testpmd(ns: &str, ifaces: &[&str], app_args: &[String], log: &Path) -> anyhow::Result<Proc> {
    let mut cmd = in_ns(ns, "dpdk-testpmd");
    // No hugepages, no PCI, nothing shared between instances; both cores allowed (the
    // scheduler places the busy-polling lcore, as it does for the INC switch thread).
    cmd.args(["--no-huge", "-m", "256", "--no-pci", "--in-memory", "--lcores", "0@(0-1),1@(0-1)"]);
    for (i, ifn) in ifaces.iter().enumerate() {
        cmd.arg(format!("--vdev=net_af_packet{i},iface={ifn}"));
    }
    cmd.arg("--").args(app_args).args(["--nb-cores=1", "--stats-period=1"]).stdin(Stdio::null());
    Proc::spawn(&format!("dpdk-testpmd in {ns}"), &mut cmd, Some(log))
}

/// Is dpdk-testpmd installed?
pub fn have_testpmd() -> bool {
    std::process::Command::new("dpdk-testpmd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Measure one forwarding path for `seconds`: `forwarders` already running (their CPU
/// time is counted) or the kernel (`forwarders` empty).
fn measure(
    plan: &Plan,
    system: &str,
    frame_len: u32,
    seconds: f64,
    forwarders: &mut [Proc],
    logs: &Path,
) -> anyhow::Result<FrameRate> {
    let (src, dst) = (&plan.hosts[0], &plan.hosts[plan.hosts.len() - 1]);
    let hops = plan.path(src, dst)?;
    let gw = plan.port(&hops[0].0, &hops[0].1)?;
    let gen_log = logs.join(format!("{system}-generator.log"));
    let mut generator = testpmd(
        &src.ns,
        &[src.ifname.as_str()],
        &[
            "--forward-mode=txonly".into(),
            "--port-topology=loop".into(),
            format!("--txpkts={frame_len}"),
            format!("--tx-ip={},{}", src.ip, dst.ip),
            format!("--eth-peer=0,{}", gw.mac),
        ],
        &gen_log,
    )?;
    // testpmd takes a moment to initialise; measure only steady traffic.
    let warm = Instant::now();
    let mut last = if_counters(&dst.ns, &dst.ifname)?.rx_packets;
    loop {
        check_interrupted()?;
        std::thread::sleep(Duration::from_millis(500));
        if !generator.running() {
            bail!("the testpmd generator exited:\n{}", tail(&gen_log, 15));
        }
        for f in forwarders.iter_mut() {
            if !f.running() {
                bail!("{} exited", f.name);
            }
        }
        let now = if_counters(&dst.ns, &dst.ifname)?.rx_packets;
        if now > last + 1000 || warm.elapsed() > Duration::from_secs(15) {
            break;
        }
        last = now;
    }
    let pids: Vec<u32> = forwarders.iter().map(Proc::pid).collect();
    let cpu0: f64 = pids.iter().filter_map(|p| cpu_seconds(*p).ok()).sum();
    let (tx0, rx0) = (
        if_counters(&src.ns, &src.ifname)?.tx_packets,
        if_counters(&dst.ns, &dst.ifname)?.rx_packets,
    );
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let (tx1, rx1) = (
        if_counters(&src.ns, &src.ifname)?.tx_packets,
        if_counters(&dst.ns, &dst.ifname)?.rx_packets,
    );
    let dt = t0.elapsed().as_secs_f64();
    let cpu1: f64 = pids.iter().filter_map(|p| cpu_seconds(*p).ok()).sum();
    generator.stop(Duration::from_secs(3));
    let delivered = (rx1 - rx0) as f64 / dt;
    Ok(FrameRate {
        system: system.to_string(),
        round: 0,
        frame_len,
        hops: hops.len() as u32,
        offered_fps: (tx1 - tx0) as f64 / dt,
        delivered_fps: delivered,
        forwarded_fps: delivered * hops.len() as f64,
        forwarder_cores: if pids.is_empty() { 0.0 } else { (cpu1 - cpu0) / dt },
        status: if rx1 > rx0 { "ok".into() } else { "FAIL: no frame arrived".into() },
    })
}

/// dpdk-testpmd io forwarding in every switch namespace on the path.
pub fn testpmd_io(
    plan: &Plan,
    frame_len: u32,
    seconds: f64,
    logs: &Path,
) -> anyhow::Result<FrameRate> {
    let (src, dst) = (&plan.hosts[0], &plan.hosts[plan.hosts.len() - 1]);
    let mut fwd = Vec::new();
    for (sw, inp, out) in plan.path(src, dst)? {
        let ns = &plan.switches.iter().find(|s| s.name == sw).context("switch")?.ns;
        let inp_if = &plan.port(&sw, &inp)?.ifname;
        let out_if = &plan.port(&sw, &out)?.ifname;
        fwd.push(testpmd(
            ns,
            &[inp_if.as_str(), out_if.as_str()],
            &["--forward-mode=io".into()],
            &logs.join(format!("testpmd-{sw}.log")),
        )?);
    }
    let r = measure(plan, "testpmd-io", frame_len, seconds, &mut fwd, logs);
    for mut f in fwd {
        f.stop(Duration::from_secs(3));
    }
    r
}

/// The kernel's IPv4 forwarding in the switch namespaces.
pub fn kernel(plan: &Plan, frame_len: u32, seconds: f64, logs: &Path) -> anyhow::Result<FrameRate> {
    let _fwd = KernelForwarding::enable(plan)?;
    measure(plan, "kernel-forwarding", frame_len, seconds, &mut [], logs)
}
