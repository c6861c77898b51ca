//! Opening the writable database: RocksDB's options, the column families, and the migration
//! to the schema version asked for.

use std::path::Path;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};

use super::column_families::cf_options;
use super::{backend, migrate};
use crate::error::{OpenError, StorageError};

/// The writable database in `path`, migrated to `target_version`.
pub(super) fn open_db(path: &Path, target_version: u32) -> Result<DB, OpenError> {
    std::fs::create_dir_all(path).map_err(|e| OpenError::Directory {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let mut db_opts = Options::default();
    db_opts.create_if_missing(true);
    db_opts.create_missing_column_families(true);
    // Group commit gives durability; RocksDB's own per-write sync stays per call.
    db_opts.set_max_total_wal_size(256 << 20);
    // Overwrite obsolete WAL files instead of growing new ones. On ext4 a sync that extends
    // a file (or fills preallocated space) also writes the inode: measured here, appending
    // syncs took 0.18 ms at the median and 0.73 ms at p99, overwriting ones 0.12 and 0.18.
    // Each record carries its log number, so a recycled file's stale tail is not replayed;
    // RocksDB recycles only files written by the running process, and only once no
    // memtable holds data from them: a D2C segment switch also flushes small memtables
    // (see `commit::switch_memtable`), so under telemetry the files free up one by one.
    db_opts.set_recycle_log_file_num(2);
    // Table files written by flushes and compactions go to disk 32 KiB at a time instead
    // of in one burst at their end: a 32 MiB segment flushed in one go queued the WAL
    // syncs behind it. Small steps, because on a virtual disk a WAL sync's cache flush
    // also writes out whatever table data went down before it: with a megabyte per step
    // one WAL sync in several paid for a whole megabyte while a segment flushed, and those
    // syncs made the PUBACK tail at 10k msg/s (docs/performance.md, seventeenth pass).
    db_opts.set_bytes_per_sync(32 << 10);
    // Compaction runs in bursts of whole seconds of CPU. On a small machine they preempt
    // the commit thread and the connections, and a PUBACK waits milliseconds behind them.
    // At the lowest CPU priority they take only what the foreground leaves; if they fall
    // behind, RocksDB's own write slowdown gives them room.
    let mut env = rocksdb::Env::new().map_err(|e| OpenError::Storage(backend(e)))?;
    env.lower_thread_pool_cpu_priority();
    db_opts.set_env(&env);
    let existing = DB::list_cf(&db_opts, path).unwrap_or_else(|_| vec!["default".to_string()]);
    let descriptors: Vec<_> = existing
        .iter()
        .map(|name| ColumnFamilyDescriptor::new(name, cf_options(name)))
        .collect();
    let mut db = DB::open_cf_descriptors(&db_opts, path, descriptors).map_err(|e| {
        // RocksDB's LOCK file: another process (a running hub) has the database open.
        let text = e.into_string();
        if text.contains("lock") || text.contains("LOCK") {
            OpenError::InUse {
                path: path.display().to_string(),
                reason: text,
            }
        } else {
            OpenError::Storage(StorageError::Backend(text))
        }
    })?;
    let current = migrate::read_version(&db)?;
    let mut target = migrate::Target::new(&mut db);
    ferrohub_migrations::migrate(&mut target, current, target_version, &mut |v, name| {
        tracing::info!(version = v, name, "applying storage migration");
    })?;
    Ok(db)
}
