//! A cluster node's copy of the hub while another node writes: the database, fed the commit
//! log's entries in order (docs/cluster.md).
//!
//! # Invariants
//! - A replica writes nothing but log entries (and the migrations every node runs alike on an
//!   empty database), so it is always a prefix of the log. The one exception is a seed: a hub
//!   outside any log writes itself into an empty log as entries of puts, then records the last
//!   one as applied.
//! - It serves reads through a follower's [`Store`] ([`Replica::store`]), whose in-memory
//!   state follows each applied entry, and writes nothing of its own through it. A node that
//!   becomes the writer closes its replica (every handle to that store) and opens a writing
//!   [`Store`] on the same directory, which loads what it needs from disk.

use std::path::Path;
use std::sync::Arc;

use crate::error::{OpenError, StorageError};
use crate::Store;

pub struct Replica {
    store: Arc<Store>,
}

impl Replica {
    /// Opens (creating if needed) the database in `path` at the current schema version.
    ///
    /// # Errors
    /// As [`crate::Store::open`]; [`OpenError::InUse`] while another handle holds it.
    pub fn open(path: &Path) -> Result<Replica, OpenError> {
        Ok(Replica {
            store: Arc::new(Store::open_follower(path)?),
        })
    }

    /// The follower's store, for reads (it refuses writes: `StorageError::NotWriter`). The
    /// database closes once the replica and every such handle are dropped.
    pub fn store(&self) -> Arc<Store> {
        Arc::clone(&self.store)
    }

    /// The last log sequence applied; 0 when none.
    ///
    /// # Errors
    /// [`StorageError`] when the record cannot be read.
    pub fn applied_sequence(&self) -> Result<u64, StorageError> {
        self.store.raw.applied_log_sequence()
    }

    /// [`Replica::applied_sequence`], once everything up to it is synced to disk (entries are
    /// applied unsynced): how far this node may tell the cluster it holds the log.
    ///
    /// # Errors
    /// [`StorageError`] when the record cannot be read or the sync fails.
    pub fn synced_applied_sequence(&self) -> Result<u64, StorageError> {
        self.store.raw.synced_applied_log_sequence()
    }

    /// The last entry this replica applied (or its store wrote as the writer): its sequence
    /// and checksum, if recorded (databases of earlier versions did not).
    ///
    /// # Errors
    /// [`StorageError`] when the record cannot be read.
    pub fn log_tip(&self) -> Result<Option<crate::LogTip>, StorageError> {
        self.store.raw.log_tip()
    }

    /// The commit log this replica follows, as recorded by [`Replica::record_log_identity`].
    ///
    /// # Errors
    /// [`StorageError`] when the record cannot be read.
    pub fn log_identity(&self) -> Result<Option<String>, StorageError> {
        self.store.raw.log_identity()
    }

    /// Records which commit log this replica follows (synced), so it never follows another.
    ///
    /// # Errors
    /// The database's failure.
    pub fn record_log_identity(&self, identity: &str) -> Result<(), StorageError> {
        self.store.raw.record_log_identity(identity)
    }

    /// Whether the database holds a hub that did not come from a cluster's log (one served or
    /// restored as a single node): its contents are in no log, so it cannot join one.
    ///
    /// # Errors
    /// [`StorageError`] when the records cannot be read.
    pub fn holds_a_hub_outside_the_log(&self) -> Result<bool, StorageError> {
        let hub = self
            .store
            .raw
            .get_record::<crate::hub::HubSettings>(
                ferrohub_migrations::cf::META,
                crate::keys::meta::HUB_SETTINGS,
            )?
            .is_some();
        Ok(hub && self.applied_sequence()? == 0)
    }

    /// Hands `each` the whole database as log entries (see `Raw::seed_log_entries`), for a hub
    /// outside any log to seed a new cluster's empty log; then [`Replica::mark_seeded`].
    ///
    /// # Errors
    /// The database's failure, or the first error of `each`.
    pub fn seed_entries<E: From<StorageError>>(
        &self,
        each: impl FnMut(Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.store
            .raw
            .seed_log_entries(crate::raw::MAX_LOG_ENTRY_BYTES, each)
    }

    /// Records that the log's entries up to `last` are this database's seed: from now on it
    /// is a replica of that log.
    ///
    /// # Errors
    /// The database's failure.
    pub fn mark_seeded(&self, last: u64) -> Result<(), StorageError> {
        self.store.raw.mark_applied(last)
    }

    /// Applies entry `seq` (see `raw::log`): `None` when it was applied already, else the
    /// D2C partitions it added events to, with their newest sequence numbers.
    ///
    /// # Errors
    /// A gap before `seq`, a malformed entry, or the database's failure.
    pub fn apply(&self, seq: u64, entry: &[u8]) -> Result<Option<Vec<(u16, u64)>>, StorageError> {
        self.store.apply_log_entry(seq, entry)
    }
}
