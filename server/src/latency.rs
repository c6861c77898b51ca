//! The per-message latency histograms (`ferrohub_mqtt_puback_seconds`,
//! `ferrohub_d2c_append_seconds`): fixed buckets counted in atomics, filled from tallies a
//! caller keeps for a group of messages, and rendered in Prometheus' text format next to the
//! exporter's own metrics.
//!
//! Why not the `metrics` facade for these two: its Prometheus exporter keeps every sample,
//! each recorded through a shared queue with an epoch pin, a generation counter and a
//! timestamp, and a telemetry flood records two per message. That was about 3.5% of the hub's
//! CPU at 100 connections. A connection that sends the PUBACKs of a group commit tallies
//! them locally and adds the tally once, a few atomic additions for the whole group.
//!
//! # Invariants
//! - Bucket counts only grow; a render reports each bucket cumulatively, and `_count` and the
//!   `+Inf` bucket are the same total, read once.
//! - A tally reaches the shared histogram only through [`Tally::add_to`], which empties it, so
//!   no sample is counted twice.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets in seconds, 100 µs to 10 s (the exporter's other histograms
/// use the same).
pub const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
pub const BUCKET_COUNT: usize = 16;
/// The bounds in nanoseconds, for comparing without floating point.
const BOUNDS_NANOS: [u64; BUCKET_COUNT] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// MQTT telemetry: PUBLISH read to PUBACK due.
pub static PUBACK: Histogram = Histogram::new(
    "ferrohub_mqtt_puback_seconds",
    "MQTT telemetry: PUBLISH read to PUBACK due",
);
/// Admission to durable per device message.
pub static APPEND: Histogram = Histogram::new(
    "ferrohub_d2c_append_seconds",
    "D2C: admission to durable per device message",
);

/// One process-wide histogram.
pub struct Histogram {
    name: &'static str,
    help: &'static str,
    /// Samples per bucket, not cumulative; the last is above every bound.
    counts: [AtomicU64; BUCKET_COUNT + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    const fn new(name: &'static str, help: &'static str) -> Histogram {
        Histogram {
            name,
            help,
            counts: [const { AtomicU64::new(0) }; BUCKET_COUNT + 1],
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Records one sample (for paths that complete one message at a time).
    pub fn record(&'static self, took: Duration) {
        let mut tally = Tally::default();
        tally.record(took);
        tally.add_to(self);
    }

    /// Each bucket's count so far, the last one past every bound (not cumulative).
    pub fn counts(&self) -> [u64; BUCKET_COUNT + 1] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }

    /// Appends the histogram in Prometheus' text exposition format.
    pub fn render_into(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} histogram", self.name);
        let mut total = 0u64;
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            total += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{}_bucket{{le=\"{bound}\"}} {total}", self.name);
        }
        total += self.counts[BUCKET_COUNT].load(Ordering::Relaxed);
        let _ = writeln!(out, "{}_bucket{{le=\"+Inf\"}} {total}", self.name);
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{}_sum {sum}", self.name);
        let _ = writeln!(out, "{}_count {total}", self.name);
        out.push('\n');
    }
}

/// Samples counted locally, to be added to a [`Histogram`] at once.
#[derive(Debug, Default)]
pub struct Tally {
    counts: [u32; BUCKET_COUNT + 1],
    sum_nanos: u64,
    samples: u32,
}

impl Tally {
    pub fn record(&mut self, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_NANOS.partition_point(|&b| b < nanos);
        self.counts[bucket] += 1;
        self.sum_nanos = self.sum_nanos.saturating_add(nanos);
        self.samples += 1;
    }

    /// How many samples the tally holds.
    pub fn samples(&self) -> u32 {
        self.samples
    }

    /// Adds the samples to `histogram` and empties the tally.
    pub fn add_to(&mut self, histogram: &Histogram) {
        if self.samples == 0 {
            return;
        }
        for (shared, &n) in histogram.counts.iter().zip(&self.counts) {
            if n != 0 {
                shared.fetch_add(u64::from(n), Ordering::Relaxed);
            }
        }
        histogram
            .sum_nanos
            .fetch_add(self.sum_nanos, Ordering::Relaxed);
        *self = Tally::default();
    }
}

/// Appends every histogram of this module.
pub fn render_into(out: &mut String) {
    PUBACK.render_into(out);
    APPEND.render_into(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(h: &Histogram) -> String {
        let mut out = String::new();
        h.render_into(&mut out);
        out
    }

    #[test]
    fn bounds_agree_and_buckets_are_cumulative_and_inclusive() {
        for (b, n) in BUCKETS.iter().zip(BOUNDS_NANOS) {
            assert_eq!((b * 1e9).round() as u64, n);
        }
        static H: Histogram = Histogram::new("t_seconds", "test");
        let mut tally = Tally::default();
        for micros in [50, 100, 101, 900, 20_000_000] {
            tally.record(Duration::from_micros(micros));
        }
        assert_eq!(tally.samples(), 5);
        tally.add_to(&H);
        tally.add_to(&H);
        assert_eq!(tally.samples(), 0);
        H.record(Duration::from_millis(3));
        let text = render(&H);
        for line in [
            "# TYPE t_seconds histogram",
            "t_seconds_bucket{le=\"0.0001\"} 2",
            "t_seconds_bucket{le=\"0.00025\"} 3",
            "t_seconds_bucket{le=\"0.001\"} 4",
            "t_seconds_bucket{le=\"0.005\"} 5",
            "t_seconds_bucket{le=\"10\"} 5",
            "t_seconds_bucket{le=\"+Inf\"} 6",
            "t_seconds_count 6",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("t_seconds_sum "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 20.004151).abs() < 1e-9, "{sum}");
    }
}
