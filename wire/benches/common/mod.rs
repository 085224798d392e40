//! Timing helper shared by the benches.

use std::time::{Duration, Instant};

/// Runs `f` repeatedly for about `budget`, returning the best per-call time of 5 rounds.
pub fn best_per_call(budget: Duration, mut f: impl FnMut()) -> Duration {
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let mut n = 0u32;
        while start.elapsed() < budget / 5 {
            for _ in 0..64 {
                f();
            }
            n += 64;
        }
        best = best.min(start.elapsed() / n);
    }
    best
}
