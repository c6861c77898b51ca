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
//! - The store sits in a [`StoreSlot`] (see [`super::store_slot`]) that every handle and lane reads per call, so
//!   [`super::storage_recovery`] can put a reopened store in place of a poisoned one; nothing
//!   else keeps an `Arc<Store>` beyond one call.

use std::sync::Arc;

use ferrohub_engine::{CommitHold, StorageError, Store};
use tokio::sync::Semaphore;

use super::append_lane::AppendLane;
use super::d2c_notify::D2cNotify;
use super::store_slot::StoreSlot;

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
