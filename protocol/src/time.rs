//! Monotonic time for sans-IO code.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};
use std::time::Duration;

/// A point in time: nanoseconds since an arbitrary, driver-chosen origin.
///
/// Engines never read a clock; drivers pass `now` (converted from `Instant` relative to
/// their start, or stepped directly by a simulation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
pub struct Time(u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);

    /// A time `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub fn saturating_sub(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

fn dur_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, rhs: Duration) -> Time {
        Time(self.0.saturating_add(dur_nanos(rhs)))
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    /// Saturates at zero, so a driver's clock jitter cannot panic an engine.
    fn sub(self, rhs: Time) -> Duration {
        self.saturating_sub(rhs)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Earliest of two optional deadlines.
pub fn earliest(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        let t = Time::from_nanos(1_500);
        assert_eq!((t + Duration::from_micros(1)).as_nanos(), 2_500);
        assert_eq!(t - Time::from_nanos(500), Duration::from_nanos(1_000));
        assert_eq!(Time::ZERO - t, Duration::ZERO);
        assert_eq!(earliest(Some(t), None), Some(t));
        assert_eq!(earliest(Some(t), Some(Time::ZERO)), Some(Time::ZERO));
        assert_eq!(format!("{:?}", Time::from_nanos(1_000_000_001)), "1.000000001s");
    }
}
