//! The methods channel (`/devices/{d}[/modules/{m}]/methods/devicebound`): calls go to the
//! device on its receiver link with `IoThub-methodname` and the call's id as correlation id
//! ([`super::messages::method_request`]); the device answers on its sender link with
//! `IoThub-status` and the same correlation id, which completes the waiting call (MTH-1).

use std::sync::Arc;

use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::messaging::{Body, Message};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};

use super::{messages, Attached};
use crate::amqp::message::{body_bytes, id_text};
use crate::hub::methods::MethodAnswer;
use crate::hub::HubContext;

pub async fn serve_answers(mut link: Receiver, ctx: HubContext, attached: Arc<Attached>) {
    let client_id = attached.auth.who.client_id();
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(identity = %attached.auth.who, error = %e, "AMQP methods link ended");
                break;
            }
        };
        attached.note_activity(&ctx);
        let (rid, status, payload) = read_answer(delivery.message());
        let completed = match (rid, status) {
            (Some(rid), Some(status)) => {
                ctx.methods
                    .complete(&client_id, &rid, MethodAnswer { status, payload })
            }
            _ => false,
        };
        if !completed {
            tracing::debug!(identity = %attached.auth.who, "method answer without a waiting call (or without IoThub-status)");
        }
        if link.accept(&delivery).await.is_err() {
            break;
        }
    }
    let _ = link.close().await;
}

/// What a device's answer carries: the call's id (its correlation id, as text), its
/// `IoThub-status`, and its payload (none for a body that is not bytes).
pub(crate) fn read_answer(answer: &Message<Body<Value>>) -> (Option<String>, Option<i32>, Vec<u8>) {
    let rid = messages::correlation(answer).map(|c| id_text(&c));
    let status = answer
        .application_properties
        .as_ref()
        .and_then(|a| a.0.get("IoThub-status"))
        .and_then(|v| match v {
            SimpleValue::Int(n) => Some(*n),
            SimpleValue::Long(n) => i32::try_from(*n).ok(),
            SimpleValue::Uint(n) => i32::try_from(*n).ok(),
            SimpleValue::String(s) => s.parse().ok(),
            _ => None,
        });
    let payload = body_bytes(&answer.body).unwrap_or_default();
    (rid, status, payload)
}
