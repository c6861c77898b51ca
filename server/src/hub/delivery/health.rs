//! Endpoint health as IoT Hub reports it (`healthy`, `unhealthy`, `degraded`, `dead`,
//! `unknown`), kept per partition by the delivery tasks and summed up per endpoint.
//!
//! - `unknown`: nothing was offered to the endpoint yet.
//! - `dead`: an event was dead-lettered (retried for the endpoint's whole
//!   `deadLetterAfterSeconds`) and nothing was accepted since.
//! - `unhealthy`: an event is being retried now.
//! - `degraded`: accepting again, less than [`RECOVERY`] after being unhealthy or dead.
//! - `healthy`: otherwise.
//!
//! The worst partition decides the endpoint's status (`unknown` counting as the best: an
//! endpoint whose other partitions deliver is not unknown).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrohub_engine::model::UnixMillis;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// How long an endpoint stays `degraded` after it accepts again.
const RECOVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Unknown,
    Healthy,
    Degraded,
    Unhealthy,
    Dead,
}

/// One partition's delivery as its task last saw it.
#[derive(Debug)]
pub struct PartitionHealth {
    state: Mutex<State>,
    /// The sequence number of the next event to deliver ([`UNKNOWN`] until the task read its
    /// cursor): what the backlog is counted from.
    position: AtomicU64,
}

/// A position not known yet.
const UNKNOWN: u64 = u64::MAX;

impl Default for PartitionHealth {
    fn default() -> PartitionHealth {
        PartitionHealth {
            state: Mutex::default(),
            position: AtomicU64::new(UNKNOWN),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    last_attempt: Option<UnixMillis>,
    last_success: Option<UnixMillis>,
    last_error: Option<(String, UnixMillis)>,
    retrying: bool,
    dead: bool,
    recovered_at: Option<Instant>,
}

impl PartitionHealth {
    /// The task's next event to deliver moved to `next`.
    pub fn set_position(&self, next: u64) {
        self.position.store(next, Ordering::Relaxed);
    }

    fn position(&self) -> Option<u64> {
        Some(self.position.load(Ordering::Relaxed)).filter(|p| *p != UNKNOWN)
    }

    pub fn accepted(&self, now: UnixMillis) {
        let mut s = self.state.lock();
        if s.retrying || s.dead {
            s.recovered_at = Some(Instant::now());
        }
        s.last_attempt = Some(now);
        s.last_success = Some(now);
        s.retrying = false;
        s.dead = false;
    }

    pub fn failed(&self, error: String, now: UnixMillis) {
        let mut s = self.state.lock();
        s.last_attempt = Some(now);
        s.last_error = Some((error, now));
        s.retrying = true;
    }

    pub fn dead_lettered(&self) {
        let mut s = self.state.lock();
        s.retrying = false;
        s.dead = true;
    }

    fn status(&self) -> HealthStatus {
        let s = self.state.lock();
        if s.dead {
            HealthStatus::Dead
        } else if s.retrying {
            HealthStatus::Unhealthy
        } else if s.last_attempt.is_none() {
            HealthStatus::Unknown
        } else if s.recovered_at.is_some_and(|t| t.elapsed() < RECOVERY) {
            HealthStatus::Degraded
        } else {
            HealthStatus::Healthy
        }
    }
}

/// An endpoint's health, as IoT Hub's `routingEndpointsHealth` reports each endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EndpointHealth {
    pub endpoint: String,
    pub status: HealthStatus,
    pub last_known_error: Option<String>,
    pub last_known_error_time: Option<UnixMillis>,
    pub last_successful_send_attempt_time: Option<UnixMillis>,
    pub last_send_attempt_time: Option<UnixMillis>,
}

/// The health of every delivered endpoint on this node, by endpoint and partition.
#[derive(Default)]
pub struct DeliveryHealth {
    partitions: Mutex<HashMap<(String, u16), Arc<PartitionHealth>>>,
}

impl DeliveryHealth {
    /// The record a partition's task reports to (kept across restarts of the task).
    pub fn partition(&self, endpoint: &str, partition: u16) -> Arc<PartitionHealth> {
        Arc::clone(
            self.partitions
                .lock()
                .entry((endpoint.to_string(), partition))
                .or_default(),
        )
    }

    /// Forgets endpoints no longer delivered.
    pub fn retain(&self, delivered: impl Fn(&str) -> bool) {
        self.partitions.lock().retain(|(e, _), _| delivered(e));
    }

    /// Where each partition's task stands: (endpoint, partition, next event to deliver), for
    /// the partitions whose task read its cursor.
    pub fn positions(&self) -> Vec<(String, u16, u64)> {
        self.partitions
            .lock()
            .iter()
            .filter_map(|((e, p), h)| Some((e.clone(), *p, h.position()?)))
            .collect()
    }

    /// Every delivered endpoint's health, by name.
    pub fn report(&self, endpoints: &[String]) -> Vec<EndpointHealth> {
        let partitions = self.partitions.lock();
        endpoints
            .iter()
            .map(|name| {
                let mine: Vec<_> = partitions
                    .iter()
                    .filter(|((e, _), _)| e == name)
                    .map(|(_, h)| h)
                    .collect();
                let status = mine
                    .iter()
                    .map(|h| h.status())
                    .max()
                    .unwrap_or(HealthStatus::Unknown);
                let latest = |pick: fn(&State) -> Option<UnixMillis>| {
                    mine.iter().filter_map(|h| pick(&h.state.lock())).max()
                };
                let error = mine
                    .iter()
                    .filter_map(|h| h.state.lock().last_error.clone())
                    .max_by_key(|(_, at)| *at);
                EndpointHealth {
                    endpoint: name.clone(),
                    status,
                    last_known_error_time: error.as_ref().map(|(_, at)| *at),
                    last_known_error: error.map(|(text, _)| text),
                    last_successful_send_attempt_time: latest(|s| s.last_success),
                    last_send_attempt_time: latest(|s| s.last_attempt),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_partition_decides_and_recovery_reads_degraded() {
        let health = DeliveryHealth::default();
        let name = vec!["hook".to_string()];
        assert_eq!(health.report(&name)[0].status, HealthStatus::Unknown);
        let (a, b) = (health.partition("hook", 40), health.partition("hook", 41));
        a.accepted(UnixMillis(1));
        assert_eq!(health.report(&name)[0].status, HealthStatus::Healthy);
        b.accepted(UnixMillis(2));
        assert_eq!(health.report(&name)[0].status, HealthStatus::Healthy);
        b.failed("the receiver answered 503".into(), UnixMillis(3));
        let report = &health.report(&name)[0];
        assert_eq!(report.status, HealthStatus::Unhealthy);
        assert_eq!(
            report.last_known_error.as_deref(),
            Some("the receiver answered 503")
        );
        assert_eq!(
            report.last_successful_send_attempt_time,
            Some(UnixMillis(2))
        );
        b.dead_lettered();
        assert_eq!(health.report(&name)[0].status, HealthStatus::Dead);
        b.accepted(UnixMillis(4));
        assert_eq!(health.report(&name)[0].status, HealthStatus::Degraded);
    }
}
