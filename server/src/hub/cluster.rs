//! This node's place in a cluster (docs/cluster.md, "Serving from every node"): the writer,
//! or a follower whose writes go to the writer, and what read-your-writes waits for.
//!
//! # Invariants
//! - A follower's store refuses writes (`StorageError::NotWriter`); every write a client
//!   asks of a follower is a [`super::calls::WriterCall`] forwarded to the writer, which
//!   answers with the log sequence holding it. The follower answers its client only once its
//!   own replica applied that sequence ([`Cluster::applied_through`]), so the client's next
//!   read on this node sees its write.
//! - While NATS answers, a service-side read on a follower sees every write any node
//!   acknowledged before the read came ([`Cluster::caught_up_for_read`]): the follower learns
//!   the log's end from the stream's leader ([`super::read_index`]) and answers once its
//!   replica applied that far. A client that writes through one node and reads through
//!   another (a balancer spreading new connections) reads its write, as with IoT Hub. The
//!   writer holds every write it acknowledged already. When NATS fails the read is served
//!   from the replica as it is, after at most the two patiences below.
//! - The writer records, per connected identity, which node's connection is current
//!   ([`Owners`]): a connection that ended records "disconnected" only while it still is.
//! - A connection is named by its node, the node's incarnation (one per spell of serving in a
//!   role: a restarted or re-roled node starts a new one, and its connection numbers start
//!   again) and its number. The writer holds an identity's connection as departed when its
//!   node answers the roll call with another incarnation, or stays silent through
//!   [`SILENT_ROLL_CALLS`] roll calls in a row ([`Owners::departed`]).

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::read_index::ReadIndex;
use crate::cluster::bus::Bus;
use crate::cluster::Link;
use crate::ids::ClientId;

/// How long a follower waits for its replica to apply a forwarded write before it answers
/// anyway (the write is durable; only the read-your-writes promise is late).
const APPLY_PATIENCE: Duration = Duration::from_secs(10);

/// How long a follower waits for the log's end before a read; past it (NATS electing a
/// leader, or unreachable: the node's standing then stops it serving) the read is served from
/// the replica as it is.
const LOG_END_PATIENCE: Duration = Duration::from_secs(2);

/// How long a read on a follower waits for its replica to apply the log's end.
const READ_APPLY_PATIENCE: Duration = Duration::from_secs(5);

/// Which part this node plays.
pub enum Role {
    Writer { owners: Owners },
    Follower,
}

/// Roll calls in a row a node may miss before the writer holds its connections as gone: long
/// enough that a node paused by a busy machine is not taken for dead, short enough that a dead
/// node's devices read "disconnected" well within a minute.
pub const SILENT_ROLL_CALLS: u32 = 3;

/// A connection somewhere in the cluster: the node holding it, that node's incarnation and the
/// connection's number there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionRef {
    pub node: String,
    pub incarnation: u64,
    pub id: u64,
}

/// A node's answer to the roll call: it serves, in this incarnation, with this many devices.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RollCallAnswer {
    pub node: String,
    pub incarnation: u64,
    pub connected_devices: u64,
}

/// The writer's record of whose connection of each identity is current.
#[derive(Default)]
pub struct Owners(Mutex<OwnersInner>);

#[derive(Default)]
struct OwnersInner {
    current: HashMap<ClientId, ConnectionRef>,
    /// Roll calls in a row each node holding a current connection did not answer.
    missed: HashMap<String, u32>,
}

impl Owners {
    /// `connection` is now the identity's current one.
    pub fn connected(&self, client: &ClientId, connection: ConnectionRef) {
        self.0.lock().current.insert(client.clone(), connection);
    }

    /// Whether `connection` may record its end: it is the current one, or none is known (a
    /// writer that took over knows only connections made since).
    pub fn ends(&self, client: &ClientId, connection: &ConnectionRef) -> bool {
        let mut owners = self.0.lock();
        match owners.current.get(client) {
            Some(current) if current != connection => false,
            Some(_) => {
                owners.current.remove(client);
                true
            }
            None => true,
        }
    }

    /// After a roll call answered by `heard`: the current connections whose node answered
    /// with another incarnation, or has now missed [`SILENT_ROLL_CALLS`] in a row. They stay
    /// current until [`Owners::ends`] records each.
    pub fn departed(&self, heard: &[RollCallAnswer]) -> Vec<(ClientId, ConnectionRef)> {
        let mut owners = self.0.lock();
        let OwnersInner { current, missed } = &mut *owners;
        let answered = |node: &str| heard.iter().find(|a| a.node == node);
        let holding: std::collections::HashSet<&str> =
            current.values().map(|c| c.node.as_str()).collect();
        missed.retain(|node, _| holding.contains(node.as_str()));
        for node in holding {
            if answered(node).is_some() {
                missed.remove(node);
            } else {
                *missed.entry(node.to_owned()).or_default() += 1;
            }
        }
        current
            .iter()
            .filter(|(_, c)| match answered(&c.node) {
                Some(a) => a.incarnation != c.incarnation,
                None => missed.get(&c.node).is_some_and(|m| *m >= SILENT_ROLL_CALLS),
            })
            .map(|(client, c)| (client.clone(), c.clone()))
            .collect()
    }
}

/// This node's part in the cluster, shared by the hub's parts.
pub struct Cluster {
    pub bus: Bus,
    pub role: Role,
    /// The last log sequence this node's store applied (a follower's; the writer's stays 0).
    applied: watch::Receiver<u64>,
    /// Cancelled once this node stops serving in its role: a follower about to become the
    /// writer sends nothing more to a writer that may be itself.
    stopping: CancellationToken,
    /// This spell of serving in this role (see [`ConnectionRef`]).
    incarnation: u64,
    /// A follower's way to the log's end, for reads ([`Cluster::caught_up_for_read`]).
    log: Option<ReadIndex>,
}

/// A number no earlier spell of this node used: the time it starts, in microseconds.
fn new_incarnation() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Cluster {
    pub fn writer(bus: Bus) -> Cluster {
        Cluster {
            bus,
            role: Role::Writer {
                owners: Owners::default(),
            },
            applied: watch::channel(0).1,
            stopping: CancellationToken::new(),
            incarnation: new_incarnation(),
            log: None,
        }
    }

    /// A follower whose replica reports what it applied through `applied`, serving until
    /// `stopping`, reading the log's end through `log`.
    pub fn follower(
        bus: Bus,
        applied: watch::Receiver<u64>,
        stopping: CancellationToken,
        log: Link,
    ) -> Cluster {
        Cluster {
            bus,
            role: Role::Follower,
            applied,
            stopping,
            incarnation: new_incarnation(),
            log: Some(ReadIndex::new(log)),
        }
    }

    /// Whether this node stopped serving in its role (see [`Cluster::stopping`]).
    pub fn stopping(&self) -> &CancellationToken {
        &self.stopping
    }

    pub fn is_follower(&self) -> bool {
        matches!(self.role, Role::Follower)
    }

    /// The writer's connection owners; `None` on a follower.
    pub fn owners(&self) -> Option<&Owners> {
        match &self.role {
            Role::Writer { owners } => Some(owners),
            Role::Follower => None,
        }
    }

    pub fn node(&self) -> &str {
        self.bus.node()
    }

    /// This spell of serving (see [`ConnectionRef`]).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The last log sequence this node applied.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Before a read: waits until this node holds every write acknowledged anywhere before
    /// now. On the writer, at once; on a follower, once its replica applied the log's end as
    /// the stream's leader reports it ([`ReadIndex`]: one NATS request shared by the reads
    /// that wait for it). Without an answer within [`LOG_END_PATIENCE`], or a replica that
    /// does not reach it within [`READ_APPLY_PATIENCE`], the read goes on from the replica as
    /// it is (NATS is failing then, and the node's standing decides whether it serves).
    pub async fn caught_up_for_read(&self) {
        let Some(index) = &self.log else {
            return;
        };
        let end = match tokio::time::timeout(LOG_END_PATIENCE, index.log_end()).await {
            Ok(Ok(end)) => end,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "no log end for a read; reading the replica as it is");
                return;
            }
            Err(_) => {
                tracing::debug!(
                    "the log's end took too long for a read; reading the replica as it is"
                );
                return;
            }
        };
        if self.wait_applied(end, READ_APPLY_PATIENCE).await == Some(false) {
            tracing::debug!(
                end,
                applied = self.applied(),
                "the replica is behind the log's end for a read; reading it as it is"
            );
        }
    }

    /// Waits until this node's replica applied `seq` (at most [`APPLY_PATIENCE`], and not once
    /// this node stopped serving: its replica may apply no more until it serves again).
    pub async fn applied_through(&self, seq: u64) {
        if self.wait_applied(seq, APPLY_PATIENCE).await == Some(false) {
            tracing::warn!(
                seq,
                applied = self.applied(),
                "the replica is slow to apply a forwarded write; answering without it"
            );
        }
    }

    /// Waits up to `patience` for this node's replica to apply `seq`: whether it did, or
    /// `None` once this node stopped serving (its replica may apply no more until it serves
    /// again).
    async fn wait_applied(&self, seq: u64, patience: Duration) -> Option<bool> {
        let mut applied = self.applied.clone();
        tokio::select! {
            r = tokio::time::timeout(patience, applied.wait_for(|a| *a >= seq)) => Some(r.is_ok()),
            _ = self.stopping.cancelled() => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(node: &str, incarnation: u64, id: u64) -> ConnectionRef {
        ConnectionRef {
            node: node.into(),
            incarnation,
            id,
        }
    }

    fn answer(node: &str, incarnation: u64) -> RollCallAnswer {
        RollCallAnswer {
            node: node.into(),
            incarnation,
            connected_devices: 1,
        }
    }

    fn clients(departed: Vec<(ClientId, ConnectionRef)>) -> Vec<String> {
        let mut c: Vec<String> = departed.into_iter().map(|(c, _)| c.into()).collect();
        c.sort();
        c
    }

    #[test]
    fn a_silent_node_departs_after_the_allowed_misses_and_others_stay() {
        let owners = Owners::default();
        owners.connected(&ClientId::new("a"), on("hub1", 7, 1));
        owners.connected(&ClientId::new("b"), on("hub2", 9, 1));
        let only_hub1 = [answer("hub1", 7)];
        for _ in 1..SILENT_ROLL_CALLS {
            assert!(owners.departed(&only_hub1).is_empty(), "not yet");
        }
        assert_eq!(clients(owners.departed(&only_hub1)), ["b"]);
        assert!(owners.ends(&ClientId::new("b"), &on("hub2", 9, 1)));
        assert!(owners.departed(&only_hub1).is_empty(), "recorded once");
    }

    #[test]
    fn an_answer_resets_the_misses() {
        let owners = Owners::default();
        owners.connected(&ClientId::new("b"), on("hub2", 9, 1));
        for _ in 1..SILENT_ROLL_CALLS {
            assert!(owners.departed(&[]).is_empty());
        }
        assert!(owners.departed(&[answer("hub2", 9)]).is_empty());
        for _ in 1..SILENT_ROLL_CALLS {
            assert!(owners.departed(&[]).is_empty(), "counting again from zero");
        }
    }

    #[test]
    fn a_restarted_node_departs_its_earlier_connections_at_once() {
        let owners = Owners::default();
        owners.connected(&ClientId::new("old"), on("hub2", 9, 4));
        owners.connected(&ClientId::new("new"), on("hub2", 10, 4));
        assert_eq!(clients(owners.departed(&[answer("hub2", 10)])), ["old"]);
    }

    #[test]
    fn a_device_that_moved_is_not_departed_with_its_old_node() {
        let owners = Owners::default();
        owners.connected(&ClientId::new("d"), on("hub2", 9, 1));
        owners.connected(&ClientId::new("d"), on("hub3", 5, 2));
        for _ in 0..SILENT_ROLL_CALLS {
            assert!(owners.departed(&[answer("hub3", 5)]).is_empty());
        }
        assert!(
            !owners.ends(&ClientId::new("d"), &on("hub2", 9, 1)),
            "hub2's end is stale"
        );
    }
}
