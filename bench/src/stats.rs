//! Order statistics and histograms of iteration times.

/// Nearest-rank quantile `q` (0..=1) of `v` (any order). 0 for an empty slice.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = (q * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// Median (nearest rank, lower middle).
pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// (max - min) / median of `v`, e.g. of per-round medians. 0 for fewer than 2 values.
pub fn spread(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let m = median(v);
    if m > 0.0 {
        (hi - lo) / m
    } else {
        0.0
    }
}

/// Paired comparison of `a` against `b` (equal lengths, the same repetition at each
/// index): how many pairs have `a < b` of those that differ, and the two-sided sign
/// test's p-value for "neither is faster" (the chance of a split at least that uneven
/// if each pair were a coin toss). (0, 0, 1.0) when every pair ties.
pub fn sign_test(a: &[f64], b: &[f64]) -> (usize, usize, f64) {
    let (mut less, mut differ) = (0usize, 0usize);
    for (x, y) in a.iter().zip(b) {
        if x != y {
            differ += 1;
            less += usize::from(x < y);
        }
    }
    let tail = less.min(differ - less);
    // P(X <= tail) for X ~ Binomial(differ, 1/2), term by term: C(n, i) / 2^n, in logs
    // because 2^-n underflows beyond about 1,074 pairs.
    let mut ln_term = -(differ as f64) * std::f64::consts::LN_2;
    let mut cumulative = 0.0;
    for i in 0..=tail {
        cumulative += ln_term.exp();
        ln_term += ((differ - i) as f64 / (i + 1) as f64).ln();
    }
    (less, differ, (2.0 * cumulative).min(1.0))
}

/// Histogram with logarithmic bins: `per_decade` bins per factor of 10 between the
/// smallest and largest value. Returns (lower edge, upper edge, count) per bin.
pub fn log_histogram(v: &[f64], per_decade: u32) -> Vec<(f64, f64, u64)> {
    let pos: Vec<f64> = v.iter().copied().filter(|x| *x > 0.0).collect();
    if pos.is_empty() {
        return Vec::new();
    }
    let lo = pos.iter().copied().fold(f64::MAX, f64::min).log10().floor();
    let hi = pos.iter().copied().fold(f64::MIN, f64::max).log10();
    let step = 1.0 / f64::from(per_decade.max(1));
    let bins = (((hi - lo) / step).floor() as usize + 1).max(1);
    let mut counts = vec![0u64; bins];
    for x in pos {
        let i = ((x.log10() - lo) / step).floor() as usize;
        counts[i.min(bins - 1)] += 1;
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let a = 10f64.powf(lo + step * i as f64);
            (a, a * 10f64.powf(step), c)
        })
        .collect()
}

/// Per-iteration times of a collective: the slowest rank of each iteration.
pub fn max_over_ranks(per_rank: &[Vec<f64>]) -> Vec<f64> {
    let n = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    (0..n).map(|i| per_rank.iter().map(|r| r[i]).fold(0.0, f64::max)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_test_counts_pairs_and_gives_the_binomial_tail() {
        // 21 of 27 faster: 2 * P(X <= 6), X ~ Binomial(27, 1/2) = 2 * 397,594 / 2^27.
        let b = vec![1.0; 28];
        let mut a = vec![0.9; 21];
        a.extend([1.1; 6]);
        a.push(1.0); // a tie: not counted
        let (less, differ, p) = sign_test(&a, &b);
        assert_eq!((less, differ), (21, 27));
        assert!((p - 2.0 * 397_594.0 / 134_217_728.0).abs() < 1e-12, "{p}");
        assert_eq!(sign_test(&[1.0; 10], &[2.0; 10]), (10, 10, 2.0 / 1024.0));
        assert_eq!(sign_test(&[2.0; 10], &[1.0; 10]), (0, 10, 2.0 / 1024.0));
        // An even split is as likely as anything: p capped at 1.
        assert_eq!(sign_test(&[1.0, 3.0, 1.0, 3.0], &[2.0; 4]), (2, 4, 1.0));
        assert_eq!(sign_test(&[1.0; 3], &[1.0; 3]), (0, 0, 1.0));
        // 1,060 of 2,000 faster: 2 * P(X <= 940), X ~ Binomial(2000, 1/2) = 0.0077771189...
        // (exact, from the integer sums); 2^-2000 alone underflows to 0.
        let b = vec![1.0; 2000];
        let mut a = vec![0.9; 1060];
        a.extend([1.1; 940]);
        let (less, differ, p) = sign_test(&a, &b);
        assert_eq!((less, differ), (1060, 2000));
        assert!((p - 0.007_777_118_901_978_714).abs() < 1e-12, "{p}");
        let p_all = sign_test(&a[..1000], &b[..1000]).2; // 1,000 of 1,000: 2^-999
        assert!((p_all / 0.5f64.powi(999) - 1.0).abs() < 1e-12, "{p_all}");
    }

    #[test]
    fn quantiles_and_spread() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(median(&v), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert!((spread(&[9.0, 10.0, 11.0]) - 0.2).abs() < 1e-12);
        assert_eq!(spread(&[5.0]), 0.0);
    }

    #[test]
    fn histogram_counts_everything_once() {
        let v = [1.0, 2.0, 9.9, 10.0, 55.0, 100.0, 1000.0];
        let h = log_histogram(&v, 5);
        assert_eq!(h.iter().map(|b| b.2).sum::<u64>(), v.len() as u64);
        assert!(h[0].0 <= 1.0 && h.last().unwrap().1 >= 1000.0);
        for w in h.windows(2) {
            assert!((w[0].1 - w[1].0).abs() < 1e-9);
        }
        assert!(log_histogram(&[], 5).is_empty());
    }

    #[test]
    fn slowest_rank_per_iteration() {
        let r = vec![vec![1.0, 5.0, 2.0], vec![3.0, 1.0, 2.5], vec![2.0, 2.0]];
        assert_eq!(max_over_ranks(&r), vec![3.0, 5.0]);
    }
}
