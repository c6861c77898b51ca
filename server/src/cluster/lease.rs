//! The writer lease: one key of the [`LEASE_BUCKET`](super::link::LEASE_BUCKET) bucket, whose
//! values expire after the configured lease time unless the holder renews them.
//!
//! # Invariants
//! - A node takes the lease only when the key is absent (expired, released) or still names
//!   this node (a restart), with compare-and-set on the key's revision, so two takers cannot
//!   both succeed.
//! - The holder renews at a third of the lease time, also by revision; a renewal refused for
//!   its revision means someone else took the lease, and the holder must stop writing at once.
//! - The lease is advisory: the log's fence, not the lease, keeps a deposed writer from
//!   writing (see [`super::log`]).

use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, UpdateErrorKind};
use bytes::Bytes;

use super::{ClusterError, Link};

pub const LEASE_KEY: &str = "writer";

pub struct WriterLease {
    bucket: kv::Store,
    node: String,
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
    pub async fn try_acquire(link: &Link) -> Result<Option<WriterLease>, ClusterError> {
        let node = link.section.node.clone();
        let value = Bytes::from(node.clone());
        let taken = match link.lease.create(LEASE_KEY, value.clone()).await {
            Ok(revision) => Some(revision),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                match link.lease.entry(LEASE_KEY).await {
                    Ok(Some(entry))
                        if entry.operation == kv::Operation::Put
                            && entry.value.as_ref() == node.as_bytes() =>
                    {
                        link.lease
                            .update(LEASE_KEY, value, entry.revision)
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
            node,
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
            .update(LEASE_KEY, Bytes::from(self.node.clone()), self.revision)
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
