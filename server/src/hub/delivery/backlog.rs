//! The backlog of each delivered endpoint: the events stored in its partitions that its target
//! has not accepted yet, measured every [`CHECK`] and bounded by `[routing]
//! endpoint_backlog_limit`.
//!
//! # Invariants
//! - An endpoint's backlog is the sum over its partitions of the events still stored from the
//!   delivery task's position on (what expired or was deleted is not owed); a partition whose
//!   task has not read its cursor yet counts nothing.
//! - An endpoint whose backlog reached the limit is full: the router sends it nothing (its
//!   messages go to the fallback route or are dropped, counted; `Router::set_full_endpoints`)
//!   until a check finds it below the limit again. So the backlog may pass the limit by what
//!   arrives within one check, never more; the events already stored stay and are delivered.
//! - Only where the delivery tasks run (the node that writes); when they stop, no endpoint
//!   reads full.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ferrohub_engine::d2c::D2cError;
use tokio_util::sync::CancellationToken;

use crate::hub::HubContext;

/// How often the backlogs are measured.
const CHECK: Duration = Duration::from_millis(250);

/// Measures the backlogs and marks the full endpoints, until `shutdown`.
pub async fn watch(ctx: HubContext, limit: u64, shutdown: CancellationToken) {
    let mut shown: HashSet<String> = HashSet::new();
    loop {
        let positions = ctx.delivery_health.positions();
        let measured = ctx
            .store
            .run(move |s| {
                let mut backlog: HashMap<String, u64> = HashMap::new();
                for (endpoint, partition, next) in positions {
                    let info = s.partition_info(partition)?;
                    let first = info.begin_sequence_number;
                    let end = info
                        .last_enqueued_sequence_number
                        .map_or(first, |last| last + 1);
                    *backlog.entry(endpoint).or_default() += end.saturating_sub(next.max(first));
                }
                Ok::<_, D2cError>(backlog)
            })
            .await;
        match measured {
            Ok(backlog) => {
                let full: HashSet<String> = backlog
                    .iter()
                    .filter(|(_, events)| **events >= limit)
                    .map(|(endpoint, _)| endpoint.clone())
                    .collect();
                // The router first: a gauge never reads an endpoint drained that the router
                // still treats as full.
                ctx.routing.set_full_endpoints(full);
                for endpoint in shown.iter().filter(|e| !backlog.contains_key(*e)) {
                    gauge(endpoint, 0);
                }
                for (endpoint, events) in &backlog {
                    gauge(endpoint, *events);
                }
                shown = backlog.into_keys().collect();
            }
            // Nothing is marked full or emptied on a failed read: the last state stands.
            Err(e) => tracing::warn!(error = %e, "cannot measure the delivery backlogs"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(CHECK) => {}
        }
    }
    ctx.routing.set_full_endpoints(HashSet::new());
}

fn gauge(endpoint: &str, events: u64) {
    metrics::gauge!("ferrohub_endpoint_backlog_events", "endpoint" => endpoint.to_string())
        .set(events as f64);
}
