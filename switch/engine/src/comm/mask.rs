//! Sets of children, by ordinal.

/// Most children one switch serves in one communicator.
pub(crate) const MAX_FAN_IN: usize = 256;

const WORDS: usize = MAX_FAN_IN / 64;

/// A set of children by ordinal (position among the communicator's children, not the
/// rules index). Fixed-size so that slot metadata stays `Copy` and the data path never
/// allocates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ChildMask([u64; WORDS]);

impl ChildMask {
    pub(crate) const EMPTY: ChildMask = ChildMask([0; WORDS]);

    /// The set holding only `child`.
    pub(crate) fn single(child: usize) -> ChildMask {
        let mut m = ChildMask::EMPTY;
        m.insert(child);
        m
    }

    /// Children `0..n`.
    pub(crate) fn first(n: usize) -> ChildMask {
        let mut m = ChildMask::EMPTY;
        for child in 0..n {
            m.insert(child);
        }
        m
    }

    pub(crate) fn insert(&mut self, child: usize) {
        self.0[child / 64] |= 1 << (child % 64);
    }

    pub(crate) fn contains(&self, child: usize) -> bool {
        self.0[child / 64] & (1 << (child % 64)) != 0
    }

    /// Number of children in the set.
    pub(crate) fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The children in the set, in ascending ordinal (the deterministic float fold relies
    /// on the order).
    pub(crate) fn iter(self) -> impl Iterator<Item = usize> {
        self.0.into_iter().enumerate().flat_map(|(w, mut word)| {
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let b = word.trailing_zeros() as usize;
                    word &= word - 1;
                    w * 64 + b
                })
            })
        })
    }
}

impl std::ops::BitAnd for ChildMask {
    type Output = ChildMask;
    fn bitand(mut self, other: ChildMask) -> ChildMask {
        self.0.iter_mut().zip(other.0).for_each(|(a, b)| *a &= b);
        self
    }
}

impl std::ops::BitOr for ChildMask {
    type Output = ChildMask;
    fn bitor(mut self, other: ChildMask) -> ChildMask {
        self.0.iter_mut().zip(other.0).for_each(|(a, b)| *a |= b);
        self
    }
}

impl std::ops::BitOrAssign for ChildMask {
    fn bitor_assign(&mut self, other: ChildMask) {
        *self = *self | other;
    }
}

impl std::ops::Not for ChildMask {
    type Output = ChildMask;
    fn not(mut self) -> ChildMask {
        self.0.iter_mut().for_each(|a| *a = !*a);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_contains_across_words() {
        for child in [0, 1, 63, 64, 65, 127, 128, 255] {
            let m = ChildMask::single(child);
            assert!(m.contains(child));
            assert!(!m.is_empty());
            assert_eq!(m.iter().collect::<Vec<_>>(), vec![child]);
            let other = if child == 0 { 1 } else { child - 1 };
            assert!(!m.contains(other));
        }
        assert!(ChildMask::EMPTY.is_empty());
        assert_eq!(ChildMask::EMPTY.iter().count(), 0);
    }

    #[test]
    fn first_n_holds_exactly_n_in_order() {
        for n in [0, 1, 63, 64, 65, 200, MAX_FAN_IN] {
            let m = ChildMask::first(n);
            assert_eq!(m.iter().collect::<Vec<_>>(), (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn set_operations() {
        let all = ChildMask::first(70);
        let one = ChildMask::single(66);
        let rest = all & !one;
        assert!(!rest.contains(66));
        assert_eq!(rest.iter().count(), 69);
        assert_eq!(rest | one, all);
        let mut m = ChildMask::EMPTY;
        m |= one;
        m |= ChildMask::single(3);
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![3, 66]);
        assert_eq!(m & all, m);
        // Bits beyond the children never show up through `&` with a real mask.
        assert_eq!((!ChildMask::EMPTY & all), all);
    }
}
