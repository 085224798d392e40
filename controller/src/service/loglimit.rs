//! Rate limit of the warnings a peer can cause, so a flood of bad frames or
//! connections cannot fill a disk: a token bucket per address and one for everyone,
//! and a "N more suppressed" line once an address's warnings flow again or go quiet.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tracing::warn;

/// Warnings an address may cause in a burst.
const BURST: f64 = 10.0;
/// Warnings per second an address may cause after its burst.
const RATE: f64 = 1.0;
/// Warnings per second of all addresses together (and their burst).
const GLOBAL_BURST: f64 = 100.0;
const GLOBAL_RATE: f64 = 20.0;
/// Addresses tracked one by one; beyond, new addresses only have the global bucket.
const MAX_TRACKED: usize = 4096;
/// A quiet address's suppressed count is reported after this long.
const QUIET: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    suppressed: u64,
}

impl Bucket {
    fn new(burst: f64, now: Instant) -> Self {
        Bucket { tokens: burst, last: now, suppressed: 0 }
    }

    fn refill(&mut self, burst: f64, rate: f64, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * rate).min(burst);
        self.last = now;
    }
}

/// Decides which peer-caused warnings are written.
#[derive(Debug)]
pub(super) struct LogLimiter {
    peers: HashMap<IpAddr, Bucket>,
    global: Bucket,
}

impl LogLimiter {
    pub(super) fn new(now: Instant) -> Self {
        LogLimiter { peers: HashMap::new(), global: Bucket::new(GLOBAL_BURST, now) }
    }

    /// Whether a warning caused by `ip` may be written now. Reports what was
    /// suppressed before it, if anything.
    pub(super) fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        self.global.refill(GLOBAL_BURST, GLOBAL_RATE, now);
        if !self.peers.contains_key(&ip) && self.peers.len() < MAX_TRACKED {
            self.peers.insert(ip, Bucket::new(BURST, now));
        }
        let peer = self.peers.get_mut(&ip);
        let peer_ok = match peer {
            Some(b) => {
                b.refill(BURST, RATE, now);
                b.tokens >= 1.0
            }
            None => true,
        };
        if !peer_ok || self.global.tokens < 1.0 {
            match self.peers.get_mut(&ip) {
                Some(b) if !peer_ok => b.suppressed += 1,
                _ => self.global.suppressed += 1,
            }
            return false;
        }
        self.global.tokens -= 1.0;
        if let Some(b) = self.peers.get_mut(&ip) {
            b.tokens -= 1.0;
            if b.suppressed > 0 {
                warn!(peer = %ip, suppressed = b.suppressed, "{} more warnings caused by this address were suppressed", b.suppressed);
                b.suppressed = 0;
            }
        }
        true
    }

    /// Report what quiet addresses had suppressed and forget addresses whose bucket
    /// is full again (called from the timer).
    pub(super) fn tick(&mut self, now: Instant) {
        self.peers.retain(|ip, b| {
            let quiet = now.saturating_duration_since(b.last) >= QUIET;
            if quiet && b.suppressed > 0 {
                warn!(peer = %ip, suppressed = b.suppressed, "{} more warnings caused by this address were suppressed", b.suppressed);
                b.suppressed = 0;
            }
            !quiet
        });
        let quiet = now.saturating_duration_since(self.global.last) >= QUIET;
        if quiet && self.global.suppressed > 0 {
            warn!(
                suppressed = self.global.suppressed,
                "{} more warnings caused by peers were suppressed (all addresses)",
                self.global.suppressed
            );
            self.global.suppressed = 0;
        }
    }

    /// When [`LogLimiter::tick`] next has something to report.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let peers = self.peers.values().filter(|b| b.suppressed > 0).map(|b| b.last + QUIET);
        let global = (self.global.suppressed > 0).then_some(self.global.last + QUIET);
        peers.chain(global).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate_then_summary() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(t0);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let allowed = (0..1000).filter(|_| l.allow(a, t0)).count();
        assert_eq!(allowed, BURST as usize);
        // Another address is not starved by the first.
        assert!(l.allow(b, t0));
        // One more per second.
        assert!(l.allow(a, t0 + Duration::from_secs(1)));
        assert!(!l.allow(a, t0 + Duration::from_secs(1)));
        assert_eq!(l.peers[&a].suppressed, 1);
        assert!(l.next_deadline().is_some());
        l.tick(t0 + Duration::from_secs(10));
        assert!(l.peers.is_empty() && l.next_deadline().is_none());
    }
}
