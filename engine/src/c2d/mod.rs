//! Cloud-to-device queues (C2D-1..C2D-6): one durable queue per device and the hub's feedback
//! queue, with locks (visibility timeouts), delivery counts, time-to-live and dead letters.
//!
//! # Lifecycle (seed 002)
//! `Enqueued` → (receive) `Invisible`, locked with a lock token until a visibility deadline →
//! `Completed` (removed), or back to `Enqueued` by abandon or lock expiry (the delivery already
//! counted when it was locked), or `Dead` (removed) when rejected, expired, or abandoned /
//! lock-expired after `max_delivery_count` deliveries. Completion and death produce feedback
//! records as the message's `ack` asks (see [`feedback`]). A send to an empty queue whose
//! receiver is waiting ([`Store::send_c2d_locked`]) goes straight to `Invisible`, its first
//! delivery counted, as if received in the same batch.
//!
//! # Invariants
//! - Every state change of a queue is one atomic batch: message, head (sequence and depth),
//!   deadline index entries and any feedback record commit together or not at all.
//! - Each stored message has exactly one expiry timer and, while locked, one lock timer in
//!   `c2d_timers`; both are removed in the batch that removes or unlocks the message. The
//!   sweepers ([`Store::expire_c2d_locks`], [`Store::expire_c2d_messages`]) therefore read only
//!   due deadlines, never every queue, and a timer whose message is gone (device deleted) is
//!   dropped when met.
//! - A device queue's writers hold that device's stripe; the feedback queue has its own lock.
//!   A sweep of device timers takes the stripes it needs in ascending order.
//! - Deadlines are stored, never kept only in memory: a lock or TTL that passes while the hub
//!   is down has passed when it comes back.
//! - Sequence numbers of a queue only grow, also across a device's deletion and re-creation.
//! - A send, receive or settle answers only once its batch is durable. The `_then` forms
//!   ([`queued`]) answer from the commit thread and keep the device's stripe until then, so
//!   the next change of the queue reads the state this one wrote, never the state before it.

mod backlog;
pub mod feedback;
pub mod file_notifications;
mod queue;
mod queued;
mod sweep;
mod token;

use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

pub use feedback::{FeedbackMessage, FeedbackRecord, FeedbackStatus};
pub use sweep::{SweepReport, TimerKind};

use queue::{Head, Lock, Queued};
use token::LockToken;

/// Whether a send also locks the message for a waiting receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockOnSend {
    No,
    IfEmpty,
}

/// Queue settings (seed 002's C2D configuration table, plus the lock timeout and depth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    /// Most messages one device queue holds (C2D-2).
    pub max_depth: u32,
    /// TTL of a message that does not set its own expiry (`defaultTtlAsIso8601`).
    pub default_ttl_ms: i64,
    /// Deliveries after which an abandoned or lock-expired message is dead.
    pub max_delivery_count: u32,
    /// How long a received message stays invisible (locked).
    pub lock_timeout_ms: i64,
    /// How long a feedback record or message lives (`feedback.ttlAsIso8601`).
    pub feedback_ttl_ms: i64,
    /// `feedback.maxDeliveryCount`.
    pub feedback_max_delivery_count: u32,
    /// Most feedback records packed into one feedback message.
    pub feedback_batch: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            max_depth: 50,
            default_ttl_ms: 3_600_000,
            max_delivery_count: 10,
            lock_timeout_ms: 60_000,
            feedback_ttl_ms: 3_600_000,
            feedback_max_delivery_count: 100,
            feedback_batch: 100,
        }
    }
}

/// Which feedback the sender asked for (`iothub-ack`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ack {
    #[default]
    None,
    Positive,
    Negative,
    Full,
}

impl Ack {
    fn on_success(self) -> bool {
        matches!(self, Ack::Positive | Ack::Full)
    }
    fn on_death(self) -> bool {
        matches!(self, Ack::Negative | Ack::Full)
    }
}

/// A message as the service sends it (C2D-1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct C2dMessage {
    pub message_id: Option<String>,
    pub correlation_id: Option<String>,
    pub user_id: Option<String>,
    pub ack: Ack,
    /// Absolute expiry set by the sender; the hub's default TTL applies when `None`.
    pub expiry: Option<UnixMillis>,
    pub content_type: Option<String>,
    pub content_encoding: Option<String>,
    /// Application properties in the order sent.
    pub properties: Vec<(String, String)>,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// What a device queue stores per message besides the message itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DeviceContent {
    pub message: C2dMessage,
    /// The device's generation id when the message was sent (for feedback).
    pub generation_id: String,
}

/// A message locked for a receiver.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Delivered {
    pub sequence: u64,
    pub lock_token: String,
    /// Deliveries so far, this one included.
    pub delivery_count: u32,
    pub enqueued: UnixMillis,
    /// When the message expires (its own expiry, or enqueued + default TTL).
    pub expiry: UnixMillis,
    pub message: C2dMessage,
}

/// How a send was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sent {
    pub sequence: u64,
    pub enqueued: UnixMillis,
    pub expiry: UnixMillis,
    /// Messages in the queue now, this one included.
    pub depth: u32,
}

/// What a settle (abandon) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Settled {
    /// Completed or rejected: the message left the queue.
    Removed,
    /// Abandoned: back in the queue, deliverable again.
    Requeued,
    /// Abandoned after its last allowed delivery: dead.
    Dead,
}

/// C2D failures; each maps to one IoT Hub error.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum C2dError {
    #[error("device {0} not registered")]
    DeviceNotFound(String),
    #[error("the queue of device {device_id} already holds the maximum of {max} messages")]
    QueueFull { device_id: String, max: u32 },
    #[error("lock token {0:?} is not well formed")]
    BadLockToken(String),
    #[error("the lock {0} was lost: the message was settled, or its lock expired")]
    LockLost(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Which settle a receiver asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Settle {
    Complete,
    Reject,
    Abandon,
}

impl Store {
    /// Queues a message for a device (C2D-1, C2D-2).
    ///
    /// # Errors
    /// [`C2dError::DeviceNotFound`], [`C2dError::QueueFull`] (nothing queued changes), storage.
    pub fn send_c2d(
        &self,
        device_id: &str,
        message: C2dMessage,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<Sent, C2dError> {
        let _guard = self.stripes.lock(device_id);
        let (batch, (sent, _)) =
            self.stage_send(device_id, message, now, settings, LockOnSend::No)?;
        self.raw.commit(batch)?;
        Ok(sent)
    }

    /// [`Store::send_c2d`] for a device whose receiver is waiting: when the queue was empty,
    /// the message is stored already locked for that receiver (its first delivery), in the
    /// send's own batch, and returned with its lock token. One commit instead of a send and a
    /// receive; FIFO order holds because nothing else was queued.
    ///
    /// # Errors
    /// As [`Store::send_c2d`].
    pub fn send_c2d_locked(
        &self,
        device_id: &str,
        message: C2dMessage,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<(Sent, Option<Delivered>), C2dError> {
        let _guard = self.stripes.lock(device_id);
        let (batch, answer) =
            self.stage_send(device_id, message, now, settings, LockOnSend::IfEmpty)?;
        self.raw.commit(batch)?;
        Ok(answer)
    }

    /// The batch of a send, and what it answers; the caller holds the device's stripe.
    fn stage_send(
        &self,
        device_id: &str,
        message: C2dMessage,
        now: UnixMillis,
        settings: &QueueSettings,
        lock: LockOnSend,
    ) -> Result<(Batch, (Sent, Option<Delivered>)), C2dError> {
        let device = self
            .raw
            .get_record::<crate::model::Identity>(cf::DEVICES, &keys::device(device_id))?
            .ok_or_else(|| C2dError::DeviceNotFound(device_id.to_string()))?;
        let queue = keys::c2d::device_queue(device_id);
        let mut head = Head::load(&self.raw, &queue)?;
        if head.depth >= settings.max_depth {
            return Err(C2dError::QueueFull {
                device_id: device_id.to_string(),
                max: settings.max_depth,
            });
        }
        // Deadlines are keyed as unsigned: an expiry before 1970 is simply already past.
        let expiry = UnixMillis(
            message
                .expiry
                .unwrap_or(UnixMillis(now.0.saturating_add(settings.default_ttl_ms)))
                .0
                .max(0),
        );
        let sequence = head.next_sequence;
        let mut queued = Queued {
            sequence,
            enqueued: now,
            expiry,
            delivery_count: 0,
            lock: None,
            content: DeviceContent {
                message,
                generation_id: device.generation_id,
            },
        };
        let mut batch = Batch::default();
        // Only an empty queue: a message locked past older ones would overtake them.
        let token = (lock == LockOnSend::IfEmpty && head.depth == 0 && expiry > now).then(|| {
            let token = LockToken::new(sequence);
            let until = UnixMillis(now.0.saturating_add(settings.lock_timeout_ms));
            queued.lock = Some(Lock {
                nonce: token.nonce,
                until,
            });
            queued.delivery_count = 1;
            batch.put_record(
                cf::C2D_TIMERS,
                keys::c2d::timer(keys::c2d::TIMER_LOCK, until.0, &queue, sequence),
                &(),
            );
            token
        });
        queued.put(&mut batch, &queue);
        batch.put_record(
            cf::C2D_TIMERS,
            keys::c2d::timer(keys::c2d::TIMER_EXPIRY, expiry.0, &queue, sequence),
            &(),
        );
        head.next_sequence += 1;
        head.depth += 1;
        head.put(&mut batch, &queue);
        let sent = Sent {
            sequence,
            enqueued: now,
            expiry,
            depth: head.depth,
        };
        let delivered = token.map(|token| Delivered {
            sequence,
            lock_token: token.render(),
            delivery_count: queued.delivery_count,
            enqueued: now,
            expiry,
            message: queued.content.message,
        });
        Ok((batch, (sent, delivered)))
    }

    /// Locks up to `max` deliverable messages of a device, oldest first (C2D-3).
    ///
    /// # Errors
    /// Storage errors.
    pub fn receive_c2d(
        &self,
        device_id: &str,
        max: usize,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<Vec<Delivered>, C2dError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let _guard = self.stripes.lock(device_id);
        let (batch, delivered) = self.stage_receive(device_id, max, now, settings)?;
        self.raw.commit(batch)?;
        Ok(delivered)
    }

    /// The batch of a receive, and what it delivers; the caller holds the device's stripe.
    fn stage_receive(
        &self,
        device_id: &str,
        max: usize,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<(Batch, Vec<Delivered>), C2dError> {
        let queue = keys::c2d::device_queue(device_id);
        let mut head = Head::load(&self.raw, &queue)?;
        let before = head;
        let mut batch = Batch::default();
        let locked = self.lock_next(&mut batch, &queue, &mut head, max, now, settings)?;
        if head != before {
            head.put(&mut batch, &queue);
        }
        Ok((batch, delivered(locked)))
    }

    /// Completes, rejects or abandons the message a lock token names (C2D-3, C2D-5).
    ///
    /// # Errors
    /// [`C2dError::BadLockToken`]; [`C2dError::LockLost`] when the token is not the message's
    /// current, unexpired lock (nothing changes); storage.
    pub fn settle_c2d(
        &self,
        device_id: &str,
        lock_token: &str,
        action: Settle,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<Settled, C2dError> {
        let _guard = self.stripes.lock(device_id);
        let (batch, outcome) = self.stage_settle(device_id, lock_token, action, now, settings)?;
        self.raw.commit(batch)?;
        Ok(outcome)
    }

    /// The batch of a settle, and its outcome; the caller holds the device's stripe.
    fn stage_settle(
        &self,
        device_id: &str,
        lock_token: &str,
        action: Settle,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<(Batch, Settled), C2dError> {
        let queue = keys::c2d::device_queue(device_id);
        let mut q = queue::locked_by::<DeviceContent>(&self.raw, &queue, lock_token, now)?;
        let mut head = Head::load(&self.raw, &queue)?;
        let mut batch = Batch::default();
        let mut change = QueueChange {
            store: self,
            batch: &mut batch,
            device_id,
            queue: &queue,
            head: &mut head,
            now,
        };
        let outcome = match action {
            Settle::Complete => {
                change.complete(&q);
                Settled::Removed
            }
            Settle::Reject => {
                change.kill(&q, FeedbackStatus::Rejected);
                Settled::Removed
            }
            Settle::Abandon => change.release(&mut q, settings.max_delivery_count),
        };
        head.put(&mut batch, &queue);
        Ok((batch, outcome))
    }

    /// Removes every message of a device's queue without feedback; returns how many.
    ///
    /// # Errors
    /// Storage errors.
    pub fn purge_c2d(&self, device_id: &str) -> Result<u32, C2dError> {
        let _guard = self.stripes.lock(device_id);
        let queue = keys::c2d::device_queue(device_id);
        let mut head = Head::load(&self.raw, &queue)?;
        let mut batch = Batch::default();
        let mut purged = 0;
        for q in queue::all::<DeviceContent>(&self.raw, &queue, &head.clone())? {
            q.remove(&mut batch, &queue, &mut head);
            purged += 1;
        }
        head.put(&mut batch, &queue);
        self.raw.commit(batch)?;
        Ok(purged)
    }

    /// Messages queued for a device now (enqueued or locked).
    ///
    /// # Errors
    /// Storage errors.
    pub fn c2d_depth(&self, device_id: &str) -> Result<u32, StorageError> {
        Ok(Head::load(&self.raw, &keys::c2d::device_queue(device_id))?.depth)
    }

    /// Stages the removal of a device's whole queue (device deletion). Timers left behind are
    /// dropped by the sweepers when met; the head keeps its next sequence number, so a
    /// re-created device never reuses a sequence number an old timer could name.
    pub(crate) fn stage_queue_deletion(
        &self,
        batch: &mut Batch,
        device_id: &str,
    ) -> Result<(), StorageError> {
        let queue = keys::c2d::device_queue(device_id);
        let mut head = Head::load(&self.raw, &queue)?;
        if head.depth == 0 {
            return Ok(());
        }
        let end = keys::prefix_end(&queue).unwrap_or_else(|| vec![0xff; queue.len() + 9]);
        batch.delete_range(cf::C2D_MESSAGES, queue.clone(), end);
        head.depth = 0;
        head.oldest = head.next_sequence;
        head.put(batch, &queue);
        Ok(())
    }
}

impl Store {
    /// Locks up to `max` (at least one) deliverable messages of a device queue, oldest first,
    /// into `batch`; advances `head.oldest` (the caller stages the head).
    fn lock_next(
        &self,
        batch: &mut Batch,
        queue: &[u8],
        head: &mut Head,
        max: usize,
        now: UnixMillis,
        settings: &QueueSettings,
    ) -> Result<Vec<(Queued<DeviceContent>, LockToken)>, StorageError> {
        queue::lock_available::<DeviceContent>(
            &self.raw,
            batch,
            queue,
            head,
            max,
            now,
            settings.lock_timeout_ms,
        )
    }
}

/// What a receiver gets for the messages [`queue::lock_available`] locked.
fn delivered(locked: Vec<(Queued<DeviceContent>, LockToken)>) -> Vec<Delivered> {
    locked
        .into_iter()
        .map(|(q, token)| Delivered {
            sequence: q.sequence,
            lock_token: token.render(),
            delivery_count: q.delivery_count,
            enqueued: q.enqueued,
            expiry: q.expiry,
            message: q.content.message,
        })
        .collect()
}

/// A staged change of one device queue: the batch, the queue's head, and the time.
pub(crate) struct QueueChange<'a> {
    pub store: &'a Store,
    pub batch: &'a mut Batch,
    pub device_id: &'a str,
    pub queue: &'a [u8],
    pub head: &'a mut Head,
    pub now: UnixMillis,
}

impl QueueChange<'_> {
    /// Removes a completed message, with feedback when its ack asks for it.
    fn complete(&mut self, q: &Queued<DeviceContent>) {
        q.remove(self.batch, self.queue, self.head);
        if q.content.message.ack.on_success() {
            self.store.stage_feedback(
                self.batch,
                self.device_id,
                q,
                FeedbackStatus::Success,
                self.now,
            );
        }
    }

    /// Removes a message as dead, with feedback when its ack asks for it.
    pub(crate) fn kill(&mut self, q: &Queued<DeviceContent>, status: FeedbackStatus) {
        q.remove(self.batch, self.queue, self.head);
        if q.content.message.ack.on_death() {
            self.store
                .stage_feedback(self.batch, self.device_id, q, status, self.now);
        }
    }

    /// Ends a lock without completion (abandon, lock expiry): back to the queue, or dead after
    /// its last allowed delivery.
    pub(crate) fn release(
        &mut self,
        q: &mut Queued<DeviceContent>,
        max_delivery_count: u32,
    ) -> Settled {
        if q.delivery_count >= max_delivery_count {
            self.kill(q, FeedbackStatus::DeliveryCountExceeded);
            Settled::Dead
        } else {
            q.unlock(self.batch, self.queue);
            Settled::Requeued
        }
    }
}
