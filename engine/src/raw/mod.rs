//! The only module that names `rocksdb::`: opening the database with its column families,
//! point reads, ordered scans, the schema-migration adapter and the group committer.
//!
//! # Invariants
//! - Every value read through [`Raw::get_record`] or [`Raw::scan_records`] has passed its
//!   checksum; a failure is [`StorageError::Corruption`] naming the column family and key.
//!   The two readers that hand out raw values ([`Raw::last_value_in`],
//!   [`Raw::scan_values_from_prev`]) serve records of several frames, whose owner checks each.
//! - Writes happen only through [`Raw::commit`] (one atomic batch, durable before it returns in
//!   [`Durability::Synced`] mode) or through the migration adapter before the store is shared.
//! - Every read and every queueing honours this thread's [`no_wait`] mode: memory-only reads,
//!   no synchronous commit, no wait for room in the commit queue.

mod column_families;
mod commit;
mod group;
mod inflight;
mod log;
mod migrate;
pub(crate) mod no_wait;
mod open;
mod pipeline;

use std::path::Path;
use std::sync::Arc;

use column_families::cf_options;
use ferrohub_migrations::{cf, m0002_registry_counters::DeviceCounters, record};
use rocksdb::{ColumnFamilyDescriptor, Direction, IteratorMode, Options, DB};
use serde::de::DeserializeOwned;

pub use commit::CommitCallback;
pub use commit::CommitStats;
use commit::Committer;
pub(crate) use commit::Ticket;
pub use commit::{CommitHold, DEFAULT_QUEUE_DEPTH, LAG_NAP, LAG_SYNC_WITHIN};
pub(crate) use group::MAX_LOG_ENTRY_BYTES;
pub(crate) use log::Touched;
pub use log::{empty_entry as empty_log_entry, AppendOutcome, CommitLog, LogError, LogTip};

use crate::error::{KeyDisplay, OpenError, StorageError};

/// How commits reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every acknowledged commit is in a synced WAL (group commit shares the sync).
    #[default]
    Synced,
    /// The WAL is written but not synced per commit: a machine crash may lose recent commits.
    /// Never the default; for development and benchmarks of the non-durable path.
    Relaxed,
}

/// One staged change inside a [`Batch`].
#[derive(Debug)]
pub(crate) enum Op {
    Put {
        cf: &'static str,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        cf: &'static str,
        key: Vec<u8>,
    },
    Merge {
        cf: &'static str,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Deletes every key in `[from, to)`: one range tombstone, for bulk retention.
    DeleteRange {
        cf: &'static str,
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

/// Changes that commit atomically, or not at all.
#[derive(Debug, Default)]
pub struct Batch {
    pub(crate) ops: Vec<Op>,
    /// A column family whose memtable the committer switches right after writing this batch,
    /// before any later batch: a later flush then holds only what was queued after it.
    pub(crate) switch_memtable: Option<&'static str>,
    /// Nobody is told this batch is on disk, so its write need not be synced (see
    /// [`Batch::may_lag`]).
    pub(crate) may_lag: bool,
    /// Twin keys every write of which in this batch changes only the reported section (with
    /// the twin's version and etag): the twin index hook knows from this alone that a
    /// definition without reported paths keeps their entries, and reads nothing for them.
    pub(crate) reported_only_twins: Vec<Vec<u8>>,
}

impl Batch {
    /// An empty batch with room for `ops` operations.
    pub(crate) fn with_capacity(ops: usize) -> Batch {
        Batch {
            ops: Vec::with_capacity(ops),
            ..Batch::default()
        }
    }

    pub(crate) fn put_record<T: serde::Serialize>(
        &mut self,
        cf: &'static str,
        key: Vec<u8>,
        value: &T,
    ) {
        self.ops.push(Op::Put {
            cf,
            key,
            value: record::encode(value),
        });
    }
    pub(crate) fn put_framed(&mut self, cf: &'static str, key: Vec<u8>, framed: Vec<u8>) {
        self.ops.push(Op::Put {
            cf,
            key,
            value: framed,
        });
    }
    pub(crate) fn delete_range(&mut self, cf: &'static str, from: Vec<u8>, to: Vec<u8>) {
        self.ops.push(Op::DeleteRange { cf, from, to });
    }
    pub(crate) fn delete(&mut self, cf: &'static str, key: Vec<u8>) {
        self.ops.push(Op::Delete { cf, key });
    }
    pub(crate) fn merge_counters(&mut self, key: &[u8], delta: DeviceCounters) {
        if delta != DeviceCounters::default() {
            self.ops.push(Op::Merge {
                cf: cf::COUNTERS,
                key: key.to_vec(),
                value: record::encode(&delta),
            });
        }
    }
    /// About the bytes this batch takes in a RocksDB write batch: keys, values and, per
    /// operation, a tag, a column family id and two length prefixes.
    pub(crate) fn encoded_len(&self) -> usize {
        self.ops
            .iter()
            .map(|op| {
                16 + match op {
                    Op::Put { key, value, .. } | Op::Merge { key, value, .. } => {
                        key.len() + value.len()
                    }
                    Op::Delete { key, .. } => key.len(),
                    Op::DeleteRange { from, to, .. } => from.len() + to.len(),
                }
            })
            .sum()
    }

    /// Asks the committer to switch `cf`'s memtable once this batch is written.
    pub(crate) fn switch_memtable_after(&mut self, cf: &'static str) {
        self.switch_memtable = Some(cf);
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.switch_memtable.is_none()
    }
    /// Lets the committer write this batch without a sync of its own: for state that nobody
    /// is told is durable and that may lag after a machine crash (a device's connection state,
    /// the router's cursor past notifications that routed nowhere). Its caller still hears
    /// back only once it is written, so reads see it, which may be up to [`LAG_NAP`] after it
    /// was queued (the committer naps after lagging writes); the WAL makes it durable with the next
    /// synced write, and the committer syncs it itself within [`LAG_SYNC_WITHIN`]. A process
    /// crash loses nothing: the WAL is in the kernel's page cache once written.
    pub(crate) fn may_lag(&mut self) {
        self.may_lag = true;
    }
    /// Records what a write of the twin under `twin_key` changed: `reported_only` says it
    /// touched nothing but the reported section. Any other write of the same twin in this
    /// batch withdraws the mark, so it holds for all of them or is absent.
    pub(crate) fn note_twin_write(&mut self, twin_key: &[u8], reported_only: bool) {
        let marked = self.reported_only_twins.iter().position(|k| k == twin_key);
        match (reported_only, marked) {
            // A write before this one that was not marked withdrew nothing: it must count.
            (true, None) if self.writes_of(cf::TWINS, twin_key) == 1 => {
                self.reported_only_twins.push(twin_key.to_vec());
            }
            (false, Some(i)) => {
                self.reported_only_twins.swap_remove(i);
            }
            _ => {}
        }
    }
    /// Whether `twin_key` is marked by [`Batch::note_twin_write`] as changed in its reported
    /// section only.
    pub(crate) fn twin_changes_reported_only(&self, twin_key: &[u8]) -> bool {
        self.reported_only_twins.iter().any(|k| k == twin_key)
    }
    /// How many operations of this batch put or delete `key` in `cf_name`.
    pub(crate) fn writes_of(&self, cf_name: &str, key: &[u8]) -> usize {
        self.ops
            .iter()
            .filter(|op| {
                matches!(op, Op::Put { cf, key: k, .. } | Op::Delete { cf, key: k }
                    if *cf == cf_name && k.as_slice() == key)
            })
            .count()
    }
}

/// The database handle shared by all domain modules.
pub(crate) struct Raw {
    db: Arc<DB>,
    /// `None` for a read-only handle and a cluster follower's.
    committer: Option<Committer>,
    /// What a write is refused with when there is no committer.
    no_committer: StorageError,
    /// Adds derived writes (the twin index) to every batch of `commit` and `submit`.
    hook: std::sync::OnceLock<Box<dyn BatchHook>>,
    /// Twin writes staged by [`Raw::stage_pipelined`] and not yet durable.
    inflight: Arc<inflight::Inflight>,
}

/// A batch staged by [`Raw::stage_pipelined`]: its tracked writes are visible in flight until
/// it is queued and durable, or until it is dropped unqueued.
pub(crate) struct Pipelined {
    batch: Batch,
    release: inflight::Release,
}

impl Pipelined {
    /// The batch, for writes that derive nothing and track nothing (change-log records).
    pub(crate) fn batch_mut(&mut self) -> &mut Batch {
        &mut self.batch
    }
}

/// Derived writes staged into a batch before it is queued, in the writer's thread (so under
/// whatever locks the writer holds). Installed once per store.
///
/// [`Raw::commit`], [`Raw::submit`], [`Raw::stage_derived`] and [`Raw::stage_pipelined`] run it: the other callback
/// paths (`submit_with`, `try_submit_with`) carry D2C appends, which never write identities or
/// twins.
pub(crate) trait BatchHook: Send + Sync {
    fn stage(&self, raw: &Raw, batch: &mut Batch) -> Result<(), StorageError>;
}

fn backend(e: rocksdb::Error) -> StorageError {
    StorageError::Backend(e.into_string())
}

impl Raw {
    /// Opens (creating if needed) the database and migrates it to `target_version`.
    pub(crate) fn open(
        path: &Path,
        durability: Durability,
        commit_queue_depth: usize,
        target_version: u32,
        log: Option<Arc<dyn CommitLog>>,
    ) -> Result<Raw, OpenError> {
        let db = Arc::new(open::open_db(path, target_version)?);
        let logged = log.is_some();
        let committer = Committer::start(Arc::clone(&db), durability, commit_queue_depth, log);
        let raw = Raw {
            db,
            committer: Some(committer),
            no_committer: StorageError::ReadOnly,
            hook: std::sync::OnceLock::new(),
            inflight: Default::default(),
        };
        if logged {
            let applied = raw.applied_log_sequence()?;
            if let Some(c) = &raw.committer {
                c.logged_from(applied);
            }
        }
        Ok(raw)
    }

    /// Opens (creating if needed) a cluster follower's database at the current schema
    /// version: it takes log entries ([`Raw::apply_log_entry`]) and serves reads, and every
    /// commit is refused with [`StorageError::NotWriter`].
    pub(crate) fn open_follower(path: &Path) -> Result<Raw, OpenError> {
        let db = open::open_db(path, ferrohub_migrations::LATEST_VERSION)?;
        Ok(Raw {
            db: Arc::new(db),
            committer: None,
            no_committer: StorageError::NotWriter,
            hook: std::sync::OnceLock::new(),
            inflight: Default::default(),
        })
    }

    /// Opens an existing database for reading only, beside a process that may be writing it.
    /// The database must already be at [`ferrohub_migrations::LATEST_VERSION`].
    pub(crate) fn open_read_only(path: &Path) -> Result<Raw, OpenError> {
        let db_opts = Options::default();
        let existing = DB::list_cf(&db_opts, path).map_err(|e| OpenError::Directory {
            path: path.display().to_string(),
            reason: format!("no database here ({})", e.into_string()),
        })?;
        let descriptors: Vec<_> = existing
            .iter()
            .map(|name| ColumnFamilyDescriptor::new(name, cf_options(name)))
            .collect();
        let db = DB::open_cf_descriptors_read_only(&db_opts, path, descriptors, false)
            .map_err(backend)?;
        let version = migrate::read_version(&db)?;
        let latest = ferrohub_migrations::LATEST_VERSION;
        if version > latest {
            return Err(ferrohub_migrations::MigrationError::TooNew {
                found: version,
                latest,
            }
            .into());
        }
        if version < latest {
            return Err(OpenError::Directory {
                path: path.display().to_string(),
                reason: format!("the database is at schema version {version}; start `ferrohub serve` once to migrate it to {latest}"),
            });
        }
        Ok(Raw {
            db: Arc::new(db),
            committer: None,
            no_committer: StorageError::ReadOnly,
            inflight: Default::default(),
            hook: std::sync::OnceLock::new(),
        })
    }

    fn handle(&self, cf: &'static str) -> Result<&rocksdb::ColumnFamily, StorageError> {
        self.db
            .cf_handle(cf)
            .ok_or_else(|| StorageError::Backend(format!("column family {cf} is missing")))
    }

    /// Reads and checks one record.
    pub(crate) fn get_record<T: DeserializeOwned>(
        &self,
        cf: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        let handle = self.handle(cf)?;
        let bytes = self
            .db
            .get_pinned_cf_opt(handle, key, &no_wait::read_options())
            .map_err(|e| self.classify(cf, key, e))?;
        match bytes {
            None => Ok(None),
            Some(b) => decode_checked(cf, key, &b).map(Some),
        }
    }

    /// Reads one record for a read-modify-write: a value written by a pipelined batch that is
    /// not yet durable comes first (see [`inflight`]), then RocksDB.
    pub(crate) fn get_for_update<T: DeserializeOwned>(
        &self,
        cf: &'static str,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        match self.inflight.get(cf, key) {
            Some(Some(bytes)) => decode_checked(cf, key, &bytes).map(Some),
            Some(None) => Ok(None),
            None => self.get_record(cf, key),
        }
    }

    /// Visits records with keys in `[from, until)` in key order; `visit` returns false to stop.
    pub(crate) fn scan_records<T: DeserializeOwned>(
        &self,
        cf: &'static str,
        from: &[u8],
        until: Option<Vec<u8>>,
        mut visit: impl FnMut(&[u8], T) -> bool,
    ) -> Result<(), StorageError> {
        let handle = self.handle(cf)?;
        let mut ro = no_wait::read_options();
        if let Some(end) = until {
            ro.set_iterate_upper_bound(end);
        }
        for item in
            self.db
                .iterator_cf_opt(handle, ro, IteratorMode::From(from, Direction::Forward))
        {
            let (k, v) = item.map_err(|e| self.classify(cf, from, e))?;
            let value = decode_checked(cf, &k, &v)?;
            if !visit(&k, value) {
                break;
            }
        }
        Ok(())
    }

    /// Visits the keys in `[from, until)` in key order (values unread); `visit` returns false
    /// to stop.
    pub(crate) fn scan_keys(
        &self,
        cf: &'static str,
        from: &[u8],
        until: Option<Vec<u8>>,
        mut visit: impl FnMut(&[u8]) -> bool,
    ) -> Result<(), StorageError> {
        let handle = self.handle(cf)?;
        let mut ro = no_wait::read_options();
        if let Some(end) = until {
            ro.set_iterate_upper_bound(end);
        }
        let mut it = self.db.raw_iterator_cf_opt(handle, ro);
        it.seek(from);
        while it.valid() {
            let Some(k) = it.key() else { break };
            if !visit(k) {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(|e| self.classify(cf, from, e))
    }

    /// Commits a batch atomically; with [`Durability::Synced`] it is on disk when this returns.
    /// Blocks the calling thread while the group's sync runs.
    pub(crate) fn commit(&self, mut batch: Batch) -> Result<(), StorageError> {
        if batch.is_empty() {
            return Ok(());
        }
        if no_wait::active() {
            return Err(no_wait::refuse());
        }
        self.run_hook(&mut batch)?;
        self.committer
            .as_ref()
            .ok_or_else(|| self.no_committer.clone())?
            .commit(batch)
    }

    /// Queues a batch in commit order without waiting; see [`Ticket::wait`].
    pub(crate) fn submit(&self, mut batch: Batch) -> Result<Ticket, StorageError> {
        if no_wait::active() {
            return Err(no_wait::refuse());
        }
        self.run_hook(&mut batch)?;
        self.committer
            .as_ref()
            .ok_or_else(|| self.no_committer.clone())?
            .submit(batch)
    }

    /// Installs the batch hook; a second one is refused (returned).
    pub(crate) fn set_hook(&self, hook: Box<dyn BatchHook>) -> Result<(), Box<dyn BatchHook>> {
        self.hook.set(hook)
    }

    fn run_hook(&self, batch: &mut Batch) -> Result<(), StorageError> {
        match self.hook.get() {
            Some(hook) => hook.stage(self, batch),
            None => Ok(()),
        }
    }

    /// Queues a batch as [`Raw::commit`] writes it (batch hook included) without waiting:
    /// `done` runs on the commit thread once it is durable, or at once for an empty batch.
    pub(crate) fn submit_then(
        &self,
        mut batch: Batch,
        done: CommitCallback,
    ) -> Result<(), StorageError> {
        if batch.is_empty() {
            done(Ok(()));
            return Ok(());
        }
        self.run_hook(&mut batch)?;
        self.submit_with(batch, done)
    }

    /// Queues a batch; `done` runs on the commit thread once it is durable. Without waiting
    /// ([`no_wait`]) a full queue refuses the batch, and `done` is dropped unrun.
    pub(crate) fn submit_with(
        &self,
        batch: Batch,
        done: CommitCallback,
    ) -> Result<(), StorageError> {
        let committer = self
            .committer
            .as_ref()
            .ok_or_else(|| self.no_committer.clone())?;
        if !no_wait::active() {
            return committer.submit_with(batch, done);
        }
        if committer.try_submit_with(batch, done)? {
            Ok(())
        } else {
            Err(no_wait::refuse())
        }
    }

    /// Stages `batch`'s derived writes (the batch hook) and makes its tracked writes visible
    /// to [`Raw::get_for_update`] until it is durable or failed, so the next write of the same
    /// twin need not wait for this sync. Queue it with [`Raw::queue_pipelined`]; dropping it
    /// unqueued withdraws it. The caller holds the stripe locks of the twins it writes, from
    /// the read to the queueing: they, not a global lock, order the writes of one twin.
    pub(crate) fn stage_pipelined(&self, mut batch: Batch) -> Result<Pipelined, StorageError> {
        if self.committer.is_none() {
            return Err(self.no_committer.clone());
        }
        self.run_hook(&mut batch)?;
        let release = self.inflight.track(&batch);
        Ok(Pipelined { batch, release })
    }

    /// Queues a staged batch without waiting; `done` runs on the commit thread once it is
    /// durable or failed, after its writes stopped being visible in flight.
    pub(crate) fn queue_pipelined(
        &self,
        staged: Pipelined,
        done: CommitCallback,
    ) -> Result<(), StorageError> {
        let Pipelined { batch, release } = staged;
        // Refused (without waiting, on a full queue): the callback is dropped unrun, and with
        // it `release`, so the batch's writes are no longer visible in flight.
        self.submit_with(
            batch,
            Box::new(move |result| {
                // Durable (or failed) first, then visible only in RocksDB, then answered.
                drop(release);
                done(result)
            }),
        )
    }

    /// Stages `batch`'s derived writes (the batch hook), for [`Raw::submit_staged`]: callers
    /// that queue under a lock of their own run the hook, which reads, before taking it.
    pub(crate) fn stage_derived(&self, batch: &mut Batch) -> Result<(), StorageError> {
        self.run_hook(batch)
    }

    /// Queues a batch whose derived writes [`Raw::stage_derived`] staged.
    pub(crate) fn submit_staged(&self, batch: Batch) -> Result<Ticket, StorageError> {
        if no_wait::active() {
            return Err(no_wait::refuse());
        }
        self.committer
            .as_ref()
            .ok_or_else(|| self.no_committer.clone())?
            .submit(batch)
    }

    /// Queues `batch` unless the commit queue is full; see `Committer::try_submit_with`.
    pub(crate) fn try_submit_with(
        &self,
        batch: Batch,
        done: CommitCallback,
    ) -> Result<bool, StorageError> {
        self.committer
            .as_ref()
            .ok_or_else(|| self.no_committer.clone())?
            .try_submit_with(batch, done)
    }

    /// The last key with its value in `[from, until)`, unchecked (for records that hold
    /// several frames, which their owner checks), if any.
    pub(crate) fn last_value_in(
        &self,
        cf: &'static str,
        from: &[u8],
        until: Vec<u8>,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>, StorageError> {
        let handle = self.handle(cf)?;
        let mut ro = no_wait::read_options();
        ro.set_iterate_lower_bound(from.to_vec());
        ro.set_iterate_upper_bound(until);
        let mut it = self.db.raw_iterator_cf_opt(handle, ro);
        it.seek_to_last();
        if let (Some(k), Some(v)) = (it.key(), it.value()) {
            return Ok(Some((k.to_vec(), v.to_vec())));
        }
        it.status().map_err(|e| self.classify(cf, from, e))?;
        Ok(None)
    }

    /// Visits keys and values, unchecked, in `[lower, until)` in key order, from the last key
    /// at or below `at` (from the first key when none is); `visit` returns false to stop. For
    /// records each holding a run of entries keyed by its first (the D2C log's packs), where
    /// the entry `at` lives in the record at or below it.
    pub(crate) fn scan_values_from_prev(
        &self,
        cf: &'static str,
        lower: Vec<u8>,
        at: &[u8],
        until: Vec<u8>,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, StorageError>,
    ) -> Result<(), StorageError> {
        let handle = self.handle(cf)?;
        let mut ro = no_wait::read_options();
        ro.set_iterate_lower_bound(lower);
        ro.set_iterate_upper_bound(until);
        let mut it = self.db.raw_iterator_cf_opt(handle, ro);
        it.seek_for_prev(at);
        if !it.valid() {
            it.status().map_err(|e| self.classify(cf, at, e))?;
            it.seek(at);
        }
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if !visit(k, v)? {
                return Ok(());
            }
            it.next();
        }
        it.status().map_err(|e| self.classify(cf, at, e))
    }

    /// The last key of a column family, if it has any.
    pub(crate) fn last_key(&self, cf: &'static str) -> Result<Option<Vec<u8>>, StorageError> {
        let handle = self.handle(cf)?;
        let mut it = self.db.raw_iterator_cf_opt(handle, no_wait::read_options());
        it.seek_to_last();
        if it.valid() {
            return Ok(it.key().map(<[u8]>::to_vec));
        }
        it.status()
            .map_err(|e| no_wait::refused_read(&e).unwrap_or_else(|| backend(e)))?;
        Ok(None)
    }

    /// See [`commit::CommitHold`]. A read-only store has nothing to hold.
    pub(crate) fn fail_next_write(&self) {
        if let Some(c) = &self.committer {
            c.fail_next_write();
        }
    }

    pub(crate) fn hold_commits(&self) -> Option<CommitHold> {
        self.committer.as_ref().map(Committer::hold)
    }

    pub(crate) fn commit_stats(&self) -> CommitStats {
        self.committer
            .as_ref()
            .map(Committer::stats)
            .unwrap_or_default()
    }

    /// Whether a failed durable write stopped the committer (see `commit`).
    /// See `Store::last_logged_sequence`.
    pub(crate) fn last_logged_sequence(&self) -> u64 {
        self.committer.as_ref().map_or(0, Committer::last_logged)
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.committer.as_ref().is_some_and(Committer::is_poisoned)
    }

    /// A RocksDB integer property summed over every column family (0 where it is absent).
    pub(crate) fn property_sum(&self, name: &str) -> u64 {
        cf::ALL
            .iter()
            .filter_map(|c| self.db.cf_handle(c))
            .filter_map(|h| self.db.property_int_value_cf(h, name).ok().flatten())
            .sum()
    }

    /// An integer property of one column family (0 when RocksDB does not report it).
    pub(crate) fn property_of(&self, cf_name: &str, name: &str) -> u64 {
        self.db
            .cf_handle(cf_name)
            .and_then(|h| self.db.property_int_value_cf(h, name).ok().flatten())
            .unwrap_or(0)
    }

    /// Writes a consistent copy of the database into `dir` (which must not exist): a RocksDB
    /// checkpoint, hard-linking table files where the file system allows.
    pub(crate) fn checkpoint(&self, dir: &Path) -> Result<(), StorageError> {
        let cp = rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(backend)?;
        cp.create_checkpoint(dir).map_err(backend)
    }

    /// Deletes the table files of `cf` that lie wholly in `[from, to)`, without compaction.
    /// Only for key ranges nothing reads any more: a snapshot taken earlier loses them too.
    pub(crate) fn drop_files_in_range(
        &self,
        cf: &'static str,
        from: &[u8],
        to: &[u8],
    ) -> Result<(), StorageError> {
        let handle = self.handle(cf)?;
        self.db
            .delete_file_in_range_cf(handle, from, to)
            .map_err(backend)
    }

    /// Flushes memtables so the next open replays little WAL. Called on clean shutdown.
    pub(crate) fn flush(&self) -> Result<(), StorageError> {
        let Some(committer) = &self.committer else {
            return Ok(());
        };
        committer.shutdown();
        self.db.flush_wal(true).map_err(backend)?;
        for name in cf::ALL {
            if let Some(h) = self.db.cf_handle(name) {
                self.db.flush_cf(h).map_err(backend)?;
            }
        }
        Ok(())
    }

    fn classify(&self, cf: &'static str, key: &[u8], e: rocksdb::Error) -> StorageError {
        if let Some(refused) = no_wait::refused_read(&e) {
            return refused;
        }
        if e.kind() == rocksdb::ErrorKind::Corruption {
            StorageError::Corruption {
                cf: cf.into(),
                key: KeyDisplay(key.to_vec()),
                reason: e.into_string(),
            }
        } else {
            backend(e)
        }
    }
}

fn decode_checked<T: DeserializeOwned>(
    cf: &'static str,
    key: &[u8],
    bytes: &[u8],
) -> Result<T, StorageError> {
    record::decode(bytes).map_err(|e| {
        tracing::error!(cf, key = %KeyDisplay(key.to_vec()), error = %e, "corrupt record");
        StorageError::Corruption {
            cf: cf.into(),
            key: KeyDisplay(key.to_vec()),
            reason: e.to_string(),
        }
    })
}
