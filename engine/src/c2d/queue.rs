//! The mechanics every queue shares, device queues and the feedback queue alike: stored
//! message records, heads, locking and the timer entries that go with each state.
//!
//! Callers hold the queue's lock and commit the batch these functions stage.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use super::token::LockToken;
use super::C2dError;
use crate::error::StorageError;
use crate::keys::{self, c2d::TIMER_EXPIRY, c2d::TIMER_LOCK};
use crate::model::UnixMillis;
use crate::raw::{Batch, Raw};

/// A queue's next sequence number, how many messages it holds, and a lower bound of its
/// oldest live sequence number.
///
/// `oldest` exists because removed messages leave tombstones until compaction: scanning a
/// queue from sequence 0 would walk every message it ever held. Invariant: no message with a
/// sequence below `oldest` is stored. A receive advances it to the first live message it meets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Head {
    pub next_sequence: u64,
    pub depth: u32,
    pub oldest: u64,
}

impl Head {
    pub(crate) fn load(raw: &Raw, queue: &[u8]) -> Result<Head, StorageError> {
        Ok(raw.get_record(cf::C2D_HEADS, queue)?.unwrap_or_default())
    }

    pub(crate) fn put(&self, batch: &mut Batch, queue: &[u8]) {
        batch.put_record(cf::C2D_HEADS, queue.to_vec(), self);
    }
}

/// A held lock: the token's random half and the visibility deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lock {
    pub nonce: u64,
    pub until: UnixMillis,
}

/// One stored message of any queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Queued<C> {
    pub sequence: u64,
    pub enqueued: UnixMillis,
    pub expiry: UnixMillis,
    /// Deliveries so far (incremented when locked).
    pub delivery_count: u32,
    pub lock: Option<Lock>,
    pub content: C,
}

impl<C: Serialize + DeserializeOwned> Queued<C> {
    pub(crate) fn load(
        raw: &Raw,
        queue: &[u8],
        sequence: u64,
    ) -> Result<Option<Self>, StorageError> {
        raw.get_record(cf::C2D_MESSAGES, &keys::c2d::message(queue, sequence))
    }

    pub(crate) fn put(&self, batch: &mut Batch, queue: &[u8]) {
        batch.put_record(
            cf::C2D_MESSAGES,
            keys::c2d::message(queue, self.sequence),
            self,
        );
    }

    /// Whether `token` is this message's current lock and that lock has not expired.
    pub(crate) fn holds_lock(&self, token: LockToken, now: UnixMillis) -> bool {
        self.lock
            .is_some_and(|l| l.nonce == token.nonce && l.until > now)
            && self.expiry > now
    }

    /// Stages the removal of the message and all its timers.
    pub(crate) fn remove(&self, batch: &mut Batch, queue: &[u8], head: &mut Head) {
        batch.delete(cf::C2D_MESSAGES, keys::c2d::message(queue, self.sequence));
        batch.delete(
            cf::C2D_TIMERS,
            keys::c2d::timer(TIMER_EXPIRY, self.expiry.0, queue, self.sequence),
        );
        if let Some(l) = self.lock {
            batch.delete(
                cf::C2D_TIMERS,
                keys::c2d::timer(TIMER_LOCK, l.until.0, queue, self.sequence),
            );
        }
        head.depth = head.depth.saturating_sub(1);
        if self.sequence == head.oldest {
            head.oldest += 1;
        }
    }

    /// Stages the return of a locked message to the queue.
    pub(crate) fn unlock(&mut self, batch: &mut Batch, queue: &[u8]) {
        if let Some(l) = self.lock.take() {
            batch.delete(
                cf::C2D_TIMERS,
                keys::c2d::timer(TIMER_LOCK, l.until.0, queue, self.sequence),
            );
        }
        self.put(batch, queue);
    }
}

/// The message a lock token names, if the token is its current, unexpired lock.
pub(crate) fn locked_by<C: Serialize + DeserializeOwned>(
    raw: &Raw,
    queue: &[u8],
    lock_token: &str,
    now: UnixMillis,
) -> Result<Queued<C>, C2dError> {
    let token = LockToken::parse(lock_token)
        .ok_or_else(|| C2dError::BadLockToken(lock_token.to_string()))?;
    Queued::<C>::load(raw, queue, token.sequence)?
        .filter(|q| q.holds_lock(token, now))
        .ok_or_else(|| C2dError::LockLost(lock_token.to_string()))
}

/// Every message of a queue in sequence order.
pub(crate) fn all<C: DeserializeOwned>(
    raw: &Raw,
    queue: &[u8],
    head: &Head,
) -> Result<Vec<Queued<C>>, StorageError> {
    let mut out = Vec::new();
    let from = keys::c2d::message(queue, head.oldest);
    raw.scan_records(cf::C2D_MESSAGES, &from, keys::prefix_end(queue), |_, q| {
        out.push(q);
        true
    })?;
    Ok(out)
}

/// Locks up to `max` unlocked, unexpired messages, oldest first, counting a delivery each,
/// and advances `head.oldest` (the caller stages the head).
pub(crate) fn lock_available<C: Serialize + DeserializeOwned>(
    raw: &Raw,
    batch: &mut Batch,
    queue: &[u8],
    head: &mut Head,
    max: usize,
    now: UnixMillis,
    lock_timeout_ms: i64,
) -> Result<Vec<(Queued<C>, LockToken)>, StorageError> {
    let mut locked = Vec::new();
    let mut first_live = None;
    raw.scan_records(
        cf::C2D_MESSAGES,
        &keys::c2d::message(queue, head.oldest),
        keys::prefix_end(queue),
        |_, q: Queued<C>| {
            first_live.get_or_insert(q.sequence);
            if q.lock.is_none() && q.expiry > now {
                locked.push(q);
            }
            locked.len() < max
        },
    )?;
    head.oldest = first_live.unwrap_or(head.next_sequence);
    let until = UnixMillis(now.0.saturating_add(lock_timeout_ms));
    Ok(locked
        .into_iter()
        .map(|mut q| {
            let token = LockToken::new(q.sequence);
            q.lock = Some(Lock {
                nonce: token.nonce,
                until,
            });
            q.delivery_count += 1;
            q.put(batch, queue);
            batch.put_record(
                cf::C2D_TIMERS,
                keys::c2d::timer(TIMER_LOCK, until.0, queue, q.sequence),
                &(),
            );
            (q, token)
        })
        .collect())
}
