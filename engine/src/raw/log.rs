//! Cluster mode's replicated commit log, as the engine sees it (docs/cluster.md).
//!
//! A writer's commit thread turns each group into one *entry*, appends it to a [`CommitLog`]
//! and only then writes the group here; a replica applies the same entries in log order.
//!
//! # Invariants
//! - An entry holds the group's operations in submission order, each naming its column family
//!   by name (column family ids differ from one database to another), so applying an entry
//!   writes exactly what the writer wrote.
//! - The entry's log sequence is written under [`APPLIED_KEY`] in the same RocksDB write as its
//!   operations, so a database is always a prefix of the log, and a restart resumes right after
//!   the last entry applied.
//! - A writer's group reaches RocksDB only after the log acknowledged its entry; a failed
//!   append poisons the committer (the outcome of an unanswered append is unknown, so the node
//!   must follow the log again before it writes).
//! - Entries are applied strictly one after another: a gap (the log no longer holds what this
//!   replica misses) is an error, never skipped.

use ferrohub_migrations::{cf, record};
use rocksdb::{WriteBatch, WriteOptions};

use super::{Op, Raw};
use crate::error::StorageError;

/// `meta` key of the last log sequence this database applied (absent: none).
pub(crate) const APPLIED_KEY: &[u8] = b"cluster_applied_seq";
/// `meta` key of the last entry this database applied or wrote: its sequence and the CRC-32
/// of its bytes, written with it, so a node can tell whether the log still holds that entry
/// (a log recreated or rewritten holds another one there).
pub(crate) const TIP_KEY: &[u8] = b"cluster_log_tip";
/// `meta` key of the commit log this database follows (its stream's identity, as the cluster
/// names it), recorded when the node first follows it.
pub(crate) const LOG_IDENTITY_KEY: &[u8] = b"cluster_log_identity";

/// The last entry a database holds: its log sequence and the CRC-32 of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogTip {
    pub sequence: u64,
    pub crc32: u32,
}

impl LogTip {
    pub fn of(sequence: u64, entry: &[u8]) -> LogTip {
        LogTip {
            sequence,
            crc32: crc32fast::hash(entry),
        }
    }
}

/// Entry format version, the entry's first byte.
const FORMAT: u8 = 1;

/// Where a writer's commit groups go before they reach RocksDB.
pub trait CommitLog: Send + Sync {
    /// Starts appending one entry after every entry started before it, and returns at once;
    /// the entry's sequence, once the log stored it durably, or the failure goes to `outcome`.
    /// Called on the commit thread, one entry at a time, in commit order.
    fn start_append(&self, entry: Vec<u8>, outcome: AppendOutcome);

    /// How many appends the commit thread keeps started and unanswered at once. An append
    /// refused or failed fails every append started after it too (the log fences them by
    /// the sequence each expects to follow).
    fn max_in_flight(&self) -> usize {
        1
    }
}

/// Where a [`CommitLog`] answers one append: on any thread, once.
pub struct AppendOutcome {
    tx: std::sync::mpsc::SyncSender<Result<u64, LogError>>,
    /// The commit thread, woken by the answer (it may be waiting for it or for new batches).
    commit_thread: std::thread::Thread,
}

impl AppendOutcome {
    pub fn send(self, outcome: Result<u64, LogError>) {
        // A commit thread that ended no longer waits: nothing to tell.
        let _ = self.tx.send(outcome);
        self.commit_thread.unpark();
    }
}

/// The commit thread's side of an append in flight.
pub(crate) struct Appending {
    rx: std::sync::mpsc::Receiver<Result<u64, LogError>>,
    answer: Option<Result<u64, LogError>>,
}

impl Appending {
    /// An append started from the current thread (the commit thread), and where it is answered.
    pub(crate) fn start() -> (AppendOutcome, Appending) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let outcome = AppendOutcome {
            tx,
            commit_thread: std::thread::current(),
        };
        (outcome, Appending { rx, answer: None })
    }

    /// Whether the log answered (without waiting).
    pub(crate) fn is_answered(&mut self) -> bool {
        if self.answer.is_none() {
            match self.rx.try_recv() {
                Ok(answer) => self.answer = Some(answer),
                Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.answer = Some(Err(Self::dropped()));
                }
            }
        }
        self.answer.is_some()
    }

    /// The log's answer, waiting for it.
    pub(crate) fn wait(mut self) -> Result<u64, LogError> {
        match self.answer.take() {
            Some(answer) => answer,
            None => self.rx.recv().unwrap_or_else(|_| Err(Self::dropped())),
        }
    }

    fn dropped() -> LogError {
        LogError::Unavailable("the commit log dropped an append unanswered".into())
    }
}

/// Why an append failed. Either way this writer may no longer write.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// Someone else appended since this writer's last entry: it was deposed.
    #[error("another writer appended to the commit log after sequence {expected}")]
    Fenced { expected: u64 },
    /// The log did not answer; the entry may or may not be stored.
    #[error("the commit log is unavailable: {0}")]
    Unavailable(String),
}

const PUT: u8 = 0;
const DELETE: u8 = 1;
const MERGE: u8 = 2;
const DELETE_RANGE: u8 = 3;

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Appends `ops` to an entry under construction (start with [`entry_header`]).
pub(crate) fn encode_ops(out: &mut Vec<u8>, ops: &[Op]) {
    for op in ops {
        let (kind, cf, a, b): (u8, &str, &[u8], &[u8]) = match op {
            Op::Put { cf, key, value } => (PUT, cf, key, value),
            Op::Delete { cf, key } => (DELETE, cf, key, &[]),
            Op::Merge { cf, key, value } => (MERGE, cf, key, value),
            Op::DeleteRange { cf, from, to } => (DELETE_RANGE, cf, from, to),
        };
        out.push(kind);
        out.push(cf.len() as u8);
        out.extend_from_slice(cf.as_bytes());
        push_bytes(out, a);
        push_bytes(out, b);
    }
}

/// A new entry with room for about `bytes` of operations.
pub(crate) fn entry_header(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes + 1);
    out.push(FORMAT);
    out
}

/// An entry of no operations: a new writer's first append, which claims the log's next
/// sequence (so a deposed writer's later append is fenced) and changes nothing when applied.
pub fn empty_entry() -> Vec<u8> {
    entry_header(0)
}

fn corrupt(what: &str) -> StorageError {
    StorageError::Backend(format!("malformed commit log entry: {what}"))
}

/// Reads `len` bytes at `*at`, advancing it.
fn take<'a>(entry: &'a [u8], at: &mut usize, len: usize) -> Result<&'a [u8], StorageError> {
    let end = at
        .checked_add(len)
        .filter(|e| *e <= entry.len())
        .ok_or_else(|| corrupt("truncated"))?;
    let slice = &entry[*at..end];
    *at = end;
    Ok(slice)
}

fn take_bytes<'a>(entry: &'a [u8], at: &mut usize) -> Result<&'a [u8], StorageError> {
    let len = take(entry, at, 4)?;
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    take(entry, at, len)
}

/// What an applied entry changed that a follower's in-memory state follows: the keys it wrote
/// in `d2c_log` (events), `d2c_state` (heads, segment index, endpoints) and `meta`.
#[derive(Debug, Default)]
pub(crate) struct Touched {
    pub(crate) d2c_events: Vec<Vec<u8>>,
    pub(crate) d2c_state: Vec<Vec<u8>>,
    pub(crate) meta: Vec<Vec<u8>>,
}

impl Touched {
    fn note(&mut self, cf_name: &str, kind: u8, key: &[u8]) {
        let list = match cf_name {
            cf::D2C_LOG if kind == PUT => &mut self.d2c_events,
            cf::D2C_STATE => &mut self.d2c_state,
            cf::META => &mut self.meta,
            _ => return,
        };
        list.push(key.to_vec());
    }
}

/// Adds an entry's operations to `wb`, resolving column families in this database, and
/// notes what it touched.
fn decode_into(
    raw: &Raw,
    entry: &[u8],
    wb: &mut WriteBatch,
    touched: &mut Touched,
) -> Result<(), StorageError> {
    if entry.first() != Some(&FORMAT) {
        return Err(corrupt("unknown format (written by a newer ferrohub?)"));
    }
    let mut at = 1;
    while at < entry.len() {
        let kind = take(entry, &mut at, 1)?[0];
        let cf_len = take(entry, &mut at, 1)?[0] as usize;
        let cf_name = std::str::from_utf8(take(entry, &mut at, cf_len)?)
            .map_err(|_| corrupt("column family name"))?;
        let name = cf::ALL
            .iter()
            .find(|n| **n == cf_name)
            .ok_or_else(|| corrupt(&format!("unknown column family {cf_name}")))?;
        let handle = raw.handle(name)?;
        let a = take_bytes(entry, &mut at)?;
        let b = take_bytes(entry, &mut at)?;
        touched.note(name, kind, a);
        match kind {
            PUT => wb.put_cf(handle, a, b),
            DELETE => wb.delete_cf(handle, a),
            MERGE => wb.merge_cf(handle, a, b),
            DELETE_RANGE => wb.delete_range_cf(handle, a, b),
            _ => return Err(corrupt("unknown operation")),
        }
    }
    Ok(())
}

impl Raw {
    /// Encodes the whole database as log entries of puts, each at most about `max_entry_bytes`
    /// (a record larger than that is an entry alone), column family by column family in key
    /// order, and hands each to `each`; the applied-sequence key is left out. Applied in order
    /// to an empty database they rebuild this one: how a hub served or restored as a single
    /// node seeds a new cluster's log. Reads a consistent snapshot.
    ///
    /// # Errors
    /// RocksDB's failure, or the first error of `each` (nothing more is read after it).
    pub(crate) fn seed_log_entries<E: From<StorageError>>(
        &self,
        max_entry_bytes: usize,
        mut each: impl FnMut(Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let snapshot = self.db.snapshot();
        let mut entry = entry_header(max_entry_bytes);
        for name in cf::ALL {
            let handle = self.handle(name)?;
            let mut ro = rocksdb::ReadOptions::default();
            ro.set_snapshot(&snapshot);
            let mut it = self.db.raw_iterator_cf_opt(handle, ro);
            it.seek_to_first();
            while it.valid() {
                let (Some(key), Some(value)) = (it.key(), it.value()) else {
                    break;
                };
                // What makes a database a replica of one log stays out of the seed.
                if !(name == cf::META && [APPLIED_KEY, TIP_KEY, LOG_IDENTITY_KEY].contains(&key)) {
                    let op_len = 2 + name.len() + 8 + key.len() + value.len();
                    if entry.len() > 1 && entry.len() + op_len > max_entry_bytes {
                        each(std::mem::replace(&mut entry, entry_header(max_entry_bytes)))?;
                    }
                    entry.push(PUT);
                    entry.push(name.len() as u8);
                    entry.extend_from_slice(name.as_bytes());
                    push_bytes(&mut entry, key);
                    push_bytes(&mut entry, value);
                }
                it.next();
            }
            it.status().map_err(|e| E::from(super::backend(e)))?;
        }
        if entry.len() > 1 {
            each(entry)?;
        }
        Ok(())
    }

    /// Records that this database holds the log up to `seq` (synced): the end of a seed.
    ///
    /// # Errors
    /// RocksDB's failure.
    pub(crate) fn mark_applied(&self, seq: u64) -> Result<(), StorageError> {
        let mut wb = WriteBatch::default();
        wb.put_cf(self.handle(cf::META)?, APPLIED_KEY, record::encode(&seq));
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(wb, &wo).map_err(super::backend)
    }

    /// The last entry this database applied or wrote, if it recorded one.
    pub(crate) fn log_tip(&self) -> Result<Option<LogTip>, StorageError> {
        self.get_record::<LogTip>(cf::META, TIP_KEY)
    }

    /// The commit log this database follows, if recorded.
    pub(crate) fn log_identity(&self) -> Result<Option<String>, StorageError> {
        self.get_record::<String>(cf::META, LOG_IDENTITY_KEY)
    }

    /// Records the commit log this database follows (synced).
    pub(crate) fn record_log_identity(&self, identity: &str) -> Result<(), StorageError> {
        let mut wb = WriteBatch::default();
        wb.put_cf(
            self.handle(cf::META)?,
            LOG_IDENTITY_KEY,
            record::encode(&identity.to_string()),
        );
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(wb, &wo).map_err(super::backend)
    }

    /// The last log sequence this database applied; 0 when it applied none.
    pub(crate) fn applied_log_sequence(&self) -> Result<u64, StorageError> {
        Ok(self.get_record::<u64>(cf::META, APPLIED_KEY)?.unwrap_or(0))
    }

    /// The last log sequence applied, after a sync of the write-ahead log: read first, so
    /// everything up to it is in the log the sync makes durable.
    pub(crate) fn synced_applied_log_sequence(&self) -> Result<u64, StorageError> {
        let applied = self.applied_log_sequence()?;
        self.db.flush_wal(true).map_err(super::backend)?;
        Ok(applied)
    }

    /// Applies the log entry `seq`: its operations and the new applied sequence in one write.
    /// Returns what it touched, or `None` (and writes nothing) for an entry already applied. Not synced: the log
    /// holds the entry, and a replica that loses its tail in a power loss applies it again.
    ///
    /// # Errors
    /// A gap before `seq`, a malformed entry, or RocksDB's failure.
    pub(crate) fn apply_log_entry(
        &self,
        seq: u64,
        entry: &[u8],
    ) -> Result<Option<Touched>, StorageError> {
        let applied = self.applied_log_sequence()?;
        if seq <= applied {
            return Ok(None);
        }
        if seq != applied + 1 {
            return Err(StorageError::Backend(format!(
                "the commit log continues at sequence {seq} but this replica applied only up to \
                 {applied}: the entries between are no longer in the log; restore this node from \
                 a backup of another"
            )));
        }
        let mut wb = WriteBatch::with_capacity_bytes(entry.len() + 64);
        let mut touched = Touched::default();
        decode_into(self, entry, &mut wb, &mut touched)?;
        wb.put_cf(self.handle(cf::META)?, APPLIED_KEY, record::encode(&seq));
        wb.put_cf(
            self.handle(cf::META)?,
            TIP_KEY,
            record::encode(&LogTip::of(seq, entry)),
        );
        self.db
            .write_opt(wb, &WriteOptions::default())
            .map_err(super::backend)?;
        Ok(Some(touched))
    }
}
