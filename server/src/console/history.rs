//! The hub at a glance over time (`GET /console/api/history`): every [`SAMPLE_EVERY`] this
//! node samples its own counters (device messages, C2D, methods, twin operations, throttled and
//! refused requests, logged warnings and errors), its connected devices and its PUBACK latency
//! histogram, and keeps the last [`KEPT`] samples (an hour) in memory. No outside service: the
//! console draws its charts from the answer.
//!
//! # Invariants
//! - A point is the difference of two samples, so it counts what happened in its interval:
//!   counters only grow within a process, and a point never goes below zero. The answer ends
//!   with a point up to the moment it was asked, so what just happened shows at once.
//! - Each node keeps its own history of what it served since it began serving in its role (a
//!   cluster node that changes role starts again); nothing crosses nodes.
//! - At most [`KEPT`] samples, the oldest dropped first; sampling reads what the metrics
//!   scrape reads, once per interval, and holds the lock only to push.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::access::require_service_side;
use super::{recent_log, NodeInfo};
use crate::auth::Principal;
use crate::hub::HubContext;
use crate::latency::{BUCKETS, BUCKET_COUNT, PUBACK};
use crate::rest::reply::{json as json_reply, Handled};
use crate::rest::Context;

/// How often a sample is taken.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How many samples are kept: an hour's.
pub const KEPT: usize = 360;

/// What a sample reads from the metrics scrape: a counter (the answer gives how much it grew
/// in each interval) or a gauge (its value at the interval's end), summed over every label
/// set of each family named.
/// `refused` counts HTTPS requests answered 4xx (the throttled 429s among them, which
/// `throttled` counts too, with the MQTT and AMQP ones), connections refused, and messages
/// over the daily quota.
struct Series {
    name: &'static str,
    families: &'static [&'static str],
    gauge: bool,
}

const SERIES: [Series; 8] = [
    Series {
        name: "deviceMessages",
        families: &["ferrohub_d2c_messages_total"],
        gauge: false,
    },
    Series {
        name: "connectedDevices",
        families: &["ferrohub_connected_devices"],
        gauge: true,
    },
    Series {
        name: "c2dSent",
        families: &["ferrohub_c2d_sent_total"],
        gauge: false,
    },
    Series {
        name: "c2dDelivered",
        families: &["ferrohub_c2d_delivered_total"],
        gauge: false,
    },
    Series {
        name: "methodCalls",
        families: &["ferrohub_method_calls_total"],
        gauge: false,
    },
    Series {
        name: "twinOperations",
        families: &["ferrohub_twin_operations_total"],
        gauge: false,
    },
    Series {
        name: "throttled",
        families: &["ferrohub_throttled_total"],
        gauge: false,
    },
    Series {
        name: "refused",
        families: &[
            "ferrohub_requests_refused_total",
            "ferrohub_connections_refused_total",
            "ferrohub_quota_refused_total",
        ],
        gauge: false,
    },
];

#[derive(Debug, Clone)]
struct Sample {
    at: DateTime<Utc>,
    values: [f64; SERIES.len()],
    warnings: u64,
    errors: u64,
    puback: [u64; BUCKET_COUNT + 1],
}

/// The kept samples.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock();
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }
}

/// Samples every [`SAMPLE_EVERY`] into `history` until `stop`.
pub async fn keep(ctx: HubContext, history: Arc<History>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => history.push(take(&ctx).await),
        }
    }
}

async fn take(ctx: &HubContext) -> Sample {
    let text = crate::hub::metrics::render(ctx).await;
    let (warnings, errors) = recent_log::logged_counts();
    Sample {
        at: Utc::now(),
        values: read_series(&text),
        warnings,
        errors,
        puback: PUBACK.counts(),
    }
}

/// Sums each series' families in a Prometheus text scrape.
fn read_series(text: &str) -> [f64; SERIES.len()] {
    let mut values = [0.0; SERIES.len()];
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((metric, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let family = metric.split('{').next().unwrap_or(metric);
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        for (sum, series) in values.iter_mut().zip(&SERIES) {
            if series.families.contains(&family) {
                *sum += value;
            }
        }
    }
    values
}

/// The `q` quantile, in milliseconds, of the samples counted in `counts` (per bucket, not
/// cumulative), interpolated within its bucket as Prometheus' `histogram_quantile` does; `None`
/// without samples.
fn quantile_ms(counts: &[u64; BUCKET_COUNT + 1], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut below = 0u64;
    for (i, &n) in counts.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let Some(&upper) = BUCKETS.get(i) else {
                // Past every bound: the largest bound is all that is known.
                return Some(BUCKETS[BUCKET_COUNT - 1] * 1e3);
            };
            let lower = if i == 0 { 0.0 } else { BUCKETS[i - 1] };
            let within = (rank - below as f64) / n as f64;
            return Some((lower + (upper - lower) * within) * 1e3);
        }
        below += n;
    }
    Some(BUCKETS[BUCKET_COUNT - 1] * 1e3)
}

/// What happened between two samples.
fn point(from: &Sample, to: &Sample) -> Value {
    let mut p = Map::new();
    p.insert(
        "at".into(),
        json!(to.at.to_rfc3339_opts(SecondsFormat::Secs, true)),
    );
    let seconds = (to.at - from.at).num_milliseconds().max(0) as f64 / 1e3;
    p.insert("seconds".into(), json!(seconds));
    for (i, series) in SERIES.iter().enumerate() {
        let value = if series.gauge {
            to.values[i]
        } else {
            (to.values[i] - from.values[i]).max(0.0)
        };
        p.insert(series.name.into(), json!(value));
    }
    p.insert(
        "warnings".into(),
        json!(to.warnings.saturating_sub(from.warnings)),
    );
    p.insert(
        "errors".into(),
        json!(to.errors.saturating_sub(from.errors)),
    );
    let puback: [u64; BUCKET_COUNT + 1] =
        std::array::from_fn(|i| to.puback[i].saturating_sub(from.puback[i]));
    p.insert("pubackP50Ms".into(), json!(quantile_ms(&puback, 0.5)));
    p.insert("pubackP99Ms".into(), json!(quantile_ms(&puback, 0.99)));
    Value::Object(p)
}

#[derive(Debug, Deserialize)]
pub struct HistoryQuery {
    /// The window, in minutes back from now (1 to 60; all that is kept by default).
    minutes: Option<u32>,
}

pub async fn history_handler(
    query: HistoryQuery,
    ctx: Context,
    p: Principal,
    node: NodeInfo,
) -> Handled {
    require_service_side(&p)?;
    let minutes = query.minutes.unwrap_or(60).clamp(1, 60);
    let now = take(&ctx).await;
    let since = now.at - chrono::Duration::minutes(i64::from(minutes));
    let mut samples: Vec<Sample> = {
        let kept = node.history.samples.lock();
        // One sample before the window too: the window's first point starts there.
        let first = kept.iter().rposition(|s| s.at <= since).unwrap_or(0);
        kept.iter().skip(first).cloned().collect()
    };
    samples.push(now);
    let points: Vec<Value> = samples.windows(2).map(|w| point(&w[0], &w[1])).collect();
    Ok(json_reply(&json!({
        "node": node.node,
        "intervalSeconds": SAMPLE_EVERY.as_secs(),
        "minutes": minutes,
        "series": SERIES.iter().map(|s| json!({"name": s.name, "gauge": s.gauge})).collect::<Vec<_>>(),
        "points": points,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_s: i64, d2c: f64, connected: f64, puback: [u64; BUCKET_COUNT + 1]) -> Sample {
        let mut values = [0.0; SERIES.len()];
        values[0] = d2c;
        values[1] = connected;
        Sample {
            at: DateTime::from_timestamp(at_s, 0).expect("a time"),
            values,
            warnings: 0,
            errors: 0,
            puback,
        }
    }

    #[test]
    fn series_sum_every_label_set_of_their_families() {
        let text = "# HELP ferrohub_d2c_messages_total x\n\
            ferrohub_d2c_messages_total{protocol=\"mqtt\"} 5\n\
            ferrohub_d2c_messages_total{protocol=\"amqp\"} 7\n\
            ferrohub_d2c_messages_total_other 100\n\
            ferrohub_connected_devices 3\n\
            ferrohub_requests_refused_total{reason=\"a\"} 1\n\
            ferrohub_quota_refused_total 2\n";
        let v = read_series(text);
        assert_eq!(v[0], 12.0);
        assert_eq!(v[1], 3.0);
        assert_eq!(v[7], 3.0);
        assert_eq!(v[2], 0.0);
    }

    #[test]
    fn a_point_counts_what_grew_and_reads_gauges_at_its_end() {
        let mut from_buckets = [0u64; BUCKET_COUNT + 1];
        from_buckets[3] = 100; // an earlier interval's samples must not count
        let mut to_buckets = from_buckets;
        to_buckets[2] += 50; // 0.25..0.5 ms
        to_buckets[4] += 50; // 1..2.5 ms
        let p = point(
            &sample(0, 10.0, 4.0, from_buckets),
            &sample(10, 35.0, 2.0, to_buckets),
        );
        assert_eq!(p["seconds"], 10.0);
        assert_eq!(p["deviceMessages"], 25.0);
        assert_eq!(p["connectedDevices"], 2.0);
        let p50 = p["pubackP50Ms"].as_f64().expect("a p50");
        assert!((p50 - 0.5).abs() < 1e-9, "{p50}");
        let p99 = p["pubackP99Ms"].as_f64().expect("a p99");
        assert!(p99 > 1.0 && p99 <= 2.5, "{p99}");
    }

    #[test]
    fn no_samples_no_quantile_and_past_every_bound_is_the_largest() {
        assert_eq!(quantile_ms(&[0; BUCKET_COUNT + 1], 0.5), None);
        let mut slow = [0u64; BUCKET_COUNT + 1];
        slow[BUCKET_COUNT] = 3;
        assert_eq!(quantile_ms(&slow, 0.99), Some(10_000.0));
    }

    #[test]
    fn an_hour_is_kept_and_no_more() {
        let h = History::default();
        for i in 0..(KEPT as i64 + 5) {
            h.push(sample(i * 10, i as f64, 0.0, [0; BUCKET_COUNT + 1]));
        }
        let kept = h.samples.lock();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept.front().map(|s| s.values[0]), Some(5.0));
    }
}
