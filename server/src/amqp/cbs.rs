//! The `$cbs` node: claims-based security (`compat` §B5). The client sends put-token requests
//! on its sender link to `$cbs`; each is answered on the client's receiver link from `$cbs`,
//! with `correlation-id` = the request's message id and application properties `status-code`
//! (an AMQP int: 200, 400, 401 or 500) and `status-description`.
//!
//! A token the authenticator accepts becomes the connection's claim, replacing the previous
//! one (renewal on the same link). What the claim allows is checked where a link is used.

use super::device::DeviceCredentials;
use crate::auth::Scope;
use crate::ids::Identity;
use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::messaging::{AmqpValue, Body, Message};
use fe2o3_amqp::types::primitives::Value;

use super::claims::Claims;
use super::replies::{application_property, correlation_of, reply, Replies};
use crate::hub::{AuthFailure, HubContext};

/// Serves the client's sender link to `$cbs` until it closes.
pub async fn serve_requests(
    mut link: Receiver,
    replies: Replies,
    ctx: HubContext,
    claims: Claims,
    devices: DeviceCredentials,
) {
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "$cbs request link ended");
                break;
            }
        };
        let request = delivery.message();
        let (status, description) = put_token(request, &ctx, &claims, &devices).await;
        let correlation_id = correlation_of(request);
        if link.accept(&delivery).await.is_err() {
            break;
        }
        replies
            .send(reply(correlation_id, status, &description, Value::Null))
            .await;
    }
    let _ = link.close().await;
}

/// Checks one put-token request and records its claim; the status and description to answer.
async fn put_token(
    request: &Message<Body<Value>>,
    ctx: &HubContext,
    claims: &Claims,
    devices: &DeviceCredentials,
) -> (i32, String) {
    if application_property(request, "operation") != Some("put-token") {
        return (
            400,
            "the $cbs node supports the put-token operation only".into(),
        );
    }
    match application_property(request, "type") {
        Some("servicebus.windows.net:sastoken" | "azure-devices.net:sastoken") => {}
        other => {
            return (
                400,
                format!(
                    "token type {other:?} is not supported; use servicebus.windows.net:sastoken"
                ),
            )
        }
    }
    let token = match &request.body {
        Body::Value(AmqpValue(Value::String(s))) => s.clone(),
        Body::Data(sections) if sections.len() == 1 => {
            String::from_utf8_lossy(&sections[0].0).into_owned()
        }
        _ => return (400, "the put-token body is not a string".into()),
    };
    match ctx.auth.service_claim(&token).await {
        Ok(claim) => {
            // A device's or module's token: its links are checked against it (AMQ-5).
            if let Scope::Device {
                device_id,
                module_id,
            } = &claim.principal.scope
            {
                devices.put_token(
                    Identity::new(device_id.clone(), module_id.clone()),
                    token.clone(),
                );
            }
            claims.set(claim);
            (200, "OK".into())
        }
        Err(AuthFailure::Refused(reason)) => {
            tracing::debug!(%reason, "$cbs put-token refused");
            (401, reason.to_string())
        }
        Err(AuthFailure::Unavailable(e)) => (500, e.to_string()),
    }
}
