//! Cloud-to-device state shared by the protocol layers and the deadline tasks: the queue
//! settings, and the alarms that wake a deadline task ([`super::c2d_sweeper`]) when a deadline
//! earlier than the one it sleeps towards is stored.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use ferrohub_engine::c2d::{QueueSettings, TimerKind};
use ferrohub_engine::UnixMillis;
use tokio::sync::Notify;

/// Wakes one deadline task when an earlier deadline than it planned for appears.
pub(super) struct Alarm {
    pub(super) notify: Notify,
    /// The deadline (ms) the task sleeps towards; `i64::MAX` when none.
    pub(super) planned: AtomicI64,
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

    pub(super) fn alarm(&self, kind: TimerKind) -> &Alarm {
        match kind {
            TimerKind::Lock => &self.lock_alarm,
            TimerKind::Expiry => &self.expiry_alarm,
        }
    }
}
