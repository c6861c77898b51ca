//! Packs: how events are laid out in `d2c_log`.
//!
//! A record of the log holds one or more consecutive events of one partition, each framed as
//! a record of its own (checksum ‖ MessagePack, see `record`), the frames back to back; its
//! key names the first event's sequence number. A record written before packs existed holds
//! one event, which is a pack of one, so old logs read unchanged.
//!
//! Why: under a telemetry flood a connection's read burst brings several messages of one
//! device, hence of one partition. RocksDB's work per key (a write-batch entry, a memtable
//! insert with its skiplist comparisons, an index entry and a key copy when the memtable is
//! flushed) then comes once per burst instead of once per event.
//!
//! # Invariants
//! - A pack's events are consecutive in sequence number, and each one's offset is the
//!   previous one's plus the previous frame's length: exactly the offsets events had when
//!   each was a record, so packing changes no offset.
//! - A partition's pack keys increase with sequence number, and a pack holds no event at or
//!   above the next pack's key. So the event with sequence number `s` is in the partition's
//!   last pack whose key is at or below `s`, in the segment that holds `s`.
//! - A pack is written by one batch, so it lies in one segment, and it is durable whole or
//!   not at all.

use smallvec::SmallVec;

use ferrohub_migrations::{cf, record};

use super::{D2cEvent, D2cEventRef};
use crate::error::{KeyDisplay, StorageError};
use crate::keys;
use crate::raw::Batch;

/// A pack is closed once it holds this many bytes; the next event starts another. Keeps the
/// events a reader decodes before the one it wants (a seek lands on the pack's first) to a
/// few dozen small ones, while a flood's bursts fit in one pack.
pub(super) const PACK_BYTES: usize = 16 << 10;

/// Packs being filled by one staging, one open pack per partition.
pub(super) struct PackWriter {
    segment: u32,
    /// `(partition, first sequence number, frames)`, a partition at most once.
    open: SmallVec<[(u16, u64, Vec<u8>); 2]>,
}

impl PackWriter {
    pub(super) fn new(segment: u32) -> PackWriter {
        PackWriter {
            segment,
            open: SmallVec::new(),
        }
    }

    /// Appends an event, the next of its partition, and returns its frame's length. `room`
    /// sizes a new pack's buffer: about what the partition's events from this one on need.
    pub(super) fn push(
        &mut self,
        batch: &mut Batch,
        event: &D2cEventRef<'_>,
        room: usize,
    ) -> usize {
        let p = event.partition;
        let at = match self.open.iter().position(|(q, _, _)| *q == p) {
            Some(i) => i,
            None => {
                let bytes = Vec::with_capacity(room.min(PACK_BYTES));
                self.open.push((p, event.sequence_number, bytes));
                self.open.len() - 1
            }
        };
        let len = event.encode_into(&mut self.open[at].2);
        if self.open[at].2.len() >= PACK_BYTES {
            let (p, first, bytes) = self.open.swap_remove(at);
            self.put(batch, p, first, bytes);
        }
        len
    }

    /// Stages every pack still open.
    pub(super) fn finish(mut self, batch: &mut Batch) {
        for (p, first, bytes) in std::mem::take(&mut self.open) {
            self.put(batch, p, first, bytes);
        }
    }

    fn put(&self, batch: &mut Batch, p: u16, first: u64, bytes: Vec<u8>) {
        batch.put_framed(cf::D2C_LOG, keys::d2c::event(self.segment, p, first), bytes);
    }
}

/// Visits a stored pack's events in order, each with its frame's length, until `visit`
/// returns false; returns whether it never did.
///
/// # Errors
/// [`StorageError::Corruption`] naming `key` when a frame fails its checksum or does not
/// decode; the events before it have been visited.
pub(super) fn for_each_event(
    key: &[u8],
    mut bytes: &[u8],
    mut visit: impl FnMut(D2cEvent, usize) -> bool,
) -> Result<bool, StorageError> {
    if bytes.is_empty() {
        return Err(corrupt(key, "an empty record".into()));
    }
    while !bytes.is_empty() {
        let (event, len) = record::decode_first::<D2cEvent>(bytes).map_err(|e| {
            tracing::error!(cf = cf::D2C_LOG, key = %KeyDisplay(key.to_vec()), error = %e, "corrupt record");
            corrupt(key, e.to_string())
        })?;
        bytes = &bytes[len..];
        if !visit(event, len) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The last event of a stored pack and its frame's length.
///
/// # Errors
/// As [`for_each_event`].
pub(super) fn last_event(key: &[u8], bytes: &[u8]) -> Result<(D2cEvent, usize), StorageError> {
    let mut last = None;
    for_each_event(key, bytes, |e, len| {
        last = Some((e, len));
        true
    })?;
    Ok(last.expect("a pack that decodes holds an event"))
}

fn corrupt(key: &[u8], reason: String) -> StorageError {
    StorageError::Corruption {
        cf: cf::D2C_LOG.into(),
        key: KeyDisplay(key.to_vec()),
        reason,
    }
}
