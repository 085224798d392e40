//! A child process run to completion within a bound: its output read by two pipe
//! readers (so a chatty child never blocks on a full pipe), its whole process group
//! sent SIGTERM at the deadline (scripts tear down in their traps) and SIGKILL after a
//! grace period. Used to run the project's scripts from end-to-end tests.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Outcome of one bounded run.
#[derive(Debug)]
pub struct RunOutcome {
    /// Exit status (`None` if it had to be stopped at the deadline).
    pub status: Option<ExitStatus>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl RunOutcome {
    /// True if the child exited 0 before the deadline.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Everything printed, for assertion messages.
    pub fn transcript(&self) -> String {
        format!(
            "status: {:?} after {:.0?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// Run `cmd` (stdout and stderr captured, in a new process group) for at most
/// `deadline`; then SIGTERM to the group, and SIGKILL `grace` later.
pub fn run_bounded(mut cmd: Command, deadline: Duration, grace: Duration) -> RunOutcome {
    let what = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out_t = reader(Box::new(child.stdout.take().expect("piped")));
    let err_t = reader(Box::new(child.stderr.take().expect("piped")));
    let start = Instant::now();
    let group = format!("-{}", child.id());
    let mut status = None;
    let mut termed = false;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            if !termed {
                status = Some(s);
            }
            break;
        }
        let elapsed = start.elapsed();
        if elapsed > deadline && !termed {
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            termed = true;
        }
        if elapsed > deadline + grace {
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    RunOutcome {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
        elapsed: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_status_are_collected() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = run_bounded(c, Duration::from_secs(30), Duration::from_secs(1));
        assert_eq!(o.status.and_then(|s| s.code()), Some(3));
        assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("out\n", "err\n"));
        assert!(!o.success());
    }

    #[test]
    fn a_child_past_its_deadline_is_stopped_with_its_group() {
        let mut c = Command::new("sh");
        // The grandchild holds the pipes open: the group kill must reach it.
        c.args(["-c", "sleep 30 & sleep 30; echo never"]);
        let o = run_bounded(c, Duration::from_millis(300), Duration::from_secs(2));
        assert!(o.status.is_none(), "{}", o.transcript());
        assert!(o.elapsed < Duration::from_secs(10), "{:?}", o.elapsed);
        assert!(!o.stdout.contains("never"));
    }
}
