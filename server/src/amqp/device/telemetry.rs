//! The telemetry link (`/devices/{d}[/modules/{m}]/messages/events`): each transfer becomes a
//! device message (a batch transfer, several), throttled and metered like MQTT telemetry, and
//! is accepted only once it is durable in every endpoint it was routed to; up to [`WINDOW`]
//! appends wait for their write while the link reads on, accepted in the order they were sent.
//! A message the hub refuses is rejected with IoT Hub's condition; the link goes on.
//!
//! # Invariants
//! - A batch transfer is one unit: all of its messages are stored, or it is rejected whole.
//!   Its size is bounded by the link's max-message-size, the limit of one message.
//! - Dispositions of an append's transfers go out together (one frame per run of consecutive
//!   delivery ids), after the append is durable; appends durable by the same time share them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use fe2o3_amqp::link::delivery::{Delivery, DeliveryInfo};
use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::definitions::Error;
use fe2o3_amqp::types::messaging::message::DecodeIntoMessage;
use fe2o3_amqp::types::messaging::{Body, Message};
use fe2o3_amqp::types::primitives::Value;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use serde_amqp::read::SliceReader;

use super::{messages, Attached};
use crate::amqp::errors;
use crate::amqp::message::BadMessage;
use crate::hub::HubContext;
use crate::telemetry::{self, DeviceMessage};

/// The transfers of an append waiting for its write (only what settles them: their
/// messages are stored by then), and the write's result.
type Stored = Pin<Box<dyn Future<Output = (Vec<DeliveryInfo>, Result<(), String>)> + Send>>;

/// Most transfers appended together.
const BURST: usize = 64;

/// Appends a link may have waiting for their write, as an MQTT connection's PUBACK window.
const WINDOW: usize = 64;

pub async fn serve(mut link: Receiver, ctx: HubContext, attached: Arc<Attached>) {
    let lane = ctx.telemetry_lane();
    let who = attached.auth.who.clone();
    // The device's share of the D2C throttle, kept across the link's messages.
    let mut mark = Default::default();
    // Appends in flight, each with its deliveries; the lane keeps their order, and each is
    // accepted as it becomes durable while the link keeps reading (as MQTT's PUBACK window).
    let mut pending: FuturesUnordered<Stored> = FuturesUnordered::new();
    loop {
        tokio::select! {
            Some(first) = pending.next(), if !pending.is_empty() => {
                // Appends that became durable together are accepted together: one
                // disposition for their run of delivery ids instead of one per append.
                let mut accepted = Vec::new();
                let mut next = Some(first);
                let mut settled = Ok(());
                while let Some((deliveries, stored)) = next.take() {
                    match stored {
                        Ok(()) => accepted.extend(deliveries),
                        Err(e) => {
                            tracing::warn!(identity = %who, error = %e, "AMQP telemetry not stored");
                            settled = settled.and(link.reject_all(deliveries, errors::internal(&e)).await);
                        }
                    }
                    next = pending.next().now_or_never().flatten();
                }
                if !accepted.is_empty() {
                    settled = settled.and(link.accept_all(accepted).await);
                }
                if settled.is_err() {
                    break;
                }
            }
            received = link.recv::<Body<Value>>(), if pending.len() < WINDOW => {
                attached.note_activity(&ctx);
                let mut next = Some(received);
                let (mut events, mut deliveries) = (Vec::new(), Vec::new());
                let mut ended = false;
                // The transfers already received make one append (one engine batch, as an
                // MQTT read burst does); a transfer not yet complete is left for the next turn.
                while let Some(received) = next.take() {
                    let delivery = match received {
                        Ok(d) => d,
                        Err(e) => {
                            tracing::debug!(identity = %who, error = %e, "AMQP telemetry link ended");
                            ended = true;
                            break;
                        }
                    };
                    match admit(&ctx, &attached, &mut mark, &delivery).await {
                        Ok(admitted) => {
                            events.extend(admitted);
                            deliveries.push(DeliveryInfo::from(delivery));
                        }
                        Err(error) => {
                            if link.reject(&delivery, error).await.is_err() {
                                ended = true;
                                break;
                            }
                        }
                    }
                    if deliveries.len() < BURST {
                        next = link.recv::<Body<Value>>().now_or_never();
                    }
                }
                if !events.is_empty() {
                    let append = ctx
                        .append_telemetry(&lane, events, who.module_id.clone())
                        .await;
                    pending.push(Box::pin(async move {
                        (deliveries, append.await.map(drop).map_err(|e| e.to_string()))
                    }));
                }
                if ended {
                    break;
                }
            }
        }
    }
    let _ = link.close().await;
}

/// The AMQP message format of a batch (the SDKs' `SendEventBatch`): each data section of the
/// body is one whole encoded message.
const BATCH_FORMAT: u32 = 0x8001_3700;

/// The stored events a transfer becomes, or the condition it is rejected with: a malformed
/// message, the D2C throttle, the daily quota, the size limit (a batch's messages together).
async fn admit(
    ctx: &HubContext,
    attached: &Attached,
    mark: &mut crate::hub::fair_share::SenderMark,
    delivery: &Delivery<Body<Value>>,
) -> Result<Vec<ferrohub_engine::d2c::NewEvent>, Error> {
    let who = &attached.auth.who;
    let device_messages = if *delivery.message_format() == Some(BATCH_FORMAT) {
        batch(delivery.message())
    } else {
        messages::telemetry(delivery.message()).map(|m| vec![m])
    }
    .map_err(|e| errors::bad_message(&e))?;
    if let Err(t) = ctx
        .throttles
        .d2c
        .admit(&who.device_id, mark, std::time::Duration::ZERO)
        .await
    {
        return Err(errors::throttled(&crate::hub::throttle::Throttled {
            operation: crate::hub::throttle::Operation::D2cSend,
            retry_after: t.retry_after(),
        }));
    }
    let bytes = device_messages.iter().map(|m| m.body.len()).sum();
    ctx.throttles
        .quota
        .charge(ctx.clock.now(), bytes)
        .map_err(|q| errors::quota_exceeded(&q))?;
    device_messages
        .into_iter()
        .map(|message| {
            telemetry::to_event(&attached.auth.record, attached.auth.method, message)
                .map_err(|e| errors::bad_message(&BadMessage::TooLarge(e.to_string())))
        })
        .collect()
}

/// The messages of a batch transfer, each decoded from its data section. The batch as a whole
/// is held to one message's size limit, as IoT Hub holds it, by the link's max-message-size
/// (a larger transfer detaches the link with `amqp:link:message-size-exceeded`).
pub(crate) fn batch(outer: &Message<Body<Value>>) -> Result<Vec<DeviceMessage>, BadMessage> {
    let Body::Data(sections) = &outer.body else {
        return Err(BadMessage::Field(
            "a batch message's body must be data sections".into(),
        ));
    };
    sections
        .iter()
        .enumerate()
        .map(|(i, section)| {
            // The frame guard walked the outer message, but a data section is opaque bytes to
            // it: each inner message gets the same structural check before the decoder, which
            // recurses once per level of nesting, sees it.
            crate::amqp::value_check::check_sections(&section.0).map_err(|e| {
                BadMessage::Field(format!(
                    "message {i} of the batch is not an AMQP message: {e}"
                ))
            })?;
            let inner = <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(
                SliceReader::new(&section.0),
            )
            .map_err(|e| {
                BadMessage::Field(format!(
                    "message {i} of the batch is not an AMQP message: {e}"
                ))
            })?;
            messages::telemetry(&inner)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp::types::messaging::Data;
    use fe2o3_amqp::types::primitives::Binary;

    use super::*;

    /// An `amqp-value` section holding `levels` lists, each the only element of the one
    /// outside it: far deeper than the decoder's stack allows.
    fn nested_value(levels: u32) -> Vec<u8> {
        let mut bytes = vec![0x00, 0x53, 0x77];
        for j in (1..=levels).rev() {
            let inner_len = 1 + 9 * (j - 1); // the lists inside this one, and the null
            bytes.push(0xD0);
            bytes.extend_from_slice(&(inner_len + 4).to_be_bytes());
            bytes.extend_from_slice(&1u32.to_be_bytes());
        }
        bytes.push(0x40);
        bytes
    }

    #[test]
    fn a_batch_message_nested_too_deep_is_refused_not_decoded() {
        let outer: Message<Body<Value>> = Message::builder()
            .body(Body::Data(
                vec![Data(Binary::from(nested_value(20_000)))].into(),
            ))
            .build();
        let refused = batch(&outer).err().expect("refused");
        assert!(
            refused.to_string().contains("message 0 of the batch"),
            "{refused}"
        );
    }
}
