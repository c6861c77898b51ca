//! Group commit: one thread turns every batch that is waiting into one RocksDB write with one
//! WAL sync, then acknowledges each waiter.
//!
//! # Invariants
//! - A caller of [`Committer::commit`] returns `Ok` only after the write that contains its
//!   batch has completed (and, in synced mode, after that write's WAL sync).
//! - A group is one RocksDB `WriteBatch`, so it is atomic as a whole; each caller's batch is
//!   therefore atomic too.
//! - With a commit log (cluster mode, [`super::log`]), a group is written only after the log
//!   acknowledged it as one entry, with several appends in flight ([`super::pipeline`]); a
//!   failed append poisons the committer as a failed write does. Groups then also end at
//!   [`super::group::MAX_LOG_ENTRY_BYTES`].
//! - After a failed write the committer is poisoned: every later commit fails with
//!   [`StorageError::Poisoned`] until the process restarts and RocksDB recovers from its WAL.
//! - A batch that asks for a memtable switch ends its group; the switch happens after its
//!   write and before the next group's, so the switch falls exactly between the two in
//!   submission order.
//! - While a [`CommitHold`] lives, nothing is written: queued batches wait, and a full queue
//!   makes `submit` block. Tests use it to show what the layers above do when the disk stalls.
//! - A group is synced unless every batch in it may lag ([`Batch::may_lag`]). Since the WAL
//!   is one ordered log, a synced write makes every earlier write durable too; a written but
//!   unsynced lagging write is synced by the thread itself at most [`LAG_SYNC_WITHIN`] later,
//!   and before the thread ends.
//! - A batch that may lag does not wake the thread by itself: after writing a group of only
//!   such batches the thread naps for [`LAG_NAP`], so lagging batches queued meanwhile share
//!   its next write. A batch that may not lag ends the nap as it is queued, so it waits for
//!   no nap (see [`Wake`]).

use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use rocksdb::{WriteOptions, DB};

use super::group::{
    finish_group, next_batch, ops_batch, take_group, write, Lagging, Next, Pending, Reply, Shared,
};
pub use super::group::{CommitCallback, LAG_NAP, LAG_SYNC_WITHIN};
use super::log::CommitLog;
use super::{Batch, Durability};
use crate::error::StorageError;

/// Waiting batches beyond this make `commit` block: backpressure instead of unbounded memory.
/// Async callers take an admission permit first (see the server's store handle), so they wait
/// without blocking a thread; this bound is the last line.
pub const DEFAULT_QUEUE_DEPTH: usize = 8192;

/// Counters that show group commit at work: `commits / writes` is the mean group size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Batches acknowledged.
    pub commits: u64,
    /// RocksDB writes.
    pub writes: u64,
    /// WAL syncs: synced writes, and the syncs of writes that were allowed to lag.
    pub syncs: u64,
}

/// A submitted batch; [`Ticket::wait`] returns once its write is durable (or failed).
#[must_use = "a submitted batch is acknowledged only by waiting on its ticket"]
pub(crate) struct Ticket {
    done: Receiver<Result<(), StorageError>>,
}

impl Ticket {
    pub(crate) fn wait(self) -> Result<(), StorageError> {
        self.done.recv().map_err(|_| StorageError::Closed)?
    }
}

/// Holds every write until dropped (see the module's invariants).
#[must_use = "writes resume when the hold is dropped"]
pub struct CommitHold {
    shared: Arc<Shared>,
}

impl Drop for CommitHold {
    fn drop(&mut self) {
        let mut holds = self.shared.holds.lock().unwrap_or_else(|p| p.into_inner());
        *holds -= 1;
        self.shared.released.notify_all();
    }
}

pub(crate) struct Committer {
    tx: Mutex<Option<SyncSender<Pending>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
}

impl Committer {
    /// Starts the commit thread. With a `log`, every group is appended to it before it is
    /// written here (see [`super::log`]).
    pub(crate) fn start(
        db: Arc<DB>,
        durability: Durability,
        queue_depth: usize,
        log: Option<Arc<dyn CommitLog>>,
    ) -> Committer {
        let (tx, rx) = sync_channel(queue_depth.max(1));
        let shared = Arc::new(Shared::default());
        let worker_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ferrohub-commit".into())
            .spawn(move || {
                let _ = worker_shared.wake.thread.set(std::thread::current());
                run(db, durability, log, rx, worker_shared)
            })
            .expect("spawning the commit thread");
        Committer {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            shared,
        }
    }

    pub(crate) fn commit(&self, batch: Batch) -> Result<(), StorageError> {
        self.submit(batch)?.wait()
    }

    /// Queues a batch and returns at once. Batches are written in the order they are
    /// submitted, so a caller that holds a lock across `submit` (not `wait`) orders its writes.
    pub(crate) fn submit(&self, batch: Batch) -> Result<Ticket, StorageError> {
        let (reply, done) = sync_channel(1);
        self.enqueue(Pending {
            batch,
            reply: Reply::Waiter(reply),
        })?;
        Ok(Ticket { done })
    }

    /// Like [`Committer::submit`], but `done` runs on the commit thread when the write is
    /// durable, so async callers need no blocking thread to wait.
    pub(crate) fn submit_with(
        &self,
        batch: Batch,
        done: CommitCallback,
    ) -> Result<(), StorageError> {
        self.enqueue(Pending {
            batch,
            reply: Reply::Callback(done),
        })
    }

    /// Like [`Committer::submit_with`], but never waits: when the queue is full nothing is
    /// queued and `Ok(false)` comes back (the batch and `done` are dropped unrun).
    pub(crate) fn try_submit_with(
        &self,
        batch: Batch,
        done: CommitCallback,
    ) -> Result<bool, StorageError> {
        if self.shared.poisoned.load(Ordering::Acquire) {
            return Err(StorageError::Poisoned);
        }
        let tx = self.tx.lock().clone().ok_or(StorageError::Closed)?;
        let may_lag = batch.may_lag;
        self.shared.wake.coming(may_lag);
        let sent = tx.try_send(Pending {
            batch,
            reply: Reply::Callback(done),
        });
        self.shared.wake.sent(may_lag, sent.is_ok());
        match sent {
            Ok(()) => Ok(true),
            Err(TrySendError::Full(_)) => Ok(false),
            Err(TrySendError::Disconnected(_)) => Err(StorageError::Closed),
        }
    }

    fn enqueue(&self, pending: Pending) -> Result<(), StorageError> {
        if self.shared.poisoned.load(Ordering::Acquire) {
            return Err(StorageError::Poisoned);
        }
        // Clone the sender so the lock is not held while blocked on a full queue.
        let tx = self.tx.lock().clone().ok_or(StorageError::Closed)?;
        let may_lag = pending.batch.may_lag;
        self.shared.wake.coming(may_lag);
        // Blocks when QUEUE_DEPTH batches wait: the backpressure point.
        let sent = tx.send(pending);
        self.shared.wake.sent(may_lag, sent.is_ok());
        sent.map_err(|_| StorageError::Closed)
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.shared.poisoned.load(Ordering::Acquire)
    }

    pub(crate) fn fail_next_write(&self) {
        self.shared.fail_next.store(true, Ordering::Release);
    }

    pub(crate) fn last_logged(&self) -> u64 {
        self.shared.last_logged.load(Ordering::Acquire)
    }

    /// Where the log stood when this writer opened (what its database had applied).
    pub(crate) fn logged_from(&self, seq: u64) {
        self.shared.last_logged.fetch_max(seq, Ordering::AcqRel);
    }

    pub(crate) fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            writes: self.shared.writes.load(Ordering::Relaxed),
            syncs: self.shared.syncs.load(Ordering::Relaxed),
        }
    }

    /// Holds every write until the returned guard is dropped.
    pub(crate) fn hold(&self) -> CommitHold {
        *self.shared.holds.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        CommitHold {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops accepting commits, lets the thread finish what is queued, and joins it.
    pub(crate) fn shutdown(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(
    db: Arc<DB>,
    durability: Durability,
    log: Option<Arc<dyn CommitLog>>,
    rx: Receiver<Pending>,
    shared: Arc<Shared>,
) {
    if let Some(log) = log {
        return super::pipeline::run(&db, durability, log.as_ref(), &rx, &shared);
    }
    let synced_mode = durability == Durability::Synced;
    let mut synced = WriteOptions::default();
    synced.set_sync(synced_mode);
    let unsynced = WriteOptions::default();
    let mut lagging = Lagging::default();
    loop {
        let first = match next_batch(&rx, lagging.since) {
            Next::Batch(p) => p,
            Next::SyncDue => {
                lagging.sync(&db, &shared);
                continue;
            }
            Next::Closed => break,
            Next::Empty => continue,
        };
        shared.wait_while_held();
        let (group, bytes) = take_group(first, &rx, &shared, usize::MAX);
        let lags = !synced_mode || group.iter().all(|p| p.batch.may_lag);
        let wo = if lags { &unsynced } else { &synced };
        let result = ops_batch(&db, &group, bytes).and_then(|wb| write(&db, wo, wb, &shared));
        if finish_group(&db, &shared, group, result, synced_mode, &mut lagging) {
            shared.wake.nap(LAG_NAP);
        }
    }
    lagging.finish(&db, &shared);
}
