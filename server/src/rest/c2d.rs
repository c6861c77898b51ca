//! C2D over HTTPS: the service side (send, purge, feedback; C2D-1, C2D-5) and the device side
//! (receive, complete, reject, abandon; HDV-2). Lock tokens travel in `ETag` and in paths.
//!
//! # Invariants
//! - A send is answered 204 only once the message is durable in the device's queue; a full
//!   queue (403004) or unknown device (404001) changes nothing.
//! - Every state change wakes whoever must act on it: the device's MQTT connection after a
//!   send or abandon, the deadline tasks after a new lock or expiry.

use bytes::Bytes;
use ferrohub_engine::c2d::{C2dMessage, Delivered, Settle, Settled};
use ferrohub_engine::model::Status;
use warp::filters::BoxedFilter;
use warp::http::{HeaderMap, HeaderValue};
use warp::{Filter, Rejection};

use super::error::ApiError;
use super::reply::{json, no_content, one_of, Handled, Response};
use super::{caller, Context, PathId};
use crate::auth::{AuthError, Permission, Principal};
use crate::c2d_message;
use crate::ids::{DeviceId, LockToken};

/// `deviceBound` as IoT Hub spells it, or all lower case (the SDKs use both).
fn device_bound() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::path("deviceBound")
        .or(warp::path("devicebound"))
        .unify()
}

fn feedback_path() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::path("messages")
        .and(
            warp::path("serviceBound")
                .or(warp::path("servicebound"))
                .unify(),
        )
        .and(warp::path("feedback"))
}

/// `?reject` (with or without a value) turns a completion into a rejection.
fn settle_action() -> impl Filter<Extract = (Settle,), Error = std::convert::Infallible> + Clone {
    let query = warp::query::raw().or(warp::any().map(String::new)).unify();
    query.map(|q: String| {
        let reject = q
            .split('&')
            .any(|kv| kv == "reject" || kv.starts_with("reject="));
        if reject {
            Settle::Reject
        } else {
            Settle::Complete
        }
    })
}

/// The C2D route table: path, method, inputs, handler. Device-side routes take the device's
/// queue path; the service's feedback routes take the hub-wide feedback queue's.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let queue = || warp::path("devices").and(warp::path::param::<PathId>()).and(warp::path("messages")).and(device_bound());
    let lock = || warp::path::param::<PathId>();
    let end = warp::path::end;
    // Read well past the limit so an oversized message gets a 413 body, not a reset.
    let body = warp::body::content_length_limit(super::MAX_BODY_BYTES).and(warp::body::bytes());
    one_of([
        queue().and(end()).and(warp::post()).and(caller()).and(warp::header::headers_cloned()).and(body).then(send).boxed(),
        queue().and(end()).and(warp::get()).and(caller()).then(receive).boxed(),
        queue().and(lock()).and(end()).and(warp::delete()).and(caller()).and(settle_action()).then(settle).boxed(),
        queue().and(lock()).and(warp::path("abandon")).and(end()).and(warp::post()).and(caller()).then(abandon).boxed(),
        warp::path!("devices" / PathId / "commands").and(warp::delete()).and(caller()).then(purge).boxed(),
        feedback_path().and(end()).and(warp::get()).and(caller()).then(receive_feedback).boxed(),
        feedback_path().and(lock()).and(end()).and(warp::delete()).and(caller()).then(complete_feedback).boxed(),
        feedback_path().and(lock()).and(warp::path("abandon")).and(end()).and(warp::post()).and(caller()).then(abandon_feedback).boxed(),
    ])
}

fn header(headers: &HeaderMap, name: &str) -> Result<Option<String>, ApiError> {
    headers
        .get(name)
        .map(|v| {
            v.to_str()
                .map(str::to_string)
                .map_err(|_| ApiError::argument(format!("header {name} is not ASCII")))
        })
        .transpose()
}

/// The message a service send describes (C2D-1).
fn message_from(headers: &HeaderMap, body: Bytes) -> Result<C2dMessage, ApiError> {
    let ack = match header(headers, "iothub-ack")? {
        None => Default::default(),
        Some(a) => c2d_message::parse_ack(&a).ok_or_else(|| {
            ApiError::argument(format!(
                "iothub-ack {a:?} is not none, positive, negative or full"
            ))
        })?,
    };
    let expiry = match header(headers, "iothub-expiry")? {
        None => None,
        Some(e) => Some(c2d_message::parse_iso(&e).ok_or_else(|| {
            ApiError::argument(format!("iothub-expiry {e:?} is not an ISO 8601 time"))
        })?),
    };
    let mut properties = Vec::new();
    for (name, value) in headers {
        if let Some(app) = name.as_str().strip_prefix("iothub-app-") {
            let v = value
                .to_str()
                .map_err(|_| ApiError::argument(format!("header {name} is not ASCII")))?;
            properties.push((app.to_string(), v.to_string()));
        }
    }
    let message = C2dMessage {
        message_id: header(headers, "iothub-messageid")?,
        correlation_id: header(headers, "iothub-correlationid")?,
        user_id: header(headers, "iothub-userid")?,
        ack,
        expiry,
        content_type: header(headers, "content-type")?,
        content_encoding: header(headers, "content-encoding")?,
        properties,
        body: body.to_vec(),
    };
    c2d_message::check_size(&message).map_err(ApiError::TooLarge)?;
    Ok(message)
}

async fn send(
    device: PathId,
    ctx: Context,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> Handled {
    let device_id = DeviceId::new(device.0);
    p.require_hub(Permission::ServiceConnect)?;
    let message = message_from(&headers, body)?;
    ctx.send_c2d(device_id, message).await?;
    Ok(no_content())
}

async fn purge(device: PathId, ctx: Context, p: Principal) -> Handled {
    let device_id = DeviceId::new(device.0);
    p.require_hub(Permission::ServiceConnect)?;
    let purged = ctx
        .write(crate::hub::calls::PurgeC2d {
            device_id: device_id.to_string(),
        })
        .await?;
    Ok(json(&serde_json::json!({
        "totalMessagesPurged": purged,
        "deviceId": device_id.as_str(),
        "moduleId": null,
    })))
}

/// The device may use its own queue; a disabled or unknown device may not.
async fn authorise_device(ctx: &Context, p: &Principal, device_id: &str) -> Result<(), ApiError> {
    super::telemetry::authorise(p, device_id, None)?;
    let id = device_id.to_string();
    let device = ctx.store.run(move |s| s.get_device(&id)).await?;
    if device.status == Status::Disabled {
        return Err(ApiError::Unauthorized(AuthError::Disabled(
            device_id.to_string(),
        )));
    }
    // The device's own C2D requests (receive, settle) are its traffic.
    ctx.note_request_activity(&crate::ids::Identity::for_device(device_id));
    Ok(())
}

async fn receive(device: PathId, ctx: Context, p: Principal) -> Handled {
    let device_id = DeviceId::new(device.0);
    authorise_device(&ctx, &p, &device_id).await?;
    let call = crate::hub::calls::ReceiveC2d {
        device_id: device_id.to_string(),
        max: 1,
        now: ctx.clock.now(),
    };
    let mut got = ctx.write(call).await?;
    let Some(d) = got.pop() else {
        return Ok(no_content());
    };
    Ok(delivered_response(&device_id, d))
}

fn delivered_response(device_id: &str, d: Delivered) -> Response {
    let mut headers: Vec<(String, String)> = vec![
        ("etag".into(), format!("\"{}\"", d.lock_token)),
        ("iothub-sequencenumber".into(), d.sequence.to_string()),
        ("iothub-enqueuedtime".into(), c2d_message::iso(d.enqueued)),
        ("iothub-deliverycount".into(), d.delivery_count.to_string()),
        ("iothub-expiry".into(), c2d_message::iso(d.expiry)),
        (
            "iothub-to".into(),
            format!("/devices/{device_id}/messages/deviceBound"),
        ),
        (
            "iothub-ack".into(),
            c2d_message::ack_name(d.message.ack).into(),
        ),
    ];
    let m = &d.message;
    for (name, value) in [
        ("iothub-messageid", &m.message_id),
        ("iothub-correlationid", &m.correlation_id),
        ("iothub-userid", &m.user_id),
        ("content-type", &m.content_type),
        ("content-encoding", &m.content_encoding),
    ] {
        if let Some(v) = value {
            headers.push((name.into(), v.clone()));
        }
    }
    for (k, v) in &m.properties {
        headers.push((format!("iothub-app-{k}"), v.clone()));
    }
    let mut response = Response::new(d.message.body.into());
    for (k, v) in headers {
        if let (Ok(name), Ok(value)) = (
            warp::http::header::HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

async fn abandon(device: PathId, token: PathId, ctx: Context, p: Principal) -> Handled {
    settle(device, token, ctx, p, Settle::Abandon).await
}

async fn settle(
    device: PathId,
    token: PathId,
    ctx: Context,
    p: Principal,
    action: Settle,
) -> Handled {
    let (device_id, token) = (DeviceId::new(device.0), LockToken::new(token.0));
    authorise_device(&ctx, &p, &device_id).await?;
    let call = crate::hub::calls::SettleC2d {
        device_id: device_id.to_string(),
        lock_token: token.to_string(),
        action,
        now: ctx.clock.now(),
    };
    let settled = ctx.write(call).await?;
    if settled == Settled::Requeued {
        ctx.connections.wake_c2d(&device_id);
    }
    Ok(no_content())
}

async fn receive_feedback(ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    let Some(f) = ctx.receive_feedback().await? else {
        return Ok(no_content());
    };
    let json = c2d_message::feedback_body(&f);
    let mut response = Response::new(json.into());
    let h = response.headers_mut();
    let mut set = |k: &'static str, v: String| {
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    };
    set("content-type", c2d_message::FEEDBACK_CONTENT_TYPE.into());
    set("etag", format!("\"{}\"", f.lock_token));
    set("iothub-enqueuedtime", c2d_message::iso(f.enqueued));
    set("iothub-deliverycount", f.delivery_count.to_string());
    set("iothub-sequencenumber", f.sequence.to_string());
    set("iothub-userid", ctx.settings.hub_name.clone());
    Ok(response)
}

async fn complete_feedback(token: PathId, ctx: Context, p: Principal) -> Handled {
    settle_feedback(token.0, ctx, p, Settle::Complete).await
}

async fn abandon_feedback(token: PathId, ctx: Context, p: Principal) -> Handled {
    settle_feedback(token.0, ctx, p, Settle::Abandon).await
}

async fn settle_feedback(token: String, ctx: Context, p: Principal, action: Settle) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    ctx.settle_feedback(LockToken::new(token), action).await?;
    Ok(no_content())
}
