//! Sender links to `/messages/devicebound` (AMQ-2): each message becomes a C2D message, and
//! is `accepted` once durable or `rejected` with the reason; nothing is stored for a rejected
//! one. Deliveries are handled one at a time, so the link's credit bounds what the hub holds.

use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;

use super::claims::Claims;
use super::{errors, message};
use crate::auth::Permission;
use crate::hub::HubContext;

/// Serves one sender link until the client closes it or its claim stops allowing it.
pub async fn serve(mut link: Receiver, ctx: HubContext, claims: Claims) {
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "devicebound link ended");
                return;
            }
        };
        if let Err(reason) = claims.check(Permission::ServiceConnect, ctx.auth.now_secs()) {
            let _ = link.reject(&delivery, errors::unauthorized(&reason)).await;
            let _ = link.close_with_error(errors::unauthorized(&reason)).await;
            return;
        }
        let admitted = ctx
            .throttles
            .admit(crate::hub::throttle::Operation::C2dSend)
            .await
            .map_err(|t| errors::throttled(&t));
        let outcome = match (admitted, message::c2d_from_amqp(delivery.message())) {
            (Err(throttled), _) => Err(throttled),
            (Ok(()), Ok((device_id, c2d))) => {
                match ctx.throttles.quota.charge(ctx.clock.now(), c2d.body.len()) {
                    Err(q) => Err(errors::quota_exceeded(&q)),
                    Ok(()) => ctx
                        .send_c2d(device_id, c2d)
                        .await
                        .map_err(|e| errors::c2d(&e)),
                }
            }
            (Ok(()), Err(e)) => Err(errors::bad_message(&e)),
        };
        let settled = match outcome {
            Ok(()) => link.accept(&delivery).await,
            Err(error) => {
                tracing::debug!(?error, "C2D send over AMQP refused");
                link.reject(&delivery, error).await
            }
        };
        if let Err(e) = settled {
            tracing::debug!(error = %e, "devicebound disposition failed");
            return;
        }
    }
}
