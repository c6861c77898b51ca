//! The writer lease: one key of the [`LEASE_BUCKET`](super::link::LEASE_BUCKET) bucket, whose
//! values expire after the configured lease time unless the holder renews them.
//!
//! # Invariants
//! - A node takes the lease only when the key is absent (expired, released) or still names
//!   this node (a restart), with compare-and-set on the key's revision, so two takers cannot
//!   both succeed.
//! - The holder renews at a third of the lease time, also by revision. A renewal refused for
//!   its revision means someone else took the lease, and the holder must stop writing at once,
//!   only when another node's value is there: the holder's own value at a newer revision (a
//!   renewal that landed unanswered) or an absent key (expired while the bucket had no
//!   leader) is no loss, and the holder keeps it (see [`WriterLease::renew`]).
//! - The value names the holder and its advertised listeners ([`Holder`]).
//! - The lease is advisory: the log's fence, not the lease, keeps a deposed writer from
//!   writing (see [`super::log`]).

use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, UpdateErrorKind};
use async_nats::jetstream::ErrorCode;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{ClusterError, Link};

pub const LEASE_KEY: &str = "writer";

/// The lease's value: who holds it, and where its listeners are (what operators and the
/// scripts read to find the writer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub node: String,
    pub host: String,
    pub https: u16,
    pub mqtt: u16,
    pub amqp: u16,
}

impl Holder {
    fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a holder serialises"))
    }

    /// The holder a lease value names; `None` for a value this version cannot read.
    pub fn decode(value: &[u8]) -> Option<Holder> {
        serde_json::from_slice(value).ok()
    }
}

/// The current holder of the lease, if any.
///
/// # Errors
/// NATS unreachable.
pub async fn current_holder(link: &Link) -> Result<Option<Holder>, ClusterError> {
    match link.lease.entry(LEASE_KEY).await {
        Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
            Ok(Holder::decode(&entry.value))
        }
        Ok(_) => Ok(None),
        Err(e) => Err(ClusterError::nats("reading the writer lease", e)),
    }
}

/// Whether a create of the lease key lost to another taker. Besides `AlreadyExists`,
/// nats-server 2.11 may refuse it with JetStream code 10164 ("wrong last sequence" while
/// another conditional write to the same key is still in flight), which the client passes on
/// as a plain publish error: taken for a NATS failure, a lost race sent a follower round its
/// whole follow loop, closing its listeners. Only for taking the lease: a holder whose own
/// renewal may be that other write in flight must not read 10164 as lost (see
/// [`WriterLease::renew`]).
fn lost_to_another_taker(create_error: &kv::CreateError) -> bool {
    if create_error.kind() == kv::CreateErrorKind::AlreadyExists {
        return true;
    }
    let mut cause = std::error::Error::source(create_error);
    while let Some(e) = cause {
        if let Some(js) = e.downcast_ref::<async_nats::jetstream::Error>() {
            return js.error_code() == ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT;
        }
        cause = e.source();
    }
    false
}

/// The lease taken, and the log sequence this node's replica caught up to (or seeded).
pub struct Promotion {
    pub lease: WriterLease,
    pub caught_up_to: u64,
}

pub struct WriterLease {
    bucket: kv::Store,
    value: Bytes,
    revision: u64,
    renewed: Instant,
    ttl: Duration,
}

/// What a renewal found.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    Held,
    /// Someone else holds it now.
    Lost,
    /// NATS did not answer; the lease may still be held until it expires.
    Unknown,
}

impl WriterLease {
    /// Takes the lease if it is free or already this node's.
    ///
    /// # Errors
    /// NATS unreachable (nothing was taken).
    pub async fn try_acquire(
        link: &Link,
        me: &Holder,
    ) -> Result<Option<WriterLease>, ClusterError> {
        let value = me.encode();
        // The key's time counts from when NATS stored it, which is after this.
        let asked = Instant::now();
        let taken = match link.lease.create(LEASE_KEY, value.clone()).await {
            Ok(revision) => Some(revision),
            // Taken already, or a create racing this one won (the client then reports the
            // conflict as another error): whoever holds it now decides.
            Err(create_error) => match link.lease.entry(LEASE_KEY).await {
                Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                    if Holder::decode(&entry.value).is_some_and(|h| h.node == me.node) {
                        link.lease
                            .update(LEASE_KEY, value.clone(), entry.revision)
                            .await
                            .ok()
                    } else {
                        None
                    }
                }
                Ok(_) if lost_to_another_taker(&create_error) => None,
                Ok(_) => {
                    return Err(ClusterError::nats("taking the writer lease", create_error));
                }
                Err(e) => return Err(ClusterError::nats("reading the writer lease", e)),
            },
        };
        Ok(taken.map(|revision| WriterLease {
            bucket: link.lease.clone(),
            value,
            revision,
            renewed: asked,
            ttl: link.section.lease,
        }))
    }

    /// How often the holder renews.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// Whether the lease has gone unrenewed for its whole time (someone else may hold it).
    pub fn expired(&self) -> bool {
        self.renewed.elapsed() >= self.ttl
    }

    /// Until when this holder may act as the writer without a renewal: a tenth of the lease
    /// before its value can expire in NATS (the key's time starts when NATS stored the last
    /// renewal, after it was asked, and NATS expires keys late, never early), so a holder cut
    /// off from NATS stops before another node can take the lease.
    pub fn valid_until(&self) -> Instant {
        self.renewed + self.ttl - self.ttl / 10
    }

    /// Renews the lease by revision, within a third of the lease time (a bucket without a
    /// leader holds a request for longer; the next renewal asks again).
    pub async fn renew(&mut self) -> Renewal {
        let asked = Instant::now();
        let patience = self.renew_every();
        let updated = tokio::time::timeout(
            patience,
            self.bucket
                .update(LEASE_KEY, self.value.clone(), self.revision),
        )
        .await;
        let renewal = match updated {
            Ok(Ok(revision)) => Ok(revision),
            Ok(Err(e)) if e.kind() == UpdateErrorKind::WrongLastRevision => {
                tokio::time::timeout(patience, self.recheck())
                    .await
                    .unwrap_or_else(|_| Err(Renewal::Unknown))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot renew the writer lease");
                Err(Renewal::Unknown)
            }
            Err(_) => {
                tracing::warn!(
                    ?patience,
                    "the writer lease's bucket did not answer a renewal"
                );
                Err(Renewal::Unknown)
            }
        };
        match renewal {
            Ok(revision) => {
                self.revision = revision;
                self.renewed = asked;
                Renewal::Held
            }
            Err(other) => other,
        }
    }

    /// After a renewal refused for its revision: the lease is lost only if another node's
    /// value is there. This holder's own value under a newer revision (an earlier renewal
    /// that landed unanswered) is renewed at that revision; an absent key (the value expired
    /// while NATS elected a leader for the bucket) is taken back by create, which fails if
    /// another node took it first. Safe either way: the log's fence, not the lease, stops a
    /// second writer.
    async fn recheck(&self) -> Result<u64, Renewal> {
        let unknown = |what: &str, e: &dyn std::fmt::Display| {
            tracing::warn!(error = %e, "cannot renew the writer lease ({what})");
            Renewal::Unknown
        };
        match self.bucket.entry(LEASE_KEY).await {
            Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                if entry.value != self.value {
                    return Err(Renewal::Lost);
                }
                match self
                    .bucket
                    .update(LEASE_KEY, self.value.clone(), entry.revision)
                    .await
                {
                    Ok(revision) => Ok(revision),
                    Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Err(Renewal::Lost),
                    Err(e) => Err(unknown("renewing at the newer revision", &e)),
                }
            }
            Ok(_) => match self.bucket.create(LEASE_KEY, self.value.clone()).await {
                Ok(revision) => {
                    tracing::info!("the writer lease had expired unrenewed; took it back");
                    Ok(revision)
                }
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Err(Renewal::Lost),
                Err(e) => Err(unknown("taking it back", &e)),
            },
            Err(e) => Err(unknown("reading it", &e)),
        }
    }

    /// Runs `work` while keeping the lease renewed (a node between roles: its follower's
    /// services draining, its writing store opening). Whether the lease was lost meanwhile.
    pub async fn keep_during<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
    ) -> (T, bool) {
        tokio::pin!(work);
        let mut tick = tokio::time::interval(self.renew_every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut lost = false;
        loop {
            tokio::select! {
                out = &mut work => return (out, lost),
                _ = tick.tick(), if !lost => lost = self.renew().await == Renewal::Lost,
            }
        }
    }

    /// Gives the lease up so another node takes over at once (a clean shutdown).
    pub async fn release(self) {
        let deleted = self
            .bucket
            .delete_expect_revision(LEASE_KEY, Some(self.revision))
            .await;
        if let Err(e) = deleted {
            tracing::warn!(error = %e, "could not release the writer lease; it expires by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};

    /// A create refused as async-nats 0.51 reports it: the JetStream error inside a publish
    /// error, inside the update create tried, inside the create's own error.
    fn refused_with(err_code: u64) -> kv::CreateError {
        let js: async_nats::jetstream::Error = serde_json::from_value(serde_json::json!({
            "code": 400, "err_code": err_code, "description": "wrong last sequence"
        }))
        .expect("a JetStream error");
        let publish = PublishError::with_source(PublishErrorKind::Other, js);
        let update = kv::UpdateError::with_source(kv::UpdateErrorKind::Other, publish);
        kv::CreateError::with_source(kv::CreateErrorKind::Other, update)
    }

    #[test]
    fn a_create_refused_for_another_write_in_flight_lost_to_another_taker() {
        assert!(lost_to_another_taker(&refused_with(10164)));
        assert!(lost_to_another_taker(&kv::CreateError::new(
            kv::CreateErrorKind::AlreadyExists
        )));
        // Anything else is a NATS failure, reported as such.
        assert!(!lost_to_another_taker(&refused_with(10077)));
        assert!(!lost_to_another_taker(&kv::CreateError::new(
            kv::CreateErrorKind::Publish
        )));
    }
}
