//! The writer's side of [`super::forwarded_appends`]: it takes the batches followers forward,
//! in arrival order, and appends each message of a batch, in the batch's order, on the one
//! writer lane it keeps per follower lane, answering the batch once every routed copy of every
//! message in it is durable in the log (one result per message).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::append_lane::AppendLane;
use super::forwarded_appends::{unavailable, AppendBatch, AppendRequest, BatchReply};
use super::HubContext;
use crate::cluster::bus::{self, Bus};
use crate::ids::ModuleId;

/// A writer lane nothing was appended on for this long is dropped.
const LANE_IDLE: Duration = Duration::from_secs(60);

/// The writer's side: appends what followers forward, until `stop`.
pub async fn serve(ctx: HubContext, stop: CancellationToken) {
    let Some(cluster) = ctx.cluster.clone() else {
        return;
    };
    let mut appends = match cluster.bus.queue_subscribe(bus::APPENDS, "writer").await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot take forwarded appends; followers' telemetry will fail");
            return;
        }
    };
    // Follower node, then its lane: a node's name is copied once, when its first lane comes.
    let mut lanes: HashMap<String, HashMap<u64, (AppendLane, Instant)>> = HashMap::new();
    let mut last_prune = Instant::now();
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            m = appends.next() => match m {
                Some(m) => m,
                None => return,
            },
        };
        let batch = match rmp_serde::from_slice::<AppendBatch>(&message.payload) {
            Ok(b) => b,
            Err(e) => {
                // Without the batch's size there is nothing to answer per message: the
                // follower fails the whole batch on a reply of the wrong size.
                let error = Err(unavailable(format!("the batch does not decode: {e}")));
                respond(
                    &cluster.bus,
                    &message,
                    &BatchReply {
                        results: vec![error],
                    },
                )
                .await;
                continue;
            }
        };
        let now = Instant::now();
        if !lanes.contains_key(batch.node) {
            lanes.insert(batch.node.to_owned(), HashMap::new());
        }
        let node_lanes = lanes.get_mut(batch.node).expect("inserted above");
        let mut answers = Vec::with_capacity(batch.messages.len());
        for encoded in batch.messages {
            let request = match rmp_serde::from_slice::<AppendRequest>(encoded) {
                Ok(r) => r,
                Err(e) => {
                    let error = Err(unavailable(format!("the append does not decode: {e}")));
                    answers.push(futures::future::Either::Left(std::future::ready(error)));
                    continue;
                }
            };
            let lane = node_lanes
                .entry(request.lane)
                .or_insert_with(|| (ctx.telemetry_lane(), now));
            lane.1 = now;
            let done = ctx
                .append_telemetry(
                    &lane.0,
                    request.events,
                    request.module_id.map(ModuleId::new),
                )
                .await;
            answers.push(futures::future::Either::Right(done));
        }
        let bus = cluster.bus.clone();
        tokio::spawn(async move {
            let reply = BatchReply {
                results: futures::future::join_all(answers).await,
            };
            respond(&bus, &message, &reply).await;
        });
        if last_prune.elapsed() > LANE_IDLE {
            lanes.retain(|_, node_lanes| {
                node_lanes.retain(|_, (_, used)| used.elapsed() < LANE_IDLE);
                !node_lanes.is_empty()
            });
            last_prune = Instant::now();
        }
    }
}

async fn respond(bus: &Bus, to: &async_nats::Message, reply: &BatchReply) {
    match rmp_serde::to_vec(reply) {
        Ok(bytes) => bus.respond(to, Bytes::from(bytes)).await,
        Err(e) => tracing::error!(error = %e, "cannot encode an append's answer"),
    }
}
