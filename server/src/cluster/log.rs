//! The engine's [`CommitLog`] on JetStream: each commit group is one message of the
//! [`LOG_STREAM`](super::link::LOG_STREAM) stream, published with `Nats-Expected-Last-Sequence`.
//!
//! # Invariants
//! - An append is answered only after JetStream's acknowledgement, which its stream leader
//!   gives once a majority of replicas stored the entry.
//! - Every append expects the sequence of this writer's previous entry (at first, the end of
//!   the log its replica caught up to). A refusal means another writer appended: this one is
//!   fenced for good.
//! - An unanswered append is sent again, the same entry with the same message id
//!   (`Nats-Msg-Id`, unique per writer and expected sequence) and the same expected sequence,
//!   for up to [`APPEND_PATIENCE`]: JetStream's duplicate window answers a copy that was stored
//!   already with the stored sequence, and a leader election (a NATS server lost) typically
//!   takes a few seconds. Only then does the writer give up.
//! - Any failure that stands, refused or unanswered, fences this writer: an unanswered append
//!   may still be stored, so only following the log tells what the hub now holds.
//!   [`JetStreamLog::failed`] is cancelled at the first such failure so the node can step down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use bytes::Bytes;
use ferrohub_engine::{CommitLog, LogError};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::link::LOG_SUBJECT;

/// How long one attempt of an append waits for its acknowledgement.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an append is retried before the writer gives up on it.
const APPEND_PATIENCE: Duration = Duration::from_secs(20);
/// The pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

pub struct JetStreamLog {
    js: jetstream::Context,
    runtime: Handle,
    /// The sequence the next append expects to follow.
    last: AtomicU64,
    fenced: AtomicBool,
    failed: CancellationToken,
    /// Names this writer's incarnation in message ids.
    incarnation: String,
}

impl JetStreamLog {
    /// A log whose next entry follows `last` (the end this node's replica caught up to);
    /// `node` names the writer in message ids.
    pub fn new(js: jetstream::Context, runtime: Handle, node: &str, last: u64) -> JetStreamLog {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        JetStreamLog {
            js,
            runtime,
            last: AtomicU64::new(last),
            fenced: AtomicBool::new(false),
            failed: CancellationToken::new(),
            incarnation: format!("{node}-{started}"),
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
        let expected = self.last.load(Ordering::Acquire);
        let entry = Bytes::from(ferrohub_engine::empty_log_entry());
        let claimed = self.publish_patiently(entry, expected).await?;
        self.last.store(claimed, Ordering::Release);
        Ok(claimed)
    }

    /// Cancelled when an append failed or [`JetStreamLog::fence`] was called.
    pub fn failed(&self) -> CancellationToken {
        self.failed.clone()
    }

    /// Refuses every later append (the lease was lost).
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
        self.failed.cancel();
    }

    /// The sequence of this writer's last entry (or the end it started from).
    pub fn last_sequence(&self) -> u64 {
        self.last.load(Ordering::Acquire)
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Publishes `entry` after `expected`, sending it again while unanswered, for up to
    /// [`APPEND_PATIENCE`] (see the module docs); the stored sequence.
    async fn publish_patiently(&self, entry: Bytes, expected: u64) -> Result<u64, LogError> {
        let give_up = tokio::time::Instant::now() + APPEND_PATIENCE;
        loop {
            let attempt =
                tokio::time::timeout(ATTEMPT_TIMEOUT, self.publish(entry.clone(), expected))
                    .await
                    .unwrap_or_else(|_| Err(LogError::Unavailable("no acknowledgement".into())));
            match attempt {
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
        }
    }

    async fn publish(&self, entry: Bytes, expected: u64) -> Result<u64, LogError> {
        let message = PublishMessage::build()
            .payload(entry)
            .message_id(format!("{}-{expected}", self.incarnation))
            .expected_last_sequence(expected);
        let ack = self
            .js
            .send_publish(LOG_SUBJECT, message)
            .await
            .map_err(|e| LogError::Unavailable(e.to_string()))?;
        match ack.await {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                Err(LogError::Fenced { expected })
            }
            Err(e) => Err(LogError::Unavailable(e.to_string())),
        }
    }
}

impl CommitLog for JetStreamLog {
    fn append(&self, entry: Vec<u8>) -> Result<u64, LogError> {
        let expected = self.last.load(Ordering::Acquire);
        if self.is_fenced() {
            return Err(LogError::Fenced { expected });
        }
        let entry = Bytes::from(entry);
        let started = std::time::Instant::now();
        // The commit thread is not a runtime thread, so it may wait on the runtime here.
        let outcome = self
            .runtime
            .block_on(self.publish_patiently(entry, expected));
        metrics::histogram!("ferrohub_cluster_append_seconds")
            .record(started.elapsed().as_secs_f64());
        match outcome {
            Ok(seq) => {
                self.last.store(seq, Ordering::Release);
                Ok(seq)
            }
            Err(e) => {
                tracing::error!(error = %e, expected, "commit log append failed; this writer stops writing");
                self.fence();
                Err(e)
            }
        }
    }
}
