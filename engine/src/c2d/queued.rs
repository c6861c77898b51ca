//! C2D queue changes answered from the commit thread: a send (locking or not), receive or settle is staged
//! and queued for the group committer on the calling thread, which then goes free; `done` runs
//! on the commit thread once the batch is durable (or with the storage error that lost it).
//!
//! # Invariants
//! - The device's stripe is held from the first read until the batch is durable (the guard
//!   travels with the callback and is dropped before `done` runs), exactly as the waiting
//!   forms hold it across their commit: the next change of the queue reads what this one
//!   wrote. What goes away is only the thread that used to wait for the sync.
//! - On an error before anything is queued the call returns it and `done` is dropped unrun.
//! - Without waiting (`Store::without_waiting`) the stripe is only tried: a stripe held until
//!   another write of the device is durable refuses the call before it reads anything.

use super::{C2dError, C2dMessage, Delivered, LockOnSend, QueueSettings, Sent, Settle, Settled};
use crate::error::StorageError;
use crate::model::UnixMillis;
use crate::Store;

impl Store {
    /// [`Store::send_c2d`], answered through `done` once durable.
    ///
    /// # Errors
    /// As [`Store::send_c2d`], before anything is queued.
    pub fn send_c2d_then(
        &self,
        device_id: &str,
        message: C2dMessage,
        now: UnixMillis,
        settings: &QueueSettings,
        done: impl FnOnce(Result<Sent, StorageError>) + Send + 'static,
    ) -> Result<(), C2dError> {
        self.queue_then(device_id, done, |s| {
            s.stage_send(device_id, message, now, settings, LockOnSend::No)
                .map(|(batch, (sent, _))| (batch, sent))
        })
    }

    /// [`Store::send_c2d_locked`], answered through `done` once durable.
    ///
    /// # Errors
    /// As [`Store::send_c2d`], before anything is queued.
    pub fn send_c2d_locked_then(
        &self,
        device_id: &str,
        message: C2dMessage,
        now: UnixMillis,
        settings: &QueueSettings,
        done: impl FnOnce(Result<(Sent, Option<Delivered>), StorageError>) + Send + 'static,
    ) -> Result<(), C2dError> {
        self.queue_then(device_id, done, |s| {
            s.stage_send(device_id, message, now, settings, LockOnSend::IfEmpty)
        })
    }

    /// [`Store::receive_c2d`], answered through `done` once the locks are durable.
    ///
    /// # Errors
    /// Storage errors before anything is queued.
    pub fn receive_c2d_then(
        &self,
        device_id: &str,
        max: usize,
        now: UnixMillis,
        settings: &QueueSettings,
        done: impl FnOnce(Result<Vec<Delivered>, StorageError>) + Send + 'static,
    ) -> Result<(), C2dError> {
        if max == 0 {
            done(Ok(Vec::new()));
            return Ok(());
        }
        self.queue_then(device_id, done, |s| {
            s.stage_receive(device_id, max, now, settings)
        })
    }

    /// [`Store::settle_c2d`], answered through `done` once durable.
    ///
    /// # Errors
    /// As [`Store::settle_c2d`] (a bad or lost lock token), before anything is queued.
    pub fn settle_c2d_then(
        &self,
        device_id: &str,
        lock_token: &str,
        action: Settle,
        now: UnixMillis,
        settings: &QueueSettings,
        done: impl FnOnce(Result<Settled, StorageError>) + Send + 'static,
    ) -> Result<(), C2dError> {
        self.queue_then(device_id, done, |s| {
            s.stage_settle(device_id, lock_token, action, now, settings)
        })
    }

    /// Stages a change of `device_id`'s queue under its stripe and queues the batch; the
    /// stripe is released on the commit thread, just before `done` gets the answer.
    pub(super) fn queue_then<T: Send + 'static>(
        &self,
        device_id: &str,
        done: impl FnOnce(Result<T, StorageError>) + Send + 'static,
        stage: impl FnOnce(&Store) -> Result<(crate::raw::Batch, T), C2dError>,
    ) -> Result<(), C2dError> {
        let guard = self.stripes.lock_unless_waiting(device_id)?;
        let (batch, answer) = stage(self)?;
        self.raw.submit_then(
            batch,
            Box::new(move |r| {
                drop(guard);
                done(r.map(|()| answer))
            }),
        )?;
        Ok(())
    }
}
