//! Event Hubs' owner-level (epoch) rules across a cluster's nodes: a consumer may attach to
//! any node, so a reader admitted on one node must push off lower readers of the same
//! partition and consumer group on the others, and be refused where a higher one reads.
//!
//! Each node keeps its own [`PartitionReaders`]; admission asks the other nodes first, over
//! core NATS ([`crate::cluster::bus::READER_CLAIMS`]), gathering their answers for
//! [`CLAIM_WINDOW`].
//!
//! # Invariants
//! - A reader is refused when this node or an answering one holds a higher owner level (or,
//!   for a plain reader, any owner), with the single node's refusal text; such a refused
//!   claim pushes no one off on this node.
//! - A claim with owner level `e` pushes off, on every node that answers, each reader there
//!   when none has a level above `e` (equal levels included: the newer reader wins).
//! - Plain readers count against [`MAX_PLAIN_READERS`] across the nodes that answered.
//! - A node that does not answer in the window is not waited for: its readers are pushed off
//!   when the claim reaches it, or the claim goes unchecked against them if it never does
//!   (what a node cut off from NATS cannot avoid).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::partition_readers::{Held, Lease, PartitionReaders, ReaderRefusal, MAX_PLAIN_READERS};
use crate::cluster::bus::{Bus, READER_CLAIMS};

/// How long a claim waits for the other nodes' answers.
pub const CLAIM_WINDOW: Duration = Duration::from_millis(200);

/// A reader about to be admitted on `node`.
#[derive(Debug, Serialize, Deserialize)]
struct Claim {
    node: String,
    partition: u16,
    group: String,
    owner_level: Option<i64>,
    shown: String,
}

/// A node's answer: what it holds of the claimed partition after the claim.
#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    top: Option<i64>,
    plain: usize,
}

/// Admission of partition readers for a node of a cluster.
pub struct ReadersEverywhere {
    bus: Bus,
    readers: PartitionReaders,
}

impl ReadersEverywhere {
    pub fn new(bus: Bus, readers: PartitionReaders) -> Arc<ReadersEverywhere> {
        Arc::new(ReadersEverywhere { bus, readers })
    }

    /// Admits a reader as [`PartitionReaders::admit`] does, with the other nodes' readers
    /// taken into account.
    ///
    /// # Errors
    /// [`ReaderRefusal`] as on one node; a NATS failure is not one (the claim then goes by
    /// this node's readers alone).
    pub async fn admit(
        &self,
        partition: u16,
        group: &str,
        owner_level: Option<i64>,
        shown: &str,
    ) -> Result<Lease, ReaderRefusal> {
        // Refused here already: ask no one, push no one off elsewhere.
        let here = self.readers.held(partition, group);
        if let Some(refused) = ReaderRefusal::held_by(here.top, owner_level, shown) {
            return Err(refused);
        }
        let claim = Claim {
            node: self.bus.node().to_owned(),
            partition,
            group: group.to_owned(),
            owner_level,
            shown: shown.to_owned(),
        };
        let payload = Bytes::from(rmp_serde::to_vec(&claim).expect("a claim always encodes"));
        let answers = match self.bus.gather(READER_CLAIMS, payload, CLAIM_WINDOW).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask the other nodes about a partition's readers");
                Vec::new()
            }
        };
        let elsewhere: Vec<Answer> = answers
            .iter()
            .filter_map(|b| rmp_serde::from_slice(b).ok())
            .collect();
        let top = elsewhere.iter().filter_map(|a| a.top).max();
        if let Some(refused) = ReaderRefusal::held_by(top, owner_level, shown) {
            return Err(refused);
        }
        let plain_elsewhere: usize = elsewhere.iter().map(|a| a.plain).sum();
        if owner_level.is_none() && here.plain + plain_elsewhere >= MAX_PLAIN_READERS {
            return Err(ReaderRefusal::too_many(shown, group));
        }
        self.readers.admit(partition, group, owner_level, shown)
    }

    /// Answers the other nodes' claims until `stop`.
    pub async fn serve(self: Arc<Self>, stop: CancellationToken) {
        let subscribed = self.bus.subscribe(READER_CLAIMS.to_owned()).await;
        let mut claims = match subscribed {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "cannot hear the cluster's reader claims"),
        };
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return,
                m = claims.next() => match m {
                    Some(m) => m,
                    None => return,
                },
            };
            let Ok(claim) = rmp_serde::from_slice::<Claim>(&message.payload) else {
                tracing::debug!("a reader claim does not decode");
                continue;
            };
            if claim.node == self.bus.node() {
                continue;
            }
            let answer = self.answer(&claim);
            let bytes = rmp_serde::to_vec(&answer).expect("an answer always encodes");
            self.bus.respond(&message, Bytes::from(bytes)).await;
        }
    }

    fn answer(&self, claim: &Claim) -> Answer {
        let (partition, group) = (claim.partition, claim.group.as_str());
        if let Some(level) = claim.owner_level {
            if let Some(higher) =
                self.readers
                    .taken_elsewhere(partition, group, level, &claim.shown)
            {
                return Answer {
                    top: Some(higher),
                    plain: 0,
                };
            }
        }
        let Held { top, plain } = self.readers.held(partition, group);
        Answer { top, plain }
    }
}
