//! The engine's [`CommitLog`] on JetStream: each commit group is one message of the
//! [`LOG_STREAM`](super::link::LOG_STREAM) stream, published with `Nats-Expected-Last-Sequence`.
//!
//! # Invariants
//! - An append is answered only after JetStream's acknowledgement, which its stream leader
//!   gives once a majority of replicas stored the entry.
//! - Every append expects the sequence of this writer's previous entry (at first, the end of
//!   the log its replica caught up to). A refusal means another writer appended: this one is
//!   fenced for good.
//! - Any failure, refused or unanswered, fences this writer: an unanswered append may still be
//!   stored, so only following the log tells what the hub now holds. [`JetStreamLog::failed`]
//!   is cancelled at the first failure so the node can step down.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use ferrohub_engine::{CommitLog, LogError};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::link::LOG_SUBJECT;

/// How long an append may wait for its acknowledgement before the writer gives up on it.
const APPEND_TIMEOUT: Duration = Duration::from_secs(5);

pub struct JetStreamLog {
    js: jetstream::Context,
    runtime: Handle,
    /// The sequence the next append expects to follow.
    last: AtomicU64,
    fenced: AtomicBool,
    failed: CancellationToken,
}

impl JetStreamLog {
    /// A log whose next entry follows `last` (the end this node's replica caught up to).
    pub fn new(js: jetstream::Context, runtime: Handle, last: u64) -> JetStreamLog {
        JetStreamLog {
            js,
            runtime,
            last: AtomicU64::new(last),
            fenced: AtomicBool::new(false),
            failed: CancellationToken::new(),
        }
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

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    async fn publish(&self, entry: Vec<u8>, expected: u64) -> Result<u64, LogError> {
        let message = PublishMessage::build()
            .payload(entry.into())
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
        // The commit thread is not a runtime thread, so it may wait on the runtime here.
        let outcome = self.runtime.block_on(async {
            tokio::time::timeout(APPEND_TIMEOUT, self.publish(entry, expected))
                .await
                .unwrap_or_else(|_| Err(LogError::Unavailable("no acknowledgement".into())))
        });
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
