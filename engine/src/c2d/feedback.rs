//! Delivery feedback (C2D-5): records produced when a message with `ack` set completes or dies,
//! and the feedback queue the service reads them from.
//!
//! # Invariants
//! - A record is staged in the same batch as the state change that produced it, so no
//!   acknowledged completion or death can lose its feedback.
//! - Records wait in `c2d_feedback` until a receiver asks; then as many as are waiting (up to
//!   [`QueueSettings::feedback_batch`]) are packed into one feedback message, which from then on
//!   has the lock / complete / abandon / TTL / max-delivery life of any queued message. Packing
//!   and locking the new message is one batch.
//! - A record older than the feedback TTL is never delivered; the TTL sweeper deletes it.

use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use super::queue::{self, Head, Lock, Queued};
use super::token::LockToken;
use super::{C2dError, DeviceContent, QueueSettings, Settle, Settled};
use crate::error::StorageError;
use crate::keys::{self, c2d::FEEDBACK_QUEUE, c2d::TIMER_EXPIRY, c2d::TIMER_LOCK};
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

/// Why a message left its queue (seed 002's `StatusCode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FeedbackStatus {
    Success,
    Expired,
    DeliveryCountExceeded,
    Rejected,
}

impl FeedbackStatus {
    /// The numeric `StatusCode`.
    pub fn code(self) -> u8 {
        match self {
            FeedbackStatus::Success => 0,
            FeedbackStatus::Expired => 1,
            FeedbackStatus::DeliveryCountExceeded => 2,
            FeedbackStatus::Rejected => 3,
        }
    }

    /// The `Description` string for the status.
    pub fn description(self) -> &'static str {
        match self {
            FeedbackStatus::Success => "Success",
            FeedbackStatus::Expired => "Message expired",
            FeedbackStatus::DeliveryCountExceeded => "Message delivery count exceeded",
            FeedbackStatus::Rejected => "Message rejected",
        }
    }
}

/// One feedback record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackRecord {
    pub original_message_id: Option<String>,
    /// When the message left its queue (completed, expired, ...).
    pub enqueued_time: UnixMillis,
    pub status: FeedbackStatus,
    pub device_id: String,
    pub device_generation_id: String,
}

/// A locked feedback message: a batch of records.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FeedbackMessage {
    pub lock_token: String,
    pub sequence: u64,
    pub enqueued: UnixMillis,
    pub delivery_count: u32,
    pub records: Vec<FeedbackRecord>,
}

type FeedbackContent = Vec<FeedbackRecord>;

impl Store {
    /// Stages a feedback record for a message leaving its device queue.
    pub(crate) fn stage_feedback(
        &self,
        batch: &mut Batch,
        device_id: &str,
        q: &Queued<DeviceContent>,
        status: FeedbackStatus,
        now: UnixMillis,
    ) {
        let sequence = self
            .feedback_sequence
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let record = FeedbackRecord {
            original_message_id: q.content.message.message_id.clone(),
            enqueued_time: now,
            status,
            device_id: device_id.to_string(),
            device_generation_id: q.content.generation_id.clone(),
        };
        batch.put_record(
            cf::C2D_FEEDBACK,
            keys::c2d::feedback_record(sequence),
            &record,
        );
    }

    /// Locks the next feedback message, packing waiting records into a new one when no
    /// message is deliverable. `None` when there is no feedback.
    ///
    /// # Errors
    /// Storage errors.
    pub fn receive_feedback(
        &self,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<Option<FeedbackMessage>, StorageError> {
        let _guard = self.feedback_lock.lock();
        let mut batch = Batch::default();
        let mut head = Head::load(&self.raw, FEEDBACK_QUEUE)?;
        let before = head;
        let existing = queue::lock_available::<FeedbackContent>(
            &self.raw,
            &mut batch,
            FEEDBACK_QUEUE,
            &mut head,
            1,
            now,
            settings.lock_timeout_ms,
        )?;
        if head != before {
            head.put(&mut batch, FEEDBACK_QUEUE);
        }
        if let Some((q, token)) = existing.into_iter().next() {
            self.raw.commit(batch)?;
            return Ok(Some(to_message(q, token)));
        }
        let mut records = Vec::new();
        self.raw.scan_records(
            cf::C2D_FEEDBACK,
            &[],
            None,
            |key, record: FeedbackRecord| {
                batch.delete(cf::C2D_FEEDBACK, key.to_vec());
                if record
                    .enqueued_time
                    .0
                    .saturating_add(settings.feedback_ttl_ms)
                    > now.0
                {
                    records.push(record);
                }
                records.len() < settings.feedback_batch.max(1)
            },
        )?;
        if records.is_empty() {
            self.raw.commit(batch)?;
            return Ok(None);
        }
        let token = LockToken::new(head.next_sequence);
        let until = UnixMillis(now.0.saturating_add(settings.lock_timeout_ms));
        let q = Queued {
            sequence: head.next_sequence,
            enqueued: now,
            expiry: UnixMillis(now.0.saturating_add(settings.feedback_ttl_ms)),
            delivery_count: 1,
            lock: Some(Lock {
                nonce: token.nonce,
                until,
            }),
            content: records,
        };
        q.put(&mut batch, FEEDBACK_QUEUE);
        batch.put_record(
            cf::C2D_TIMERS,
            keys::c2d::timer(TIMER_EXPIRY, q.expiry.0, FEEDBACK_QUEUE, q.sequence),
            &(),
        );
        batch.put_record(
            cf::C2D_TIMERS,
            keys::c2d::timer(TIMER_LOCK, until.0, FEEDBACK_QUEUE, q.sequence),
            &(),
        );
        head.next_sequence += 1;
        head.depth += 1;
        head.put(&mut batch, FEEDBACK_QUEUE);
        self.raw.commit(batch)?;
        Ok(Some(to_message(q, token)))
    }

    /// Completes or abandons a feedback message. Abandoning it after its last allowed
    /// delivery drops it (feedback has no feedback).
    ///
    /// # Errors
    /// [`C2dError::BadLockToken`], [`C2dError::LockLost`], storage.
    pub fn settle_feedback(
        &self,
        lock_token: &str,
        action: Settle,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<Settled, C2dError> {
        let _guard = self.feedback_lock.lock();
        let mut q =
            queue::locked_by::<FeedbackContent>(&self.raw, FEEDBACK_QUEUE, lock_token, now)?;
        let mut head = Head::load(&self.raw, FEEDBACK_QUEUE)?;
        let mut batch = Batch::default();
        let outcome = match action {
            Settle::Complete | Settle::Reject => {
                q.remove(&mut batch, FEEDBACK_QUEUE, &mut head);
                Settled::Removed
            }
            Settle::Abandon if q.delivery_count >= settings.feedback_max_delivery_count => {
                q.remove(&mut batch, FEEDBACK_QUEUE, &mut head);
                Settled::Dead
            }
            Settle::Abandon => {
                q.unlock(&mut batch, FEEDBACK_QUEUE);
                Settled::Requeued
            }
        };
        head.put(&mut batch, FEEDBACK_QUEUE);
        self.raw.commit(batch)?;
        Ok(outcome)
    }

    /// Feedback records waiting to be packed (not counting packed messages).
    ///
    /// # Errors
    /// Storage errors.
    pub fn pending_feedback_records(&self) -> Result<usize, StorageError> {
        let mut n = 0;
        self.raw
            .scan_records(cf::C2D_FEEDBACK, &[], None, |_, _: FeedbackRecord| {
                n += 1;
                true
            })?;
        Ok(n)
    }

    /// Deletes waiting records older than the feedback TTL; returns how many, and when the
    /// oldest remaining one expires.
    pub(crate) fn drop_expired_feedback_records(
        &self,
        now: UnixMillis,
        settings: &QueueSettings,
        limit: usize,
    ) -> Result<(usize, Option<UnixMillis>), StorageError> {
        let mut batch = Batch::default();
        let mut dropped = 0;
        let mut next = None;
        self.raw
            .scan_records(cf::C2D_FEEDBACK, &[], None, |key, r: FeedbackRecord| {
                let expires = r.enqueued_time.0.saturating_add(settings.feedback_ttl_ms);
                if expires <= now.0 && dropped < limit {
                    batch.delete(cf::C2D_FEEDBACK, key.to_vec());
                    dropped += 1;
                    true
                } else {
                    next = Some(UnixMillis(expires));
                    false
                }
            })?;
        self.raw.commit(batch)?;
        Ok((dropped, next))
    }
}

fn to_message(q: Queued<FeedbackContent>, token: LockToken) -> FeedbackMessage {
    FeedbackMessage {
        lock_token: token.render(),
        sequence: q.sequence,
        enqueued: q.enqueued,
        delivery_count: q.delivery_count,
        records: q.content,
    }
}
