//! Summaries of repeated measurements: median, p99, mean, extremes; and a least-squares slope
//! for memory soaks.
//!
//! Percentiles use the nearest-rank method on the sorted samples (no interpolation), so a p99
//! of 100 samples is the 99th smallest. This module measures nothing itself.

use std::time::Duration;

use serde::Serialize;

/// Order statistics of a set of durations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub min: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub mean: Duration,
}

impl Summary {
    /// The summary of `samples`; `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let total: Duration = sorted.iter().sum();
        let count = u32::try_from(sorted.len()).unwrap_or(u32::MAX);
        Some(Summary {
            samples: sorted.len(),
            min: sorted[0],
            p50: percentile(&sorted, 50.0),
            p99: percentile(&sorted, 99.0),
            max: sorted[sorted.len() - 1],
            mean: total / count.max(1),
        })
    }
}

/// Nearest-rank percentile of sorted, non-empty `sorted`.
pub fn percentile(sorted: &[Duration], pct: f64) -> Duration {
    let rank = ((pct / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of non-empty `values`.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[middle] } else { (sorted[middle - 1] + sorted[middle]) / 2.0 }
}

/// Least-squares slope of `y` over `x` (per unit of `x`); `None` with fewer than two points or
/// when every `x` is the same.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    (variance > 0.0).then(|| covariance / variance)
}

/// A duration in milliseconds with three decimals (`0.412 ms`).
pub fn ms(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

/// Bytes in megabytes (10^6, as the targets are written) with one decimal, and in MiB.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MB ({:.1} MiB)", bytes as f64 / 1e6, bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let summary = Summary::of(&samples).expect("samples");
        assert_eq!(summary.p50, Duration::from_millis(50));
        assert_eq!(summary.p99, Duration::from_millis(99));
        assert_eq!((summary.min, summary.max), (Duration::from_millis(1), Duration::from_millis(100)));
        assert_eq!(Summary::of(&[]), None);
        let one = Summary::of(&[Duration::from_millis(7)]).expect("one");
        assert_eq!((one.p50, one.p99), (Duration::from_millis(7), Duration::from_millis(7)));
    }

    #[test]
    fn slope_of_a_line() {
        let points: Vec<(f64, f64)> = (0..10).map(|x| (f64::from(x), 3.0 * f64::from(x) + 1.0)).collect();
        let fitted = slope(&points).expect("slope");
        assert!((fitted - 3.0).abs() < 1e-9, "{fitted}");
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 3.0)]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}
