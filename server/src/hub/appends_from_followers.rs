//! The writer's side of [`super::forwarded_appends`]: it takes what followers forward, in
//! arrival order, and appends each message on the one writer lane it keeps per follower lane,
//! answering once every routed copy is durable in the log.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::append_lane::AppendLane;
use super::forwarded_appends::{unavailable, AppendReply, AppendRequest};
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
    let mut lanes: HashMap<(String, u64), (AppendLane, Instant)> = HashMap::new();
    let mut last_prune = Instant::now();
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            m = appends.next() => match m {
                Some(m) => m,
                None => return,
            },
        };
        let request = match rmp_serde::from_slice::<AppendRequest>(&message.payload) {
            Ok(r) => r,
            Err(e) => {
                let reply = AppendReply {
                    result: Err(unavailable(format!("the append does not decode: {e}"))),
                };
                respond(&cluster.bus, &message, &reply).await;
                continue;
            }
        };
        let now = Instant::now();
        let lane = lanes
            .entry((request.node, request.lane))
            .or_insert_with(|| (ctx.telemetry_lane(), now));
        lane.1 = now;
        let done = ctx
            .append_telemetry(
                &lane.0,
                request.events,
                request.module_id.map(ModuleId::new),
            )
            .await;
        let bus = cluster.bus.clone();
        tokio::spawn(async move {
            let reply = AppendReply { result: done.await };
            respond(&bus, &message, &reply).await;
        });
        if last_prune.elapsed() > LANE_IDLE {
            lanes.retain(|_, (_, used)| used.elapsed() < LANE_IDLE);
            last_prune = Instant::now();
        }
    }
}

async fn respond(bus: &Bus, to: &async_nats::Message, reply: &AppendReply) {
    match rmp_serde::to_vec_named(reply) {
        Ok(bytes) => bus.respond(to, Bytes::from(bytes)).await,
        Err(e) => tracing::error!(error = %e, "cannot encode an append's answer"),
    }
}
