//! The event router task: reads the engine's notification outbox in order, shapes each record
//! as its non-telemetry event ([`crate::routing::events`]), routes it, and appends the routed
//! events together with its cursor.
//!
//! # Invariants
//! - Records are handled strictly in sequence order and each exactly once: the cursor moves
//!   in the batch that stores their events (see `ferrohub_engine::endpoints`).
//! - All of it, twin reads for `$twin` conditions included, runs behind the store seam.
//! - Routed records are handed to the configuration reconciler (twins that may now be
//!   targeted differently).

use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::d2c::NewEvent;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::context::HubContext;
use super::routes::StoreTwins;
use crate::routing::events::to_event;

/// Records routed per batch.
const BATCH: usize = 256;
/// The longest the task sleeps without looking (the wake-up is the mechanism).
const IDLE_CHECK: Duration = Duration::from_secs(5);
/// After a wake-up, how long notifications gather before a pass reads them. A pass is two
/// thread hand-offs and a write; under a connect storm (two notifications per connection)
/// passes of one or two records each cost more than the routing. Events wait this much more.
const GATHER: Duration = Duration::from_millis(2);

/// Routes the outbox until shutdown. `wake` is notified by the engine after new records.
pub async fn run(ctx: HubContext, wake: Arc<Notify>, shutdown: CancellationToken) {
    let mut cursor = match ctx.store.run(|s| s.router_cursor()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the router cursor; non-telemetry events stop");
            return;
        }
    };
    loop {
        let from = cursor;
        let router = Arc::clone(&ctx.routing);
        let clock = ctx.clock.clone();
        let routed = ctx
            .store
            .run(move |s| {
                let notes = s.read_notifications(from, BATCH)?;
                let Some(last) = notes.last() else {
                    return Ok(None);
                };
                let next = last.sequence + 1;
                let at = clock.now();
                // A notification whose source no route takes is routed nowhere: it is not
                // shaped as an event (under a connect storm, two per connection).
                let events: Vec<NewEvent> = notes
                    .iter()
                    .filter(|n| router.routes_source(n.op.source()))
                    .flat_map(|n| {
                        let event = to_event(n, router.hub_name());
                        router.route(
                            &StoreTwins(s),
                            event,
                            n.module_id.as_deref(),
                            n.op.source(),
                            at,
                        )
                    })
                    .filter(|e| e.endpoints.as_ref().is_none_or(|v| !v.is_empty()))
                    .collect();
                let routed: Vec<u64> = notes.iter().map(|n| n.sequence).collect();
                let appended = s.append_routed_notifications(events, at, &routed)?;
                Ok::<_, ferrohub_engine::d2c::D2cError>(Some((next, appended, notes)))
            })
            .await;
        match routed {
            Ok(Some((next, appended, notes))) => {
                for a in appended {
                    ctx.d2c.appended(a.partition, a.sequence_number);
                }
                ctx.configurations.twins_changed(&notes);
                cursor = next;
            }
            Ok(None) => {
                tokio::select! {
                    _ = wake.notified() => tokio::time::sleep(GATHER).await,
                    _ = tokio::time::sleep(IDLE_CHECK) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "routing non-telemetry events failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    }
}
