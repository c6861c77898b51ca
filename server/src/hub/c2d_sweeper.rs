//! The two C2D deadline tasks (lock expiry, TTL expiry).
//!
//! # Invariants
//! - Each deadline task sleeps until the earliest stored deadline of its kind, or until a new
//!   deadline earlier than the one it planned for is created ([`super::c2d::C2d::scheduled`]).
//!   Nothing polls queues.
//! - After a sweep returns messages to their queues or kills them, the devices' connections are
//!   woken, so a requeued message is delivered again, and the messages behind a dead one are
//!   fetched, without waiting for a new send.
//! - Deadlines are wall times read from the hub's clock, so a paused test clock drives them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ferrohub_engine::c2d::{SweepReport, TimerKind};
use tokio_util::sync::CancellationToken;

use super::context::HubContext;
use crate::ids::DeviceId;

/// Most timers one sweep handles before it commits and looks again.
const SWEEP_LIMIT: usize = 512;
/// The longest a deadline task sleeps without looking (a safety net, not the mechanism).
const MAX_SLEEP: Duration = Duration::from_secs(300);

/// Runs the deadline task of `kind` until shutdown.
pub async fn run(kind: TimerKind, ctx: HubContext, shutdown: CancellationToken) {
    let (store, connections, clock) = (&ctx.store, &ctx.connections, &ctx.clock);
    let settings = ctx.c2d.settings;
    let alarm = ctx.c2d.alarm(kind);
    loop {
        let at = clock.now();
        let swept: Result<SweepReport, _> = store
            .run(move |s| match kind {
                TimerKind::Lock => s.expire_c2d_locks(at, &settings, SWEEP_LIMIT),
                TimerKind::Expiry => s.expire_c2d_messages(at, &settings, SWEEP_LIMIT),
            })
            .await;
        let more = match swept {
            Ok(report) => {
                if report.dead > 0 || !report.requeued_devices.is_empty() {
                    tracing::debug!(
                        ?kind,
                        dead = report.dead,
                        requeued = report.requeued_devices.len(),
                        "c2d sweep"
                    );
                }
                // Requeued messages are deliverable again; dead ones freed window room.
                for device in report.requeued_devices.iter().chain(&report.dead_devices) {
                    connections.wake_c2d(&DeviceId::new(device.as_str()));
                }
                report.more
            }
            Err(e) => {
                tracing::error!(?kind, error = %e, "c2d sweep failed; retrying");
                false
            }
        };
        if more {
            continue;
        }
        // While the next deadline is being read, any new deadline must wake us: it may have
        // been committed after the read saw the index. (`scheduled` wakes when the new
        // deadline is earlier than `planned`; every deadline is earlier than MAX.)
        alarm.planned.store(i64::MAX, Ordering::Release);
        let next = store
            .run(move |s| s.next_c2d_deadline(kind, &settings))
            .await
            .unwrap_or_else(|e| {
                tracing::error!(?kind, error = %e, "cannot read the next c2d deadline");
                None
            });
        alarm
            .planned
            .store(next.map_or(i64::MAX, |d| d.0), Ordering::Release);
        let sleep = next.map_or(MAX_SLEEP, |d| {
            Duration::from_millis((d.0 - clock.now().0).max(0) as u64 + 1).min(MAX_SLEEP)
        });
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = alarm.notify.notified() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
