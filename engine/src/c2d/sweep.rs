//! The two deadline concerns: lock (visibility) expiry and time-to-live expiry.
//!
//! Each walks only its own due entries in `c2d_timers`, earliest first, and reports when the
//! next one is due, so its task sleeps until exactly then. A timer is acted on only if the
//! message still carries that exact deadline; otherwise it is stale and simply deleted.

use std::collections::{BTreeSet, HashMap};

use ferrohub_migrations::cf;

use super::feedback::FeedbackStatus;
use super::queue::{Head, Queued};
use super::{DeviceContent, QueueChange, QueueSettings, Settled};
use crate::error::StorageError;
use crate::keys::{self, c2d::FEEDBACK_QUEUE, c2d::TIMER_EXPIRY, c2d::TIMER_LOCK};
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

/// Which deadlines a sweeper handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerKind {
    /// Lock (visibility) timeouts: the message returns to its queue, or dies after its last
    /// allowed delivery.
    Lock,
    /// Time-to-live: the message dies with status Expired.
    Expiry,
}

impl TimerKind {
    fn byte(self) -> u8 {
        match self {
            TimerKind::Lock => TIMER_LOCK,
            TimerKind::Expiry => TIMER_EXPIRY,
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Devices with messages deliverable again (to wake their connections).
    pub requeued_devices: Vec<String>,
    /// Devices whose messages died here (their connections have room to fetch more).
    pub dead_devices: Vec<String>,
    /// Messages (and feedback records) that died or were dropped.
    pub dead: usize,
    /// The limit was reached; sweep again at once.
    pub more: bool,
}

struct Due {
    key: Vec<u8>,
    deadline: i64,
    queue: Vec<u8>,
    sequence: u64,
}

impl Store {
    /// When the earliest timer of `kind` is due (for TTL also waiting feedback records).
    ///
    /// # Errors
    /// Storage errors.
    pub fn next_c2d_deadline(
        &self,
        kind: TimerKind,
        settings: &QueueSettings,
    ) -> Result<Option<UnixMillis>, StorageError> {
        let mut next = None;
        let from = [kind.byte()];
        self.raw
            .scan_records(cf::C2D_TIMERS, &from, keys::prefix_end(&from), |k, ()| {
                next = keys::c2d::parse_timer(k).map(|(d, _, _)| UnixMillis(d));
                false
            })?;
        if kind == TimerKind::Expiry {
            let mut oldest = None;
            self.raw.scan_records(
                cf::C2D_FEEDBACK,
                &[],
                None,
                |_, r: super::FeedbackRecord| {
                    oldest = Some(UnixMillis(
                        r.enqueued_time.0.saturating_add(settings.feedback_ttl_ms),
                    ));
                    false
                },
            )?;
            next = match (next, oldest) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(next)
    }

    /// Handles up to `limit` lock timeouts due at `now`.
    ///
    /// # Errors
    /// Storage errors (nothing of the failed batch is applied).
    pub fn expire_c2d_locks(
        &self,
        now: UnixMillis,
        settings: &QueueSettings,
        limit: usize,
    ) -> Result<SweepReport, StorageError> {
        self.sweep(TimerKind::Lock, now, settings, limit)
    }

    /// Handles up to `limit` TTL expiries due at `now`, and drops expired feedback records.
    ///
    /// # Errors
    /// Storage errors (nothing of the failed batch is applied).
    pub fn expire_c2d_messages(
        &self,
        now: UnixMillis,
        settings: &QueueSettings,
        limit: usize,
    ) -> Result<SweepReport, StorageError> {
        let mut report = self.sweep(TimerKind::Expiry, now, settings, limit)?;
        let (dropped, _) = self.drop_expired_feedback_records(now, settings, limit)?;
        report.dead += dropped;
        report.more |= dropped == limit;
        Ok(report)
    }

    fn due_timers(
        &self,
        kind: TimerKind,
        now: UnixMillis,
        limit: usize,
    ) -> Result<Vec<Due>, StorageError> {
        let (from, to) = keys::c2d::timers_due(kind.byte(), now.0);
        let mut due = Vec::new();
        self.raw
            .scan_records(cf::C2D_TIMERS, &from, Some(to), |k, ()| {
                if let Some((deadline, queue, sequence)) = keys::c2d::parse_timer(k) {
                    due.push(Due {
                        key: k.to_vec(),
                        deadline,
                        queue: queue.to_vec(),
                        sequence,
                    });
                }
                due.len() < limit
            })?;
        Ok(due)
    }

    fn sweep(
        &self,
        kind: TimerKind,
        now: UnixMillis,
        settings: &QueueSettings,
        limit: usize,
    ) -> Result<SweepReport, StorageError> {
        let due = self.due_timers(kind, now, limit.max(1))?;
        let mut report = SweepReport {
            more: due.len() >= limit.max(1),
            ..SweepReport::default()
        };
        let (feedback, devices): (Vec<Due>, Vec<Due>) =
            due.into_iter().partition(|d| d.queue == FEEDBACK_QUEUE);
        if !devices.is_empty() {
            self.sweep_devices(kind, devices, now, settings, &mut report)?;
        }
        if !feedback.is_empty() {
            self.sweep_feedback(kind, feedback, settings, &mut report)?;
        }
        Ok(report)
    }

    fn sweep_devices(
        &self,
        kind: TimerKind,
        due: Vec<Due>,
        now: UnixMillis,
        settings: &QueueSettings,
        report: &mut SweepReport,
    ) -> Result<(), StorageError> {
        let ids: BTreeSet<String> = due
            .iter()
            .filter_map(|d| keys::c2d::queue_device(&d.queue).map(str::to_string))
            .collect();
        let _guards = self.stripes.lock_many(ids.iter().map(String::as_str));
        let mut heads: HashMap<Vec<u8>, Head> = HashMap::new();
        let mut requeued = BTreeSet::new();
        let mut died = BTreeSet::new();
        let mut batch = Batch::default();
        for d in &due {
            batch.delete(cf::C2D_TIMERS, d.key.clone());
            let Some(device_id) = keys::c2d::queue_device(&d.queue) else {
                continue;
            };
            let Some(mut q) = Queued::<DeviceContent>::load(&self.raw, &d.queue, d.sequence)?
            else {
                continue;
            };
            if !heads.contains_key(&d.queue) {
                heads.insert(d.queue.clone(), Head::load(&self.raw, &d.queue)?);
            }
            let head = heads.get_mut(&d.queue).expect("inserted above");
            let mut change = QueueChange {
                store: self,
                batch: &mut batch,
                device_id,
                queue: &d.queue,
                head,
                now,
            };
            match kind {
                TimerKind::Lock if q.lock.is_some_and(|l| l.until.0 == d.deadline) => {
                    match change.release(&mut q, settings.max_delivery_count) {
                        Settled::Requeued => {
                            requeued.insert(device_id.to_string());
                        }
                        _ => {
                            report.dead += 1;
                            died.insert(device_id.to_string());
                        }
                    }
                }
                TimerKind::Expiry if q.expiry.0 == d.deadline => {
                    change.kill(&q, FeedbackStatus::Expired);
                    report.dead += 1;
                    died.insert(device_id.to_string());
                }
                _ => {}
            }
        }
        for (queue, head) in &heads {
            head.put(&mut batch, queue);
        }
        self.raw.commit(batch)?;
        report.requeued_devices = requeued.into_iter().collect();
        report.dead_devices = died.into_iter().collect();
        Ok(())
    }

    fn sweep_feedback(
        &self,
        kind: TimerKind,
        due: Vec<Due>,
        settings: &QueueSettings,
        report: &mut SweepReport,
    ) -> Result<(), StorageError> {
        let _guard = self.feedback_lock.lock();
        let mut head = Head::load(&self.raw, FEEDBACK_QUEUE)?;
        let mut batch = Batch::default();
        for d in &due {
            batch.delete(cf::C2D_TIMERS, d.key.clone());
            let Some(mut q) =
                Queued::<Vec<super::FeedbackRecord>>::load(&self.raw, FEEDBACK_QUEUE, d.sequence)?
            else {
                continue;
            };
            let dies = match kind {
                TimerKind::Lock if q.lock.is_some_and(|l| l.until.0 == d.deadline) => {
                    q.delivery_count >= settings.feedback_max_delivery_count
                }
                TimerKind::Expiry => q.expiry.0 == d.deadline,
                TimerKind::Lock => continue,
            };
            if dies {
                q.remove(&mut batch, FEEDBACK_QUEUE, &mut head);
                report.dead += 1;
            } else if kind == TimerKind::Lock {
                q.unlock(&mut batch, FEEDBACK_QUEUE);
            }
        }
        head.put(&mut batch, FEEDBACK_QUEUE);
        self.raw.commit(batch)
    }
}
