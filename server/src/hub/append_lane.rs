//! Ordered appends of device messages, without engine waits on the runtime's threads.
//!
//! A connection owns one [`AppendLane`]. Each message is admitted (an async permit, see
//! [`super::StoreHandle`]) and then staged into the engine, whose group committer makes it
//! durable; the caller gets a future that resolves once the message is on disk. Staging takes
//! one of two paths:
//! - **direct**, on the caller's thread: the message was routed without storage (no route
//!   reads `$twin`) and the engine can take it without waiting for a lock or for room in the
//!   commit queue (`Store::try_append_events_then`);
//! - **queued**, on tokio's blocking pool: everything else (routing that reads twins, a busy
//!   partition, a full commit queue), and every message behind one that is queued.
//!
//! # Invariants
//! - Messages of one lane are staged in the order [`AppendLane::append`] was called: the
//!   direct path is taken only while the lane's queue is empty and no drainer runs, and one
//!   drainer at a time takes the queue from the front. So a device's events keep their order
//!   in the partition, and its PUBACKs can leave in order.
//! - Nothing here waits on a runtime thread: a full commit queue suspends the appending task
//!   at admission, the direct path gives up rather than wait, and routing that reads twins and
//!   staging that may wait run on the blocking pool.
//! - A permit is held from admission until the message's write completed (or failed), so the
//!   number of staged-but-not-durable lane messages (each one batch in the commit queue; a
//!   lane message may carry a burst of device messages) never exceeds the admission limit.
//! - A message is answered either by its own future ([`AppendLane::append`]) or by a run of
//!   tickets in the lane's [`LaneAcks`] window ([`AppendLane::append_in_order`]); one lane's tickets
//!   are answered in the order they were issued.
//! - On a cluster follower a lane stages nothing here: each admitted message is queued for the
//!   writer ([`super::forwarded_appends`]) before the next is admitted, behind every message
//!   queued before it, so the writer takes one lane's messages in their order, and appends
//!   them there, routing included.

use crate::latency::{self, Tally};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::{StorageError, Store, UnixMillis};
use parking_lot::Mutex;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::d2c_notify::D2cNotify;
use super::lane_acks::{LaneAcks, Tickets};
use super::store_slot::StoreSlot;

/// Decides what to append for one message, on the blocking pool: routing that reads twins.
pub type Prepare = Box<dyn FnOnce(&Store) -> Vec<NewEvent> + Send>;

/// A device message for a lane.
pub enum Message {
    /// Routed already: the events to append.
    Routed(Vec<NewEvent>),
    /// To be routed with access to the store.
    Unrouted(Prepare),
    /// A follower's: routed by the writer, which it is forwarded to (the events name no
    /// endpoints; `module_id` is the sender's module, which routing conditions may read).
    ToWriter {
        events: Vec<NewEvent>,
        module_id: Option<String>,
    },
}

/// Who is told that a message is durable.
enum Reply {
    /// The future [`AppendLane::append`] returned.
    Once(oneshot::Sender<Result<Vec<Appended>, D2cError>>),
    /// A run of tickets in the lane's window ([`AppendLane::append_in_order`]).
    InOrder(Arc<LaneAcks>, Tickets),
}

/// How one admitted message ends: its permit returned, readers woken, the caller answered.
/// Shared between the lane and the engine's commit callback; whichever finishes it first wins.
#[derive(Clone)]
struct Completion(
    Arc<Mutex<Option<(OwnedSemaphorePermit, Reply)>>>,
    Arc<D2cNotify>,
);

impl Completion {
    fn finish(&self, result: Result<Vec<Appended>, D2cError>) {
        let Some((permit, reply)) = self.0.lock().take() else {
            return;
        };
        drop(permit);
        if let Ok(appended) = &result {
            for a in appended {
                self.1.appended(a.partition, a.sequence_number);
            }
        }
        match reply {
            Reply::Once(tx) => drop(tx.send(result)),
            Reply::InOrder(acks, tickets) => acks.fill(tickets, result.map(drop)),
        }
    }

    /// The engine's durability callback.
    fn on_durable(&self) -> impl FnOnce(Result<Vec<Appended>, StorageError>) + Send + 'static {
        let this = self.clone();
        move |result| this.finish(result.map_err(D2cError::from))
    }
}

struct Job {
    message: Message,
    now: UnixMillis,
    completion: Completion,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// A drainer runs (or has been spawned) for this lane.
    draining: bool,
}

struct Lane {
    store: Arc<StoreSlot>,
    /// Where a follower's lane sends its messages.
    forward: Option<super::forwarded_appends::Forwarder>,
    /// Metric handles, looked up once per lane rather than once per message.
    durable_messages: metrics::Counter,
    admission: Arc<Semaphore>,
    readers: Arc<D2cNotify>,
    queue: Mutex<Queue>,
    acks: Arc<LaneAcks>,
}

/// One connection's ordered path into the D2C partitions.
#[derive(Clone)]
pub struct AppendLane(Arc<Lane>);

impl AppendLane {
    pub(super) fn new(
        store: Arc<StoreSlot>,
        admission: Arc<Semaphore>,
        readers: Arc<D2cNotify>,
        forward: Option<super::forwarded_appends::Forwarder>,
    ) -> Self {
        AppendLane(Arc::new(Lane {
            store,
            forward,
            durable_messages: metrics::counter!("ferrohub_d2c_messages_total"),
            admission,
            readers,
            queue: Mutex::new(Queue::default()),
            acks: Arc::default(),
        }))
    }

    /// Waits for admission, stages or queues the message, and returns a future that resolves
    /// once its events are durable (readers of their partitions are woken then).
    ///
    /// Call from one task, in arrival order: the order of calls is the order of the appends.
    pub async fn append(
        &self,
        message: Message,
        now: UnixMillis,
    ) -> impl Future<Output = Result<Vec<Appended>, D2cError>> + Send + 'static {
        let (reply, done) = oneshot::channel();
        self.admit(message, now, Reply::Once(reply)).await;
        let started = std::time::Instant::now();
        let durable_messages = self.0.durable_messages.clone();
        async move {
            let result = done
                .await
                .unwrap_or(Err(D2cError::Storage(StorageError::Closed)));
            if result.is_ok() {
                // Admission to durable: what a device waits for its PUBACK or 204.
                durable_messages.increment(1);
                latency::APPEND.record(started.elapsed());
            }
            result
        }
    }

    /// Like [`AppendLane::append`], but answered through the lane's ticket window
    /// ([`AppendLane::acks`]), in call order, rather than by a future of its own: a
    /// connection with many messages in flight then keeps no channel or future per message.
    /// `message` carries the events of `count` device messages (a burst that came in one
    /// read), staged as one atomic write; each device message has its own ticket, all filled
    /// with the write's result. Whether admission had to wait (the time since the messages
    /// came then misleads).
    ///
    /// Call from one task, in arrival order. The caller counts the durable messages
    /// ([`AppendLane::durable`]).
    pub async fn append_in_order(&self, message: Message, count: u32, now: UnixMillis) -> bool {
        let tickets = self.0.acks.issue(count);
        let reply = Reply::InOrder(Arc::clone(&self.0.acks), tickets);
        self.admit(message, now, reply).await
    }

    /// The ticket window of [`AppendLane::append_in_order`].
    pub fn acks(&self) -> &LaneAcks {
        &self.0.acks
    }

    /// Counts messages answered through the ticket window as durable, with their times from
    /// admission to durable tallied by the caller; empties the tally.
    pub fn durable(&self, admission_to_durable: &mut Tally) {
        self.0
            .durable_messages
            .increment(u64::from(admission_to_durable.samples()));
        admission_to_durable.add_to(&latency::APPEND);
    }

    /// Waits for admission, then stages or queues the message; whether admission had to wait.
    async fn admit(&self, message: Message, now: UnixMillis, reply: Reply) -> bool {
        let (permit, waited) = match Arc::clone(&self.0.admission).try_acquire_owned() {
            Ok(permit) => (Ok(permit), false),
            Err(_) => (Arc::clone(&self.0.admission).acquire_owned().await, true),
        };
        match permit {
            Ok(permit) => {
                let completion = Completion(
                    Arc::new(Mutex::new(Some((permit, reply)))),
                    Arc::clone(&self.0.readers),
                );
                match &self.0.forward {
                    // Queued before the next message is admitted: the writer keeps the order.
                    Some(forward) => {
                        let (events, module_id) = match message {
                            Message::ToWriter { events, module_id } => (events, module_id),
                            Message::Routed(events) => (events, None),
                            Message::Unrouted(_) => {
                                completion.finish(Err(D2cError::Storage(StorageError::Backend(
                                    "a follower routes nothing itself".into(),
                                ))));
                                return waited;
                            }
                        };
                        let done = completion.clone();
                        forward.send(events, module_id, move |r| done.finish(r));
                    }
                    None => self.stage_or_queue(message, now, completion),
                }
            }
            // The semaphore is never closed while the store is open.
            Err(_) => {
                let closed = Err(D2cError::Storage(StorageError::Closed));
                match reply {
                    Reply::Once(tx) => drop(tx.send(closed)),
                    Reply::InOrder(acks, tickets) => acks.fill(tickets, closed.map(drop)),
                }
            }
        }
        waited
    }

    fn stage_or_queue(&self, mut message: Message, now: UnixMillis, completion: Completion) {
        let mut q = self.0.queue.lock();
        if q.jobs.is_empty() && !q.draining {
            // While storage recovery holds the slot, the queued path waits for it instead.
            if let (Message::Routed(_), Some(store)) = (&message, self.0.store.try_current()) {
                let Message::Routed(events) = message else {
                    unreachable!("matched above")
                };
                match store.try_append_events_then(events, now, completion.on_durable()) {
                    Ok(Ok(())) => return,
                    Ok(Err(would_wait)) => message = Message::Routed(would_wait.events),
                    Err(e) => return completion.finish(Err(e)),
                }
            }
        }
        q.jobs.push_back(Job {
            message,
            now,
            completion,
        });
        if !std::mem::replace(&mut q.draining, true) {
            let lane = Arc::clone(&self.0);
            tokio::task::spawn_blocking(move || lane.drain());
        }
    }
}

impl Lane {
    /// Stages every queued job in order, then stops (the next queued job starts a new drainer).
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
            message,
            now,
            completion,
        } = job;
        let store = match self.store.current() {
            Ok(s) => s,
            Err(e) => return completion.finish(Err(D2cError::Storage(e))),
        };
        let store = &*store;
        let events = match message {
            Message::Routed(events) | Message::ToWriter { events, .. } => events,
            // A panic in routing must not wedge the lane: the message fails, the lane goes on.
            Message::Unrouted(prepare) => {
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(store))) {
                    Ok(events) => events,
                    Err(_) => {
                        return completion.finish(Err(D2cError::Storage(StorageError::Backend(
                            "routing the message failed".into(),
                        ))))
                    }
                }
            }
        };
        if let Err(e) = store.append_events_then(events, now, completion.on_durable()) {
            completion.finish(Err(e));
        }
    }
}
