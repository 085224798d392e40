//! What a link does to frames ([`Impairments`]) and its text form, as given on the
//! command line (`inc-switch run --link-emu`) and in topologies (`emulate:`):
//! `loss=1%,burst=4,delay=2ms,rate=1gbit,seed=7`. [`PortLinkEmu`] is the setting of
//! one switch port, per direction.
//!
//! Settings only: the emulator itself (sans-IO, seeded) lives in
//! `inc_switch_io::link_emu`. This crate has no I/O so that the topology crate can
//! validate the same text the switch applies.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

/// Frames a link holds (delayed, rate-queued, reordered) before it drops new ones.
pub const DEFAULT_LIMIT: usize = 4096;
/// Extra delay of a reordered frame when `reorder-delay` is not given.
pub const DEFAULT_REORDER_DELAY: Duration = Duration::from_millis(1);

/// Impairments of one direction of one link. Probabilities are per frame, in `0..=1`.
///
/// Order of application to a frame (as in Linux netem): loss, then corruption, then
/// timing (rate, delay, jitter, reordering); a duplicate follows its original.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Impairments {
    /// Mean loss probability.
    pub loss: f64,
    /// Mean length of a loss burst in frames (Gilbert–Elliott); `None`: independent losses.
    pub burst: Option<f64>,
    /// Probability that a frame is sent twice.
    pub duplicate: f64,
    /// Probability that a frame is held back by `reorder_delay`, so later frames pass it.
    pub reorder: f64,
    /// How long a reordered frame is held back (on top of `delay`).
    pub reorder_delay: Duration,
    /// Probability that one random bit of a frame is flipped.
    pub corrupt: f64,
    /// Added one-way latency.
    pub delay: Duration,
    /// Uniform extra latency in `0..jitter`; frames keep their order.
    pub jitter: Duration,
    /// Link rate in bits per second (frame bytes only); `None`: unlimited.
    pub rate_bps: Option<u64>,
    /// Frames held at most; more are dropped (tail drop) and counted.
    pub limit: usize,
    /// RNG seed (mixed with the port and direction, so links differ).
    pub seed: u64,
}

impl Default for Impairments {
    fn default() -> Self {
        Impairments {
            loss: 0.0,
            burst: None,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: DEFAULT_REORDER_DELAY,
            corrupt: 0.0,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            rate_bps: None,
            limit: DEFAULT_LIMIT,
            seed: 0,
        }
    }
}

impl Impairments {
    /// True if the link does nothing to frames.
    pub fn is_noop(&self) -> bool {
        self.loss == 0.0
            && self.duplicate == 0.0
            && self.reorder == 0.0
            && self.corrupt == 0.0
            && self.delay.is_zero()
            && self.jitter.is_zero()
            && self.rate_bps.is_none()
    }

    /// Apply `key=value` pairs of `spec` over `self` (so a per-port spec can refine a
    /// global one). Keys: see [`Impairments::KEYS`].
    pub fn apply(&mut self, spec: &str) -> Result<(), SpecError> {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) =
                item.split_once('=').ok_or_else(|| SpecError::new(item, "expected KEY=VALUE"))?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |why: &str| SpecError::new(item, why);
            match key {
                "loss" => self.loss = probability(value).map_err(|e| bad(&e))?,
                "burst" => {
                    let b: f64 = value.parse().map_err(|_| bad("expected a number of frames"))?;
                    if !(1.0..=1e9).contains(&b) {
                        return Err(bad("mean burst length must be at least 1 frame"));
                    }
                    self.burst = Some(b);
                }
                "dup" | "duplicate" => self.duplicate = probability(value).map_err(|e| bad(&e))?,
                "reorder" => self.reorder = probability(value).map_err(|e| bad(&e))?,
                "reorder-delay" => self.reorder_delay = duration(value).map_err(|e| bad(&e))?,
                "corrupt" => self.corrupt = probability(value).map_err(|e| bad(&e))?,
                "delay" => self.delay = duration(value).map_err(|e| bad(&e))?,
                "jitter" => self.jitter = duration(value).map_err(|e| bad(&e))?,
                "rate" => self.rate_bps = Some(rate(value).map_err(|e| bad(&e))?),
                "limit" => {
                    self.limit = value
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad("expected a positive number of frames"))?
                }
                "seed" => self.seed = value.parse().map_err(|_| bad("expected an integer"))?,
                _ => {
                    return Err(bad(&format!("unknown key `{key}` (known: {})", Self::KEYS)));
                }
            }
        }
        if self.burst.is_some() && self.loss >= 1.0 {
            return Err(SpecError::new(spec, "bursty loss needs loss below 100%"));
        }
        Ok(())
    }

    /// The keys [`Impairments::apply`] understands.
    pub const KEYS: &'static str =
        "loss, burst, dup, reorder, reorder-delay, corrupt, delay, jitter, rate, limit, seed";
}

impl FromStr for Impairments {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let mut imp = Impairments::default();
        imp.apply(s)?;
        Ok(imp)
    }
}

impl fmt::Display for Impairments {
    /// The spec form, listing what differs from the defaults.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = Impairments::default();
        let mut parts = Vec::new();
        if self.loss != 0.0 {
            parts.push(format!("loss={}%", self.loss * 100.0));
        }
        if let Some(b) = self.burst {
            parts.push(format!("burst={b}"));
        }
        if self.duplicate != 0.0 {
            parts.push(format!("dup={}%", self.duplicate * 100.0));
        }
        if self.reorder != 0.0 {
            parts.push(format!("reorder={}%", self.reorder * 100.0));
        }
        if self.reorder_delay != d.reorder_delay {
            parts.push(format!("reorder-delay={}ns", self.reorder_delay.as_nanos()));
        }
        if self.corrupt != 0.0 {
            parts.push(format!("corrupt={}%", self.corrupt * 100.0));
        }
        if !self.delay.is_zero() {
            parts.push(format!("delay={}ns", self.delay.as_nanos()));
        }
        if !self.jitter.is_zero() {
            parts.push(format!("jitter={}ns", self.jitter.as_nanos()));
        }
        if let Some(r) = self.rate_bps {
            parts.push(format!("rate={r}bit"));
        }
        if self.limit != d.limit {
            parts.push(format!("limit={}", self.limit));
        }
        if self.seed != 0 {
            parts.push(format!("seed={}", self.seed));
        }
        f.write_str(&parts.join(","))
    }
}

/// Link emulation of one switch port.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PortLinkEmu {
    /// Applied to the frames the switch sends on the port.
    pub tx: Option<Impairments>,
    /// Applied to the frames the switch receives on the port: the other direction of a
    /// link whose far end (a host) has no emulator of its own.
    pub rx: Option<Impairments>,
}

impl PortLinkEmu {
    /// True if neither direction is impaired.
    pub fn is_noop(&self) -> bool {
        self.tx.as_ref().is_none_or(Impairments::is_noop)
            && self.rx.as_ref().is_none_or(Impairments::is_noop)
    }
}

/// A bad link emulation spec: names the offending item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("link emulation `{item}`: {reason}")]
pub struct SpecError {
    /// The `key=value` item (or the whole spec) at fault.
    pub item: String,
    /// What is wrong.
    pub reason: String,
}

impl SpecError {
    fn new(item: &str, reason: &str) -> Self {
        SpecError { item: item.to_string(), reason: reason.to_string() }
    }
}

/// `1%`, `0.5%` or a fraction `0.01`.
fn probability(v: &str) -> Result<f64, String> {
    let p = match v.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().map(|x| x / 100.0),
        None => v.parse::<f64>(),
    }
    .map_err(|_| "expected a probability like 1% or 0.01".to_string())?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err("probability must be within 0%..100%".into())
    }
}

/// `250us`, `2ms`, `1.5s`, `100ns` (a bare number is milliseconds).
fn duration(v: &str) -> Result<Duration, String> {
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let x: f64 = num.parse().map_err(|_| format!("expected a duration like 2ms, got `{v}`"))?;
    let scale = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "" | "ms" => 1e-3,
        "s" => 1.0,
        u => return Err(format!("unknown time unit `{u}` (ns, us, ms, s)")),
    };
    let secs = x * scale;
    if !(0.0..=3600.0).contains(&secs) {
        return Err("duration must be within 0..1h".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `1gbit`, `100mbit`, `64kbit`, `9600bit` (decimal units, as tc).
fn rate(v: &str) -> Result<u64, String> {
    let lower = v.to_ascii_lowercase();
    let split = lower.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(lower.len());
    let (num, unit) = lower.split_at(split);
    let x: f64 = num.parse().map_err(|_| format!("expected a rate like 1gbit, got `{v}`"))?;
    let scale = match unit {
        "bit" | "bps" => 1e0,
        "kbit" | "kbps" => 1e3,
        "mbit" | "mbps" => 1e6,
        "gbit" | "gbps" => 1e9,
        u => return Err(format!("unknown rate unit `{u}` (bit, kbit, mbit, gbit)")),
    };
    let bps = x * scale;
    if !(1000.0..=1e13).contains(&bps) {
        return Err("rate must be within 1kbit..10000gbit".into());
    }
    Ok(bps as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let imp: Impairments = "loss=1%,burst=4,dup=0.5%,reorder=0.02,reorder-delay=3ms,\
                                corrupt=0.1%,delay=250us,jitter=1ms,rate=1.5gbit,limit=99,seed=7"
            .parse()
            .unwrap();
        assert!((imp.loss - 0.01).abs() < 1e-12);
        assert_eq!(imp.burst, Some(4.0));
        assert!((imp.duplicate - 0.005).abs() < 1e-12);
        assert!((imp.reorder - 0.02).abs() < 1e-12);
        assert_eq!(imp.reorder_delay, Duration::from_millis(3));
        assert!((imp.corrupt - 0.001).abs() < 1e-12);
        assert_eq!(imp.delay, Duration::from_micros(250));
        assert_eq!(imp.jitter, Duration::from_millis(1));
        assert_eq!(imp.rate_bps, Some(1_500_000_000));
        assert_eq!(imp.limit, 99);
        assert_eq!(imp.seed, 7);
        assert!(!imp.is_noop());
        // Display lists the same settings and parses back to them.
        let again: Impairments = imp.to_string().parse().unwrap();
        assert_eq!(again.burst, imp.burst);
        assert_eq!(again.delay, imp.delay);
        assert_eq!(again.rate_bps, imp.rate_bps);
        assert!("".parse::<Impairments>().unwrap().is_noop());
    }

    #[test]
    fn errors_name_the_item() {
        for (spec, needle) in [
            ("loss=2", "loss=2"),
            ("loss=-1%", "loss=-1%"),
            ("burst=0.5,loss=1%", "burst=0.5"),
            ("delay=5parsecs", "delay=5parsecs"),
            ("rate=fast", "rate=fast"),
            ("rate=10bit", "rate=10bit"),
            ("color=red", "unknown key `color`"),
            ("loss", "expected KEY=VALUE"),
            ("limit=0", "limit=0"),
            ("loss=100%,burst=3", "below 100%"),
        ] {
            let e = spec.parse::<Impairments>().unwrap_err().to_string();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }

    #[test]
    fn later_specs_refine_earlier_ones() {
        let mut imp: Impairments = "loss=1%,delay=1ms".parse().unwrap();
        imp.apply("delay=0,seed=3").unwrap();
        assert!((imp.loss - 0.01).abs() < 1e-12);
        assert!(imp.delay.is_zero());
        assert_eq!(imp.seed, 3);
    }
}
