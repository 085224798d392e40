//! Seed selection and the one-line reproduction command of a failing case.
//!
//! - `INC_SIM_SEED=N` runs only seed `N` (reproduce a failure).
//! - `INC_SIM_CASES=K` runs `K` seeds instead of the test's default (soak runs).
//! - `INC_SIM_MTU=M` gives every communicator payload size `M` instead of the
//!   topology's default (tests that draw their own sizes keep drawing them).

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Environment variable naming the one seed to run.
pub const SEED_VAR: &str = "INC_SIM_SEED";
/// Environment variable overriding the number of seeds.
pub const CASES_VAR: &str = "INC_SIM_CASES";
/// Environment variable overriding the communicators' payload size.
pub const MTU_VAR: &str = "INC_SIM_MTU";

/// The seeds a test runs: `INC_SIM_SEED` alone if set, else `0..INC_SIM_CASES` (or
/// `0..default_cases`).
///
/// # Panics
/// If a variable is set but is not a number (naming the variable).
pub fn seeds(default_cases: u64) -> Vec<u64> {
    if let Some(seed) = env_u64(SEED_VAR) {
        return vec![seed];
    }
    (0..env_u64(CASES_VAR).unwrap_or(default_cases)).collect()
}

/// The payload size `INC_SIM_MTU` asks for, if set.
///
/// # Panics
/// If it is set but is not a number (naming the variable).
pub fn mtu_override() -> Option<u16> {
    env_u64(MTU_VAR).map(|m| u16::try_from(m).unwrap_or_else(|_| panic!("{MTU_VAR}={m} too large")))
}

fn env_u64(var: &str) -> Option<u64> {
    let v = std::env::var(var).ok()?;
    Some(v.trim().parse().unwrap_or_else(|_| panic!("{var}={v:?} is not a number")))
}

/// The command that re-runs one seed of one test of the `sim` test binary.
pub fn repro_line(test: &str, seed: u64) -> String {
    let mtu = mtu_override().map_or(String::new(), |m| format!("{MTU_VAR}={m} "));
    format!(
        "reproduce: {mtu}{SEED_VAR}={seed} cargo test -p inc-tests --test sim -- {test} --exact"
    )
}

/// Runs `case` for every seed of [`seeds`]; on the first failure (an `Err` or a panic,
/// e.g. inside an engine) prints the reproduction line and panics with the cause.
/// Returns the per-seed results.
pub fn run_seeds<R>(
    test: &str,
    default_cases: u64,
    mut case: impl FnMut(u64) -> Result<R, String>,
) -> Vec<R> {
    let mut out = Vec::new();
    for seed in seeds(default_cases) {
        let result = catch_unwind(AssertUnwindSafe(|| case(seed)));
        let cause = match result {
            Ok(Ok(r)) => {
                out.push(r);
                continue;
            }
            Ok(Err(msg)) => msg,
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .map_or_else(|| "panic".to_string(), |s| format!("panic: {s}")),
        };
        eprintln!("{}", repro_line(test, seed));
        panic!("{test} failed at seed {seed}: {cause}\n{}", repro_line(test, seed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repro_line_names_seed_and_test() {
        assert_eq!(
            repro_line("allreduce_1_2_4", 42),
            "reproduce: INC_SIM_SEED=42 cargo test -p inc-tests --test sim -- allreduce_1_2_4 --exact"
        );
    }

    #[test]
    fn failures_and_panics_carry_the_seed() {
        // Only meaningful when the environment does not pin a seed.
        if std::env::var(SEED_VAR).is_ok() || std::env::var(CASES_VAR).is_ok() {
            return;
        }
        let ok = run_seeds("t", 3, |s| Ok::<_, String>(s * 2));
        assert_eq!(ok, vec![0, 2, 4]);
        let err =
            catch_unwind(|| run_seeds("t", 5, |s| if s == 3 { Err("bad".into()) } else { Ok(()) }))
                .unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.contains("seed 3: bad") && msg.contains("INC_SIM_SEED=3"), "{msg}");
        let err = catch_unwind(|| {
            run_seeds("t", 5, |s| -> Result<(), String> {
                assert!(s < 1, "boom");
                Ok(())
            })
        })
        .unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.contains("seed 1: panic: boom"), "{msg}");
    }
}
