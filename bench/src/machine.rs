//! What machine a run measured: its description, and what the kernel charges for the
//! things the emulator does most on a small machine (system calls, giving up the CPU,
//! waking a sleeping process). INC / MPI ratios move with these from one machine to
//! the next: on 2 CPUs every process of the emulation (ranks, switch) shares them, and
//! the same AllGather has measured 0.97 x MPI on one 2-vCPU VM and 2.0 x on another.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Barrier;
use std::time::Instant;

use serde::Serialize;

/// One line: CPUs and model, memory, kernel, load average.
pub fn describe() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cpus = cpuinfo.lines().filter(|l| l.starts_with("processor")).count();
    let mem = read("/proc/meminfo")
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse::<u64>()
        .unwrap_or(0);
    format!(
        "{cpus} x {model}, {:.0} GiB RAM, Linux {}, load average at start {}",
        mem as f64 / 1048576.0,
        read("/proc/sys/kernel/osrelease").trim(),
        read("/proc/loadavg").split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    )
}

/// Costs of scheduling on this machine, in microseconds, each the median of three
/// batches (taken before the namespaces come up, so with only what else runs here).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SchedulingCosts {
    /// One trivial system call (`getpid`).
    pub syscall_us: f64,
    /// One switch between two threads on one CPU that take turns with `sched_yield`
    /// (what a busy-polling rank pays per empty poll when others wait for the CPU).
    pub yield_switch_us: f64,
    /// One round trip between two threads on one CPU, each sleeping in `read` on a
    /// socket until the other writes (two wake-ups and two switches).
    pub wakeup_rtt_same_cpu_us: f64,
    /// The same across two CPUs (the wake-up then interrupts the other CPU); `None` on
    /// a machine with one CPU or where threads cannot be placed.
    pub wakeup_rtt_cross_cpu_us: Option<f64>,
}

const SYSCALLS: u32 = 50_000;
const YIELDS: u32 = 20_000;
const ROUND_TRIPS: u32 = 5_000;

impl SchedulingCosts {
    /// Measures; under a second. `None` if threads cannot be pinned to the first CPU
    /// this process may use (affinity refused).
    pub fn measure() -> Option<SchedulingCosts> {
        let cpus = usable_cpus();
        let first = *cpus.first()?;
        Some(SchedulingCosts {
            syscall_us: median3(|| {
                let t = Instant::now();
                for _ in 0..SYSCALLS {
                    std::hint::black_box(std::process::id());
                }
                Some(per(t, SYSCALLS))
            }),
            yield_switch_us: median3(|| yield_pair(first)),
            wakeup_rtt_same_cpu_us: median3(|| ping_pong(first, first)),
            wakeup_rtt_cross_cpu_us: cpus
                .get(1)
                .map(|&second| median3(|| ping_pong(first, second)))
                .filter(|us| us.is_finite()),
        })
        .filter(|c| c.yield_switch_us.is_finite() && c.wakeup_rtt_same_cpu_us.is_finite())
    }

    /// For the run's notes.
    pub fn describe(&self) -> String {
        let cross =
            self.wakeup_rtt_cross_cpu_us.map_or("-".to_string(), |us| format!("{us:.1} us"));
        format!(
            "scheduling costs on this machine: system call {:.2} us, switch by sched_yield \
             {:.2} us, wake-up round trip on one CPU {:.1} us, across CPUs {cross} (threads; \
             busy polling pays the switch per empty poll, sleeping the wake-ups)",
            self.syscall_us, self.yield_switch_us, self.wakeup_rtt_same_cpu_us
        )
    }
}

/// Median of three runs of `f`; a run that fails counts as infinitely slow.
fn median3(mut f: impl FnMut() -> Option<f64>) -> f64 {
    let mut v: Vec<f64> = (0..3).map(|_| f().unwrap_or(f64::INFINITY)).collect();
    v.sort_by(f64::total_cmp);
    v[1]
}

/// Microseconds per operation since `t`.
fn per(t: Instant, n: u32) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

/// CPUs this process may run on, in order.
fn usable_cpus() -> Vec<usize> {
    // Safety: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most
    // size_of::<cpu_set_t>() bytes into it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        set
    };
    // Safety: CPU_ISSET reads the set within its size (the index is below CPU_SETSIZE).
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Pins the calling thread to `cpu`; false if refused.
fn pin(cpu: usize) -> bool {
    // Safety: a zeroed cpu_set_t is a valid empty set, CPU_SET stays within it (cpu came
    // from usable_cpus, below CPU_SETSIZE), and sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Runs `timed` on a thread pinned to `a` and `partner` on one pinned to `b`, both
/// started together (so that neither runs alone for long); `timed`'s result, `None` if
/// either thread could not be pinned. Never the caller's thread: the processes this
/// run starts later inherit its affinity.
fn on_two_cpus<T: Send>(
    a: usize,
    b: usize,
    timed: impl FnOnce() -> Option<T> + Send,
    partner: impl FnOnce() -> Option<()> + Send,
) -> Option<T> {
    let start = Barrier::new(2);
    std::thread::scope(|s| {
        let start = &start;
        let other = s.spawn(move || {
            let pinned = pin(b);
            start.wait();
            partner().filter(|()| pinned)
        });
        let mine = s.spawn(move || {
            let pinned = pin(a);
            start.wait();
            timed().filter(|_| pinned)
        });
        let result = mine.join().ok()?;
        other.join().ok()??;
        result
    })
}

/// Two threads on `cpu` yielding to each other: time per switch.
fn yield_pair(cpu: usize) -> Option<f64> {
    let yields = || {
        for _ in 0..YIELDS {
            std::thread::yield_now();
        }
    };
    on_two_cpus(
        cpu,
        cpu,
        || {
            let t = Instant::now();
            yields();
            Some(per(t, 2 * YIELDS))
        },
        || {
            yields();
            Some(())
        },
    )
}

/// A byte sent back and forth between a thread on `a` and one on `b`, each blocking in
/// `read`: time per round trip.
fn ping_pong(a: usize, b: usize) -> Option<f64> {
    let (mut near, mut far) = UnixStream::pair().ok()?;
    on_two_cpus(
        a,
        b,
        move || {
            let mut byte = [0u8];
            let t = Instant::now();
            for _ in 0..ROUND_TRIPS {
                near.write_all(&byte).ok()?;
                near.read_exact(&mut byte).ok()?;
            }
            Some(per(t, ROUND_TRIPS))
        },
        move || {
            let mut byte = [0u8];
            for _ in 0..ROUND_TRIPS {
                far.read_exact(&mut byte).ok()?;
                far.write_all(&byte).ok()?;
            }
            Some(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_positive_and_ordered() {
        let Some(c) = SchedulingCosts::measure() else {
            // Only where this process may not place its threads (a cpuset without them).
            let cpus = usable_cpus();
            assert!(cpus.is_empty() || std::thread::spawn(move || !pin(cpus[0])).join().unwrap());
            return;
        };
        assert!(c.syscall_us > 0.0 && c.syscall_us < 1_000.0, "{c:?}");
        assert!(c.yield_switch_us > 0.0, "{c:?}");
        // A round trip is two wake-ups and two switches at least: never cheaper than a
        // system call.
        assert!(c.wakeup_rtt_same_cpu_us > c.syscall_us, "{c:?}");
        if let Some(cross) = c.wakeup_rtt_cross_cpu_us {
            assert!(cross > c.syscall_us, "{c:?}");
        }
        let line = c.describe();
        assert!(line.contains("system call") && line.contains("across CPUs"), "{line}");
    }

    #[test]
    fn the_description_names_cpus_and_kernel() {
        let d = describe();
        assert!(d.contains(" x ") && d.contains("Linux"), "{d}");
    }
}
