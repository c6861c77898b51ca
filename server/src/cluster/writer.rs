//! The writer's watch over its own standing: renew the lease, and say when to step down.
//!
//! # Invariants
//! - A lease found taken by another node fences the log at once: not one more append.
//! - After a failed append the writer refuses writes (503 / CONNACK 3) and keeps serving
//!   reads until NATS answers again; only then does it step down, since a step-down needs the
//!   log to follow.
//! - A lease merely unrenewed (NATS electing a new leader for the bucket) changes nothing by
//!   itself: if another node takes the lease and appends, this writer's next append is fenced.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::lease::{Renewal, WriterLease};
use super::log::JetStreamLog;

/// Keeps `lease` while this node writes; cancels `stop` when the node must step down. Returns
/// the lease if it is still held, for release.
pub async fn hold(
    mut lease: WriterLease,
    log: Arc<JetStreamLog>,
    stop: CancellationToken,
) -> Option<WriterLease> {
    let failed = log.failed();
    let mut failure_seen = false;
    let mut tick = tokio::time::interval(lease.renew_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Some(lease),
            _ = tick.tick() => {}
            _ = failed.cancelled(), if !failure_seen => failure_seen = true,
        }
        match lease.renew().await {
            Renewal::Held if log.is_fenced() => {
                tracing::warn!("the commit log failed and NATS answers again: stepping down");
                stop.cancel();
                return Some(lease);
            }
            Renewal::Held => {}
            Renewal::Lost => {
                tracing::warn!("another node took the writer lease: stepping down");
                log.fence();
                stop.cancel();
                return None;
            }
            Renewal::Unknown => {
                if lease.expired() {
                    tracing::warn!("the writer lease went unrenewed for its whole time");
                }
            }
        }
    }
}
