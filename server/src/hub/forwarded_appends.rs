//! Device messages a cluster follower receives, sent to the writer (docs/cluster.md,
//! "Serving from every node"): a follower's [`super::AppendLane`] publishes each admitted
//! message to the writer, which routes and appends it on a lane of its own for that follower
//! lane, and answers once it is durable.
//!
//! # Invariants
//! - A follower lane publishes its messages one after another from the task that admits them;
//!   the writer takes the subject in one task, in arrival order, and appends each on the one
//!   writer lane it keeps for that follower lane. So a device's messages keep their order in
//!   the partition, as on a single node.
//! - The writer answers an append only once every routed copy is durable in the log; the
//!   follower acknowledges its device then (PUBACK, AMQP accept, 204), without waiting for its
//!   own replica: nothing a device can read depends on its own telemetry.
//! - An append nobody received (no writer at the moment: a failover) is sent again for up to
//!   [`FAILOVER_PATIENCE`] (unless this follower stopped serving), holding the lane's gate so none of its later messages is published
//!   meanwhile: a failover costs the device a pause, not its connection. Only a later message
//!   published in the instant the new writer subscribes can overtake it.
//! - An append sent but not answered (NATS unreachable, the writer lost mid-append) fails with
//!   a storage error, as a failed write does on a single node; the device resends it once it
//!   has reconnected (QoS 1 is at least once).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::{StorageError, UnixMillis};
use serde::{Deserialize, Serialize};

use super::calls::{FAILOVER_PATIENCE, RESEND_PAUSE, STOPPED_SERVING};
use super::cluster::Cluster;
use crate::cluster::bus::{self, BusError};

/// How long a forwarded append waits for the writer's answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Numbers this process's follower lanes.
static NEXT_LANE: AtomicU64 = AtomicU64::new(0);

#[derive(Serialize, Deserialize)]
pub(super) struct AppendRequest {
    pub(super) node: String,
    pub(super) lane: u64,
    pub(super) module_id: Option<String>,
    pub(super) events: Vec<NewEvent>,
    pub(super) now: UnixMillis,
}

#[derive(Serialize, Deserialize)]
pub(super) struct AppendReply {
    pub(super) result: Result<Vec<Appended>, D2cError>,
}

/// A follower lane's way to the writer.
pub struct Forwarder {
    cluster: Arc<Cluster>,
    lane: u64,
    /// Held while a message is published, and while one that found no writer is sent again.
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Forwarder {
    pub fn new(cluster: Arc<Cluster>) -> Forwarder {
        Forwarder {
            cluster,
            lane: NEXT_LANE.fetch_add(1, Ordering::Relaxed),
            gate: Arc::default(),
        }
    }

    /// Publishes one message's `events` (of `module_id`'s sender, if a module) to the writer
    /// now; `done` gets the writer's answer later.
    pub async fn send(
        &self,
        events: Vec<NewEvent>,
        module_id: Option<String>,
        now: UnixMillis,
        done: impl FnOnce(Result<Vec<Appended>, D2cError>) + Send + 'static,
    ) {
        let request = AppendRequest {
            node: self.cluster.node().to_owned(),
            lane: self.lane,
            module_id,
            events,
            now,
        };
        let payload = match rmp_serde::to_vec_named(&request) {
            Ok(p) => Bytes::from(p),
            Err(e) => return done(Err(unavailable(e.to_string()))),
        };
        let pending = {
            let _gate = self.gate.lock().await;
            self.cluster.bus.send(bus::APPENDS, payload.clone()).await
        };
        let mut pending = match pending {
            Ok(p) => p,
            Err(e) => return done(Err(unavailable(e.to_string()))),
        };
        let (cluster, gate) = (Arc::clone(&self.cluster), Arc::clone(&self.gate));
        tokio::spawn(async move {
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
            let result = match answer {
                Ok(bytes) => rmp_serde::from_slice::<AppendReply>(&bytes)
                    .map_err(|e| unavailable(format!("the writer's answer does not decode: {e}")))
                    .and_then(|r| r.result),
                Err(e) => Err(unavailable(e.to_string())),
            };
            done(result);
        });
    }
}

pub(super) fn unavailable(e: String) -> D2cError {
    D2cError::Storage(StorageError::Unavailable(e))
}
