//! The telemetry link (`/devices/{d}[/modules/{m}]/messages/events`): each transfer becomes a
//! device message, throttled and metered like MQTT telemetry, and is accepted only once it is
//! durable in every endpoint it was routed to. A message the hub refuses is rejected with IoT
//! Hub's condition; the link goes on.

use std::sync::Arc;

use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;

use super::{messages, Attached};
use crate::amqp::errors;
use crate::hub::HubContext;
use crate::telemetry;

pub async fn serve(mut link: Receiver, ctx: HubContext, attached: Arc<Attached>) {
    let lane = ctx.telemetry_lane();
    let who = attached.auth.who.clone();
    // The device's share of the D2C throttle, kept across the link's messages.
    let mut mark = Default::default();
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(identity = %who, error = %e, "AMQP telemetry link ended");
                break;
            }
        };
        let message = match messages::telemetry(delivery.message()) {
            Ok(m) => m,
            Err(e) => {
                let _ = link.reject(&delivery, errors::bad_message(&e)).await;
                continue;
            }
        };
        if let Err(t) = ctx
            .throttles
            .d2c
            .admit(&who.device_id, &mut mark, std::time::Duration::ZERO)
            .await
        {
            let throttled = crate::hub::throttle::Throttled {
                operation: crate::hub::throttle::Operation::D2cSend,
                retry_after: t.retry_after(),
            };
            let _ = link.reject(&delivery, errors::throttled(&throttled)).await;
            continue;
        }
        if let Err(q) = ctx
            .throttles
            .quota
            .charge(ctx.clock.now(), message.body.len())
        {
            let _ = link.reject(&delivery, errors::quota_exceeded(&q)).await;
            continue;
        }
        let event = match telemetry::to_event(&attached.auth.record, attached.auth.method, message)
        {
            Ok(e) => e,
            Err(e) => {
                let _ = link
                    .reject(
                        &delivery,
                        errors::bad_message(&crate::amqp::message::BadMessage::TooLarge(
                            e.to_string(),
                        )),
                    )
                    .await;
                continue;
            }
        };
        let appended = ctx
            .append_telemetry(&lane, vec![event], who.module_id.clone())
            .await
            .await;
        let settled = match appended {
            Ok(_) => link.accept(&delivery).await,
            Err(e) => {
                tracing::warn!(identity = %who, error = %e, "AMQP telemetry not stored");
                link.reject(&delivery, errors::internal(&e.to_string()))
                    .await
            }
        };
        if settled.is_err() {
            break;
        }
    }
    let _ = link.close().await;
}
