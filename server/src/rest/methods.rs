//! Direct methods (MTH-1, MTH-2): `POST /twins/{id}/methods` and
//! `POST /twins/{id}/modules/{mid}/methods` (ServiceConnect). The call goes to the connected
//! device on `$iothub/methods/POST/{method}/?$rid={rid}`; its answer on
//! `$iothub/methods/res/{status}/?$rid={rid}` returns as `{"status", "payload"}`.
//!
//! A device that is not connected, or has not subscribed to `$iothub/methods/POST/#`, is not
//! online: the call waits up to `connectTimeoutInSeconds` for it, then answers 404 (404103). No
//! answer within `responseTimeoutInSeconds` (5..300, default 30) is 504 (504101). Payloads are
//! limited to 128 KB each way. A pending call blocks nothing else of the device.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::error::ApiError;
use super::reply::{json, json_with_status, one_of, Handled, Response};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::method_call::{CallFailure, MethodRequest};
use crate::ids::Identity;

/// Largest request or response payload.
pub const MAX_PAYLOAD: usize = 128 * 1024;
const DEFAULT_RESPONSE_TIMEOUT: u64 = 30;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MethodCall {
    method_name: String,
    #[serde(default)]
    payload: Value,
    response_timeout_in_seconds: Option<u64>,
    connect_timeout_in_seconds: Option<u64>,
}

/// The device's side failed (not online, no answer): IoT Hub answers these with the direct
/// method error body (a `message` beside the registry-style fields), not as `ApiError`s.
fn error(status: StatusCode, code: u32, name: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "Message": format!("ErrorCode:{name};{message}"),
        "ExceptionMessage": "",
        "errorCode": code,
        "message": message,
    });
    json_with_status(&body, status)
}

/// The direct-method route table; a device's method is the module's without a module.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let device = warp::path!("twins" / PathId / "methods").map(|d: PathId| (d, None));
    let module = warp::path!("twins" / PathId / "modules" / PathId / "methods").map(|d: PathId, m: PathId| (d, Some(m)));
    one_of([
        device.and(warp::post()).and(caller()).and(json_body()).then(invoke).boxed(),
        module.and(warp::post()).and(caller()).and(json_body()).then(invoke).boxed(),
    ])
}

/// How a call ended: the device's answer, or the response IoT Hub gives when the device's side
/// failed (not online, no answer).
pub(super) enum Called {
    Answered { status: i32, payload: Value },
    Failed(Response),
}

/// A call to the direct method `method` of `device` (or its `module`), checked as IoT Hub
/// checks it; shared by `/twins/.../methods` and the digital twin commands.
///
/// # Errors
/// 400 for a bad name or timeout, 413 for a payload over 128 KB, 404 for an identity that is
/// not registered.
pub(super) async fn call(
    ctx: &Context,
    (device, module): (String, Option<String>),
    method: String,
    payload: &Value,
    (response_timeout, connect_timeout): (Option<u64>, Option<u64>),
) -> Result<Called, ApiError> {
    if method.is_empty() || method.len() > 256 {
        return Err(ApiError::argument("methodName must be 1 to 256 characters"));
    }
    let response_timeout = response_timeout.unwrap_or(DEFAULT_RESPONSE_TIMEOUT);
    if !(5..=300).contains(&response_timeout) {
        return Err(ApiError::argument(
            "responseTimeoutInSeconds must be 5 to 300",
        ));
    }
    let connect_timeout = connect_timeout.unwrap_or(0).min(300);
    let payload = serde_json::to_vec(payload).map_err(|e| ApiError::format(e.to_string()))?;
    if payload.len() > MAX_PAYLOAD {
        return Err(ApiError::TooLarge(format!(
            "method payload of {} bytes; at most 128 KB",
            payload.len()
        )));
    }
    // The identity must exist (404 DeviceNotFound otherwise), whatever its connection. A
    // connection that takes methods proves it without a store lookup: it authenticated as
    // the identity, and deleting or disabling an identity kicks its connections once that is
    // stored (a kicked connection takes no calls).
    let who = Identity::new(device.clone(), module.clone());
    if ctx.connections.method_target(&who.client_id()).is_none() {
        let (d, m) = (device, module);
        ctx.store
            .run(move |s| match &m {
                Some(m) => s.get_module(&d, m).map(drop),
                None => s.get_device(&d).map(drop),
            })
            .await?;
    }
    let request = MethodRequest {
        method,
        payload,
        connect_timeout: Duration::from_secs(connect_timeout),
        response_timeout: Duration::from_secs(response_timeout),
    };
    match ctx.call_method(&who, request).await {
        Ok(a) => {
            if a.payload.len() > MAX_PAYLOAD {
                return Err(ApiError::TooLarge(
                    "the device's method response exceeds 128 KB".into(),
                ));
            }
            let payload = if a.payload.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&a.payload).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&a.payload).into_owned())
                })
            };
            Ok(Called::Answered {
                status: a.status,
                payload,
            })
        }
        Err(failure) => {
            let (code, name, message) = failure.iot_hub_error();
            let status = if failure == CallFailure::Timeout {
                StatusCode::GATEWAY_TIMEOUT
            } else {
                StatusCode::NOT_FOUND
            };
            Ok(Called::Failed(error(status, code, name, message)))
        }
    }
}

async fn invoke(
    (device, module): (PathId, Option<PathId>),
    ctx: Context,
    p: Principal,
    c: MethodCall,
) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    let timeouts = (c.response_timeout_in_seconds, c.connect_timeout_in_seconds);
    let target = (device.0, module.map(|m| m.0));
    Ok(
        match call(&ctx, target, c.method_name, &c.payload, timeouts).await? {
            Called::Answered { status, payload } => {
                json(&serde_json::json!({ "status": status, "payload": payload }))
            }
            Called::Failed(response) => response,
        },
    )
}
