//! The C2D link (`/devices/{d}/messages/deviceBound`): the device's queued messages, locked
//! one at a time and sent; the device's disposition settles each (C2D-3, C2D-5): `accepted`
//! completes, `rejected` rejects (dead-letters, with negative feedback), `released` or
//! `modified` abandons (the message is delivered again). A link that ends with a message
//! unsettled abandons it. A wake-up from a send (or an abandon elsewhere) makes the link look
//! at the queue again.

use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::link::Sender;
use fe2o3_amqp::types::messaging::Outcome;
use ferrohub_engine::c2d::{Settle, Settled};

use super::{messages, Attached};
use crate::amqp::errors;
use crate::hub::HubContext;
use crate::ids::LockToken;

/// How long the link waits for a wake-up before it looks at the queue anyway (a lock that
/// expired elsewhere returns a message without waking this connection).
const RECHECK: Duration = Duration::from_secs(5);

pub async fn serve(mut link: Sender, ctx: HubContext, attached: Arc<Attached>) {
    let who = attached.auth.who.clone();
    let device_id = who.device_id.clone();
    loop {
        let call = crate::hub::calls::ReceiveC2d {
            device_id: device_id.to_string(),
            max: 1,
            now: ctx.clock.now(),
        };
        let next = ctx.write(call).await;
        let delivered = match next {
            Ok(mut d) => d.pop(),
            Err(e) => {
                tracing::warn!(identity = %who, error = %e, "C2D queue could not be read");
                let _ = link.close_with_error(errors::c2d(&e)).await;
                return;
            }
        };
        let Some(delivered) = delivered else {
            tokio::select! {
                _ = attached.registration.c2d.wake.notified() => continue,
                _ = tokio::time::sleep(RECHECK) => continue,
                _ = link.on_detach() => return,
            }
        };
        let token = LockToken::new(delivered.lock_token.clone());
        let sent = link
            .send(messages::c2d_delivery(&device_id, &delivered))
            .await;
        let (action, link_ok) = match sent {
            Ok(Outcome::Accepted(_)) => (Settle::Complete, true),
            Ok(Outcome::Rejected(_)) => (Settle::Reject, true),
            Ok(_) => (Settle::Abandon, true),
            Err(e) => {
                tracing::debug!(identity = %who, error = %e, "C2D link ended with a message unsettled");
                (Settle::Abandon, false)
            }
        };
        if link_ok {
            attached.note_activity(&ctx);
        }
        let call = crate::hub::calls::SettleC2d {
            device_id: device_id.to_string(),
            lock_token: token.to_string(),
            action,
            now: ctx.clock.now(),
        };
        match ctx.write(call).await {
            // An abandoned message is deliverable again: whichever connection of the device
            // is receiving looks at the queue (as MQTT and HTTPS settles do).
            Ok(Settled::Requeued) => ctx.connections.wake_c2d(&device_id),
            Ok(_) => {}
            Err(e) => tracing::debug!(identity = %who, error = %e, ?action, "C2D settle refused"),
        }
        if !link_ok {
            return;
        }
    }
}
