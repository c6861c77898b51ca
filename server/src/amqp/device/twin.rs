//! The twin channel (`/devices/{d}[/modules/{m}]/twin`, a sender and a receiver sharing
//! `com.microsoft:channel-correlation-id`): requests carry the message annotations
//! `operation` and `resource` and a correlation id; each reply echoes the correlation id with
//! a `status` annotation (and `version` after a reported patch). Operations:
//!
//! - `GET`: the twin's `{"desired", "reported"}` sections, each with `$version` (200);
//! - `PATCH` `/properties/reported`: the reported patch, stored (204, `version`);
//! - `PUT` / `DELETE` `/notifications/twin/properties/desired`: desired-property pushes on or
//!   off; pushes then come on the same channel with no correlation id.
//!
//! Throttles and the daily quota apply as over MQTT (429, 403); a refused request changes
//! nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use serde_json::{json, Map, Value as Json};

use super::{messages, Attached};
use crate::amqp::message::body_bytes;
use crate::hub::throttle::Operation;
use crate::hub::HubContext;

const DESIRED_NOTIFICATIONS: &str = "/notifications/twin/properties/desired";
const REPORTED: &str = "/properties/reported";

pub async fn serve_requests(mut link: Receiver, ctx: HubContext, attached: Arc<Attached>) {
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(identity = %attached.auth.who, error = %e, "AMQP twin link ended");
                break;
            }
        };
        attached.note_activity(&ctx);
        let request = delivery.message();
        let correlation = messages::correlation(request);
        let (status, version, body) = answer(request, &ctx, &attached).await;
        if link.accept(&delivery).await.is_err() {
            break;
        }
        attached
            .twin
            .send(messages::twin_reply(correlation, status, version, body))
            .await;
    }
    let _ = link.close().await;
}

fn section(body: &Map<String, Json>, version: u64) -> Json {
    let mut out = body.clone();
    out.insert("$version".into(), Json::from(version));
    Json::Object(out)
}

fn error_body(message: impl std::fmt::Display) -> Vec<u8> {
    json!({ "message": message.to_string() })
        .to_string()
        .into_bytes()
}

/// Admits a twin operation under its throttle and the daily quota, or the refusal.
async fn refusal(ctx: &HubContext, op: Operation, bytes: usize) -> Option<(i32, Vec<u8>)> {
    let (status, body) = ctx
        .throttles
        .refuse_twin_operation(op, bytes, ctx.clock.now())
        .await?;
    Some((i32::from(status), body.to_string().into_bytes()))
}

/// What a twin request asks, from its `operation` and `resource` annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TwinRequest<'a> {
    /// `GET`: the twin.
    Get,
    /// `PATCH` of `/properties/reported`: the body is a reported patch.
    PatchReported,
    /// `PUT` (true) or `DELETE` (false) of `/notifications/twin/properties/desired`.
    DesiredPushes(bool),
    /// Anything else: the operation and the resource (without trailing `/`) it named.
    Unknown {
        operation: &'a str,
        resource: &'a str,
    },
}

/// Reads what `request` asks; a missing annotation reads as empty.
pub(crate) fn twin_request(
    request: &fe2o3_amqp::types::messaging::Message<Body<Value>>,
) -> TwinRequest<'_> {
    let operation = messages::annotation_text(request, "operation").unwrap_or_default();
    let resource = messages::annotation_text(request, "resource").unwrap_or_default();
    match (operation, resource.trim_end_matches('/')) {
        ("GET", _) => TwinRequest::Get,
        ("PATCH", REPORTED) => TwinRequest::PatchReported,
        ("PUT", DESIRED_NOTIFICATIONS) => TwinRequest::DesiredPushes(true),
        ("DELETE", DESIRED_NOTIFICATIONS) => TwinRequest::DesiredPushes(false),
        (operation, resource) => TwinRequest::Unknown {
            operation,
            resource,
        },
    }
}

async fn answer(
    request: &fe2o3_amqp::types::messaging::Message<Body<Value>>,
    ctx: &HubContext,
    attached: &Attached,
) -> (i32, Option<u64>, Vec<u8>) {
    let who = attached.auth.who.clone();
    match twin_request(request) {
        TwinRequest::Get => {
            if let Some((status, body)) = refusal(ctx, Operation::TwinRead, 0).await {
                return (status, None, body);
            }
            let result = ctx
                .store
                .run(move |s| s.get_twin(&who.device_id, who.module_id.as_deref()))
                .await;
            match result {
                Ok(t) => {
                    let body = json!({
                        "desired": section(&t.record.desired.body, t.record.desired.version),
                        "reported": section(&t.record.reported.body, t.record.reported.version),
                    });
                    (200, None, body.to_string().into_bytes())
                }
                Err(e) => (
                    i32::from(crate::error_codes::twin(&e).0.as_u16()),
                    None,
                    error_body(&e),
                ),
            }
        }
        TwinRequest::PatchReported => {
            let payload = match body_bytes(&request.body) {
                Ok(b) => b,
                Err(e) => return (400, None, error_body(e)),
            };
            if let Some((status, body)) =
                refusal(ctx, Operation::TwinUpdate, payload.len()).await
            {
                return (status, None, body);
            }
            let patch = match serde_json::from_slice::<Json>(&payload) {
                Ok(Json::Object(m)) => m,
                _ => return (400, None, error_body("the reported patch must be a JSON object")),
            };
            let now = ctx.clock.now();
            let call = crate::hub::calls::PatchReported::by(&who, patch, now);
            let result = ctx.write(call).await;
            match result {
                Ok(version) => (204, Some(version), Vec::new()),
                Err(e) => (
                    i32::from(crate::error_codes::twin(&e).0.as_u16()),
                    None,
                    error_body(&e),
                ),
            }
        }
        TwinRequest::DesiredPushes(on) => {
            attached.desired.store(on, Ordering::Release);
            (200, None, Vec::new())
        }
        TwinRequest::Unknown {
            operation,
            resource,
        } => (
            400,
            None,
            error_body(format!(
                "twin operation {operation:?} on {resource:?} is not GET, PATCH {REPORTED}, or PUT/DELETE {DESIRED_NOTIFICATIONS}"
            )),
        ),
    }
}
