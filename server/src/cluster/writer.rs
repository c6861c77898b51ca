//! The writer's watch over its own standing: renew the lease, and say when to step down.
//!
//! # Invariants
//! - A lease found taken by another node fences the log at once: not one more append.
//! - A lease gone unrenewed until [`WriterLease::valid_until`] (a tenth of the lease before
//!   NATS can expire it and another node take it) stops this node serving at once: the log is
//!   fenced and `stop` cancelled, which closes the listeners and every client connection. So
//!   a writer cut off from NATS serves nothing, stale reads included, by the time another node
//!   can write.
//! - After a failed append the writer refuses writes (503 / CONNACK 3) and keeps serving
//!   reads while its lease holds and until NATS answers again; only then does it step down,
//!   since a step-down needs the log to follow.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::lease::{Renewal, WriterLease};
use super::log::JetStreamLog;
use super::standing::Standing;
use super::Link;

/// Keeps `lease` while this node writes; cancels `stop` when the node must step down. Returns
/// the lease if it may still be held, for release.
pub async fn hold(
    mut lease: WriterLease,
    link: Link,
    log: Arc<JetStreamLog>,
    standing: Arc<Standing>,
    stop: CancellationToken,
) -> Option<WriterLease> {
    let failed = log.failed();
    let mut failure_seen = false;
    let mut tick = tokio::time::interval(lease.renew_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        standing.set_lease_until(Some(lease.valid_until()));
        let deadline = tokio::time::Instant::from_std(lease.valid_until());
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Some(lease),
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(
                    "the writer lease went unrenewed for nearly its whole time (NATS \
                     unreachable): this node stops serving before another can take it"
                );
                log.fence();
                standing.set_lease_until(None);
                stop.cancel();
                return Some(lease);
            }
            _ = tick.tick() => {}
            _ = failed.cancelled(), if !failure_seen => failure_seen = true,
        }
        // A renewal answered after the deadline must not extend it: the sleep above is raced
        // only between renewals, so bound this one by the deadline too.
        let renewal = tokio::time::timeout_at(deadline, lease.renew()).await;
        match renewal {
            Ok(Renewal::Held) if log.is_fenced() => {
                tracing::warn!("the commit log failed and NATS answers again: stepping down");
                stop.cancel();
                return Some(lease);
            }
            Ok(Renewal::Held) => report_log(&link, &log, &standing, deadline).await,
            Ok(Renewal::Lost) => {
                tracing::warn!("another node took the writer lease: stepping down");
                log.fence();
                standing.set_lease_until(None);
                stop.cancel();
                return None;
            }
            Ok(Renewal::Unknown) | Err(_) => {}
        }
    }
}

/// Tells the node's standing what this writer appended and what the log holds (for health
/// and metrics); a log that does not answer before `deadline` is reported next time.
async fn report_log(
    link: &Link,
    log: &JetStreamLog,
    standing: &Standing,
    deadline: tokio::time::Instant,
) {
    standing.set_applied(log.last_sequence());
    if let Ok(Ok((first, end, bytes))) = tokio::time::timeout_at(deadline, link.log_state()).await {
        standing.set_log(first, end, bytes);
    }
}
