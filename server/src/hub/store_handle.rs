//! The one async seam to the synchronous engine: every protocol adapter and hub task reaches
//! the [`Store`] through a [`StoreHandle`], and nothing else holds the store.
//!
//! # Invariants
//! - No engine call runs on a runtime worker thread: [`StoreHandle::run`] moves a call to
//!   tokio's blocking pool, and device messages go through an [`AppendLane`], which routes and
//!   stages them there too.
//! - Writes that do not wait for their own durability (lane appends) are admitted first: an
//!   async permit, one per staged batch, returned when its write completed. At most the engine's
//!   commit queue depth is admitted, so a stalled disk suspends the writing tasks at admission
//!   instead of parking a worker thread in the engine's blocking submit.
//! - Calls through `run` may block their blocking-pool thread while a write is synced; many
//!   such waiters are exactly what lets the committer fold their writes into one sync.
//! - The store sits in a [`StoreSlot`] that every handle and lane reads per call, so
//!   [`super::storage_recovery`] can put a reopened store in place of a poisoned one; nothing
//!   else keeps an `Arc<Store>` beyond one call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferrohub_engine::{CommitHold, StorageError, Store};
use parking_lot::RwLock;
use tokio::sync::Semaphore;

use super::append_lane::AppendLane;
use super::d2c_notify::D2cNotify;

/// The store in use. `None` only while storage recovery could open neither a writable nor a
/// read-only store; `read_only` while it serves a read-only one.
pub struct StoreSlot {
    store: RwLock<Option<Arc<Store>>>,
    read_only: AtomicBool,
}

impl StoreSlot {
    fn new(store: Arc<Store>) -> Self {
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

    /// Whether writes are refused: the store is poisoned, read-only, or missing.
    pub fn refuses_writes(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
            || self.store.read().as_ref().is_none_or(|s| s.is_poisoned())
    }

    /// Exclusive access for replacing the store (storage recovery only).
    pub(super) fn replace(&self) -> parking_lot::RwLockWriteGuard<'_, Option<Arc<Store>>> {
        self.store.write()
    }

    pub(super) fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }
}

#[derive(Clone)]
pub struct StoreHandle {
    slot: Arc<StoreSlot>,
    admission: Arc<Semaphore>,
}

impl StoreHandle {
    pub fn new(store: Arc<Store>) -> Self {
        let permits = store.commit_queue_depth().max(1);
        StoreHandle {
            slot: Arc::new(StoreSlot::new(store)),
            admission: Arc::new(Semaphore::new(permits)),
        }
    }

    pub(super) fn slot(&self) -> &Arc<StoreSlot> {
        &self.slot
    }

    /// Runs `f` against the store on the blocking pool.
    ///
    /// # Errors
    /// The closure's own error; a panic inside it becomes [`StorageError::Backend`] (via `E`).
    pub async fn run<T, E>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
    {
        let slot = Arc::clone(&self.slot);
        // Read the slot on the blocking thread: storage recovery may hold it while it reopens.
        let call = move || -> Result<T, E> {
            let store = slot.current()?;
            f(&store)
        };
        match tokio::task::spawn_blocking(call).await {
            Ok(r) => r,
            Err(e) => Err(E::from(StorageError::Backend(format!(
                "engine task failed: {e}"
            )))),
        }
    }

    /// A new ordered lane for one connection's (or one request's) device messages; readers
    /// of the partitions they land in are woken through `readers`.
    pub fn lane(&self, readers: Arc<D2cNotify>) -> AppendLane {
        AppendLane::new(
            Arc::clone(&self.slot),
            Arc::clone(&self.admission),
            readers,
        )
    }

    /// Holds every write until the guard is dropped (see `ferrohub_engine::Store::hold_commits`).
    #[doc(hidden)]
    pub fn hold_commits(&self) -> Option<CommitHold> {
        self.slot.current().ok()?.hold_commits()
    }

    /// Whether writes are refused (a failed durable write poisoned the store, or recovery
    /// serves it read-only): flag reads, no engine work.
    pub fn is_poisoned(&self) -> bool {
        self.slot.refuses_writes()
    }

    /// Finishes queued writes, syncs and flushes, on the blocking pool.
    ///
    /// # Errors
    /// [`StorageError`] when the final flush fails.
    pub async fn close(&self) -> Result<(), StorageError> {
        self.run(|s| s.close()).await
    }
}
