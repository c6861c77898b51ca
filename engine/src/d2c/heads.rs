//! Where a partition head comes from when a store opens.
//!
//! Appends write only their events, not the head: under load one batch often holds one event,
//! and the head record doubled the memtable inserts and added a record to encode per batch. The
//! head is the stored one brought forward to the partition's last event in the log.
//!
//! # Invariants
//! - Every write that makes events unreadable (retention raising `begin`, an endpoint's
//!   deletion) stores the partition's whole head, as it is then, in its batch. Table files are
//!   dropped only after such a write, and only below every readable event. So each partition's
//!   newest event is either still in the log or no newer than its stored head: the stored head
//!   brought forward to the newest logged event is the head as of the last durable append.
//! - A logged event older than the stored head (a level-0 file that outlived retention) never
//!   moves the head back.

use super::pack;
use super::segments::Segments;
use super::PartitionHead;
use crate::error::StorageError;
use crate::keys;
use crate::raw::Raw;
use ferrohub_migrations::cf;

/// Brings `stored` forward to partition `p`'s newest event in the log.
pub(super) fn recover(
    raw: &Raw,
    segments: &Segments,
    p: u16,
    stored: PartitionHead,
) -> Result<PartitionHead, StorageError> {
    // Newest segment first: an indexed segment may hold none of the partition's events (its
    // index entry was written, its files already dropped), so go back until one does.
    for segment in segments.of_partition_newest_first(p) {
        let last = raw.last_value_in(
            cf::D2C_LOG,
            &keys::d2c::event(segment, p, 0),
            keys::d2c::segment_partition_end(segment, p),
        )?;
        let Some((key, value)) = last else {
            continue;
        };
        // The partition's newest event is the last of its newest pack.
        let (event, stored_len) = pack::last_event(&key, &value)?;
        if event.sequence_number < stored.next_sequence {
            return Ok(stored);
        }
        return Ok(PartitionHead {
            next_sequence: event.sequence_number + 1,
            next_offset: event.offset + stored_len as u64,
            last_enqueued: event.enqueued_time.max(stored.last_enqueued),
            last_sequence: Some(event.sequence_number),
            last_offset: Some(event.offset),
            segment: Some(segment),
            begin: stored.begin,
        });
    }
    Ok(stored)
}
