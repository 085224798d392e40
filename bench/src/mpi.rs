//! The host-based reference: OpenMPI (TCP BTL) with one rank per host namespace, over
//! the same veths with kernel forwarding in the switch namespaces. The benchmark
//! program (bench/mpi/inc_mpi_bench.c) is compiled with mpicc into the output directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::netns::Plan;
use crate::procs::{check_interrupted, tail, Proc};

const SOURCE: &str = include_str!("../mpi/inc_mpi_bench.c");
const NSEXEC: &str = include_str!("../mpi/nsexec.sh");
const NSRSH: &str = include_str!("../mpi/nsrsh.sh");

/// Force Open MPI's ring AllReduce (coll/tuned algorithm 4).
pub const RING: [(&str, &str); 2] =
    [("coll_tuned_use_dynamic_rules", "1"), ("coll_tuned_allreduce_algorithm", "4")];

/// Force Open MPI's ring AllGather (coll/tuned algorithm 4).
pub const RING_ALLGATHER: [(&str, &str); 2] =
    [("coll_tuned_use_dynamic_rules", "1"), ("coll_tuned_allgather_algorithm", "4")];

/// One size of an MPI run.
#[derive(Debug, Clone)]
pub struct MpiRow {
    /// Message bytes.
    pub bytes: u64,
    /// Warm-up iterations.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
    /// Wrong elements over all ranks and iterations.
    pub wrong: u64,
    /// Per-iteration time, slowest rank (us).
    pub times_us: Vec<f64>,
}

/// A prepared MPI harness (files, agent, compiled program).
#[derive(Debug)]
pub struct Mpi {
    dir: PathBuf,
    bin: PathBuf,
    first_host: String,
    world: usize,
    ifname: String,
}

impl Mpi {
    /// Write the name-resolution files, hostfile and launch agent into `dir`; compile the
    /// benchmark with mpicc.
    pub fn prepare(plan: &Plan, prefix: &str, dir: &Path) -> anyhow::Result<Mpi> {
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let d = dir.to_string_lossy();
        let mut hosts = String::from("127.0.0.1 localhost\n");
        let mut hostfile = String::new();
        for h in &plan.hosts {
            hosts += &format!("{} {}\n", h.ip, h.name);
            hostfile += &format!("{} slots=1\n", h.name);
        }
        std::fs::write(dir.join("hosts"), hosts)?;
        std::fs::write(dir.join("resolv.conf"), "")?;
        std::fs::write(dir.join("hostfile"), hostfile)?;
        for (name, text) in [("nsexec", NSEXEC), ("nsrsh", NSRSH)] {
            let path = dir.join(name);
            std::fs::write(&path, text.replace("@PREFIX@", prefix).replace("@DIR@", &d))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
        let src = dir.join("inc_mpi_bench.c");
        std::fs::write(&src, SOURCE)?;
        let bin = dir.join("inc_mpi_bench");
        let out = Command::new("mpicc")
            // -march=native: the half types' MPI_Op converts with F16C where the CPU has it.
            .args(["-O2", "-march=native", "-Wall", "-o"])
            .arg(&bin)
            .arg(&src)
            .output()
            .context("cannot run mpicc (install openmpi-bin and libopenmpi-dev)")?;
        if !out.status.success() {
            bail!("mpicc failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Mpi {
            dir,
            bin,
            first_host: plan.hosts[0].name.clone(),
            world: plan.hosts.len(),
            ifname: plan.hosts[0].ifname.clone(),
        })
    }

    /// Run `kind` (allreduce, reducescatter, allgather or barrier) of `dtype` with `op`
    /// for each (bytes, warm-up, iterations); for reducescatter and allgather the bytes
    /// are S, the whole vector, which the program rounds down to whole blocks (the rows
    /// report the bytes it used).
    pub fn run(
        &self,
        kind: &str,
        dtype: &str,
        op: &str,
        sizes: &[(u64, u32, u32)],
        extra_mca: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Vec<MpiRow>> {
        let list: Vec<String> = sizes.iter().map(|(b, w, i)| format!("{b}:{w}:{i}")).collect();
        let out = log.with_extension("out");
        let mut cmd = Command::new(self.dir.join("nsexec"));
        cmd.arg(&self.first_host)
            .args(["mpirun", "-np", &self.world.to_string(), "--hostfile"])
            .arg(self.dir.join("hostfile"))
            .args(["--map-by", "node", "--bind-to", "none", "--mca", "plm_rsh_agent"])
            .arg(self.dir.join("nsrsh"))
            .args(["--mca", "plm_rsh_no_tree_spawn", "1"])
            .args(["--mca", "oob_tcp_if_include", &self.ifname])
            // tcp,self only: every namespace shares /dev/shm, so vader would bypass the network.
            .args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"])
            .args(["--mca", "btl_tcp_if_include", &self.ifname])
            // Four busy-polling ranks on two cores: yield, or small messages take ms.
            .args(["--mca", "mpi_yield_when_idle", "1"]);
        for (k, v) in extra_mca {
            cmd.args(["--mca", k, v]);
        }
        cmd.arg(&self.bin)
            .args(["-k", kind, "-d", dtype, "-o", op, "-s", &list.join(",")])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(log)?);
        let mut p = Proc::spawn("mpirun", &mut cmd, None)?;
        let bytes: f64 = sizes.iter().map(|(b, w, i)| *b as f64 * f64::from(w + i)).sum();
        let budget =
            60.0 + bytes / 5e6 + sizes.iter().map(|s| f64::from(s.1 + s.2)).sum::<f64>() * 0.02;
        let deadline = Instant::now() + Duration::from_secs_f64(budget);
        while p.running() {
            if let Err(e) = check_interrupted() {
                p.stop(Duration::from_secs(2));
                return Err(e);
            }
            if Instant::now() > deadline {
                p.stop(Duration::from_secs(3));
                bail!("mpirun did not finish within {budget:.0} s:\n{}", tail(log, 10));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = p.child.wait()?;
        let rows = parse(&std::fs::read_to_string(&out)?);
        if rows.len() != sizes.len() {
            bail!(
                "mpirun ({status}) reported {} of {} sizes:\n{}",
                rows.len(),
                sizes.len(),
                tail(log, 10)
            );
        }
        Ok(rows)
    }
}

/// Parse the `row` / `times` lines of the MPI program.
pub fn parse(text: &str) -> Vec<MpiRow> {
    let mut rows: Vec<MpiRow> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match f.first().copied() {
            Some("row") if f.len() >= 8 => rows.push(MpiRow {
                bytes: num(3),
                warmup: num(5) as u32,
                iters: num(6) as u32,
                wrong: num(7),
                times_us: vec![],
            }),
            Some("times") => {
                if let Some(r) = rows.last_mut() {
                    r.times_us = f.iter().skip(2).filter_map(|t| t.parse().ok()).collect();
                }
            }
            _ => {}
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rows_and_times() {
        let rows = parse("junk\nrow allreduce int32 16 4 1 2 0\ntimes 16 101.5 99.0\nrow barrier - 0 0 1 1 3\ntimes 0 7.0\n");
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].bytes, rows[0].warmup, rows[0].iters, rows[0].wrong), (16, 1, 2, 0));
        assert_eq!(rows[0].times_us, vec![101.5, 99.0]);
        assert_eq!(rows[1].wrong, 3);
    }
}
