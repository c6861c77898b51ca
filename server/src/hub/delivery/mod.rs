//! Delivery of custom endpoints to receivers outside the hub (docs/routing.md, "Endpoints
//! outside the hub"). A route names the endpoint like any custom endpoint, so a matched
//! message is stored in the endpoint's partitions in the same synced batch as every other copy
//! (before the device's acknowledgement); these tasks then hand the stored events to the
//! endpoint's target.
//!
//! # Invariants
//! - Runs only where the store is written (a single node, or a cluster's writer: a new writer
//!   resumes every partition at its stored cursor).
//! - Each partition of each delivered endpoint has its own task ([`worker`]): a receiver that
//!   is down holds back only its own endpoint's events, never another endpoint, the built-in
//!   endpoint or device telemetry. Its backlog stays in the endpoint's partitions, bounded by
//!   the hub's retention like every endpoint's; what expires undelivered is counted
//!   (`outcome="expired"`).
//! - The set of tasks follows the stored endpoints within [`RECONCILE`]: a new or changed
//!   target starts (or restarts) its tasks, a removed one stops them.

pub mod health;
pub mod webhook;
mod worker;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::delivery::DeliveryTarget;
use ferrohub_engine::endpoints::Endpoint;
use tokio_util::sync::CancellationToken;

use super::HubContext;
pub use health::{DeliveryHealth, EndpointHealth, HealthStatus};

/// How often the stored endpoints are compared with the running tasks.
const RECONCILE: Duration = Duration::from_secs(1);

/// The tasks of one delivered endpoint, and the target they deliver to.
struct Running {
    target: DeliveryTarget,
    stop: CancellationToken,
}

/// Keeps one task per partition of every endpoint with a target, until `shutdown`.
pub async fn run(ctx: HubContext, shutdown: CancellationToken) {
    let mut running: HashMap<String, Running> = HashMap::new();
    loop {
        let endpoints = match ctx
            .store
            .run(|s| Ok::<_, ferrohub_engine::StorageError>(s.list_endpoints()))
            .await
        {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list endpoints to deliver");
                Vec::new()
            }
        };
        let wanted: HashMap<&str, &Endpoint> = endpoints
            .iter()
            .filter(|e| e.delivery.is_some())
            .map(|e| (e.name.as_str(), e))
            .collect();
        running.retain(|name, r| {
            let keep = wanted
                .get(name.as_str())
                .is_some_and(|e| e.delivery.as_ref() == Some(&r.target));
            if !keep {
                r.stop.cancel();
            }
            keep
        });
        for (name, endpoint) in &wanted {
            if running.contains_key(*name) {
                continue;
            }
            if let Some(r) = start(&ctx, endpoint, &shutdown) {
                running.insert((*name).to_string(), r);
            }
        }
        ctx.delivery_health.retain(|e| wanted.contains_key(e));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(RECONCILE) => {}
        }
    }
}

/// Starts an endpoint's partition tasks; `None` (logged) when its target cannot be used.
fn start(ctx: &HubContext, endpoint: &Endpoint, shutdown: &CancellationToken) -> Option<Running> {
    let target = endpoint.delivery.clone()?;
    let DeliveryTarget::Webhook(webhook) = &target;
    let sender = match webhook::WebhookSender::new(&endpoint.name, webhook) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::error!(endpoint = %endpoint.name, error = %e, "cannot deliver to this endpoint's webhook");
            return None;
        }
    };
    let stop = shutdown.child_token();
    for partition in endpoint.slot.base..endpoint.slot.base + endpoint.slot.partitions {
        let task = worker::PartitionDelivery {
            ctx: ctx.clone(),
            endpoint: endpoint.name.clone(),
            partition,
            sender: Arc::clone(&sender),
            dead_letter_after: Duration::from_millis(webhook.dead_letter_after_ms),
            health: ctx.delivery_health.partition(&endpoint.name, partition),
        };
        tokio::spawn(task.run(stop.clone()));
    }
    tracing::info!(endpoint = %endpoint.name, url = %webhook.url, "delivering to a webhook");
    Some(Running { target, stop })
}
