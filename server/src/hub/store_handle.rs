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
//!   through [`StoreHandle::run_then`] are staged in place in the no-waiting mode, or else on a
//!   small fixed pool ([`super::staging_pool`]) that frees its thread once the write is
//!   queued; either way the commit thread's answer is awaited as a task (the twin patch and
//!   C2D hot paths: no thread per sync, no thread per call). A refused attempt is made again
//!   only when its callback was dropped unrun, so no write is queued twice.
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

/// Where a `run_then` call's one answer goes; taken by whichever ending comes first.
type Reply<T, E> = Arc<parking_lot::Mutex<Option<tokio::sync::oneshot::Sender<Result<T, E>>>>>;

/// Sends `result` unless the reply was already answered.
fn answer<T, E>(reply: &Reply<T, E>, result: Result<T, E>) {
    if let Some(tx) = reply.lock().take() {
        let _ = tx.send(result);
    }
}

/// The commit thread's callback that answers `reply`.
fn answer_with<T, E>(reply: &Reply<T, E>) -> DoneCallback<T>
where
    T: Send + 'static,
    E: From<StorageError> + Send + 'static,
{
    let reply = Arc::clone(reply);
    Box::new(move |r| answer(&reply, r.map_err(E::from)))
}

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
        // A follower's store commits nothing (depth 0); its lanes' messages, forwarded to the
        // writer, are admitted as many as a writer's commit queue takes.
        let permits = match store.commit_queue_depth() {
            0 => ferrohub_engine::DEFAULT_COMMIT_QUEUE_DEPTH,
            n => n,
        };
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

    /// Runs a call in the engine's `*_then` form: it queues a write and hands `done` to the
    /// commit thread, then the answer is awaited without holding a thread. The call is made
    /// here, on the calling runtime thread, when it can be staged without waiting
    /// (`Store::without_waiting`: the device's stripe free, reads from memory, room in the
    /// commit queue); otherwise on the staging pool, where it may wait. For the twin patch and
    /// C2D hot paths, whose staging is microseconds of work that two thread hand-offs
    /// multiplied (issue 19). `f` is `Fn` because a refused attempt is made again.
    ///
    /// # Errors
    /// What `f` refuses before queueing, or the storage error that lost the write; a panic in
    /// `f` becomes [`StorageError::Backend`] (via `E`).
    pub async fn run_then<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: Fn(&Store, DoneCallback<T>) -> Result<(), E> + Send + 'static,
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
        // One reply for every ending, so the task wakes once: the commit thread's answer, or
        // `f`'s refusal (then nothing was queued and `done` was dropped unrun).
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<T, E>>();
        let reply: Reply<T, E> = Arc::new(parking_lot::Mutex::new(Some(tx)));
        if self.stage_in_place(&f, &reply) {
            self.stage_on_pool(f, reply);
        }
        match rx.await {
            Ok(r) => r,
            // The call panicked (its reply dropped unsent), or the store closed under it.
            Err(_) => Err(E::from(StorageError::Backend(
                "engine task failed before answering".into(),
            ))),
        }
    }

    /// [`StoreHandle::run_then`]'s attempt without waiting; true when it must be made again
    /// where it may wait. Whatever else happens, `reply` is answered or its callback queued.
    fn stage_in_place<T, E, F>(&self, f: &F, reply: &Reply<T, E>) -> bool
    where
        F: Fn(&Store, DoneCallback<T>) -> Result<(), E>,
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
    {
        let Some(store) = self.slot.try_current() else {
            return true;
        };
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.without_waiting(|s| f(s, answer_with(reply)))
        }));
        match attempt {
            Ok(Some(Ok(()))) => false,
            Ok(Some(Err(e))) => {
                answer(reply, Err(e));
                false
            }
            Err(_) => {
                answer(
                    reply,
                    Err(E::from(StorageError::Backend(
                        "engine call panicked".into(),
                    ))),
                );
                false
            }
            // Refused. Made again only if `done` was dropped unrun: a callback still held (by
            // the commit queue) or already run means a write was queued after all, which a
            // second attempt would repeat.
            Ok(None) => Arc::strong_count(reply) == 1 && reply.lock().is_some(),
        }
    }

    /// Stages `f` on the staging pool, answering `reply`.
    fn stage_on_pool<T, E, F>(&self, f: F, reply: Reply<T, E>)
    where
        F: Fn(&Store, DoneCallback<T>) -> Result<(), E> + Send + 'static,
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
    {
        let slot = Arc::clone(&self.slot);
        self.staging.run(move || {
            // Read the slot here: storage recovery may hold it while it reopens.
            let staged = slot
                .current()
                .map_err(E::from)
                .and_then(|store| f(&store, answer_with(&reply)));
            if let Err(e) = staged {
                answer(&reply, Err(e));
            }
        });
    }

    /// A new ordered lane for one connection's (or one request's) device messages; readers
    /// of the partitions they land in are woken through `readers`.
    pub fn lane(&self, readers: Arc<D2cNotify>) -> AppendLane {
        AppendLane::new(
            Arc::clone(&self.slot),
            Arc::clone(&self.admission),
            readers,
            None,
        )
    }

    /// A cluster follower's lane: its messages go to the writer through `forward`.
    pub fn forwarding_lane(
        &self,
        readers: Arc<D2cNotify>,
        forward: super::forwarded_appends::Forwarder,
    ) -> AppendLane {
        AppendLane::new(
            Arc::clone(&self.slot),
            Arc::clone(&self.admission),
            readers,
            Some(forward),
        )
    }

    /// Holds every write until the guard is dropped (see `ferrohub_engine::Store::hold_commits`).
    #[doc(hidden)]
    pub fn hold_commits(&self) -> Option<CommitHold> {
        self.slot.current().ok()?.hold_commits()
    }

    /// The commit log sequence of the last write this node appended (a cluster's writer; 0
    /// elsewhere): every write acknowledged so far is at or below it.
    pub fn last_logged_sequence(&self) -> u64 {
        self.slot
            .try_current()
            .map_or(0, |s| s.last_logged_sequence())
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ferrohub_engine::c2d::{C2dError, C2dMessage, QueueSettings};
    use ferrohub_engine::model::{IdentitySpec, UnixMillis};
    use ferrohub_engine::StoreConfig;
    use parking_lot::Mutex;

    use super::*;

    const T0: UnixMillis = UnixMillis(1_700_000_000_000);

    /// Which call ran its engine closure on which thread, in order.
    type Attempts = Arc<Mutex<Vec<(u32, String)>>>;

    fn handle(dir: &std::path::Path) -> StoreHandle {
        let store = Store::open(dir, StoreConfig::default()).unwrap();
        store
            .create_device("d", &IdentitySpec::default(), T0)
            .unwrap();
        StoreHandle::new(Arc::new(store))
    }

    fn settings() -> QueueSettings {
        QueueSettings {
            max_depth: 10,
            default_ttl_ms: 60_000,
            max_delivery_count: 3,
            lock_timeout_ms: 60_000,
            feedback_ttl_ms: 60_000,
            feedback_max_delivery_count: 2,
            feedback_batch: 100,
        }
    }

    async fn send(handle: &StoreHandle, call: u32, attempts: &Attempts) -> Result<u32, C2dError> {
        let attempts = Arc::clone(attempts);
        handle
            .run_then(move |s, done| {
                let here = std::thread::current().name().unwrap_or("").to_owned();
                attempts.lock().push((call, here));
                let message = C2dMessage {
                    body: vec![1, 2, 3],
                    ..C2dMessage::default()
                };
                s.send_c2d_then("d", message, T0, &settings(), done)
            })
            .await
            .map(|sent| sent.depth)
    }

    fn this_thread() -> String {
        std::thread::current().name().unwrap_or("").to_owned()
    }

    #[tokio::test]
    async fn a_then_call_is_staged_in_place_unless_the_device_stripe_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let handle = handle(dir.path());
        let attempts = Attempts::default();
        assert_eq!(send(&handle, 1, &attempts).await.unwrap(), 1);

        // With the disk held, the second send is queued in place and holds the device's
        // stripe until it is durable; the third is refused in place and staged on the pool,
        // where it waits for the stripe.
        let hold = handle.hold_commits().unwrap();
        let second = tokio::spawn({
            let (handle, attempts) = (handle.clone(), Arc::clone(&attempts));
            async move { send(&handle, 2, &attempts).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let third = tokio::spawn({
            let (handle, attempts) = (handle.clone(), Arc::clone(&attempts));
            async move { send(&handle, 3, &attempts).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(hold);
        assert_eq!(second.await.unwrap().unwrap(), 2);
        assert_eq!(third.await.unwrap().unwrap(), 3);

        let here = this_thread();
        let attempts = attempts.lock().clone();
        assert_eq!(attempts.len(), 4, "{attempts:?}");
        assert_eq!(attempts[0], (1, here.clone()));
        assert_eq!(attempts[1], (2, here.clone()));
        assert_eq!(attempts[2], (3, here));
        assert_eq!(attempts[3].0, 3);
        assert!(attempts[3].1.starts_with("ferrohub-stage-"), "{attempts:?}");
        assert_eq!(handle.run(|s| s.c2d_depth("d")).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_refused_call_whose_write_was_queued_is_not_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let handle = handle(dir.path());
        handle
            .run(|s| s.save_session("d", &Default::default()))
            .await
            .unwrap();
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        // Against the rule (one write, as the last step): the send is queued, then a synced
        // write is refused and its error swallowed. The call reads as refused, but its
        // callback is held by the commit queue, so it must be answered, not repeated.
        let depth = handle
            .run_then(move |s, done| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let message = C2dMessage::default();
                s.send_c2d_then("d", message, T0, &settings(), done)?;
                let _swallowed = s.delete_session("d");
                Ok::<(), C2dError>(())
            })
            .await
            .unwrap()
            .depth;
        assert_eq!(depth, 1);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(handle.run(|s| s.c2d_depth("d")).await.unwrap(), 1);
    }
}
