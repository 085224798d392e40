//! Processes the benchmark starts: in a namespace, in their own process group, stopped
//! by process-group id when dropped; CPU time from /proc; Ctrl-C.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Set by SIGINT/SIGTERM; long waits give up and the guards tear down.
pub fn interrupted() -> &'static Arc<AtomicBool> {
    static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Install the SIGINT/SIGTERM handler.
pub fn install_signal_handler() -> anyhow::Result<()> {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupted().clone())
            .context("installing signal handlers")?;
    }
    Ok(())
}

/// Fail if the user interrupted the run.
pub fn check_interrupted() -> anyhow::Result<()> {
    if interrupted().load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    Ok(())
}

/// Run a command to completion, output to `log`; error with the log's tail on failure.
pub fn run_quiet(cmd: &mut Command, log: &Path) -> anyhow::Result<()> {
    let f = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f)
        .status()
        .with_context(|| format!("cannot run {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} exited with {status}:\n{}", cmd.get_program(), tail(log, 20));
    }
    Ok(())
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Run `args` (program first) to completion; its standard error in the error if it
/// fails.
pub fn run_checked(args: &[String]) -> anyhow::Result<()> {
    let out = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// A command run inside namespace `ns` (`ip netns exec` execs it: same pid).
pub fn in_ns(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

/// A started process (and its process group), stopped on drop.
#[derive(Debug)]
pub struct Proc {
    /// What it is, for messages.
    pub name: String,
    /// The child.
    pub child: Child,
}

impl Proc {
    /// Start `cmd` in a new process group; stdout and stderr to `log` unless the caller
    /// set them.
    pub fn spawn(name: &str, cmd: &mut Command, log: Option<&Path>) -> anyhow::Result<Proc> {
        if let Some(log) = log {
            let f =
                File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
            cmd.stdout(f.try_clone()?).stderr(f);
        }
        let child = cmd.process_group(0).spawn().with_context(|| format!("cannot start {name}"))?;
        Ok(Proc { name: name.to_string(), child })
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM the group, wait up to `grace`, then SIGKILL. Returns the exit status.
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal(libc::SIGKILL);
        self.child.wait().ok()
    }

    /// Send `sig` to the process group.
    pub fn signal(&self, sig: i32) {
        let pgid = self.child.id() as i32;
        // Safety: kill(2) with a negative pid signals the process group this process
        // created for the child (process_group(0)); no memory is involved.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            self.stop(Duration::from_secs(3));
        } else {
            // Children of a finished leader (e.g. orted) may still live in the group.
            self.signal(libc::SIGKILL);
        }
    }
}

/// User plus system CPU seconds of process `pid` (from /proc/PID/stat).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is gone"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Safety: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11) + ticks(12)) as f64 / hz)
}

/// Resident set size of `pid` in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Poll `ok` every 100 ms until it returns true or `secs` pass.
pub fn wait_until(secs: u64, what: &str, mut ok: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        check_interrupted()?;
        if Instant::now() > deadline {
            bail!("timed out after {secs} s waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_of_this_process_is_readable() {
        let t = cpu_seconds(std::process::id()).unwrap();
        assert!(t >= 0.0);
        assert!(rss_bytes(std::process::id()) > 0);
        assert!(cpu_seconds(u32::MAX).is_err());
    }

    #[test]
    fn stopping_a_group_ends_it() {
        let mut p = Proc::spawn("sleep", Command::new("sleep").arg("30"), None).unwrap();
        assert!(p.running());
        assert!(p.stop(Duration::from_secs(2)).is_some());
        assert!(!p.running());
    }
}
