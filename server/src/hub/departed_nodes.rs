//! The writer's sweep for connections on nodes that went away (docs/cluster.md, "Failure
//! model"): a node killed or cut off cannot record its devices' "disconnected" state, so the
//! writer calls the roll every [`ROLL_CALL_EVERY`] and records it for them.
//!
//! # Invariants
//! - Only the writer sweeps, and only connections it knows as current ([`Owners`]): a device
//!   that reconnected elsewhere has a newer current connection, which no sweep touches.
//! - A roll call nobody answered (not even this node) says nothing about the others: NATS is
//!   out of reach, and the sweep waits for the next one.
//! - "Disconnected" is recorded by the same writer call as a connection's own end
//!   ([`super::calls::RecordDisconnection`]): checked against the writer's current
//!   connections under the device's lock, so it never lands after a newer connection's
//!   "connected".

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::calls::RecordDisconnection;
use super::cluster::ConnectionRef;
use super::HubContext;
use crate::ids::{ClientId, Identity};

/// How often the writer calls the roll.
const ROLL_CALL_EVERY: Duration = Duration::from_secs(5);

/// Sweeps until `stop`; a no-op on a single node or a follower.
pub async fn run(ctx: HubContext, stop: CancellationToken) {
    let Some(live) = ctx.live.clone() else { return };
    let mut tick = tokio::time::interval(ROLL_CALL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let Some(heard) = live.roll_call().await else {
            continue;
        };
        if heard.is_empty() {
            continue;
        }
        let Some(owners) = ctx.cluster.as_deref().and_then(|c| c.owners()) else {
            return;
        };
        for (client, connection) in owners.departed(&heard) {
            tracing::info!(%client, node = %connection.node, "the node holding this connection is gone; recording it disconnected");
            record_departed(&ctx, client, connection).await;
        }
    }
}

/// The same call as a connection's own end, made here: only the writer sweeps.
async fn record_departed(ctx: &HubContext, client: ClientId, connection: ConnectionRef) {
    let call = RecordDisconnection {
        who: Identity::of_client(&client),
        connection,
        now: ctx.clock.now(),
    };
    if let Err(e) = ctx.write(call).await {
        tracing::warn!(error = %e, "cannot record a departed node's connection state");
    }
}
