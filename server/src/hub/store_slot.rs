//! The store in use, replaceable: [`super::storage_recovery`] puts a reopened store in place of
//! a poisoned one, and every [`super::StoreHandle`] call and append lane reads the slot once per
//! call, so nothing keeps the old store beyond the call that holds it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferrohub_engine::{StorageError, Store};
use parking_lot::RwLock;

/// The store in use. `None` only while storage recovery could open neither a writable nor a
/// read-only store; `read_only` while it serves a read-only one.
pub struct StoreSlot {
    store: RwLock<Option<Arc<Store>>>,
    read_only: AtomicBool,
}

impl StoreSlot {
    pub(super) fn new(store: Arc<Store>) -> Self {
        StoreSlot {
            store: RwLock::new(Some(store)),
            read_only: AtomicBool::new(false),
        }
    }

    /// The store for one call.
    ///
    /// # Errors
    /// [`StorageError::Closed`] while there is none.
    pub fn current(&self) -> Result<Arc<Store>, StorageError> {
        self.store.read().clone().ok_or(StorageError::Closed)
    }

    /// The store without waiting: `None` while recovery holds the slot (or there is none).
    /// For callers on a runtime thread.
    pub fn try_current(&self) -> Option<Arc<Store>> {
        self.store.try_read()?.clone()
    }

    /// Whether writes are refused: the store is poisoned, read-only, missing, or being
    /// replaced. Never waits (callers include connection handshakes on runtime threads).
    pub fn refuses_writes(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
            || self
                .store
                .try_read()
                .is_none_or(|g| g.as_ref().is_none_or(|s| s.is_poisoned()))
    }

    /// Exclusive access for replacing the store (storage recovery only).
    pub(super) fn replace(&self) -> parking_lot::RwLockWriteGuard<'_, Option<Arc<Store>>> {
        self.store.write()
    }

    pub(super) fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }
}
