//! The writer lease: one key of the [`LEASE_BUCKET`](super::link::LEASE_BUCKET) bucket, whose
//! values expire after the configured lease time unless the holder renews them.
//!
//! # Invariants
//! - A node takes the lease only when the key is absent (expired, released) or still names
//!   this node (a restart), with compare-and-set on the key's revision, so two takers cannot
//!   both succeed.
//! - The holder renews at a third of the lease time, also by revision; a renewal refused for
//!   its revision means someone else took the lease, and the holder must stop writing at once.
//! - The value names the holder and its advertised listeners ([`Holder`]).
//! - The lease is advisory: the log's fence, not the lease, keeps a deposed writer from
//!   writing (see [`super::log`]).

use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, UpdateErrorKind};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{ClusterError, Link};

pub const LEASE_KEY: &str = "writer";

/// The lease's value: who holds it, and where its listeners are, so followers can forward
/// the connections they accept (see [`super::relay`]).
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
        let taken = match link.lease.create(LEASE_KEY, value.clone()).await {
            Ok(revision) => Some(revision),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                match link.lease.entry(LEASE_KEY).await {
                    Ok(Some(entry))
                        if entry.operation == kv::Operation::Put
                            && Holder::decode(&entry.value).is_some_and(|h| h.node == me.node) =>
                    {
                        link.lease
                            .update(LEASE_KEY, value.clone(), entry.revision)
                            .await
                            .ok()
                    }
                    Ok(_) => None,
                    Err(e) => return Err(ClusterError::nats("reading the writer lease", e)),
                }
            }
            Err(e) => return Err(ClusterError::nats("taking the writer lease", e)),
        };
        Ok(taken.map(|revision| WriterLease {
            bucket: link.lease.clone(),
            value,
            revision,
            renewed: Instant::now(),
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

    pub async fn renew(&mut self) -> Renewal {
        let asked = Instant::now();
        match self
            .bucket
            .update(LEASE_KEY, self.value.clone(), self.revision)
            .await
        {
            Ok(revision) => {
                self.revision = revision;
                self.renewed = asked;
                Renewal::Held
            }
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Renewal::Lost,
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew the writer lease");
                Renewal::Unknown
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
