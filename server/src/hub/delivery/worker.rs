//! One partition of one delivered endpoint: offers its events to the target in order, one at
//! a time, and stores the cursor past what was accepted.
//!
//! # Invariants
//! - An event is offered only after every event before it in the partition was accepted or
//!   dead-lettered: order per device is kept.
//! - The stored cursor never passes an event that was neither accepted nor dead-lettered; it
//!   is stored after each read batch and when the task stops, so a crash offers again at most
//!   one batch that was accepted.
//! - A failing receiver is retried with a doubling backoff (100 ms to 30 s) until the
//!   endpoint's `deadLetterAfterSeconds` has passed since the event's first offer; then the
//!   event is dead-lettered (counted, logged with its sequence number) and the next one moves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrohub_engine::d2c::{D2cEvent, ReadPosition};
use tokio_util::sync::CancellationToken;

use super::health::PartitionHealth;
use super::sender::{EventSender, Sender};
use crate::hub::HubContext;

/// Events read per pass.
const BATCH: usize = 64;
/// The longest a quiet partition waits without looking (the wake-up is the mechanism).
const IDLE_CHECK: Duration = Duration::from_secs(2);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The wait between failed attempts at the same event or batch: doubling from
/// [`FIRST_BACKOFF`] to [`MAX_BACKOFF`].
pub(super) struct Backoff(Duration);

impl Backoff {
    pub(super) fn new() -> Backoff {
        Backoff(FIRST_BACKOFF)
    }

    /// Waits the current backoff and doubles it; `false` when `stop` came first.
    pub(super) async fn wait(&mut self, stop: &CancellationToken) -> bool {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep(self.0) => {}
        }
        self.0 = (self.0 * 2).min(MAX_BACKOFF);
        true
    }
}

/// What one partition's task needs.
pub struct PartitionDelivery {
    pub ctx: HubContext,
    pub endpoint: String,
    pub partition: u16,
    pub sender: Sender,
    pub dead_letter_after: Duration,
    pub health: Arc<PartitionHealth>,
}

enum Offered {
    Accepted,
    DeadLettered,
    Stopped,
}

impl PartitionDelivery {
    /// Delivers until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let sender = match &self.sender {
            Sender::Batched(writer) => {
                let writer = Arc::clone(writer);
                return self.run_batches(&writer, stop).await;
            }
            Sender::Each(sender) => sender,
        };
        let Some(mut next) = self.stored_cursor(&stop).await else {
            return;
        };
        self.health.set_position(next);
        let mut stored = next;
        loop {
            // Subscribe before reading: an append after the read wakes the wait.
            let mut wake = self.ctx.d2c.subscribe(self.partition);
            let (partition, from) = (self.partition, next);
            let events = match self
                .ctx
                .store
                .run(move |s| s.read_events(partition, ReadPosition::Sequence(from), BATCH))
                .await
            {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(endpoint = %self.endpoint, partition, error = %e, "cannot read events to deliver");
                    Vec::new()
                }
            };
            if let Some(first) = events.first().filter(|_| next > 0) {
                // Retention deleted what was never delivered: said, not hidden. (A partition
                // never delivered from starts at its oldest event: nothing is counted.)
                let lost = first.sequence_number.saturating_sub(next);
                if lost > 0 {
                    tracing::warn!(endpoint = %self.endpoint, partition, lost, "events expired before they were delivered");
                    self.count("expired", lost);
                }
            }
            for event in &events {
                match self.offer(sender, event, &stop).await {
                    Offered::Accepted | Offered::DeadLettered => {
                        next = event.sequence_number + 1;
                        self.health.set_position(next);
                    }
                    Offered::Stopped => break,
                }
            }
            if next != stored && self.store_cursor(next).await {
                stored = next;
            }
            if stop.is_cancelled() {
                return;
            }
            if events.len() < BATCH {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(IDLE_CHECK) => {}
                    _ = async {
                        match wake.as_mut() {
                            Some(w) => { let _ = w.changed().await; }
                            None => std::future::pending().await,
                        }
                    } => {}
                }
            }
        }
    }

    pub(super) async fn stored_cursor(&self, stop: &CancellationToken) -> Option<u64> {
        loop {
            let (endpoint, partition) = (self.endpoint.clone(), self.partition);
            match self
                .ctx
                .store
                .run(move |s| s.delivery_cursor(&endpoint, partition))
                .await
            {
                Ok(next) => return Some(next),
                Err(e) => {
                    tracing::warn!(endpoint = %self.endpoint, error = %e, "cannot read the delivery cursor")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tokio::time::sleep(IDLE_CHECK) => {}
            }
        }
    }

    /// Stores the cursor; `false` (logged) when it could not be stored this time.
    pub(super) async fn store_cursor(&self, next: u64) -> bool {
        let (endpoint, partition) = (self.endpoint.clone(), self.partition);
        match self
            .ctx
            .store
            .run(move |s| s.advance_delivery_cursor(&endpoint, partition, next))
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(endpoint = %self.endpoint, partition, error = %e, "cannot store the delivery cursor");
                false
            }
        }
    }

    /// Offers one event until it is accepted, dead-lettered, or the task stops.
    async fn offer(
        &self,
        sender: &EventSender,
        event: &D2cEvent,
        stop: &CancellationToken,
    ) -> Offered {
        let first_offer = Instant::now();
        let mut backoff = Backoff::new();
        loop {
            let outcome = tokio::select! {
                biased;
                _ = stop.cancelled() => return Offered::Stopped,
                outcome = sender.post(event) => outcome,
            };
            let now = self.ctx.clock.now();
            match outcome {
                Ok(()) => {
                    self.health.accepted(now);
                    self.count("delivered", 1);
                    let waited = (now.0 - event.enqueued_time.0).max(0) as f64 / 1000.0;
                    metrics::histogram!("ferrohub_endpoint_delivery_latency_seconds", "endpoint" => self.endpoint.clone())
                        .record(waited);
                    return Offered::Accepted;
                }
                Err(error) => {
                    self.count("failed_attempts", 1);
                    if first_offer.elapsed() >= self.dead_letter_after {
                        tracing::warn!(endpoint = %self.endpoint, partition = self.partition,
                            sequence_number = event.sequence_number, %error,
                            "dead-lettered: the receiver did not accept the event in time");
                        self.health.failed(error, now);
                        self.health.dead_lettered();
                        self.count("dead_lettered", 1);
                        return Offered::DeadLettered;
                    }
                    tracing::debug!(endpoint = %self.endpoint, %error, "delivery failed; retrying");
                    self.health.failed(error, now);
                }
            }
            if !backoff.wait(stop).await {
                return Offered::Stopped;
            }
        }
    }

    pub(super) fn count(&self, what: &'static str, n: u64) {
        metrics::counter!("ferrohub_endpoint_deliveries_total", "endpoint" => self.endpoint.clone(), "outcome" => what)
            .increment(n);
    }
}
