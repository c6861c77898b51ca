//! Segments of the D2C log: why events are keyed `segment ‖ partition ‖ sequence`, and the
//! index that finds a partition's events in them.
//!
//! A segment is a hub-wide counter. New events take the current one; once about
//! [`DEFAULT_SEGMENT_BYTES`] of events are in it, the writer that notices takes every partition
//! lock, advances the counter and queues a marker that makes the committer switch the log's
//! memtable. So a memtable (and the table file its flush writes) holds one segment, whose keys
//! sort above every older file's: RocksDB's leveled compaction finds no overlap and only moves
//! files down, where partition-major keys made it rewrite every retained event repeatedly.
//!
//! # Invariants
//! - Every batch that writes a partition's first event in a segment also writes the index
//!   entry `(partition, that event's sequence) -> segment`; entries of a partition therefore
//!   increase in both sequence and segment, and a partition's events in segment `s` are the
//!   sequences from its entry for `s` up to (not including) its next entry's.
//! - The counter changes only while every partition lock is held, and batches are staged and
//!   queued under their partitions' locks: all events queued before the marker carry the old
//!   segment, all after it the new one.
//! - At open the counter restarts above every segment the index, the stored counter or a
//!   partition head names, so no new key sorts below an existing file's, and a partition's
//!   first write after an open always starts a new index entry.
//! - Index entries are removed only for segments below every readable event (see
//!   [`Segments::expired_below`]); their table files are dropped whole.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::RwLock;

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::keys::d2c as keys;
use crate::raw::{Batch, Raw};

/// Event bytes per segment. Below RocksDB's 64 MiB memtable, with room for keys and skiplist
/// nodes, so the memtable switch is the segment's and not RocksDB's own.
pub const DEFAULT_SEGMENT_BYTES: u64 = 32 << 20;

pub(crate) struct Segments {
    current: AtomicU32,
    /// Event bytes staged into the current segment.
    bytes: AtomicU64,
    limit: AtomicU64,
    /// A writer is advancing the counter; others go on.
    switching: AtomicBool,
    /// `(partition, first sequence) -> segment`, as stored.
    index: RwLock<BTreeMap<(u16, u64), u32>>,
}

impl Segments {
    /// Loads the index and places the counter above every segment in use: those the index
    /// names, the stored counter, and `last_written`, the highest segment a partition head
    /// records (its index entry may be gone with retention). `present` is false for a database
    /// older than the segmented log (nothing to load).
    pub(crate) fn load(
        raw: &Raw,
        present: bool,
        last_written: u32,
    ) -> Result<Segments, StorageError> {
        let mut index = BTreeMap::new();
        let mut top = last_written;
        if present {
            raw.scan_records::<u32>(
                cf::D2C_STATE,
                keys::SEGMENT_INDEX_PREFIX,
                crate::keys::prefix_end(keys::SEGMENT_INDEX_PREFIX),
                |k, segment| {
                    if let Some(entry) = keys::parse_segment_index_key(k) {
                        index.insert(entry, segment);
                        top = top.max(segment);
                    }
                    true
                },
            )?;
            if let Some(stored) = raw.get_record::<u32>(cf::D2C_STATE, keys::CURRENT_SEGMENT_KEY)? {
                top = top.max(stored);
            }
        }
        Ok(Segments {
            current: AtomicU32::new(top.saturating_add(1)),
            bytes: AtomicU64::new(0),
            limit: AtomicU64::new(DEFAULT_SEGMENT_BYTES),
            switching: AtomicBool::new(false),
            index: RwLock::new(index),
        })
    }

    /// The segment new events take. Read under a partition lock (see the invariants).
    pub(crate) fn current(&self) -> u32 {
        self.current.load(Ordering::Acquire)
    }

    pub(crate) fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Counts staged event bytes.
    pub(crate) fn add_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether the current segment is full and nobody is advancing it yet; a `true` obliges
    /// the caller to call [`Segments::advance`] or [`Segments::give_up`].
    pub(crate) fn claim_switch(&self) -> bool {
        self.bytes.load(Ordering::Relaxed) >= self.limit.load(Ordering::Relaxed)
            && !self.switching.swap(true, Ordering::AcqRel)
    }

    /// Advances the counter and stages the marker that switches the memtable after the last
    /// batch of the old segment. The caller holds every partition lock and queues `batch`
    /// before releasing them.
    pub(crate) fn advance(&self, batch: &mut Batch) {
        let next = self.current().saturating_add(1);
        batch.put_record(cf::D2C_STATE, keys::CURRENT_SEGMENT_KEY.to_vec(), &next);
        batch.switch_memtable_after(cf::D2C_LOG);
        self.current.store(next, Ordering::Release);
        self.bytes.store(0, Ordering::Relaxed);
        self.switching.store(false, Ordering::Release);
    }

    /// Ends a claim without switching (a partition lock was busy); a later writer retries.
    pub(crate) fn give_up(&self) {
        self.switching.store(false, Ordering::Release);
    }

    /// Stages the index entry for a partition's first event in `segment`.
    pub(crate) fn note_first(
        &self,
        batch: &mut Batch,
        partition: u16,
        sequence: u64,
        segment: u32,
    ) {
        batch.put_record(
            cf::D2C_STATE,
            keys::segment_index_key(partition, sequence),
            &segment,
        );
        // Recorded at once: a reader may look for the event only after it is durable, and an
        // entry whose batch failed names a segment where the partition simply has no events.
        self.index.write().insert((partition, sequence), segment);
    }

    /// The segments holding a partition's events from sequence `from` on, in order: the one
    /// that holds `from`, then every later one of the partition.
    pub(crate) fn segments_from(&self, partition: u16, from: u64) -> Vec<u32> {
        let index = self.index.read();
        let of_partition = index.range((partition, 0)..=(partition, u64::MAX));
        let mut out: Vec<u32> = Vec::new();
        for (&(_, first), &segment) in of_partition {
            if first <= from {
                // Only the last entry at or below `from` can hold it.
                out.clear();
            }
            out.push(segment);
        }
        out
    }

    /// The segments a partition has written to, as indexed, newest first.
    pub(crate) fn of_partition_newest_first(&self, partition: u16) -> Vec<u32> {
        self.index
            .read()
            .range((partition, 0)..=(partition, u64::MAX))
            .rev()
            .map(|(_, &s)| s)
            .collect()
    }

    /// The segment holding a partition's sequence `at`; `None` when the partition wrote nothing
    /// at or before it.
    fn segment_of(&self, partition: u16, at: u64) -> Option<u32> {
        self.index
            .read()
            .range((partition, 0)..=(partition, at))
            .next_back()
            .map(|(_, &s)| s)
    }

    /// The lowest segment that still holds a readable event, given each partition's first
    /// readable sequence (partitions with nothing readable are left out). Below it every event
    /// is expired or deleted.
    pub(crate) fn expired_below(&self, readable_from: &[(u16, u64)]) -> u32 {
        readable_from
            .iter()
            .map(|&(p, from)| {
                self.segment_of(p, from)
                    .unwrap_or_else(|| self.first_segment_of(p).unwrap_or(u32::MAX))
            })
            .min()
            .unwrap_or_else(|| self.current())
            .min(self.current())
    }

    fn first_segment_of(&self, partition: u16) -> Option<u32> {
        self.index
            .read()
            .range((partition, 0)..=(partition, u64::MAX))
            .next()
            .map(|(_, &s)| s)
    }

    /// Stages the removal of every index entry of a segment below `segment`; returns them
    /// for [`Segments::forget`] once the batch is durable.
    pub(crate) fn stage_forget_below(&self, batch: &mut Batch, segment: u32) -> Vec<(u16, u64)> {
        let gone: Vec<(u16, u64)> = self
            .index
            .read()
            .iter()
            .filter(|(_, &s)| s < segment)
            .map(|(&k, _)| k)
            .collect();
        for &(p, first) in &gone {
            batch.delete(cf::D2C_STATE, keys::segment_index_key(p, first));
        }
        gone
    }

    /// Records an index entry written elsewhere (a cluster follower applying the log).
    pub(crate) fn record(&self, entry: (u16, u64), segment: u32) {
        self.index.write().insert(entry, segment);
        self.current.fetch_max(segment, Ordering::AcqRel);
    }

    pub(crate) fn forget(&self, gone: &[(u16, u64)]) {
        let mut index = self.index.write();
        for k in gone {
            index.remove(k);
        }
    }
}

/// Drops the table files of segments wholly below `segment`. RocksDB leaves files that also
/// hold later keys, and level-0 files; they go when compaction reaches them.
pub(crate) fn drop_files_below(raw: &Raw, segment: u32) -> Result<(), StorageError> {
    if segment == 0 {
        return Ok(());
    }
    raw.drop_files_in_range(
        cf::D2C_LOG,
        &keys::segment_start(0),
        &keys::segment_start(segment),
    )
}
