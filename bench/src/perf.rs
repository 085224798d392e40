//! Optional `perf` profiles of the switch process and of rank 0 during one message size.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use crate::procs::Proc;

/// Two running `perf record`s.
#[derive(Debug)]
pub struct Profile {
    dir: PathBuf,
    recorders: Vec<(String, Proc)>,
}

impl Profile {
    /// Attach `perf record -g` to the switch and to rank 0.
    pub fn start(dir: &Path, switch_pid: u32, host_pid: u32) -> anyhow::Result<Profile> {
        std::fs::create_dir_all(dir)?;
        let mut recorders = Vec::new();
        for (name, pid) in [("switch", switch_pid), ("host-rank0", host_pid)] {
            let data = dir.join(format!("{name}.perf.data"));
            let p = Proc::spawn(
                &format!("perf record ({name})"),
                Command::new("perf")
                    .args(["record", "-g", "-F", "999", "-o"])
                    .arg(&data)
                    .args(["-p", &pid.to_string()])
                    .stdin(Stdio::null()),
                Some(&dir.join(format!("{name}.perf.log"))),
            )
            .context("starting perf (is it installed?)")?;
            recorders.push((name.to_string(), p));
        }
        Ok(Profile { dir: dir.to_path_buf(), recorders })
    }

    /// Stop recording and write `NAME.perf.txt` summaries (top symbols, self time).
    pub fn finish(mut self) -> anyhow::Result<()> {
        for (_, p) in &mut self.recorders {
            p.signal(libc::SIGINT);
        }
        for (name, p) in &mut self.recorders {
            for _ in 0..100 {
                if !p.running() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let report = Command::new("perf")
                .args(["report", "--stdio", "--no-children", "--percent-limit", "0.5"])
                .args(["--sort", "comm,dso,symbol", "-g", "none", "-i"])
                .arg(self.dir.join(format!("{name}.perf.data")))
                .stderr(Stdio::null())
                .output()
                .context("running perf report")?;
            std::fs::write(self.dir.join(format!("{name}.perf.txt")), &report.stdout)?;
        }
        Ok(())
    }
}
