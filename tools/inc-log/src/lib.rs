//! The one logging setup shared by `inc-switch`, `inc-controller`, the host programs and
//! INCCL's C ABI: `tracing` events to stderr (never stdout, which carries results and
//! JSON), filtered by an environment variable with `tracing_subscriber`'s `EnvFilter`
//! syntax (`info`, `inc_switch=debug,warn`, ...), colour only on a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Logs to stderr with the filter in `$env_var`, or `default` when it is unset or invalid.
/// A second call (or another subscriber already set) is ignored.
pub fn init(env_var: &str, default: &str) {
    let filter = EnvFilter::try_from_env(env_var).unwrap_or_else(|_| EnvFilter::new(default));
    install(filter);
}

/// Logs to stderr only if `$env_var` is set (a library inside someone else's program
/// stays silent unless asked).
pub fn init_if_set(env_var: &str) {
    if let Ok(filter) = EnvFilter::try_from_env(env_var) {
        install(filter);
    }
}

fn install(filter: EnvFilter) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_second_init_is_harmless() {
        super::init("INC_LOG_TEST_UNSET_VARIABLE", "warn");
        super::init("INC_LOG_TEST_UNSET_VARIABLE", "debug");
        super::init_if_set("INC_LOG_TEST_UNSET_VARIABLE");
        tracing_subscriber::fmt::try_init().expect_err("a subscriber is already installed");
    }
}
