//! The one async seam to the synchronous engine: every protocol adapter and hub task reaches
//! the [`Store`] through a [`StoreHandle`], and nothing else holds the store.
//!
//! # Invariants
//! - No engine call that may wait runs on a runtime worker thread: [`StoreHandle::run`] moves
//!   a call to tokio's blocking pool, device messages go through an [`AppendLane`], which
//!   routes and stages them there too (or in place when nothing can make them wait), and
//!   [`StoreHandle::run_quick`] runs a call in place only in the engine's no-waiting mode
//!   (`Store::without_waiting`), moving it to the pool when it would wait.
//! - Writes that do not wait for their own durability (lane appends) are admitted first: an
//!   async permit, one per staged batch, returned when its write completed. At most the engine's
//!   commit queue depth is admitted, so a stalled disk suspends the writing tasks at admission
//!   instead of parking a worker thread in the engine's blocking submit.
//! - Calls through `run` may block their blocking-pool thread while a write is synced; many
//!   such waiters are exactly what lets the committer fold their writes into one sync. Calls
//!   through [`StoreHandle::run_then`] run on a small fixed pool ([`super::staging_pool`]),
//!   free their thread once the write is queued and wait for the commit thread's answer as a
//!   task (the twin patch and C2D hot paths: no thread per sync, no thread per call).
//! - The store sits in a [`StoreSlot`] (see [`super::store_slot`]) that every handle and lane reads per call, so
//!   [`super::storage_recovery`] can put a reopened store in place of a poisoned one; nothing
//!   else keeps an `Arc<Store>` beyond one call.

use std::sync::Arc;

use ferrohub_engine::{CommitHold, StorageError, Store};
use tokio::sync::Semaphore;

use super::append_lane::AppendLane;
use super::d2c_notify::D2cNotify;
use super::staging_pool::StagingPool;
use super::store_slot::StoreSlot;

/// The answer of a `*_then` engine call, run on the commit thread.
pub type DoneCallback<T> = Box<dyn FnOnce(Result<T, StorageError>) + Send>;

#[derive(Clone)]
pub struct StoreHandle {
    slot: Arc<StoreSlot>,
    admission: Arc<Semaphore>,
    /// Where `run_then` stages its calls.
    staging: Arc<StagingPool>,
    /// `run_then` waits for its answer on the blocking pool (see [`StoreHandle::wait_on_pool`]).
    answers_on_pool: bool,
}

impl StoreHandle {
    pub fn new(store: Arc<Store>) -> Self {
        let permits = store.commit_queue_depth().max(1);
        StoreHandle {
            slot: Arc::new(StoreSlot::new(store)),
            admission: Arc::new(Semaphore::new(permits)),
            staging: Arc::new(StagingPool::start()),
            answers_on_pool: false,
        }
    }

    /// Makes [`StoreHandle::run_then`] wait for the commit thread's answer on the blocking
    /// pool, as `run` does. For a hub on tokio's paused test clock: that clock jumps to the
    /// next timer whenever no task and no blocking call runs, so a task waiting for another
    /// thread's answer would let lock and keep-alive deadlines pass in no real time.
    pub fn wait_on_pool(&mut self) {
        self.answers_on_pool = true;
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

    /// Runs `f` here, on the calling runtime thread, when it can finish without waiting
    /// (`Store::without_waiting`: reads from memory, locks free, room in the commit queue);
    /// otherwise, or while storage recovery holds the store, as [`StoreHandle::run`] does. For
    /// the few microseconds of engine work on a connect, which cost several times that as two
    /// thread hand-offs (issue 19). `f` is cloned for the second attempt, so it must keep to
    /// `without_waiting`'s rule: at most one write, as its last step.
    ///
    /// # Errors
    /// As [`StoreHandle::run`].
    pub async fn run_quick<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&Store) -> Result<T, E> + Clone + Send + 'static,
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
    {
        if let Some(store) = self.slot.try_current() {
            // A panic in the engine call ends the call, as on the pool, not the caller's task.
            let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                store.without_waiting(f.clone())
            }));
            match attempt {
                Ok(Some(done)) => return done,
                Ok(None) => {}
                Err(_) => {
                    return Err(E::from(StorageError::Backend(
                        "engine call panicked".into(),
                    )))
                }
            }
        }
        self.run(f).await
    }

    /// Runs `f` on the staging pool, where it queues a write and hands `done` to the commit
    /// thread, then waits for that answer without holding a thread: for engine calls in the
    /// `*_then` form, whose locks are held until the write is durable.
    ///
    /// # Errors
    /// What `f` refuses before queueing, or the storage error that lost the write; a panic in
    /// `f` becomes [`StorageError::Backend`] (via `E`).
    pub async fn run_then<T, E>(
        &self,
        f: impl FnOnce(&Store, DoneCallback<T>) -> Result<(), E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
    {
        if self.answers_on_pool {
            return self
                .run(move |s| {
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    f(s, Box::new(move |r| drop(tx.send(r))))?;
                    rx.recv()
                        .unwrap_or(Err(StorageError::Closed))
                        .map_err(E::from)
                })
                .await;
        }
        // One reply for both endings, so the task wakes once: the commit thread's answer, or
        // `f`'s refusal (then nothing was queued and `done` was dropped unrun).
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<T, E>>();
        let reply = Arc::new(parking_lot::Mutex::new(Some(tx)));
        let slot = Arc::clone(&self.slot);
        self.staging.run(move || {
            let answer = Arc::clone(&reply);
            let done: DoneCallback<T> = Box::new(move |r| {
                if let Some(tx) = answer.lock().take() {
                    let _ = tx.send(r.map_err(E::from));
                }
            });
            // Read the slot here: storage recovery may hold it while it reopens.
            let staged = slot
                .current()
                .map_err(E::from)
                .and_then(|store| f(&store, done));
            if let Err(e) = staged {
                if let Some(tx) = reply.lock().take() {
                    let _ = tx.send(Err(e));
                }
            }
        });
        match rx.await {
            Ok(r) => r,
            // The call panicked (its reply dropped unsent), or the store closed under it.
            Err(_) => Err(E::from(StorageError::Backend(
                "engine task failed before answering".into(),
            ))),
        }
    }

    /// A new ordered lane for one connection's (or one request's) device messages; readers
    /// of the partitions they land in are woken through `readers`.
    pub fn lane(&self, readers: Arc<D2cNotify>) -> AppendLane {
        AppendLane::new(Arc::clone(&self.slot), Arc::clone(&self.admission), readers)
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
