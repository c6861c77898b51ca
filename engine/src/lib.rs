//! ferrohub storage engine: the hub's state on one RocksDB database.
//!
//! # Layout
//! - [`raw`](crate::raw) (private): the only module naming `rocksdb::`; column families,
//!   checked reads, and the group committer that makes every acknowledged write durable.
//! - `keys` (private): every stored key, built in one place.
//! - [`model`]: identity records and their validation rules.
//! - [`identity`]: the device and module registry.
//! - [`archive`]: identities with their twins as whole records, for export and restore.
//! - [`jobs`]: import/export job records.
//! - [`hub`]: hub settings and shared access policies.
//! - [`c2d`]: cloud-to-device queues, locks, expiry, dead letters and feedback.
//! - [`endpoints`]: custom endpoints (more partitioned streams) and the routed append.
//! - [`d2c`]: device-to-cloud partitions, consumer groups, checkpoints, retention.
//! - `slots` (private, re-exported by `d2c` and `endpoints`): the global partition numbering
//!   both share.
//! - [`sessions`]: persistent MQTT sessions (subscriptions per client id).
//! - [`notifications`]: the outbox of non-telemetry events (twin, lifecycle, connection).
//! - [`routing`]: routes, the fallback route and enrichments (stored configuration).
//! - [`twin`]: twin section rules (limits, merge patches, versions, metadata), and IoT Plug
//!   and Play's digital twin view of a twin (`twin::pnp`).
//! - [`error`]: one error enum per kind of operation, wrapping [`StorageError`].
//! - Record framing and schema versions live in `ferrohub-migrations`.
//!
//! # What it is not
//! The engine knows nothing of sockets, protocols, tokens or JSON wire shapes, and never reads
//! the clock: time comes in as [`UnixMillis`]. Its API is synchronous; a write blocks the calling
//! thread until it is durable, so async callers reach it through `spawn_blocking`.
//!
//! # Durability
//! With [`Durability::Synced`] (the default), a call that changes state returns only after the
//! change is in a synced write-ahead log. Concurrent writers share one sync (group commit).
//!
//! ```
//! use ferrohub_engine::{model::{IdentitySpec, UnixMillis}, Store, StoreConfig};
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
//! let dev = store.create_device("dev1", &IdentitySpec::default(), UnixMillis(0)).unwrap();
//! assert_eq!(store.get_device("dev1").unwrap().etag, dev.etag);
//! ```

pub mod archive;
pub mod c2d;
pub mod configurations;
pub mod d2c;
pub mod delivery;
pub mod endpoints;
pub mod error;
pub mod hub;
pub mod identity;
pub mod jobs;
mod keys;
pub mod model;
pub mod notifications;
pub mod policies;
pub mod provisioning;
mod raw;
pub mod replica;
pub mod routing;
pub mod scheduled_jobs;
pub mod sessions;
mod slots;
mod stripes;
pub mod twin;
pub mod twin_index;

use std::path::Path;

use parking_lot::Mutex;

pub use error::{HubError, OpenError, RegistryError, StorageError, TwinError, ValidationError};
pub use ferrohub_migrations::LATEST_VERSION as SCHEMA_VERSION;
pub use model::UnixMillis;
pub use raw::{
    empty_log_entry, AppendOutcome, CommitHold, CommitLog, CommitStats, Durability, LogError,
    LogTip, LAG_NAP, LAG_SYNC_WITHIN,
};
/// Batches that may wait for the committer by default (see [`StoreConfig::commit_queue_depth`]).
pub const DEFAULT_COMMIT_QUEUE_DEPTH: usize = raw::DEFAULT_QUEUE_DEPTH;
pub use replica::Replica;

/// Engine settings.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    pub durability: Durability,
    /// D2C partitions of a new hub; an existing hub keeps the count it was created with.
    pub d2c_partitions: u16,
    /// Batches that may wait for the committer before `submit` blocks; see
    /// [`Store::commit_queue_depth`].
    pub commit_queue_depth: usize,
}

/// RocksDB's view of itself, summed over column families (see [`Store::storage_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Writes are stopped (too many memtables or level-0 files).
    pub write_stopped: bool,
    /// Bytes/s writes are throttled to while RocksDB delays them (0: not delayed).
    pub actual_delayed_write_rate: u64,
    pub pending_compaction_bytes: u64,
    pub sst_bytes: u64,
    pub memtable_bytes: u64,
    /// RocksDB's estimate of the C2D messages queued for all devices (enqueued or locked).
    pub c2d_messages_estimate: u64,
}

/// IoT Hub's default partition count.
pub const DEFAULT_D2C_PARTITIONS: u16 = 4;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            durability: Durability::default(),
            d2c_partitions: DEFAULT_D2C_PARTITIONS,
            commit_queue_depth: raw::DEFAULT_QUEUE_DEPTH,
        }
    }
}

fn next_twin_sequence(raw: &raw::Raw, version: u32) -> Result<u64, StorageError> {
    if version < 4 {
        return Ok(0);
    }
    let after_last = match raw.last_key(ferrohub_migrations::cf::TWIN_CHANGES)? {
        Some(k) if k.len() == 8 => u64::from_be_bytes(k.try_into().unwrap_or([0; 8])) + 1,
        _ => 0,
    };
    // Routed notifications are deleted: the router's cursor remembers how far numbering got.
    Ok(after_last.max(endpoints::stored_cursor(raw)?))
}

/// A handle to the open database. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Store {
    raw: raw::Raw,
    stripes: stripes::Stripes,
    /// Registration ids being assigned (identity/provisioned.rs); apart from `stripes` so the
    /// two are never the same lock.
    registration_stripes: stripes::Stripes,
    partitions: d2c::Partitions,
    /// Next notification sequence number; held while one is submitted (see `notifications`).
    twin_sequence: Mutex<u64>,
    notification_hook: notifications::HookCell,
    /// Serialises hub-settings writes (rare; never on a hot path).
    hub_lock: Mutex<()>,
    /// Next key for a waiting feedback record (see `c2d::feedback`).
    feedback_sequence: std::sync::atomic::AtomicU64,
    /// Serialises changes of the feedback queue.
    feedback_lock: Mutex<()>,
    /// Serialises job creation and changes (see `jobs`).
    job_lock: jobs::JobLock,
    /// Serialises scheduled-job creation and changes (see `scheduled_jobs`).
    scheduled_job_lock: scheduled_jobs::ScheduledJobLock,
    configuration_lock: configurations::ConfigurationLock,
    enrollment_lock: provisioning::EnrollmentLock,
    /// The twin query index maintenance, on writable stores at version 6 or later.
    twin_index: std::sync::OnceLock<std::sync::Arc<twin_index::Hook>>,
    commit_queue_depth: usize,
    /// Whether twin writes of Plug and Play twins record digital twin changes (PNP-5): set by
    /// the hub while a route takes them, so a fleet without such a route pays nothing.
    digital_twin_changes: std::sync::atomic::AtomicBool,
}

fn next_feedback_sequence(raw: &raw::Raw, version: u32) -> Result<u64, StorageError> {
    if version < 5 {
        return Ok(0);
    }
    Ok(match raw.last_key(ferrohub_migrations::cf::C2D_FEEDBACK)? {
        Some(k) if k.len() == 8 => u64::from_be_bytes(k.try_into().unwrap_or([0; 8])) + 1,
        _ => 0,
    })
}

/// The built-in endpoint's partition count as recorded when the hub was created, if it was.
fn stored_partition_count(raw: &raw::Raw) -> Result<Option<u16>, StorageError> {
    raw.get_record::<u16>(
        ferrohub_migrations::cf::D2C_STATE,
        keys::d2c::PARTITION_COUNT,
    )
}

/// The built-in partition count; a new hub records `requested` (1 to 32) once, and an existing
/// hub keeps the count it was created with.
fn builtin_partition_count(raw: &raw::Raw, requested: u16) -> Result<u16, StorageError> {
    if let Some(n) = stored_partition_count(raw)? {
        return Ok(n);
    }
    let n = requested.clamp(1, 32);
    let mut batch = raw::Batch::default();
    batch.put_record(
        ferrohub_migrations::cf::D2C_STATE,
        keys::d2c::PARTITION_COUNT.to_vec(),
        &n,
    );
    raw.commit(batch)?;
    Ok(n)
}

impl Store {
    /// Opens or creates the database in `path` and brings its schema to [`SCHEMA_VERSION`].
    ///
    /// # Errors
    /// [`OpenError::Schema`] when the database is newer than this build (nothing is changed) or
    /// a migration fails; [`OpenError::Storage`] or [`OpenError::Directory`] otherwise.
    /// A cluster node's replica is refused ([`OpenError::ClusterReplica`]): a single node's
    /// writes there would be in no commit log.
    pub fn open(path: &Path, config: StoreConfig) -> Result<Store, OpenError> {
        Self::open_at_version(path, config, SCHEMA_VERSION)
    }

    /// Opens a database migrated only up to `version`. For tests that write fixtures of older
    /// schema versions; the hub itself always uses [`Store::open`].
    #[doc(hidden)]
    pub fn open_at_version(
        path: &Path,
        config: StoreConfig,
        version: u32,
    ) -> Result<Store, OpenError> {
        Self::open_with_log(path, config, version, None, false)
    }

    /// Opens the database exclusively to copy it out (a backup's checkpoint, an export),
    /// whether it is a single node's or a cluster node's replica: the caller writes nothing.
    ///
    /// # Errors
    /// As [`Store::open`], but a replica is no error.
    pub fn open_to_copy(path: &Path, config: StoreConfig) -> Result<Store, OpenError> {
        Self::open_with_log(path, config, SCHEMA_VERSION, None, true)
    }

    /// Opens the store of a cluster's writer: every commit group is appended to `log`, and
    /// acknowledged by it, before it is written here (docs/cluster.md). The database must have
    /// applied the log up to its end, as a [`Replica`]; `log` is told where that is.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn open_replicated(
        path: &Path,
        config: StoreConfig,
        log: std::sync::Arc<dyn CommitLog>,
    ) -> Result<Store, OpenError> {
        Self::open_with_log(path, config, SCHEMA_VERSION, Some(log), true)
    }

    /// `replica_allowed`: whether a database that applied commit log entries may be opened
    /// (by the writer, with its log, or to copy it out); otherwise it is refused before
    /// anything of the store's own opening writes to it.
    fn open_with_log(
        path: &Path,
        config: StoreConfig,
        version: u32,
        log: Option<std::sync::Arc<dyn CommitLog>>,
        replica_allowed: bool,
    ) -> Result<Store, OpenError> {
        let raw = raw::Raw::open(
            path,
            config.durability,
            config.commit_queue_depth,
            version,
            log,
        )?;
        if !replica_allowed {
            let applied = raw.applied_log_sequence()?;
            if applied > 0 {
                return Err(OpenError::ClusterReplica {
                    path: path.display().to_string(),
                    applied,
                });
            }
        }
        // Before version 3 there are no D2C partitions (and no column family to record them).
        let partition_count = if version >= 3 {
            builtin_partition_count(&raw, config.d2c_partitions)?
        } else {
            0
        };
        Ok(Self::from_raw(
            raw,
            partition_count,
            version,
            config.commit_queue_depth,
        )?)
    }

    /// Opens an existing, current database read-only; works while another process serves it.
    ///
    /// # Errors
    /// [`OpenError`] when there is no database, or it is not at [`SCHEMA_VERSION`].
    pub fn open_read_only(path: &Path) -> Result<Store, OpenError> {
        let raw = raw::Raw::open_read_only(path)?;
        // Read-only: a hub that never recorded its count has no partitions to read.
        let partition_count = stored_partition_count(&raw)?.unwrap_or(0);
        Ok(Self::from_raw(raw, partition_count, SCHEMA_VERSION, 0)?)
    }

    /// Opens (creating if needed) a cluster follower's store: the database as the commit log
    /// made it, fed further entries by [`Store::apply_log_entry`]. It serves every read as a
    /// writer's store does, from the same in-memory state kept current as entries apply, and
    /// refuses every write with [`StorageError::NotWriter`] (the writer makes them). Nothing
    /// is written on open, not even to an empty database: a new node learns the hub from the
    /// log.
    ///
    /// # Errors
    /// As [`Store::open`]; [`OpenError::InUse`] while another handle holds the database.
    pub fn open_follower(path: &Path) -> Result<Store, OpenError> {
        let raw = raw::Raw::open_follower(path)?;
        let partition_count = stored_partition_count(&raw)?.unwrap_or(0);
        let store = Self::from_raw(raw, partition_count, SCHEMA_VERSION, 0)?;
        store.follow_twin_index()?;
        Ok(store)
    }

    /// Applies the commit log's entry `seq` to a follower's store (see [`Replica`]) and brings
    /// its in-memory state along. Returns `None` for an entry applied already, else the D2C
    /// partitions whose newest event the entry added, each with its sequence number.
    ///
    /// # Errors
    /// A gap before `seq`, a malformed entry, or the database's failure.
    pub fn apply_log_entry(
        &self,
        seq: u64,
        entry: &[u8],
    ) -> Result<Option<Vec<(u16, u64)>>, StorageError> {
        let Some(touched) = self.raw.apply_log_entry(seq, entry)? else {
            return Ok(None);
        };
        let advanced = self.partitions.follow(&self.raw, &touched)?;
        if touched
            .meta
            .iter()
            .any(|k| Store::is_twin_index_definition_key(k))
        {
            self.follow_twin_index()?;
        }
        Ok(Some(advanced))
    }

    /// The commit log sequence of the last group this writer appended (0 before the first, and
    /// on a store without a log): every write acknowledged so far is in the log at or below it.
    pub fn last_logged_sequence(&self) -> u64 {
        self.raw.last_logged_sequence()
    }

    /// The one constructor: loads what the engine keeps in memory (partition heads and
    /// endpoints, the next notification and feedback sequence numbers) from a database already
    /// at `version`. `commit_queue_depth` is 0 for a read-only store, which commits nothing.
    fn from_raw(
        raw: raw::Raw,
        partition_count: u16,
        version: u32,
        commit_queue_depth: usize,
    ) -> Result<Store, StorageError> {
        let custom_endpoints = endpoints::load(&raw)?;
        let partitions =
            d2c::Partitions::load(&raw, partition_count, custom_endpoints, version >= 7)?;
        let twin_sequence = Mutex::new(next_twin_sequence(&raw, version)?);
        let feedback_sequence = next_feedback_sequence(&raw, version)?.into();
        let store = Store {
            raw,
            stripes: stripes::Stripes::new(),
            registration_stripes: stripes::Stripes::new(),
            partitions,
            twin_sequence,
            hub_lock: Mutex::new(()),
            feedback_sequence,
            feedback_lock: Mutex::new(()),
            digital_twin_changes: std::sync::atomic::AtomicBool::new(false),
            job_lock: jobs::JobLock::default(),
            scheduled_job_lock: scheduled_jobs::ScheduledJobLock::default(),
            configuration_lock: configurations::ConfigurationLock::default(),
            enrollment_lock: provisioning::EnrollmentLock::default(),
            twin_index: std::sync::OnceLock::new(),
            notification_hook: Default::default(),
            commit_queue_depth,
        };
        // The index needs its column family (version 6) and a store that writes.
        if version >= 6 && commit_queue_depth > 0 {
            store.open_twin_index()?;
        }
        Ok(store)
    }

    /// The last cluster commit log sequence this database holds (0: none, or not a cluster's).
    ///
    /// # Errors
    /// [`StorageError`] when the record cannot be read.
    pub fn applied_log_sequence(&self) -> Result<u64, StorageError> {
        self.raw.applied_log_sequence()
    }

    /// [`Store::applied_log_sequence`], once everything up to it is synced to disk: how far
    /// this node may tell the cluster it holds the log (entries before it may be trimmed).
    ///
    /// # Errors
    /// [`StorageError`] when the record cannot be read or the sync fails.
    pub fn synced_applied_log_sequence(&self) -> Result<u64, StorageError> {
        self.raw.synced_applied_log_sequence()
    }

    /// How many batches may wait for the committer before a submit blocks its thread. Async
    /// callers admit at most this many writes at once, so they wait without blocking one.
    /// A consistent copy of the whole database in `dir` (a full backup: queues and partitions
    /// included); `dir` must not exist. Open it with [`Store::open`] like any database.
    ///
    /// # Errors
    /// Storage errors (an existing `dir` included).
    pub fn checkpoint(&self, dir: &Path) -> Result<(), StorageError> {
        self.raw.checkpoint(dir)
    }

    /// Runs `f` on this thread as far as it goes without waiting: reads come from memory
    /// (memtables and the block cache) only, a write is queued only if the commit queue has
    /// room and never waited for, and a device's stripe or the notification sequence is only
    /// tried. `None` when some step would have waited; that step changed nothing. For a caller
    /// on a thread that must not block (an async runtime's worker), which then makes the same
    /// call where it may wait.
    ///
    /// The calls that keep to this are the reads, [`Store::load_session`],
    /// [`Store::delete_session`], [`Store::record_connection_then`],
    /// [`Store::record_disconnection_then`], [`Store::patch_reported_then`] and the C2D
    /// queue's `*_then` calls (send, receive, settle). `f` must make at most
    /// one write, as its last step, so that a refused `f` has changed nothing as a whole.
    pub fn without_waiting<T>(&self, f: impl FnOnce(&Store) -> T) -> Option<T> {
        let (out, refused) = raw::no_wait::run(|| f(self));
        (!refused).then_some(out)
    }

    /// Whether the engine refuses every write after a failed durable write (restart to recover).
    pub fn is_poisoned(&self) -> bool {
        self.raw.is_poisoned()
    }

    /// What RocksDB says about its own state, for operators.
    pub fn storage_stats(&self) -> StorageStats {
        StorageStats {
            write_stopped: self.raw.property_sum("rocksdb.is-write-stopped") > 0,
            actual_delayed_write_rate: self.raw.property_sum("rocksdb.actual-delayed-write-rate"),
            pending_compaction_bytes: self
                .raw
                .property_sum("rocksdb.estimate-pending-compaction-bytes"),
            sst_bytes: self.raw.property_sum("rocksdb.total-sst-files-size"),
            memtable_bytes: self.raw.property_sum("rocksdb.cur-size-all-mem-tables"),
            c2d_messages_estimate: self.raw.property_of(
                ferrohub_migrations::cf::C2D_MESSAGES,
                "rocksdb.estimate-num-keys",
            ),
        }
    }

    pub fn commit_queue_depth(&self) -> usize {
        self.commit_queue_depth
    }

    /// Holds every write until the guard is dropped: writers queue, then block, as when the
    /// disk stalls. For tests of back-pressure; `None` on a read-only store.
    #[doc(hidden)]
    pub fn hold_commits(&self) -> Option<CommitHold> {
        self.raw.hold_commits()
    }

    /// Fault injection for tests: the next group write fails as a failed WAL write or sync
    /// would (nothing of it applied), which poisons the store.
    #[doc(hidden)]
    pub fn fail_next_write(&self) {
        self.raw.fail_next_write();
    }

    /// How many commits and how many RocksDB writes (syncs) there have been.
    pub fn commit_stats(&self) -> CommitStats {
        self.raw.commit_stats()
    }

    /// Finishes queued writes, syncs and flushes. Later writes fail with [`StorageError::Closed`].
    ///
    /// # Errors
    /// [`StorageError::Backend`] when the final flush fails.
    pub fn close(&self) -> Result<(), StorageError> {
        self.raw.flush()
    }
}
