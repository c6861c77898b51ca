//! Storage recovery: after a durable write failed (a full disk, an I/O error), the store refuses
//! writes for good (it cannot know what a failed sync left behind). This task brings writes back
//! without a restart, the way a restart would: once the data directory takes a probe file of
//! [`Recovery::probe_bytes`] again (`[storage] recovery_free_space_mb`), it closes the poisoned
//! store and opens it anew, so RocksDB recovers from its write-ahead log exactly the
//! acknowledged writes.
//!
//! # Invariants
//! - The old store is closed before the new one opens (RocksDB's lock), and only once no call
//!   holds it: the slot's write lock stops new calls, and the task waits for running ones.
//!   While it waits (at most [`DRAIN_WAIT`] per attempt) calls queue on the blocking pool.
//! - Reads never stop for longer than one reopen: if the writable open fails, the store is
//!   opened read-only (writes answer 503 and readiness stays false) and the task tries again.
//! - The twin index definition is declared again after a reopen (a no-op when unchanged).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrohub_engine::{Store, StoreConfig};
use tokio_util::sync::CancellationToken;

use super::store_slot::StoreSlot;
use super::StoreHandle;

/// How often a store that refuses writes is looked at.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long one attempt waits for calls still using the old store.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// What a reopen needs to know.
pub struct Recovery {
    pub data_dir: PathBuf,
    pub db_dir: PathBuf,
    pub config: StoreConfig,
    pub indexed_paths: Vec<String>,
    /// Free space the data directory must show (as a file written and synced) before a reopen.
    pub probe_bytes: usize,
}

/// Runs until `shutdown`, reopening the store whenever it refuses writes and space allows.
pub async fn run(store: StoreHandle, recovery: Recovery, shutdown: CancellationToken) {
    let recovery = Arc::new(recovery);
    let mut told = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
        if !store.is_poisoned() {
            told = false;
            continue;
        }
        if !std::mem::replace(&mut told, true) {
            tracing::warn!(
                dir = %recovery.data_dir.display(),
                "writes are refused; the store is reopened once {} MB can be written here",
                recovery.probe_bytes >> 20
            );
        }
        let (slot, recovery) = (Arc::clone(store.slot()), Arc::clone(&recovery));
        let outcome = tokio::task::spawn_blocking(move || attempt(&slot, &recovery)).await;
        match outcome {
            Ok(Attempt::NoSpace(e)) => tracing::debug!(error = %e, "storage recovery: no room yet"),
            Ok(Attempt::Busy) => {
                tracing::warn!("storage recovery: calls still hold the store; trying again")
            }
            Ok(Attempt::Writable) => {
                tracing::warn!("storage recovered: the store was reopened and takes writes again")
            }
            Ok(Attempt::ReadOnly(e)) => {
                tracing::error!(error = %e, "storage recovery: reopened read-only; writes stay refused")
            }
            Ok(Attempt::Failed(e)) => {
                tracing::error!(error = %e, "storage recovery: the store could not be opened at all")
            }
            Err(e) => tracing::error!(error = %e, "storage recovery task failed"),
        }
    }
}

enum Attempt {
    NoSpace(std::io::Error),
    Busy,
    Writable,
    ReadOnly(String),
    Failed(String),
}

/// Blocking: probes for space, then swaps the store.
fn attempt(slot: &StoreSlot, recovery: &Recovery) -> Attempt {
    if let Err(e) = probe(&recovery.data_dir, recovery.probe_bytes) {
        return Attempt::NoSpace(e);
    }
    let mut guard = slot.replace();
    let deadline = Instant::now() + DRAIN_WAIT;
    while guard.as_ref().is_some_and(|s| Arc::strong_count(s) > 1) {
        if Instant::now() > deadline {
            return Attempt::Busy;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Dropping the last reference closes RocksDB (its committer thread ends first).
    drop(guard.take());
    match Store::open(&recovery.db_dir, recovery.config) {
        Ok(store) => {
            if let Err(e) = store.define_twin_index(recovery.indexed_paths.clone()) {
                tracing::error!(error = %e, "storage recovery: declaring the twin index failed");
            }
            *guard = Some(Arc::new(store));
            slot.set_read_only(false);
            Attempt::Writable
        }
        Err(writable) => match Store::open_read_only(&recovery.db_dir) {
            Ok(store) => {
                *guard = Some(Arc::new(store));
                slot.set_read_only(true);
                Attempt::ReadOnly(writable.to_string())
            }
            Err(e) => {
                slot.set_read_only(true);
                Attempt::Failed(format!("{writable}; read-only: {e}"))
            }
        },
    }
}

/// Writes, syncs and removes a file of `bytes` in the data directory.
fn probe(dir: &std::path::Path, bytes: usize) -> std::io::Result<()> {
    use std::io::Write as _;
    let path = dir.join(".space-probe");
    let result = (|| {
        let mut file = std::fs::File::create(&path)?;
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..bytes.div_ceil(chunk.len()) {
            file.write_all(&chunk)?;
        }
        file.sync_all()
    })();
    let _ = std::fs::remove_file(&path);
    result
}
