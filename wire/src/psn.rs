//! 24-bit packet sequence numbers with wrap-around arithmetic.

use core::fmt;
use core::ops::{Add, AddAssign, Sub, SubAssign};

/// A 24-bit InfiniBand packet sequence number.
///
/// Arithmetic wraps modulo 2^24. Ordering is only meaningful within half the space
/// (2^23), which is why `Psn` implements no `Ord`: use [`Psn::distance`],
/// [`Psn::is_before`] and [`Psn::in_window`], which are correct across the wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Bit mask of the 24 valid bits.
    pub const MASK: u32 = 0x00ff_ffff;
    /// Size of the PSN space, 2^24.
    pub const MODULUS: u32 = 1 << 24;
    pub const ZERO: Psn = Psn(0);

    /// Creates a PSN from the low 24 bits of `v` (higher bits are discarded).
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }

    /// The PSN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// Signed distance `self - other` modulo 2^24, in `[-2^23, 2^23)`.
    ///
    /// Positive means `self` is ahead of (after) `other`: for a responder,
    /// `psn.distance(expected)` is 0 for the expected packet, negative for a duplicate
    /// and positive for a gap.
    pub const fn distance(self, other: Psn) -> i32 {
        let d = self.0.wrapping_sub(other.0) & Self::MASK;
        // Sign-extend bit 23.
        ((d << 8) as i32) >> 8
    }

    /// True if `self` comes strictly before `other` (within half the space).
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance(other) < 0
    }

    /// True if `self` comes strictly after `other` (within half the space).
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance(other) > 0
    }

    /// True if `self` is one of the `len` PSNs `start, start+1, ..., start+len-1`.
    /// `len` above 2^24 is treated as the whole space.
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        let off = self.0.wrapping_sub(start.0) & Self::MASK;
        off < len
    }

    /// The PSN `n` steps after this one.
    pub const fn wrapping_add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// The PSN `n` steps before this one.
    pub const fn wrapping_sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    pub const fn next(self) -> Psn {
        self.wrapping_add(1)
    }
}

impl Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        self.wrapping_add(n)
    }
}

impl AddAssign<u32> for Psn {
    fn add_assign(&mut self, n: u32) {
        *self = self.wrapping_add(n);
    }
}

impl Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, n: u32) -> Psn {
        self.wrapping_sub(n)
    }
}

impl SubAssign<u32> for Psn {
    fn sub_assign(&mut self, n: u32) {
        *self = self.wrapping_sub(n);
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        let p = Psn::new(0xff_fffe);
        assert_eq!((p + 3).value(), 1);
        assert_eq!((Psn::ZERO - 1).value(), 0xff_ffff);
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Psn::new(1).distance(Psn::new(0xff_ffff)), 2);
        assert_eq!(Psn::new(0xff_ffff).distance(Psn::new(1)), -2);
        assert!(Psn::new(0xff_ffff).is_before(Psn::new(0)));
        assert!(Psn::new(2).in_window(Psn::new(0xff_fffe), 5));
        assert!(!Psn::new(3).in_window(Psn::new(0xff_fffe), 5));
        assert_eq!(Psn::ZERO.distance(Psn::new(1 << 23)), -(1 << 23));
    }

    proptest! {
        #[test]
        fn add_then_distance(a in 0u32..Psn::MODULUS, n in 0u32..(1 << 23)) {
            let p = Psn::new(a);
            let q = p + n;
            prop_assert_eq!(q.distance(p), n as i32);
            prop_assert_eq!(p.distance(q), -(n as i32));
            prop_assert_eq!(q - n, p);
            prop_assert!(q.in_window(p, n + 1));
            prop_assert!(!q.in_window(p, n));
            prop_assert_eq!(p.is_before(q), n != 0);
            prop_assert_eq!(q.is_after(p), n != 0);
        }

        #[test]
        fn distance_range_and_antisymmetry(a in any::<u32>(), b in any::<u32>()) {
            let (p, q) = (Psn::new(a), Psn::new(b));
            let d = p.distance(q);
            prop_assert!((-(1 << 23)..(1 << 23)).contains(&d));
            prop_assert_eq!(q.wrapping_add(d as u32), p);
            if d != -(1 << 23) {
                prop_assert_eq!(q.distance(p), -d);
            }
        }

        #[test]
        fn matches_wide_reference(a in 0u32..Psn::MODULUS, n in 0u32..(1 << 23)) {
            // Reference: unwrap into u64 and compare there.
            let wide = u64::from(a) + u64::from(n);
            let p = Psn::new(a) + n;
            prop_assert_eq!(u64::from(p.value()), wide % u64::from(Psn::MODULUS));
        }
    }
}
