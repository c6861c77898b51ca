//! Ordered appends of device messages, off the runtime's threads.
//!
//! A connection owns one [`AppendLane`]. Each message is admitted (an async permit, see
//! [`super::StoreHandle`]), queued on the lane, and then — on tokio's blocking pool — routed
//! (which may read the device's twin) and staged into the engine, whose group committer makes
//! it durable. The caller gets a future that resolves once the message is on disk.
//!
//! # Invariants
//! - Messages of one lane are staged in the order [`AppendLane::append`] was called: one
//!   drainer at a time takes the lane's queue from the front. So a device's events keep their
//!   order in the partition, and its PUBACKs can leave in order.
//! - Nothing here blocks a runtime thread: a full commit queue suspends the appending task at
//!   admission; routing, twin reads and staging run on the blocking pool.
//! - A permit is held from admission until the message's write completed (or failed), so the
//!   number of staged-but-not-durable lane messages never exceeds the admission limit.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::{StorageError, Store, UnixMillis};
use parking_lot::Mutex;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::d2c_notify::D2cNotify;

/// Decides what to append for one message, on the blocking pool: routing lives here.
pub type Prepare = Box<dyn FnOnce(&Store) -> Vec<NewEvent> + Send>;

type Reply = oneshot::Sender<Result<Vec<Appended>, D2cError>>;

struct Job {
    prepare: Prepare,
    now: UnixMillis,
    permit: OwnedSemaphorePermit,
    reply: Reply,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A drainer runs (or has been spawned) for this lane.
    draining: bool,
}

struct Lane {
    store: Arc<Store>,
    admission: Arc<Semaphore>,
    readers: Arc<D2cNotify>,
    queue: Mutex<Queue>,
}

/// One connection's ordered path into the D2C partitions.
#[derive(Clone)]
pub struct AppendLane(Arc<Lane>);

impl AppendLane {
    pub(super) fn new(
        store: Arc<Store>,
        admission: Arc<Semaphore>,
        readers: Arc<D2cNotify>,
    ) -> Self {
        AppendLane(Arc::new(Lane {
            store,
            admission,
            readers,
            queue: Mutex::new(Queue::default()),
        }))
    }

    /// Waits for admission, queues the message, and returns a future that resolves once its
    /// events are durable (readers of their partitions are woken then).
    ///
    /// Call from one task, in arrival order: the order of calls is the order of the appends.
    pub async fn append(
        &self,
        prepare: Prepare,
        now: UnixMillis,
    ) -> impl Future<Output = Result<Vec<Appended>, D2cError>> + Send + 'static {
        let (reply, done) = oneshot::channel();
        match Arc::clone(&self.0.admission).acquire_owned().await {
            Ok(permit) => self.enqueue(Job {
                prepare,
                now,
                permit,
                reply,
            }),
            // The semaphore is never closed while the store is open.
            Err(_) => drop(reply.send(Err(D2cError::Storage(StorageError::Closed)))),
        }
        async move {
            done.await
                .unwrap_or(Err(D2cError::Storage(StorageError::Closed)))
        }
    }

    fn enqueue(&self, job: Job) {
        let start = {
            let mut q = self.0.queue.lock();
            q.jobs.push_back(job);
            !std::mem::replace(&mut q.draining, true)
        };
        if start {
            let lane = Arc::clone(&self.0);
            tokio::task::spawn_blocking(move || lane.drain());
        }
    }
}

impl Lane {
    /// Stages every queued job in order, then stops (the next `append` starts a new drainer).
    fn drain(&self) {
        loop {
            let job = {
                let mut q = self.queue.lock();
                match q.jobs.pop_front() {
                    Some(j) => j,
                    None => {
                        q.draining = false;
                        return;
                    }
                }
            };
            self.stage(job);
        }
    }

    fn stage(&self, job: Job) {
        let Job {
            prepare,
            now,
            permit,
            reply,
        } = job;
        let store = &self.store;
        // A panic in routing must not wedge the lane: the message fails, the lane goes on.
        let events = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(store)))
        {
            Ok(events) => events,
            Err(_) => {
                let _ = reply.send(Err(D2cError::Storage(StorageError::Backend(
                    "routing the message failed".into(),
                ))));
                return;
            }
        };
        let readers = Arc::clone(&self.readers);
        // Shared by the callback and the error path: whichever runs first takes it.
        let reply = Arc::new(Mutex::new(Some(reply)));
        let on_durable = {
            let reply = Arc::clone(&reply);
            move |result: Result<Vec<Appended>, StorageError>| {
                drop(permit);
                if let Ok(appended) = &result {
                    for a in appended {
                        readers.appended(a.partition, a.sequence_number);
                    }
                }
                if let Some(tx) = reply.lock().take() {
                    let _ = tx.send(result.map_err(D2cError::from));
                }
            }
        };
        if let Err(e) = store.append_events_then(events, now, on_durable) {
            if let Some(tx) = reply.lock().take() {
                let _ = tx.send(Err(e));
            }
        }
    }
}
