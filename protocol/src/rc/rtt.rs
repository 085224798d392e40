//! Retransmission timeout from measured round-trip times (RFC 6298 style).

use std::time::Duration;

/// Smoothed RTT estimator: `RTO = SRTT + 4 * RTTVAR`, clamped to `[min, max]`, with
/// exponential backoff on timeouts that only a new sample ends (Karn's algorithm, RFC
/// 6298 5.5-5.7): acknowledgements of retransmitted packets say nothing of the RTT, and
/// dropping the backoff on them re-arms a timer already shown too short.
#[derive(Debug, Clone)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    initial: Duration,
    min: Duration,
    max: Duration,
    backoff: u32,
}

impl RttEstimator {
    /// New estimator; `initial` is used until the first sample.
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        RttEstimator { srtt: None, rttvar: Duration::ZERO, initial, min, max, backoff: 0 }
    }

    /// Feed one RTT sample (only from packets sent once: Karn's rule is the caller's job).
    pub fn sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let diff = srtt.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
        self.backoff = 0;
    }

    /// Smoothed RTT, if any sample was taken.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The base timeout without backoff.
    pub fn base_rto(&self) -> Duration {
        let rto = match self.srtt {
            None => self.initial,
            Some(srtt) => srtt + self.rttvar * 4,
        };
        rto.clamp(self.min, self.max)
    }

    /// The current timeout, including backoff.
    pub fn rto(&self) -> Duration {
        let mult = 1u32 << self.backoff.min(16);
        self.base_rto().saturating_mul(mult).min(self.max)
    }

    /// A timeout fired: double the next timeout.
    pub fn on_timeout(&mut self) {
        self.backoff = self.backoff.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn floor_backoff_and_ceiling() {
        let mut r = RttEstimator::new(ms(10), ms(1), ms(200));
        assert_eq!(r.rto(), ms(10));
        r.sample(Duration::from_micros(50));
        // SRTT + 4 RTTVAR = 150 us, below the 1 ms floor.
        assert_eq!(r.rto(), ms(1));
        r.on_timeout();
        assert_eq!(r.rto(), ms(2));
        for _ in 0..20 {
            r.on_timeout();
        }
        assert_eq!(r.rto(), ms(200));
        r.sample(Duration::from_micros(50));
        assert_eq!(r.rto(), ms(1));
    }

    #[test]
    fn converges() {
        let mut r = RttEstimator::new(ms(10), ms(1), ms(1000));
        for _ in 0..100 {
            r.sample(ms(20));
        }
        let rto = r.rto();
        assert!(rto >= ms(20) && rto < ms(22), "{rto:?}");
    }
}
