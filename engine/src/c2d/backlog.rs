//! Completing a message and locking the next ones in one batch (C2D-3, issue 19): what a
//! receiver with a backlog does at each acknowledgement, in one commit instead of a settle and
//! a receive.
//!
//! # Invariants
//! - As a settle followed by a receive: the token must be the message's current, unexpired
//!   lock or nothing changes ([`C2dError::LockLost`]); the messages locked are the oldest
//!   deliverable ones, each counting a delivery. The completed message is locked, so the scan
//!   for deliverable messages passes over it.
//! - The device's stripe is held from the first read until the batch is durable.

use super::{queue, C2dError, Delivered, DeviceContent, QueueChange, QueueSettings};
use crate::error::StorageError;
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

impl Store {
    /// Completes the message `lock_token` names and locks up to `max` deliverable messages
    /// behind it.
    ///
    /// # Errors
    /// [`C2dError::BadLockToken`], [`C2dError::LockLost`] (nothing changes), storage.
    pub fn complete_and_receive_c2d(
        &self,
        device_id: &str,
        lock_token: &str,
        max: usize,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<Vec<Delivered>, C2dError> {
        let _guard = self.stripes.lock(device_id);
        let (batch, delivered) =
            self.stage_complete_and_receive(device_id, lock_token, max, now, settings)?;
        self.raw.commit(batch)?;
        Ok(delivered)
    }

    /// [`Store::complete_and_receive_c2d`], answered through `done` once durable.
    ///
    /// # Errors
    /// As [`Store::complete_and_receive_c2d`], before anything is queued.
    pub fn complete_and_receive_c2d_then(
        &self,
        device_id: &str,
        lock_token: &str,
        max: usize,
        now: UnixMillis,
        settings: &QueueSettings,
        done: impl FnOnce(Result<Vec<Delivered>, StorageError>) + Send + 'static,
    ) -> Result<(), C2dError> {
        self.queue_then(device_id, done, |s| {
            s.stage_complete_and_receive(device_id, lock_token, max, now, settings)
        })
    }

    fn stage_complete_and_receive(
        &self,
        device_id: &str,
        lock_token: &str,
        max: usize,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<(Batch, Vec<Delivered>), C2dError> {
        let queue = keys::c2d::device_queue(device_id);
        let completed = queue::locked_by::<DeviceContent>(&self.raw, &queue, lock_token, now)?;
        let mut head = super::Head::load(&self.raw, &queue)?;
        let mut batch = Batch::default();
        // `lock_available` takes at least one message: a receiver with no room gets none.
        let locked = if max == 0 {
            Vec::new()
        } else {
            self.lock_next(&mut batch, &queue, &mut head, max, now, settings)?
        };
        QueueChange {
            store: self,
            batch: &mut batch,
            device_id,
            queue: &queue,
            head: &mut head,
            now,
        }
        .complete(&completed);
        head.put(&mut batch, &queue);
        Ok((batch, super::delivered(locked)))
    }
}
