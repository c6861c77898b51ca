//! A storage container endpoint's partition: its events written in batches to blobs, as IoT
//! Hub's storage endpoints write them (docs/routing.md, "Storage container endpoints").
//!
//! # Invariants
//! - A batch begins at the partition's delivery cursor and holds the events enqueued within
//!   `batchFrequencyInSeconds` of its first one, cut earlier once it reaches
//!   `maxChunkSizeInBytes`. It is written once its window has passed (or it is full), as one
//!   blob, and the cursor moves past it only after the blob was committed.
//! - The blob's name depends only on stored events ([`super::archive::blob_name`]): a batch
//!   written again after a crash or a failed write replaces its own blob with the same
//!   content, so a blob never holds an event twice and no event is lost.
//! - A failed write is retried with a backoff doubling from 100 ms to 30 s until it succeeds;
//!   what waits stays in the endpoint, bounded by the hub's retention (expired events are
//!   counted, as for every target).

use std::time::Duration;

use ferrohub_engine::d2c::{D2cEvent, ReadPosition};
use tokio_util::sync::CancellationToken;

use super::archive::{self, BatchEncoder};
use super::storage_writer::StorageWriter;
use super::worker::{Backoff, PartitionDelivery};

/// Events read per page while a batch is measured or written.
const PAGE: usize = 256;
/// How long past its window a batch waits before it is closed: an event enqueued just
/// before the window ended may become readable a moment after (its time is given before it
/// is durable), and must land in this batch, as it would in a rewrite.
const GRACE_MS: i64 = 2_000;
/// The longest a partition waits without looking again (wake-ups are the mechanism).
const IDLE_CHECK: Duration = Duration::from_secs(2);

/// Why a batch was not written.
enum WriteError {
    /// Retention deleted some of its events: it is measured again.
    Expired,
    /// The store or the container failed: written again after a backoff.
    Failed(String),
}

/// A batch measured and ready to write: events `first..=last`.
struct Batch {
    first: D2cEvent,
    last: u64,
    count: u64,
    name: String,
}

impl PartitionDelivery {
    /// Writes the partition's batches until `stop`.
    pub(super) async fn run_batches(self, writer: &StorageWriter, stop: CancellationToken) {
        let Some(mut next) = self.stored_cursor(&stop).await else {
            return;
        };
        self.health.set_position(next);
        'batches: loop {
            let Some(batch) = self.measure(writer, next, &stop).await else {
                return;
            };
            let mut backoff = Backoff::new();
            loop {
                let outcome = tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    outcome = self.write(writer, &batch) => outcome,
                };
                let now = self.ctx.clock.now();
                match outcome {
                    Ok(()) => {
                        self.health.accepted(now);
                        self.count("delivered", batch.count);
                        let waited = (now.0 - batch.first.enqueued_time.0).max(0) as f64 / 1000.0;
                        metrics::histogram!("ferrohub_endpoint_delivery_latency_seconds", "endpoint" => self.endpoint.clone())
                            .record(waited);
                        break;
                    }
                    Err(WriteError::Expired) => {
                        // Measured again from its first event: what is gone is counted as
                        // expired there, and the batch is cut from what is still stored.
                        tracing::warn!(endpoint = %self.endpoint, blob = %batch.name, "a batch expired in part before it was written");
                        continue 'batches;
                    }
                    Err(WriteError::Failed(error)) => {
                        tracing::debug!(endpoint = %self.endpoint, blob = %batch.name, %error, "writing a batch failed; retrying");
                        self.count("failed_attempts", 1);
                        self.health.failed(error, now);
                    }
                }
                if !backoff.wait(&stop).await {
                    return;
                }
            }
            next = batch.last + 1;
            self.health.set_position(next);
            // A cursor not stored now is stored with the next batch: the blob is rewritten
            // whole, never appended to, so writing it again is harmless.
            self.store_cursor(next).await;
        }
    }

    /// Waits for the next batch from `next` to be complete (its window passed, or full);
    /// `None` once stopped.
    async fn measure(
        &self,
        writer: &StorageWriter,
        mut next: u64,
        stop: &CancellationToken,
    ) -> Option<Batch> {
        let mut first: Option<D2cEvent> = None;
        let (mut last, mut count, mut size) = (0u64, 0u64, 0u64);
        loop {
            // Subscribe before reading: an append after the read wakes the wait.
            let mut wake = self.ctx.d2c.subscribe(self.partition);
            let events = self.read_retrying(next, PAGE, stop).await?;
            if first.is_none() {
                if let Some(head) = events.first() {
                    let lost = head.sequence_number.saturating_sub(next);
                    if next > 0 && lost > 0 {
                        tracing::warn!(endpoint = %self.endpoint, partition = self.partition, lost,
                            "events expired before they were written");
                        self.count("expired", lost);
                    }
                    first = Some(head.clone());
                }
            }
            let mut window_end = None;
            if let Some(head) = &first {
                let end = head.enqueued_time.0 + writer.window_ms;
                window_end = Some(end);
                let mut full = false;
                for event in &events {
                    let grown = size + archive::approximate_size(event, writer.encoding);
                    if event.enqueued_time.0 >= end || (count > 0 && grown > writer.max_chunk) {
                        full = true;
                        break;
                    }
                    (last, count, size, next) = (
                        event.sequence_number,
                        count + 1,
                        grown,
                        event.sequence_number + 1,
                    );
                }
                let more_stored = events.len() == PAGE && !full;
                if more_stored {
                    continue;
                }
                if full || size >= writer.max_chunk || self.ctx.clock.now().0 >= end + GRACE_MS {
                    let head = head.clone();
                    let name = self.blob_name(writer, &head, stop).await?;
                    return Some(Batch {
                        first: head,
                        last,
                        count,
                        name,
                    });
                }
            }
            // Every stored event was read and the window is open (or nothing is stored).
            let sleep = window_end.map_or(IDLE_CHECK, |end| {
                let left = (end + GRACE_MS - self.ctx.clock.now().0).clamp(0, 60_000) as u64;
                Duration::from_millis(left).min(IDLE_CHECK)
            });
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(sleep) => {}
                _ = async {
                    match wake.as_mut() {
                        Some(w) => { let _ = w.changed().await; }
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// The batch's blob name; `_{sequence}` is added when the event before it shares its
    /// minute (the batch before may then have the same name) or is no longer stored (it may
    /// have: a name that might repeat one is never used, at the cost of a rewrite after a
    /// crash perhaps getting another name). `None` once stopped.
    async fn blob_name(
        &self,
        writer: &StorageWriter,
        first: &D2cEvent,
        stop: &CancellationToken,
    ) -> Option<String> {
        let after_same_minute = match first.sequence_number.checked_sub(1) {
            None => false,
            Some(seq) => {
                let before = self.read_retrying(seq, 1, stop).await?;
                before
                    .into_iter()
                    .find(|e| e.sequence_number == seq)
                    .is_none_or(|b| archive::same_minute(b.enqueued_time, first.enqueued_time))
            }
        };
        Some(archive::blob_name(
            &writer.file_name_format,
            &writer.hub_name,
            writer.index,
            first,
            after_same_minute,
        ))
    }

    /// Encodes the batch's events and commits them as its blob.
    async fn write(&self, writer: &StorageWriter, batch: &Batch) -> Result<(), WriteError> {
        let mut blob = writer
            .container
            .writer(&batch.name)
            .map_err(|e| WriteError::Failed(e.to_string()))?;
        let mut encoder = BatchEncoder::new(writer.encoding);
        let mut from = batch.first.sequence_number;
        let written: Result<(), WriteError> = async {
            while from <= batch.last {
                let events = self
                    .read_or_fail(from, PAGE)
                    .await
                    .map_err(WriteError::Failed)?;
                // Retention deleted part of the batch while it waited to be written.
                if events.first().is_none_or(|e| e.sequence_number != from) {
                    return Err(WriteError::Expired);
                }
                for event in events.iter().filter(|e| e.sequence_number <= batch.last) {
                    encoder.append(event).map_err(WriteError::Failed)?;
                    from = event.sequence_number + 1;
                }
                let bytes = encoder.take().map_err(WriteError::Failed)?;
                blob.write(&bytes)
                    .await
                    .map_err(|e| WriteError::Failed(e.to_string()))?;
            }
            Ok(())
        }
        .await;
        match written {
            Ok(()) => blob
                .finish()
                .await
                .map_err(|e| WriteError::Failed(e.to_string())),
            Err(e) => {
                blob.abort().await;
                Err(e)
            }
        }
    }

    /// Reads until the store answers (a failed read is not an empty partition); `None`
    /// once stopped.
    async fn read_retrying(
        &self,
        from: u64,
        n: usize,
        stop: &CancellationToken,
    ) -> Option<Vec<D2cEvent>> {
        loop {
            match self.read_or_fail(from, n).await {
                Ok(events) => return Some(events),
                Err(e) => {
                    tracing::warn!(endpoint = %self.endpoint, partition = self.partition, error = %e, "cannot read events to write");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(IDLE_CHECK) => {}
            }
        }
    }

    async fn read_or_fail(&self, from: u64, n: usize) -> Result<Vec<D2cEvent>, String> {
        let partition = self.partition;
        self.ctx
            .store
            .run(move |s| s.read_events(partition, ReadPosition::Sequence(from), n))
            .await
            .map_err(|e| e.to_string())
    }
}
