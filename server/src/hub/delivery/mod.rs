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
//!   `[routing] endpoint_backlog_limit` ([`backlog`]) and the hub's retention; what expires
//!   undelivered is counted (`outcome="expired"`).
//! - The set of tasks follows the stored endpoints within [`RECONCILE`]: a new or changed
//!   target, or an endpoint deleted and made again (another slot), starts (or restarts) its
//!   tasks, a removed one stops them. A restart waits for the old tasks to end before the new
//!   ones start, so two tasks never deliver one partition at once; a task that ended on its
//!   own (a panic) is started again. A failed listing of the endpoints changes nothing.
//! - At shutdown every task is awaited, so the last cursors are stored before the store
//!   closes.

mod archive;
mod backlog;
mod client_tls;
mod headers;
pub mod health;
mod mqtt;
mod nats;
pub mod sender;
mod storage;
mod storage_writer;
pub mod webhook;
mod worker;

use std::collections::HashMap;
use std::time::Duration;

use ferrohub_engine::endpoints::Endpoint;
use futures::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::HubContext;
pub use health::{DeliveryHealth, EndpointHealth, HealthStatus};

/// How often the stored endpoints are compared with the running tasks.
const RECONCILE: Duration = Duration::from_secs(1);

/// The tasks of one delivered endpoint, and what they deliver.
struct Running {
    endpoint: Endpoint,
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Running {
    /// Stops the tasks and waits until they ended (their cursors stored).
    async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Whether every task still runs (one that panicked ended).
    fn intact(&self) -> bool {
        self.tasks.len() == usize::from(self.endpoint.slot.partitions)
    }
}

/// Keeps one task per partition of every endpoint with a target, and the backlog watch (at most
/// `backlog_limit` events per endpoint), until `shutdown`.
pub async fn run(ctx: HubContext, backlog_limit: u64, shutdown: CancellationToken) {
    let watch = tokio::spawn(backlog::watch(ctx.clone(), backlog_limit, shutdown.clone()));
    let mut running: HashMap<String, Running> = HashMap::new();
    loop {
        let listed = ctx
            .store
            .run(|s| Ok::<_, ferrohub_engine::StorageError>(s.list_endpoints()))
            .await;
        match listed {
            Ok(endpoints) => reconcile(&ctx, &mut running, endpoints, &shutdown).await,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list endpoints to deliver; keeping the tasks as they are")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(RECONCILE) => {}
        }
    }
    for (_, r) in running.drain() {
        r.stop().await;
    }
    let _ = watch.await;
}

/// Makes the running tasks match the endpoints with a target.
async fn reconcile(
    ctx: &HubContext,
    running: &mut HashMap<String, Running>,
    endpoints: Vec<Endpoint>,
    shutdown: &CancellationToken,
) {
    let wanted: HashMap<String, Endpoint> = endpoints
        .into_iter()
        .filter(|e| e.delivery.is_some())
        .map(|e| (e.name.clone(), e))
        .collect();
    // Also joins the ended tasks of every endpoint kept, which `intact` then counts.
    for r in running.values_mut() {
        while let Some(Some(ended)) = r.tasks.join_next().now_or_never() {
            if let Err(e) = ended {
                tracing::error!(endpoint = %r.endpoint.name, error = %e, "a delivery task ended; starting it again");
            }
        }
    }
    let stale: Vec<String> = running
        .iter()
        .filter(|(name, r)| wanted.get(*name) != Some(&r.endpoint) || !r.intact())
        .map(|(name, _)| name.clone())
        .collect();
    for name in stale {
        if let Some(r) = running.remove(&name) {
            r.stop().await;
        }
    }
    for (name, endpoint) in &wanted {
        if running.contains_key(name) {
            continue;
        }
        if let Some(r) = start(ctx, endpoint, shutdown).await {
            running.insert(name.clone(), r);
        }
    }
    ctx.delivery_health.retain(|e| wanted.contains_key(e));
}

/// Starts an endpoint's partition tasks; `None` (logged) when its target cannot be used.
async fn start(
    ctx: &HubContext,
    endpoint: &Endpoint,
    shutdown: &CancellationToken,
) -> Option<Running> {
    let target = endpoint.delivery.as_ref()?;
    let senders = match sender::for_partitions(endpoint, ctx.routing.hub_name()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(endpoint = %endpoint.name, error = %e, "cannot deliver to this endpoint's target");
            // Said where an operator looks, not only in the log.
            let now = ctx.clock.now();
            for p in endpoint.slot.base..endpoint.slot.base + endpoint.slot.partitions {
                ctx.delivery_health
                    .partition(&endpoint.name, p)
                    .failed(e.clone(), now);
            }
            return None;
        }
    };
    let stop = shutdown.child_token();
    let mut tasks = JoinSet::new();
    for (partition, sender) in senders {
        let task = worker::PartitionDelivery {
            ctx: ctx.clone(),
            endpoint: endpoint.name.clone(),
            partition,
            sender,
            dead_letter_after: Duration::from_millis(target.dead_letter_after_ms()),
            health: ctx.delivery_health.partition(&endpoint.name, partition),
        };
        tasks.spawn(task.run(stop.clone()));
    }
    tracing::info!(endpoint = %endpoint.name, kind = target.kind(), to = %target.shown(), "delivering outside the hub");
    Some(Running {
        endpoint: endpoint.clone(),
        stop,
        tasks,
    })
}
