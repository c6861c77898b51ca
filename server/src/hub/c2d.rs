//! Cloud-to-device glue between the protocol layers and the engine's queues: the queue
//! settings, the two deadline tasks (lock expiry, TTL expiry) and the wake-ups that tell a
//! connected device's connection to look at its queue again.
//!
//! # Invariants
//! - Each deadline task sleeps until the earliest stored deadline of its kind, or until a new
//!   deadline earlier than the one it planned for is created ([`C2d::scheduled`]). Nothing
//!   polls queues.
//! - After a sweep returns messages to their queues or kills them, the devices' connections are
//!   woken, so a requeued message is delivered again, and the messages behind a dead one are
//!   fetched, without waiting for a new send.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::c2d::{QueueSettings, SweepReport, TimerKind};
use ferrohub_engine::UnixMillis;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Connections, StoreHandle};
use crate::rest::now;

/// Most timers one sweep handles before it commits and looks again.
const SWEEP_LIMIT: usize = 512;
/// The longest a deadline task sleeps without looking (a safety net, not the mechanism).
const MAX_SLEEP: Duration = Duration::from_secs(300);

/// Wakes one deadline task when an earlier deadline than it planned for appears.
struct Alarm {
    notify: Notify,
    /// The deadline (ms) the task sleeps towards; `i64::MAX` when none.
    planned: AtomicI64,
}

impl Default for Alarm {
    fn default() -> Self {
        Alarm {
            notify: Notify::new(),
            // Until the task has looked, every new deadline wakes it.
            planned: AtomicI64::new(i64::MAX),
        }
    }
}

impl Alarm {
    fn scheduled(&self, deadline: UnixMillis) {
        if deadline.0 < self.planned.load(Ordering::Acquire) {
            self.notify.notify_one();
        }
    }
}

/// Shared C2D state: settings and the deadline alarms.
pub struct C2d {
    pub settings: QueueSettings,
    lock_alarm: Alarm,
    expiry_alarm: Alarm,
}

impl C2d {
    pub fn new(settings: QueueSettings) -> Arc<Self> {
        Arc::new(C2d {
            settings,
            lock_alarm: Alarm::default(),
            expiry_alarm: Alarm::default(),
        })
    }

    /// Tells the deadline task of `kind` that a deadline was stored.
    pub fn scheduled(&self, kind: TimerKind, deadline: UnixMillis) {
        self.alarm(kind).scheduled(deadline);
    }

    fn alarm(&self, kind: TimerKind) -> &Alarm {
        match kind {
            TimerKind::Lock => &self.lock_alarm,
            TimerKind::Expiry => &self.expiry_alarm,
        }
    }
}

/// Runs the deadline task of `kind` until shutdown.
pub async fn run_sweeper(
    kind: TimerKind,
    c2d: Arc<C2d>,
    store: StoreHandle,
    connections: Arc<Connections>,
    shutdown: CancellationToken,
) {
    let settings = c2d.settings;
    let alarm = c2d.alarm(kind);
    loop {
        let at = now();
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
                    connections.wake_c2d(device);
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
            Duration::from_millis((d.0 - now().0).max(0) as u64 + 1).min(MAX_SLEEP)
        });
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = alarm.notify.notified() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
