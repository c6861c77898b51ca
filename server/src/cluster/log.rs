//! The engine's [`CommitLog`] on JetStream: each commit group is one message of the
//! [`LOG_STREAM`](super::link::LOG_STREAM) stream, published with `Nats-Expected-Last-Sequence`.
//!
//! # Invariants
//! - An append is answered only after JetStream's acknowledgement, which its stream leader
//!   gives once a majority of replicas stored the entry.
//! - Up to `[cluster] appends_in_flight` appends are unanswered
//!   at once. Each expects the sequence the one
//!   started before it will get (the first: the end of the log this node's replica caught up
//!   to), so the log stores them in commit order or refuses them. Each first attempt is sent
//!   on the commit thread, in commit order, over the one connection, so they reach the
//!   stream leader in that order.
//! - A refusal (wrong last sequence) is final only once the append before it was stored: a
//!   later entry can overtake one whose first attempt was lost (a leader election) and is
//!   being sent again. Then it is sent again itself; refused once more, another writer
//!   appended, and this one is fenced for good.
//! - An unanswered append is sent again, the same entry with the same message id
//!   (`Nats-Msg-Id`, unique per writer and expected sequence) and the same expected sequence,
//!   for up to [`APPEND_PATIENCE`]: JetStream's duplicate window answers a copy that was stored
//!   already with the stored sequence, and a leader election (a NATS server lost) typically
//!   takes a few seconds. Only then does the writer give up.
//! - Any failure that stands, refused or unanswered, fences this writer and fails every append
//!   after it: an unanswered append may still be stored, so only following the log tells what
//!   the hub now holds. [`JetStreamLog::failed`] is cancelled at the first such failure so the
//!   node can step down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use ferrohub_engine::{AppendOutcome, CommitLog, LogError};
use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::link::LOG_SUBJECT;

/// How long one attempt of an append waits for its acknowledgement.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an append is retried before the writer gives up on it.
const APPEND_PATIENCE: Duration = Duration::from_secs(20);
/// The pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

pub struct JetStreamLog {
    shared: Arc<Shared>,
    runtime: Handle,
    /// The sequence the append started last will get, if stored: the next one expects it.
    /// Only the commit thread starts appends.
    started: AtomicU64,
    in_flight: usize,
    /// Whether the append started last was stored (`None` while unanswered), which a refused
    /// append after it waits for (see the module docs).
    previous: Mutex<watch::Receiver<Option<bool>>>,
}

/// What the appends' tasks share with the log.
struct Shared {
    js: jetstream::Context,
    /// The sequence of this writer's last stored entry (or the end it started from).
    last: AtomicU64,
    fenced: AtomicBool,
    failed: CancellationToken,
    /// Names this writer's incarnation in message ids.
    incarnation: String,
}

impl JetStreamLog {
    /// A log whose next entry follows `last` (the end this node's replica caught up to);
    /// `node` names the writer in message ids; at most `in_flight` appends unanswered.
    pub fn new(
        js: jetstream::Context,
        runtime: Handle,
        node: &str,
        last: u64,
        in_flight: usize,
    ) -> JetStreamLog {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        JetStreamLog {
            shared: Arc::new(Shared {
                js,
                last: AtomicU64::new(last),
                fenced: AtomicBool::new(false),
                failed: CancellationToken::new(),
                incarnation: format!("{node}-{started}"),
            }),
            runtime,
            started: AtomicU64::new(last),
            in_flight: in_flight.max(1),
            previous: Mutex::new(watch::channel(Some(true)).1),
        }
    }

    /// A new writer's first append, before it opens its store: an empty entry at the
    /// sequence after the log's end as this node caught up to it. Once it is stored, a
    /// deposed writer's later append is fenced; if it is refused, that writer appended after
    /// this node read the log's end, and this node must follow again (its replica lacks those
    /// entries). The same patience as every append.
    ///
    /// # Errors
    /// [`LogError::Fenced`] when the log moved on, [`LogError::Unavailable`] when NATS did not
    /// answer in time.
    pub async fn claim(&self) -> Result<u64, LogError> {
        self.append_alone(Bytes::from(ferrohub_engine::empty_log_entry()))
            .await
    }

    /// Appends one entry with none other in flight and waits until it is stored (seeding a
    /// new cluster's log, on a blocking thread). A failure fences this writer.
    pub fn append_and_wait(&self, entry: Vec<u8>) -> Result<u64, LogError> {
        let appended = self.runtime.block_on(self.append_alone(Bytes::from(entry)));
        if let Err(e) = &appended {
            tracing::error!(error = %e, "commit log append failed; this writer stops writing");
            self.fence();
        }
        appended
    }

    async fn append_alone(&self, entry: Bytes) -> Result<u64, LogError> {
        let expected = self.started.load(Ordering::Acquire);
        let first = self.shared.attempt(entry.clone(), expected).await;
        let stored = Arc::clone(&self.shared)
            .settle(first, entry, expected, watch::channel(Some(true)).1)
            .await?;
        self.shared.last.store(stored, Ordering::Release);
        self.started.store(stored, Ordering::Release);
        Ok(stored)
    }

    /// Cancelled when an append failed or [`JetStreamLog::fence`] was called.
    pub fn failed(&self) -> CancellationToken {
        self.shared.failed.clone()
    }

    /// Refuses every later append (the lease was lost).
    pub fn fence(&self) {
        self.shared.fence();
    }

    /// The sequence of this writer's last stored entry (or the end it started from).
    pub fn last_sequence(&self) -> u64 {
        self.shared.last.load(Ordering::Acquire)
    }

    pub fn is_fenced(&self) -> bool {
        self.shared.is_fenced()
    }
}

impl Shared {
    fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
        self.failed.cancel();
    }

    fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Sends `entry` after `expected`; the acknowledgement to wait for.
    async fn send(&self, entry: Bytes, expected: u64) -> Result<PublishAckFuture, LogError> {
        let message = PublishMessage::build()
            .payload(entry)
            .message_id(format!("{}-{expected}", self.incarnation))
            .expected_last_sequence(expected);
        self.js
            .send_publish(LOG_SUBJECT, message)
            .await
            .map_err(|e| LogError::Unavailable(e.to_string()))
    }

    /// The stored sequence an acknowledgement gives, waiting at most [`ATTEMPT_TIMEOUT`].
    async fn answer(ack: PublishAckFuture, expected: u64) -> Result<u64, LogError> {
        match tokio::time::timeout(ATTEMPT_TIMEOUT, ack).await {
            Err(_) => Err(LogError::Unavailable("no acknowledgement".into())),
            Ok(Ok(ack)) => Ok(ack.sequence),
            Ok(Err(e)) if e.kind() == PublishErrorKind::WrongLastSequence => {
                Err(LogError::Fenced { expected })
            }
            Ok(Err(e)) => Err(LogError::Unavailable(e.to_string())),
        }
    }

    /// One attempt: send and wait for the answer.
    async fn attempt(&self, entry: Bytes, expected: u64) -> Result<u64, LogError> {
        let ack = tokio::time::timeout(ATTEMPT_TIMEOUT, self.send(entry, expected))
            .await
            .unwrap_or_else(|_| {
                Err(LogError::Unavailable(
                    "the connection is not taking messages".into(),
                ))
            })?;
        Self::answer(ack, expected).await
    }

    /// Settles an append after its first attempt's outcome `first`: sends it again while
    /// unanswered, for up to [`APPEND_PATIENCE`], and once more after a refusal if the append
    /// before it (`previous`) was stored meanwhile (see the module docs); the stored sequence.
    async fn settle(
        self: Arc<Self>,
        first: Result<u64, LogError>,
        entry: Bytes,
        expected: u64,
        mut previous: watch::Receiver<Option<bool>>,
    ) -> Result<u64, LogError> {
        let give_up = tokio::time::Instant::now() + APPEND_PATIENCE;
        let mut previous_stored = false;
        let mut outcome = first;
        loop {
            match outcome {
                Err(LogError::Fenced { .. }) if !previous_stored && !self.is_fenced() => {
                    let stored = previous
                        .wait_for(Option::is_some)
                        .await
                        .map(|v| *v == Some(true))
                        .unwrap_or(false);
                    if !stored {
                        return Err(LogError::Unavailable(
                            "an earlier entry was not stored".into(),
                        ));
                    }
                    previous_stored = true;
                }
                // A writer fenced meanwhile (its lease ran out) answers its callers now: the
                // entry may or may not be stored, as with any unanswered append.
                Err(LogError::Unavailable(e)) if self.is_fenced() => {
                    return Err(LogError::Unavailable(format!(
                        "{e}; this writer stepped down meanwhile"
                    )))
                }
                Err(LogError::Unavailable(e)) if tokio::time::Instant::now() < give_up => {
                    tracing::warn!(error = %e, expected, "commit log publish unanswered; sending it again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                other => return other,
            }
            outcome = self.attempt(entry.clone(), expected).await;
        }
    }
}

impl CommitLog for JetStreamLog {
    fn start_append(&self, entry: Vec<u8>, outcome: AppendOutcome) {
        let expected = self.started.fetch_add(1, Ordering::AcqRel);
        let (stored_tx, stored_rx) = watch::channel(None);
        let previous = std::mem::replace(&mut *self.previous.lock(), stored_rx);
        if self.shared.is_fenced() {
            stored_tx.send_replace(Some(false));
            outcome.send(Err(LogError::Fenced { expected }));
            return;
        }
        let entry = Bytes::from(entry);
        let started = std::time::Instant::now();
        // The first attempt is sent here, on the commit thread (not a runtime thread, so it
        // may wait on the runtime), so entries reach NATS in commit order.
        let sent = self
            .runtime
            .block_on(self.shared.send(entry.clone(), expected));
        let shared = Arc::clone(&self.shared);
        self.runtime.spawn(async move {
            let first = match sent {
                Ok(ack) => Shared::answer(ack, expected).await,
                Err(e) => Err(e),
            };
            let result = Arc::clone(&shared)
                .settle(first, entry, expected, previous)
                .await;
            metrics::histogram!("ferrohub_cluster_append_seconds")
                .record(started.elapsed().as_secs_f64());
            match &result {
                Ok(seq) => {
                    shared.last.fetch_max(*seq, Ordering::AcqRel);
                }
                Err(e) => {
                    if !shared.is_fenced() {
                        tracing::error!(error = %e, expected, "commit log append failed; this writer stops writing");
                    }
                    shared.fence();
                }
            }
            stored_tx.send_replace(Some(result.is_ok()));
            outcome.send(result);
        });
    }

    fn max_in_flight(&self) -> usize {
        self.in_flight
    }
}
