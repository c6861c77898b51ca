//! What the two commit threads share (a single node's in [`super::commit`], a cluster
//! writer's in [`super::pipeline`]): a submitted batch and how it is answered, the committer's
//! shared state, taking a group from the queue, writing it, and answering it.
//!
//! # Invariants
//! - A group's batches are answered together, after its write (or its failure), in the order
//!   they were queued; a failed write poisons the committer ([`Shared::poisoned`]).
//! - The invariants of the nap ([`Wake`]) and of lagging batches ([`Lagging`]) are those of
//!   [`super::commit`]'s module docs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

use rocksdb::{WriteBatch, WriteOptions, DB};

use super::{Batch, Op};
use crate::error::StorageError;

/// Most batches folded into one write. Bounds the latency of the first waiter in a group.
pub(super) const MAX_GROUP: usize = 1024;
/// With a commit log, a group ends once it holds this many bytes (a lone larger batch still
/// goes alone): the log's messages are bounded (the cluster's NATS servers take 8 MiB).
pub(crate) const MAX_LOG_ENTRY_BYTES: usize = 4 << 20;
/// The longest a written lagging batch waits for a sync. Seed 002 lets a device's connection
/// state lag by up to five minutes; a second keeps the window a machine crash can lose small
/// while a connect storm, whose records all may lag, costs about one sync a second.
pub const LAG_SYNC_WITHIN: Duration = Duration::from_secs(1);
/// How long the thread naps after a group of lagging batches. A connect storm queues two
/// such batches per connection (connected, disconnected), and a thread woken for each one
/// spent more on the wake-ups than on the writes (issue 19).
pub const LAG_NAP: Duration = Duration::from_millis(1);

/// Called on the commit thread once the batch's write is durable (or failed). Must be quick.
pub type CommitCallback = Box<dyn FnOnce(Result<(), StorageError>) + Send>;

pub(super) enum Reply {
    Waiter(SyncSender<Result<(), StorageError>>),
    Callback(CommitCallback),
}

impl Reply {
    pub(super) fn send(self, r: Result<(), StorageError>) {
        match self {
            // A waiter that gave up (dropped its receiver) is not an error here.
            Reply::Waiter(tx) => drop(tx.send(r)),
            Reply::Callback(f) => f(r),
        }
    }
}

pub(super) struct Pending {
    pub(super) batch: Batch,
    pub(super) reply: Reply,
}

#[derive(Default)]
pub(super) struct Shared {
    pub(super) wake: Wake,
    pub(super) commits: AtomicU64,
    pub(super) writes: AtomicU64,
    pub(super) syncs: AtomicU64,
    pub(super) poisoned: AtomicBool,
    /// The sequence the commit log gave the last group appended (cluster mode).
    pub(super) last_logged: AtomicU64,
    /// Fault injection: the next write fails as a failed WAL write would (tests only).
    pub(super) fail_next: AtomicBool,
    /// Live [`CommitHold`]s; the thread writes only while this is 0.
    pub(super) holds: std::sync::Mutex<usize>,
    pub(super) released: std::sync::Condvar,
}

impl Shared {
    pub(super) fn wait_while_held(&self) {
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
pub(super) struct Wake {
    napping: AtomicBool,
    /// Batches that may not lag, queued and not yet taken by the thread.
    urgent: AtomicU64,
    pub(super) thread: std::sync::OnceLock<std::thread::Thread>,
}

impl Wake {
    /// Before a batch is queued.
    pub(super) fn coming(&self, may_lag: bool) {
        if !may_lag {
            self.urgent.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// After it was queued (`queued`) or not (a full or closed queue).
    pub(super) fn sent(&self, may_lag: bool, queued: bool) {
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
    pub(super) fn taken(&self, may_lag: bool) {
        if !may_lag {
            self.urgent.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// On the thread: naps up to `nap` unless a batch that may not lag is queued or comes.
    pub(super) fn nap(&self, nap: Duration) {
        self.napping.store(true, Ordering::SeqCst);
        if self.urgent.load(Ordering::SeqCst) == 0 {
            std::thread::park_timeout(nap);
        }
        self.napping.store(false, Ordering::SeqCst);
    }
}

/// Written lagging batches not yet synced (see the module's invariants).
#[derive(Default)]
pub(super) struct Lagging {
    /// When the oldest written lagging batch not yet synced was written.
    pub(super) since: Option<Instant>,
}

impl Lagging {
    pub(super) fn sync(&mut self, db: &DB, shared: &Shared) {
        sync_lagging(db, shared);
        self.since = None;
    }

    /// Whether the sync is due now.
    pub(super) fn due(&self) -> bool {
        self.since
            .is_some_and(|since| since.elapsed() >= LAG_SYNC_WITHIN)
    }

    /// How long until the sync is due (`None`: nothing waits for one).
    pub(super) fn due_in(&self) -> Option<Duration> {
        self.since
            .map(|since| LAG_SYNC_WITHIN.saturating_sub(since.elapsed()))
    }

    /// Before the thread ends.
    pub(super) fn finish(&mut self, db: &DB, shared: &Shared) {
        if self.since.is_some() {
            self.sync(db, shared);
        }
    }
}

/// Takes the batches queued behind `first` into its group, up to [`MAX_GROUP`] batches and
/// `byte_cap` bytes, ending it at a memtable switch; the group and its encoded size.
pub(super) fn take_group(
    first: Pending,
    rx: &Receiver<Pending>,
    shared: &Shared,
    byte_cap: usize,
) -> (Vec<Pending>, usize) {
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
    (group, bytes)
}

/// After a group's write (or its failure): counts its sync, switches the memtable it asked
/// for, and answers its batches. Whether the thread should nap (the group was all lagging).
pub(super) fn finish_group(
    db: &DB,
    shared: &Shared,
    group: Vec<Pending>,
    result: Result<(), StorageError>,
    synced_mode: bool,
    lagging: &mut Lagging,
) -> bool {
    let only_lagging = group.iter().all(|p| p.batch.may_lag);
    if synced_mode && result.is_ok() {
        if only_lagging {
            lagging.since.get_or_insert_with(Instant::now);
        } else {
            shared.syncs.fetch_add(1, Ordering::Relaxed);
            lagging.since = None;
        }
    }
    if let (Ok(()), Some(cf)) = (&result, group[group.len() - 1].batch.switch_memtable) {
        switch_memtable(db, cf);
    }
    shared
        .commits
        .fetch_add(group.len() as u64, Ordering::Relaxed);
    let nap = only_lagging && result.is_ok();
    for p in group {
        p.reply.send(result.clone());
    }
    nap
}

pub(super) enum Next {
    Batch(Pending),
    /// Nothing queued (only from a look that does not wait).
    Empty,
    /// Lagging writes have waited [`LAG_SYNC_WITHIN`] for a sync.
    SyncDue,
    Closed,
}

pub(super) fn next_batch(rx: &Receiver<Pending>, lagging_since: Option<Instant>) -> Next {
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
pub(super) fn sync_lagging(db: &DB, shared: &Shared) {
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

/// The group's operations as one RocksDB batch, sized up front (`bytes`, counted as the group
/// was taken): growing RocksDB's batch buffer copied it again at every doubling.
pub(super) fn ops_batch(
    db: &DB,
    group: &[Pending],
    bytes: usize,
) -> Result<WriteBatch, StorageError> {
    let mut wb = WriteBatch::with_capacity_bytes(bytes + 64);
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
    Ok(wb)
}

/// Writes one group's batch; a failure poisons the committer.
pub(super) fn write(
    db: &DB,
    wo: &WriteOptions,
    wb: WriteBatch,
    shared: &Shared,
) -> Result<(), StorageError> {
    if shared.poisoned.load(Ordering::Acquire) {
        return Err(StorageError::Poisoned);
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
