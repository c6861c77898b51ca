//! Group commit: one thread turns every batch that is waiting into one RocksDB write with one
//! WAL sync, then acknowledges each waiter.
//!
//! # Invariants
//! - A caller of [`Committer::commit`] returns `Ok` only after the write that contains its
//!   batch has completed (and, in synced mode, after that write's WAL sync).
//! - A group is one RocksDB `WriteBatch`, so it is atomic as a whole; each caller's batch is
//!   therefore atomic too.
//! - With a commit log (cluster mode, [`super::log`]), a group is written only after the log
//!   acknowledged it as one entry; a failed append poisons the committer as a failed write
//!   does. Groups then also end at [`MAX_LOG_ENTRY_BYTES`].
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rocksdb::{WriteBatch, WriteOptions, DB};

use super::log::{self, CommitLog};
use super::{Batch, Durability, Op};
use crate::error::StorageError;

/// Most batches folded into one write. Bounds the latency of the first waiter in a group.
const MAX_GROUP: usize = 1024;
/// With a commit log, a group ends once it holds this many bytes (a lone larger batch still
/// goes alone): the log's messages are bounded (the cluster's NATS servers take 8 MiB).
pub(crate) const MAX_LOG_ENTRY_BYTES: usize = 4 << 20;
/// Waiting batches beyond this make `commit` block: backpressure instead of unbounded memory.
/// Async callers take an admission permit first (see the server's store handle), so they wait
/// without blocking a thread; this bound is the last line.
pub const DEFAULT_QUEUE_DEPTH: usize = 8192;
/// The longest a written lagging batch waits for a sync. Seed 002 lets a device's connection
/// state lag by up to five minutes; a second keeps the window a machine crash can lose small
/// while a connect storm, whose records all may lag, costs about one sync a second.
pub const LAG_SYNC_WITHIN: Duration = Duration::from_secs(1);
/// How long the thread naps after a group of lagging batches. A connect storm queues two
/// such batches per connection (connected, disconnected), and a thread woken for each one
/// spent more on the wake-ups than on the writes (issue 19).
pub const LAG_NAP: Duration = Duration::from_millis(1);

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

/// Called on the commit thread once the batch's write is durable (or failed). Must be quick.
pub type CommitCallback = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

enum Reply {
    Waiter(SyncSender<Result<(), StorageError>>),
    Callback(CommitCallback),
}

impl Reply {
    fn send(self, r: Result<(), StorageError>) {
        match self {
            // A waiter that gave up (dropped its receiver) is not an error here.
            Reply::Waiter(tx) => drop(tx.send(r)),
            Reply::Callback(f) => f(r),
        }
    }
}

struct Pending {
    batch: Batch,
    reply: Reply,
}

#[derive(Default)]
struct Shared {
    wake: Wake,
    commits: AtomicU64,
    writes: AtomicU64,
    syncs: AtomicU64,
    poisoned: AtomicBool,
    /// The sequence the commit log gave the last group appended (cluster mode).
    last_logged: AtomicU64,
    /// Fault injection: the next write fails as a failed WAL write would (tests only).
    fail_next: AtomicBool,
    /// Live [`CommitHold`]s; the thread writes only while this is 0.
    holds: std::sync::Mutex<usize>,
    released: std::sync::Condvar,
}

impl Shared {
    fn wait_while_held(&self) {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        while *holds > 0 {
            holds = self.released.wait(holds).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Ends the commit thread's nap when a batch that may not lag is queued.
///
/// The thread sets `napping` and then reads `urgent`; a submitter adds to `urgent` before it
/// queues the batch and reads `napping` after (all sequentially consistent). So either the
/// thread sees the batch coming and does not nap (it then waits for it on the queue), or the
/// submitter sees the nap and unparks the thread; an unpark that comes before the park makes
/// the park return at once. Counting before queueing keeps `urgent` from dropping below the
/// batches really on their way.
#[derive(Default)]
struct Wake {
    napping: AtomicBool,
    /// Batches that may not lag, queued and not yet taken by the thread.
    urgent: AtomicU64,
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Wake {
    /// Before a batch is queued.
    fn coming(&self, may_lag: bool) {
        if !may_lag {
            self.urgent.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// After it was queued (`queued`) or not (a full or closed queue).
    fn sent(&self, may_lag: bool, queued: bool) {
        if may_lag {
            return;
        }
        if !queued {
            self.urgent.fetch_sub(1, Ordering::SeqCst);
        } else if self.napping.load(Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// On the thread, for each batch it takes.
    fn taken(&self, may_lag: bool) {
        if !may_lag {
            self.urgent.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// On the thread: naps up to `nap` unless a batch that may not lag is queued or comes.
    fn nap(&self, nap: Duration) {
        self.napping.store(true, Ordering::SeqCst);
        if self.urgent.load(Ordering::SeqCst) == 0 {
            std::thread::park_timeout(nap);
        }
        self.napping.store(false, Ordering::SeqCst);
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
    let byte_cap = if log.is_some() {
        MAX_LOG_ENTRY_BYTES
    } else {
        usize::MAX
    };
    let synced_mode = durability == Durability::Synced;
    let mut synced = WriteOptions::default();
    synced.set_sync(synced_mode);
    let unsynced = WriteOptions::default();
    // When the oldest written lagging batch not yet synced was written.
    let mut lagging_since: Option<Instant> = None;
    loop {
        let first = match next_batch(&rx, lagging_since) {
            Next::Batch(p) => p,
            Next::SyncDue => {
                sync_lagging(&db, &shared);
                lagging_since = None;
                continue;
            }
            Next::Closed => break,
        };
        shared.wait_while_held();
        shared.wake.taken(first.batch.may_lag);
        let mut bytes = first.batch.encoded_len();
        let mut group = vec![first];
        while group.len() < MAX_GROUP
            && bytes < byte_cap
            && group[group.len() - 1].batch.switch_memtable.is_none()
        {
            match rx.try_recv() {
                Ok(p) => {
                    shared.wake.taken(p.batch.may_lag);
                    bytes += p.batch.encoded_len();
                    group.push(p);
                }
                Err(_) => break,
            }
        }
        let only_lagging = group.iter().all(|p| p.batch.may_lag);
        let lags = !synced_mode || only_lagging;
        let wo = if lags { &unsynced } else { &synced };
        let result = write_group(&db, wo, log.as_deref(), &group, bytes, &shared);
        if synced_mode && result.is_ok() {
            if lags {
                lagging_since.get_or_insert_with(Instant::now);
            } else {
                shared.syncs.fetch_add(1, Ordering::Relaxed);
                lagging_since = None;
            }
        }
        if let (Ok(()), Some(cf)) = (&result, group[group.len() - 1].batch.switch_memtable) {
            switch_memtable(&db, cf);
        }
        shared
            .commits
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        for p in group {
            p.reply.send(result.clone());
        }
        if only_lagging && result.is_ok() {
            shared.wake.nap(LAG_NAP);
        }
    }
    if lagging_since.is_some() {
        sync_lagging(&db, &shared);
    }
}

enum Next {
    Batch(Pending),
    /// Lagging writes have waited [`LAG_SYNC_WITHIN`] for a sync.
    SyncDue,
    Closed,
}

fn next_batch(rx: &Receiver<Pending>, lagging_since: Option<Instant>) -> Next {
    let Some(since) = lagging_since else {
        return rx.recv().map_or(Next::Closed, Next::Batch);
    };
    let wait = LAG_SYNC_WITHIN.saturating_sub(since.elapsed());
    // A steady stream of lagging batches must not postpone the sync forever.
    if wait.is_zero() {
        return Next::SyncDue;
    }
    match rx.recv_timeout(wait) {
        Ok(p) => Next::Batch(p),
        Err(RecvTimeoutError::Timeout) => Next::SyncDue,
        Err(RecvTimeoutError::Disconnected) => Next::Closed,
    }
}

/// Syncs the WAL under writes that were allowed to lag. A failure poisons the committer as a
/// failed write does: what was written may not be on disk, and nobody can be told.
fn sync_lagging(db: &DB, shared: &Shared) {
    if shared.poisoned.load(Ordering::Acquire) {
        return;
    }
    match db.flush_wal(true) {
        Ok(()) => {
            shared.syncs.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            shared.poisoned.store(true, Ordering::Release);
            tracing::error!(error = %e, "syncing lagging writes failed; refusing further writes");
        }
    }
}

/// Memtables below this size are flushed along with a switch (see [`switch_memtable`]).
const SMALL_MEMTABLE: u64 = 8 << 20;

/// Switches a column family's memtable (RocksDB does it in this thread; the flush of the old
/// one runs in the background). A failure costs only the alignment, so it is logged.
///
/// Every other column family whose memtable holds a little is flushed too. A WAL file can be
/// recycled only once no memtable holds data from it, and a column family with a trickle of
/// writes (the segment index, connection state) otherwise pins every WAL file until the total
/// WAL size forces a flush: under steady telemetry that is 256 MiB of WAL, all written by
/// appending, whose syncs also write the inode (see `Raw::open`). Large memtables are left
/// alone: their column families flush often on their own.
fn switch_memtable(db: &DB, cf: &str) {
    let mut fo = rocksdb::FlushOptions::default();
    fo.set_wait(false);
    for name in ferrohub_migrations::cf::ALL {
        let Some(handle) = db.cf_handle(name) else {
            continue;
        };
        if name != cf {
            let held = |p: &str| db.property_int_value_cf(handle, p).ok().flatten();
            let entries = held("rocksdb.num-entries-active-mem-table").unwrap_or(0);
            let bytes = held("rocksdb.cur-size-active-mem-table").unwrap_or(u64::MAX);
            if entries == 0 || bytes >= SMALL_MEMTABLE {
                continue;
            }
        }
        if let Err(e) = db.flush_cf_opt(handle, &fo) {
            tracing::warn!(cf = name, error = %e, "memtable switch failed");
        }
    }
}

fn write_group(
    db: &DB,
    wo: &WriteOptions,
    log: Option<&dyn CommitLog>,
    group: &[Pending],
    bytes: usize,
    shared: &Shared,
) -> Result<(), StorageError> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(StorageError::Poisoned);
    }
    // Sized up front (`bytes`, counted as the group was taken): growing RocksDB's batch buffer
    // copied it again at every doubling.
    let mut wb = WriteBatch::with_capacity_bytes(bytes + 12);
    if let Some(log) = log {
        let mut entry = log::entry_header(bytes);
        for p in group {
            log::encode_ops(&mut entry, &p.batch.ops);
        }
        let crc32 = crc32fast::hash(&entry);
        let seq = log.append(entry).map_err(|e| {
            shared.poisoned.store(true, Ordering::Release);
            tracing::error!(error = %e, "commit log append failed; refusing further writes");
            StorageError::WriteFailed(e.to_string())
        })?;
        shared.last_logged.store(seq, Ordering::Release);
        let Some(meta) = db.cf_handle(ferrohub_migrations::cf::META) else {
            return Err(StorageError::Backend(
                "column family meta is missing".into(),
            ));
        };
        wb.put_cf(
            meta,
            log::APPLIED_KEY,
            ferrohub_migrations::record::encode(&seq),
        );
        wb.put_cf(
            meta,
            log::TIP_KEY,
            ferrohub_migrations::record::encode(&log::LogTip {
                sequence: seq,
                crc32,
            }),
        );
    }
    for p in group {
        for op in &p.batch.ops {
            let (Op::Put { cf, .. }
            | Op::Delete { cf, .. }
            | Op::Merge { cf, .. }
            | Op::DeleteRange { cf, .. }) = op;
            let Some(h) = db.cf_handle(cf) else {
                return Err(StorageError::Backend(format!(
                    "column family {cf} is missing"
                )));
            };
            match op {
                Op::Put { key, value, .. } => wb.put_cf(h, key, value),
                Op::Delete { key, .. } => wb.delete_cf(h, key),
                Op::Merge { key, value, .. } => wb.merge_cf(h, key, value),
                Op::DeleteRange { from, to, .. } => wb.delete_range_cf(h, from, to),
            }
        }
    }
    shared.writes.fetch_add(1, Ordering::Relaxed);
    let written = if shared.fail_next.swap(false, Ordering::AcqRel) {
        Err("injected write failure".to_string())
    } else {
        db.write_opt(wb, wo).map_err(rocksdb::Error::into_string)
    };
    written.map_err(|e| {
        shared.poisoned.store(true, Ordering::Release);
        tracing::error!(error = %e, "durable write failed; refusing further writes");
        StorageError::WriteFailed(e)
    })
}
