//! Latency percentiles over recorded samples (microseconds).

use serde::Serialize;

#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Nearest-rank percentiles of `samples_us`.
pub fn percentiles(mut samples_us: Vec<u64>) -> Percentiles {
    if samples_us.is_empty() {
        return Percentiles::default();
    }
    samples_us.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * samples_us.len() as f64).ceil() as usize).clamp(1, samples_us.len());
        samples_us[rank - 1] as f64 / 1000.0
    };
    Percentiles {
        count: samples_us.len(),
        p50_ms: at(0.50),
        p90_ms: at(0.90),
        p99_ms: at(0.99),
        max_ms: at(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let p = percentiles((1..=100).map(|i| i * 1000).collect());
        assert_eq!(
            (p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms),
            (50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(percentiles(vec![]).count, 0);
    }
}
