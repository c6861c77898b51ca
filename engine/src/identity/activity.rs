//! A device's or module's last activity time: moved by its traffic, not only by connecting and
//! disconnecting, as IoT Hub's `lastActivityTime` is ("the last time the device connected,
//! received, or sent a message").
//!
//! # Invariants
//! - Only `last_activity_time` changes: no etag, no version, no connection state, no event.
//! - The time only moves forward; an earlier or equal time writes nothing.
//! - Like a connection state, the write may lag its sync: it describes traffic that a crash
//!   ends anyway, and IoT Hub documents the field as one that may lag.

use super::Txn;
use crate::error::{RegistryError, StorageError};
use crate::model::UnixMillis;
use crate::Store;

impl Store {
    /// Moves the identity's last activity time to `now`, queued without waiting for the sync
    /// (`done` runs on the commit thread once it is written, or at once when nothing is).
    /// Returns whether anything was queued: not for an identity that no longer exists or whose
    /// time is already `now` or later.
    ///
    /// # Errors
    /// Storage errors before anything is queued (`done` is then dropped unrun);
    /// [`StorageError::WouldBlock`] from a caller that may not wait.
    pub fn record_activity_then(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        now: UnixMillis,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<bool, RegistryError> {
        let _guard = self.stripes.lock_unless_waiting(device_id)?;
        let mut txn = Txn::new(self);
        let current = match module_id {
            Some(m) => txn.module(device_id, m)?,
            None => txn.device(device_id)?,
        };
        let Some(current) = current else {
            done(Ok(()));
            return Ok(false);
        };
        if current.last_activity_time.is_some_and(|t| t >= now) {
            done(Ok(()));
            return Ok(false);
        }
        let mut next = current.clone();
        next.last_activity_time = Some(now);
        match module_id {
            Some(_) => txn.put_module(next),
            None => txn.put_device(Some(&current), next),
        }
        txn.batch.may_lag();
        txn.submit_pipelined(done)?;
        Ok(true)
    }
}
