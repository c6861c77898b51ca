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

use std::sync::Arc;

use ferrohub_engine::{CommitHold, StorageError, Store};
use tokio::sync::Semaphore;

use super::append_lane::AppendLane;
use super::d2c_notify::D2cNotify;

#[derive(Clone)]
pub struct StoreHandle {
    store: Arc<Store>,
    admission: Arc<Semaphore>,
}

impl StoreHandle {
    pub fn new(store: Arc<Store>) -> Self {
        let permits = store.commit_queue_depth().max(1);
        StoreHandle {
            store,
            admission: Arc::new(Semaphore::new(permits)),
        }
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
        let store = Arc::clone(&self.store);
        match tokio::task::spawn_blocking(move || f(&store)).await {
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
            Arc::clone(&self.store),
            Arc::clone(&self.admission),
            readers,
        )
    }

    /// Holds every write until the guard is dropped (see `ferrohub_engine::Store::hold_commits`).
    #[doc(hidden)]
    pub fn hold_commits(&self) -> Option<CommitHold> {
        self.store.hold_commits()
    }

    /// Finishes queued writes, syncs and flushes, on the blocking pool.
    ///
    /// # Errors
    /// [`StorageError`] when the final flush fails.
    /// Whether the engine refuses writes after a failed sync: a flag read, no engine work.
    pub fn is_poisoned(&self) -> bool {
        self.store.is_poisoned()
    }

    pub async fn close(&self) -> Result<(), StorageError> {
        self.run(|s| s.close()).await
    }
}
