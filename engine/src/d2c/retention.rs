//! Retention and deletion of D2C events, and advancing the log's segment: the writes that
//! change what a reader may see of a partition other than appends.
//!
//! # Invariants
//! - A partition head's `begin` only rises, and changes under the partition's lock, in a batch
//!   queued before the lock is released (so no append writes an older head after it).
//! - Table files are dropped only below every readable event (see `segments`).

use ferrohub_migrations::cf;

use super::segments;
use super::{D2cError, MAX_PARTITIONS};
use crate::error::StorageError;
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

impl Store {
    /// Makes every event enqueued before `cutoff` unreadable, by raising each partition's
    /// `begin`, then drops the table files no readable event is in. Returns how many events
    /// were removed.
    ///
    /// # Errors
    /// Storage errors; then nothing was removed.
    pub fn trim_events_before(&self, cutoff: UnixMillis) -> Result<u64, D2cError> {
        let mut plan = Vec::new();
        let mut removed = 0;
        for p in self.partitions().all() {
            let info = self.partition_info(p)?;
            if info.is_empty {
                continue;
            }
            let keep_from = self.first_sequence_where(p, |e| e.enqueued_time >= cutoff)?;
            if keep_from > info.begin_sequence_number {
                removed += keep_from - info.begin_sequence_number;
                plan.push((p, keep_from));
            }
        }
        if !plan.is_empty() {
            plan.sort_unstable();
            let mut batch = Batch::default();
            // Under the partitions' locks (ascending), so no append writes an older head after
            // this one.
            let mut guards = Vec::with_capacity(plan.len());
            for &(p, keep_from) in &plan {
                let mut head = self.partitions().heads[p as usize].lock();
                head.begin = head.begin.max(keep_from);
                batch.put_record(cf::D2C_STATE, keys::d2c::head(p), &*head);
                guards.push(head);
            }
            let ticket = self.raw.submit(batch)?;
            drop(guards);
            ticket.wait()?;
        }
        if let Err(e) = self.drop_unreadable_segments() {
            // The events are unreadable already; their space comes back on a later trim.
            tracing::warn!(error = %e, "dropping expired D2C table files failed");
        }
        Ok(removed)
    }

    /// Forgets the index entries of segments below every readable event and drops their table
    /// files.
    fn drop_unreadable_segments(&self) -> Result<(), StorageError> {
        let parts = self.partitions();
        let readable: Vec<(u16, u64)> = (0..MAX_PARTITIONS)
            .filter_map(|p| {
                let head = *parts.heads[p as usize].lock();
                (head.begin < head.next_sequence).then_some((p, head.begin))
            })
            .collect();
        let below = parts.segments.expired_below(&readable);
        let mut batch = Batch::default();
        let gone = parts.segments.stage_forget_below(&mut batch, below);
        if !gone.is_empty() {
            self.raw.commit(batch)?;
            parts.segments.forget(&gone);
        }
        segments::drop_files_below(&self.raw, below)
    }

    /// Stages making every event of `partitions` unreadable (an endpoint's deletion). The
    /// caller holds the endpoint list for writing, so no append to them runs meanwhile.
    pub(crate) fn stage_hide_partitions(
        &self,
        batch: &mut Batch,
        partitions: std::ops::Range<u16>,
    ) {
        for p in partitions {
            let mut head = self.partitions().heads[p as usize].lock();
            head.begin = head.next_sequence;
            batch.put_record(cf::D2C_STATE, keys::d2c::head(p), &*head);
        }
    }

    /// Advances the log's segment when the current one is full (see `d2c_segments`). Never
    /// waits: when a partition is busy, a later append tries again.
    pub(super) fn maybe_switch_segment(&self) -> Result<(), StorageError> {
        let parts = self.partitions();
        if !parts.segments.claim_switch() {
            return Ok(());
        }
        let mut guards = Vec::with_capacity(parts.heads.len());
        for head in &parts.heads {
            match head.try_lock() {
                Some(guard) => guards.push(guard),
                None => {
                    parts.segments.give_up();
                    return Ok(());
                }
            }
        }
        let mut batch = Batch::default();
        parts.segments.advance(&mut batch);
        let queued = self.raw.submit_then(batch, Box::new(|_| {}));
        drop(guards);
        queued
    }

    /// Sets how many event bytes fill a segment of the D2C log (tests use small ones).
    pub fn set_d2c_segment_bytes(&self, bytes: u64) {
        self.partitions().segments.set_limit(bytes);
    }
}
