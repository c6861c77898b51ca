//! File-upload notifications (FUP-1): one message per completed upload, in their own queue,
//! delivered to the service with the lock / complete / abandon life of any queued message.
//!
//! # Invariants
//! - The queue (key `u`) has no timer records, so the C2D sweepers never see it: an expired
//!   lock is released, and an expired or exhausted notification dropped, by the next receive
//!   that meets it.
//! - Enqueueing and every state change is one committed batch under the feedback lock (the
//!   queue is as rare and as serial as feedback).

use serde::{Deserialize, Serialize};

use super::queue::{self, Head, Lock, Queued};
use super::token::LockToken;
use super::{C2dError, Settle, Settled};
use crate::error::StorageError;
use crate::keys::c2d::FILE_NOTIFICATION_QUEUE as QUEUE;
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

/// What the service is told about one upload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileNotification {
    pub device_id: String,
    pub blob_name: String,
    pub blob_uri: String,
    pub blob_size: u64,
    pub last_updated: UnixMillis,
}

/// A locked notification.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockedFileNotification {
    pub lock_token: String,
    pub enqueued: UnixMillis,
    pub delivery_count: u32,
    pub notification: FileNotification,
}

/// How long notifications live and how often they are delivered.
#[derive(Debug, Clone, Copy)]
pub struct FileNotificationSettings {
    pub ttl_ms: i64,
    pub lock_timeout_ms: i64,
    pub max_delivery_count: u32,
}

impl Store {
    /// Queues a notification.
    ///
    /// # Errors
    /// Storage errors.
    pub fn enqueue_file_notification(
        &self,
        n: FileNotification,
        now: UnixMillis,
        settings: &FileNotificationSettings,
    ) -> Result<(), StorageError> {
        let _guard = self.feedback_lock.lock();
        let mut head = Head::load(&self.raw, QUEUE)?;
        let q = Queued {
            sequence: head.next_sequence,
            enqueued: now,
            expiry: UnixMillis(now.0.saturating_add(settings.ttl_ms)),
            delivery_count: 0,
            lock: None,
            content: n,
        };
        let mut batch = Batch::default();
        q.put(&mut batch, QUEUE);
        head.next_sequence += 1;
        head.depth += 1;
        head.put(&mut batch, QUEUE);
        self.raw.commit(batch)
    }

    /// Locks the oldest deliverable notification; `None` when there is none.
    ///
    /// # Errors
    /// Storage errors.
    pub fn receive_file_notification(
        &self,
        now: UnixMillis,
        settings: &FileNotificationSettings,
    ) -> Result<Option<LockedFileNotification>, StorageError> {
        let _guard = self.feedback_lock.lock();
        let mut head = Head::load(&self.raw, QUEUE)?;
        let all = queue::all::<FileNotification>(&self.raw, QUEUE, &head)?;
        let mut batch = Batch::default();
        let mut found = None;
        for mut q in all {
            let lock_free = q.lock.is_none_or(|l| l.until <= now);
            if q.expiry <= now || (lock_free && q.delivery_count >= settings.max_delivery_count) {
                q.remove(&mut batch, QUEUE, &mut head);
                continue;
            }
            if lock_free {
                let token = LockToken::new(q.sequence);
                q.lock = Some(Lock {
                    nonce: token.nonce,
                    until: UnixMillis(now.0.saturating_add(settings.lock_timeout_ms)),
                });
                q.delivery_count += 1;
                q.put(&mut batch, QUEUE);
                found = Some(LockedFileNotification {
                    lock_token: token.render(),
                    enqueued: q.enqueued,
                    delivery_count: q.delivery_count,
                    notification: q.content,
                });
                break;
            }
        }
        head.put(&mut batch, QUEUE);
        self.raw.commit(batch)?;
        Ok(found)
    }

    /// Completes (or rejects: dropped) or abandons (back in the queue) a notification.
    ///
    /// # Errors
    /// [`C2dError::BadLockToken`], [`C2dError::LockLost`], storage.
    pub fn settle_file_notification(
        &self,
        lock_token: &str,
        action: Settle,
        now: UnixMillis,
    ) -> Result<Settled, C2dError> {
        let _guard = self.feedback_lock.lock();
        let mut q = queue::locked_by::<FileNotification>(&self.raw, QUEUE, lock_token, now)?;
        let mut head = Head::load(&self.raw, QUEUE)?;
        let mut batch = Batch::default();
        let outcome = match action {
            Settle::Complete | Settle::Reject => {
                q.remove(&mut batch, QUEUE, &mut head);
                Settled::Removed
            }
            Settle::Abandon => {
                q.lock = None;
                q.put(&mut batch, QUEUE);
                Settled::Requeued
            }
        };
        head.put(&mut batch, QUEUE);
        self.raw.commit(batch)?;
        Ok(outcome)
    }
}
