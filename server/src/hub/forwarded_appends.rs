//! Device messages a cluster follower receives, sent to the writer (docs/cluster.md,
//! "Serving from every node"): every [`super::AppendLane`] of a follower queues its admitted
//! messages on the node's one [`Forwarding`], which sends whatever has queued as one batch to
//! the writer; the writer routes and appends each message on a lane of its own for that
//! follower lane, and answers the batch once every message in it is durable.
//!
//! Batches, not messages, cross NATS: at full load one request carries tens of messages, so the
//! NATS servers, the TLS between them and both hubs' tasks are paid per batch. At low load a
//! batch holds one message and leaves at once; messages wait in the queue only while
//! [`BATCHES_IN_FLIGHT`] batches are unanswered.
//!
//! # Invariants
//! - One queue per follower spell, filled by the lanes in admission order and drained from the
//!   front by one task that publishes the batches in order; the writer takes the subject in one
//!   task, in arrival order, and appends each message on the one writer lane it keeps for its
//!   follower lane. So a device's messages keep their order in the partition, as on a single
//!   node.
//! - A batch is at most [`MAX_BATCH_MESSAGES`] messages and [`MAX_BATCH_BYTES`] (a message
//!   larger than that goes alone), well under NATS's default payload limit of 1 MiB.
//! - The writer answers a batch only once every routed copy of every message in it is durable
//!   in the log, with one result per message, in order; the follower acknowledges each device
//!   then (PUBACK, AMQP accept, 204), without waiting for its own replica: nothing a device can
//!   read depends on its own telemetry.
//! - A batch nobody received (no writer at the moment: a failover) is sent again for up to
//!   [`FAILOVER_PATIENCE`] (unless this follower stopped serving), holding the gate so no later
//!   batch is published meanwhile: a failover costs the devices a pause, not their connections.
//!   Only a later batch published in the instant the new writer subscribes can overtake it.
//! - A batch sent but not answered (NATS unreachable, the writer lost mid-append) fails every
//!   message in it with a storage error, as a failed write does on a single node; the devices
//!   resend once they have reconnected (QoS 1 is at least once). So does every message queued
//!   when the follower stops serving.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::StorageError;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Mutex, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::calls::{FAILOVER_PATIENCE, RESEND_PAUSE, STOPPED_SERVING};
use super::cluster::Cluster;
use crate::cluster::bus::{self, BusError};

/// How long a forwarded batch waits for the writer's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Batches sent and not yet answered, at most. While this many are out, messages queue and
/// leave together in the next one. Four keeps a follower's messages in the writer's next
/// commit group while the previous groups are still being acknowledged by the log.
pub const BATCHES_IN_FLIGHT: usize = 4;

/// Messages in one batch, at most.
pub const MAX_BATCH_MESSAGES: usize = 256;

/// Encoded messages' bytes in one batch, at most (unless one message is larger).
pub const MAX_BATCH_BYTES: usize = 512 * 1024;

/// One device message for the writer: the follower lane it came through, the events to route
/// and append (they name no endpoints) and the sender's module (routing conditions may read it).
/// The writer stamps the events with its own clock, as it does its own clients'.
#[derive(Serialize, Deserialize)]
pub(super) struct AppendRequest {
    pub(super) lane: u64,
    pub(super) module_id: Option<String>,
    pub(super) events: Vec<NewEvent>,
}

/// What a follower sends: its node's name and its messages, each encoded on its own (so the
/// batch's size is known before it is sent, and one bad message fails alone). Batches, their
/// messages and the answers are MessagePack arrays, not maps: field names would be a fifth of
/// a small message's bytes. The subject ([`bus::APPENDS`]) names this format, so a node of
/// another build finds no writer rather than misreading it. Both ends borrow: the follower
/// from its queued messages, the writer from the request's payload.
#[derive(Serialize, Deserialize)]
pub(super) struct AppendBatch<'a> {
    pub(super) node: &'a str,
    #[serde(borrow)]
    pub(super) messages: Vec<&'a serde_bytes::Bytes>,
}

/// The writer's answer: one result per message of the batch, in its order.
#[derive(Serialize, Deserialize)]
pub(super) struct BatchReply {
    pub(super) results: Vec<Result<Vec<Appended>, D2cError>>,
}

type Done = Box<dyn FnOnce(Result<Vec<Appended>, D2cError>) + Send>;

/// A message queued for the next batch.
struct Queued {
    encoded: Vec<u8>,
    done: Done,
}

/// A follower's one way to the writer for device messages (see the module docs).
pub struct Forwarding {
    cluster: Arc<Cluster>,
    queue: mpsc::UnboundedSender<Queued>,
    /// The queue's far end, until [`Forwarding::serve`] takes it.
    drain: parking_lot::Mutex<Option<mpsc::UnboundedReceiver<Queued>>>,
    /// Numbers this spell's follower lanes.
    next_lane: AtomicU64,
}

impl Forwarding {
    pub fn new(cluster: Arc<Cluster>) -> Arc<Forwarding> {
        let (queue, drain) = mpsc::unbounded_channel();
        Arc::new(Forwarding {
            cluster,
            queue,
            drain: parking_lot::Mutex::new(Some(drain)),
            next_lane: AtomicU64::new(0),
        })
    }

    /// The way for one new lane's messages.
    pub fn lane(self: &Arc<Self>) -> Forwarder {
        Forwarder {
            forwarding: Arc::clone(self),
            lane: self.next_lane.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Sends the queued messages in batches until `stop` or until this follower stops
    /// serving; whatever is queued then fails. Run once.
    pub async fn serve(self: Arc<Self>, stop: CancellationToken) {
        let Some(mut drain) = self.drain.lock().take() else {
            return;
        };
        let stopping = self.cluster.stopping().clone();
        let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
        let gate = Arc::new(Mutex::new(()));
        let mut held: Option<Queued> = None;
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => break,
                _ = stopping.cancelled() => break,
                p = Arc::clone(&in_flight).acquire_owned() => p.expect("never closed"),
            };
            let first = match held.take() {
                Some(q) => q,
                None => tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = stopping.cancelled() => break,
                    q = drain.recv() => match q {
                        Some(q) => q,
                        None => break,
                    },
                },
            };
            let (batch, over) = take_batch(first, &mut drain);
            held = over;
            self.send(batch, &gate, permit).await;
        }
        drain.close();
        let stopped = || Err(unavailable(STOPPED_SERVING.into()));
        for q in held
            .into_iter()
            .chain(std::iter::from_fn(|| drain.try_recv().ok()))
        {
            (q.done)(stopped());
        }
    }

    /// Publishes one batch, and answers its messages once the writer answered it (in a task of
    /// its own, holding `permit` until then).
    async fn send(&self, batch: Vec<Queued>, gate: &Arc<Mutex<()>>, permit: OwnedSemaphorePermit) {
        metrics::histogram!("ferrohub_cluster_forwarded_batch_messages").record(batch.len() as f64);
        let (encoded, dones): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|q| (q.encoded, q.done)).unzip();
        let request = AppendBatch {
            node: self.cluster.node(),
            messages: encoded.iter().map(|e| serde_bytes::Bytes::new(e)).collect(),
        };
        let payload = match rmp_serde::to_vec(&request) {
            Ok(p) => Bytes::from(p),
            Err(e) => return answer_all(dones, &e.to_string()),
        };
        let pending = {
            let _gate = gate.lock().await;
            self.cluster.bus.send(bus::APPENDS, payload.clone()).await
        };
        let mut pending = match pending {
            Ok(p) => p,
            Err(e) => return answer_all(dones, &e.to_string()),
        };
        let (cluster, gate) = (Arc::clone(&self.cluster), Arc::clone(gate));
        tokio::spawn(async move {
            let _permit = permit;
            let give_up = Instant::now() + FAILOVER_PATIENCE;
            let answer = loop {
                let answered = tokio::select! {
                    a = pending.answer(ANSWER_TIMEOUT) => a,
                    _ = cluster.stopping().cancelled() => {
                        break Err(BusError::Unanswered(STOPPED_SERVING.into()));
                    }
                };
                match answered {
                    Err(BusError::NoResponders(_))
                        if Instant::now() < give_up && !cluster.stopping().is_cancelled() =>
                    {
                        let _gate = gate.lock().await;
                        tokio::time::sleep(RESEND_PAUSE).await;
                        pending = match cluster.bus.send(bus::APPENDS, payload.clone()).await {
                            Ok(p) => p,
                            Err(e) => break Err(e),
                        };
                    }
                    other => break other,
                }
            };
            let reply = answer.map_err(|e| e.to_string()).and_then(|bytes| {
                rmp_serde::from_slice::<BatchReply>(&bytes)
                    .map_err(|e| format!("the writer's answer does not decode: {e}"))
            });
            match reply {
                Ok(BatchReply { results }) if results.len() == dones.len() => {
                    for (done, result) in dones.into_iter().zip(results) {
                        done(result);
                    }
                }
                Ok(BatchReply { results }) => answer_all(
                    dones,
                    &format!(
                        "the writer answered {} messages of a batch of another size",
                        results.len()
                    ),
                ),
                Err(e) => answer_all(dones, &e),
            }
        });
    }
}

/// `first` and what is queued behind it, up to the batch limits, in queue order; and the
/// message taken that did not fit (it starts the next batch).
fn take_batch(
    first: Queued,
    drain: &mut mpsc::UnboundedReceiver<Queued>,
) -> (Vec<Queued>, Option<Queued>) {
    let mut bytes = first.encoded.len();
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH_MESSAGES {
        let Ok(next) = drain.try_recv() else { break };
        if bytes + next.encoded.len() > MAX_BATCH_BYTES {
            return (batch, Some(next));
        }
        bytes += next.encoded.len();
        batch.push(next);
    }
    (batch, None)
}

/// Fails every message of a batch with the same storage error.
fn answer_all(dones: Vec<Done>, error: &str) {
    for done in dones {
        done(Err(unavailable(error.to_owned())));
    }
}

/// A follower lane's way to the writer.
pub struct Forwarder {
    forwarding: Arc<Forwarding>,
    lane: u64,
}

impl Forwarder {
    /// Queues one message's `events` (of `module_id`'s sender, if a module) for the writer,
    /// behind every message queued before it; `done` gets the writer's answer later.
    pub fn send(
        &self,
        events: Vec<NewEvent>,
        module_id: Option<String>,
        done: impl FnOnce(Result<Vec<Appended>, D2cError>) + Send + 'static,
    ) {
        let request = AppendRequest {
            lane: self.lane,
            module_id,
            events,
        };
        let encoded = match rmp_serde::to_vec(&request) {
            Ok(e) => e,
            Err(e) => return done(Err(unavailable(e.to_string()))),
        };
        let queued = Queued {
            encoded,
            done: Box::new(done),
        };
        if let Err(mpsc::error::SendError(q)) = self.forwarding.queue.send(queued) {
            (q.done)(Err(unavailable(STOPPED_SERVING.into())));
        }
    }
}

pub(super) fn unavailable(e: String) -> D2cError {
    D2cError::Storage(StorageError::Unavailable(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(tag: u8, len: usize) -> Queued {
        Queued {
            encoded: vec![tag; len],
            done: Box::new(|_| {}),
        }
    }

    fn tags(batch: &[Queued]) -> Vec<u8> {
        batch.iter().map(|q| q.encoded[0]).collect()
    }

    #[test]
    fn a_batch_takes_what_is_queued_in_order_up_to_its_message_limit() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for i in 1..=MAX_BATCH_MESSAGES + 2 {
            assert!(tx.send(queued((i % 250) as u8, 10)).is_ok());
        }
        let (batch, over) = take_batch(queued(0, 10), &mut rx);
        assert_eq!(batch.len(), MAX_BATCH_MESSAGES);
        assert!(over.is_none());
        let expected: Vec<u8> = (0..MAX_BATCH_MESSAGES).map(|i| (i % 250) as u8).collect();
        assert_eq!(tags(&batch), expected);
        // 258 queued behind the first: 255 went with it, 3 remain.
        let (rest, _) = take_batch(rx.try_recv().expect("queued"), &mut rx);
        assert_eq!(rest.len(), 3);
    }

    #[test]
    fn a_message_over_the_byte_limit_starts_the_next_batch_and_a_large_one_goes_alone() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let half = MAX_BATCH_BYTES / 2;
        assert!(tx.send(queued(2, half)).is_ok());
        assert!(tx.send(queued(3, MAX_BATCH_BYTES + 1)).is_ok());
        assert!(tx.send(queued(4, 1)).is_ok());
        let (batch, over) = take_batch(queued(1, half - 1), &mut rx);
        assert_eq!(tags(&batch), vec![1, 2]);
        let over = over.expect("the third did not fit");
        assert_eq!(over.encoded[0], 3);
        let (alone, next) = take_batch(over, &mut rx);
        assert_eq!(tags(&alone), vec![3]);
        assert_eq!(next.map(|q| q.encoded[0]), Some(4));
    }
}
