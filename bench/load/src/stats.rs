//! Percentiles over recorded samples (every sample is kept; runs are bounded, so this is cheap).

use serde_json::{json, Value};

/// A distribution summary; units are whatever the samples were in (µs or ms here).
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=1).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn summarize(samples: &[f64]) -> Summary {
    if samples.is_empty() {
        return Summary {
            n: 0,
            mean: f64::NAN,
            min: f64::NAN,
            p50: f64::NAN,
            p90: f64::NAN,
            p99: f64::NAN,
            p999: f64::NAN,
            max: f64::NAN,
        };
    }
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Summary {
        n: v.len(),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        min: v[0],
        p50: percentile(&v, 0.50),
        p90: percentile(&v, 0.90),
        p99: percentile(&v, 0.99),
        p999: percentile(&v, 0.999),
        max: v[v.len() - 1],
    }
}

impl Summary {
    pub fn to_json(self) -> Value {
        let r = |x: f64| {
            if x.is_finite() {
                json!((x * 10.0).round() / 10.0)
            } else {
                Value::Null
            }
        };
        json!({"n": self.n, "mean": r(self.mean), "min": r(self.min), "p50": r(self.p50), "p90": r(self.p90),
               "p99": r(self.p99), "p999": r(self.p999), "max": r(self.max)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = summarize(&v);
        assert_eq!((s.p50, s.p99, s.max, s.min), (50.0, 99.0, 100.0, 1.0));
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert!(summarize(&[]).p50.is_nan());
    }
}
