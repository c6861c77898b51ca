//! C2D over HTTPS: the service side (send, purge, feedback; C2D-1, C2D-5) and the device side
//! (receive, complete, reject, abandon; HDV-2). Lock tokens travel in `ETag` and in paths.
//!
//! # Invariants
//! - A send is answered 204 only once the message is durable in the device's queue; a full
//!   queue (403004) or unknown device (404001) changes nothing.
//! - Every state change wakes whoever must act on it: the device's MQTT connection after a
//!   send or abandon, the deadline tasks after a new lock or expiry.

use bytes::Bytes;
use ferrohub_engine::c2d::{
    C2dMessage, Delivered, FeedbackMessage, Sent, Settle, Settled, TimerKind,
};
use ferrohub_engine::model::Status;
use ferrohub_engine::UnixMillis;
use serde::Serialize;
use warp::http::{HeaderMap, HeaderValue, Response, StatusCode};
use warp::{Filter, Rejection, Reply};

use super::error::ApiError;
use super::{authenticated, Context, PathId};
use crate::auth::{AuthError, Permission, Principal};
use crate::c2d_message::{self, MAX_C2D_BYTES};

const FEEDBACK_CONTENT_TYPE: &str = "application/vnd.microsoft.iothub.feedback.json";

type Reply_ = Result<warp::reply::Response, Rejection>;

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

pub fn routes(
    ctx: Context,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Rejection> + Clone {
    let queue = warp::path("devices")
        .and(warp::path::param::<PathId>())
        .and(warp::path("messages"))
        .and(device_bound());
    let c = ctx.clone();
    let send = queue
        .clone()
        .and(warp::path::end())
        .and(warp::post())
        .and(authenticated(ctx.clone()))
        .and(warp::header::headers_cloned())
        // Read well past the limit so an oversized message gets a 413 body, not a reset.
        .and(warp::body::content_length_limit(super::MAX_BODY_BYTES))
        .and(warp::body::bytes())
        .and_then(move |id: PathId, p, h, b| send(c.clone(), id.0, p, h, b));
    let c = ctx.clone();
    let receive = queue
        .clone()
        .and(warp::path::end())
        .and(warp::get())
        .and(authenticated(ctx.clone()))
        .and_then(move |id: PathId, p| receive(c.clone(), id.0, p));
    let c = ctx.clone();
    let complete = queue
        .clone()
        .and(warp::path::param::<PathId>())
        .and(warp::path::end())
        .and(warp::delete())
        .and(authenticated(ctx.clone()))
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and_then(move |id: PathId, token: PathId, p, q: String| {
            let reject = q
                .split('&')
                .any(|kv| kv == "reject" || kv.starts_with("reject="));
            let action = if reject {
                Settle::Reject
            } else {
                Settle::Complete
            };
            settle(c.clone(), id.0, token.0, p, action)
        });
    let c = ctx.clone();
    let abandon = queue
        .and(warp::path::param::<PathId>())
        .and(warp::path("abandon"))
        .and(warp::path::end())
        .and(warp::post())
        .and(authenticated(ctx.clone()))
        .and_then(move |id: PathId, token: PathId, p| {
            settle(c.clone(), id.0, token.0, p, Settle::Abandon)
        });
    let c = ctx.clone();
    let purge = warp::path!("devices" / PathId / "commands")
        .and(warp::delete())
        .and(authenticated(ctx.clone()))
        .and_then(move |id: PathId, p| purge(c.clone(), id.0, p));
    let c = ctx.clone();
    let feedback_receive = feedback_path()
        .and(warp::path::end())
        .and(warp::get())
        .and(authenticated(ctx.clone()))
        .and_then(move |p| receive_feedback(c.clone(), p));
    let c = ctx.clone();
    let feedback_complete = feedback_path()
        .and(warp::path::param::<PathId>())
        .and(warp::path::end())
        .and(warp::delete())
        .and(authenticated(ctx.clone()))
        .and_then(move |token: PathId, p| settle_feedback(c.clone(), token.0, p, Settle::Complete));
    let c = ctx.clone();
    let feedback_abandon = feedback_path()
        .and(warp::path::param::<PathId>())
        .and(warp::path("abandon"))
        .and(warp::path::end())
        .and(warp::post())
        .and(authenticated(ctx))
        .and_then(move |token: PathId, p| settle_feedback(c.clone(), token.0, p, Settle::Abandon));
    send.or(receive)
        .unify()
        .or(complete)
        .unify()
        .or(abandon)
        .unify()
        .or(purge)
        .unify()
        .or(feedback_receive)
        .unify()
        .or(feedback_complete)
        .unify()
        .or(feedback_abandon)
        .unify()
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
    let size = message.body.len()
        + message
            .properties
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    if size > MAX_C2D_BYTES {
        return Err(ApiError::TooLarge(format!(
            "the message is {size} bytes with its properties; at most {MAX_C2D_BYTES}"
        )));
    }
    Ok(message)
}

async fn send(
    ctx: Context,
    device_id: String,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> Reply_ {
    let result = async {
        p.require_hub(Permission::ServiceConnect)?;
        let message = message_from(&headers, body)?;
        let (settings, id, at) = (ctx.c2d.settings, device_id.clone(), ctx.clock.now());
        let sent: Sent = ctx
            .store
            .run(move |s| s.send_c2d(&id, message, at, &settings))
            .await?;
        ctx.c2d.scheduled(TimerKind::Expiry, sent.expiry);
        ctx.connections.wake_c2d(&device_id);
        Ok::<_, ApiError>(no_content())
    }
    .await;
    result.map_err(warp::reject::custom)
}

async fn purge(ctx: Context, device_id: String, p: Principal) -> Reply_ {
    let result = async {
        p.require_hub(Permission::ServiceConnect)?;
        let id = device_id.clone();
        let purged = ctx
            .store
            .run(move |s| {
                s.get_device(&id)?;
                s.purge_c2d(&id).map_err(ApiError::from)
            })
            .await?;
        Ok::<_, ApiError>(super::json_reply(&serde_json::json!({
            "totalMessagesPurged": purged,
            "deviceId": device_id,
            "moduleId": null,
        })))
    }
    .await;
    result.map_err(warp::reject::custom)
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
    Ok(())
}

async fn receive(ctx: Context, device_id: String, p: Principal) -> Reply_ {
    let result = async {
        authorise_device(&ctx, &p, &device_id).await?;
        let (settings, id, at) = (ctx.c2d.settings, device_id.clone(), ctx.clock.now());
        let mut got = ctx
            .store
            .run(move |s| s.receive_c2d(&id, 1, at, &settings))
            .await?;
        let Some(d) = got.pop() else {
            return Ok(no_content());
        };
        ctx.c2d
            .scheduled(TimerKind::Lock, UnixMillis(at.0 + settings.lock_timeout_ms));
        Ok::<_, ApiError>(delivered_response(&device_id, d))
    }
    .await;
    result.map_err(warp::reject::custom)
}

fn delivered_response(device_id: &str, d: Delivered) -> warp::reply::Response {
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

async fn settle(
    ctx: Context,
    device_id: String,
    token: String,
    p: Principal,
    action: Settle,
) -> Reply_ {
    let result = async {
        authorise_device(&ctx, &p, &device_id).await?;
        let (settings, id, at) = (ctx.c2d.settings, device_id.clone(), ctx.clock.now());
        let settled = ctx
            .store
            .run(move |s| s.settle_c2d(&id, &token, action, at, &settings))
            .await?;
        if settled == Settled::Requeued {
            ctx.connections.wake_c2d(&device_id);
        }
        Ok::<_, ApiError>(no_content())
    }
    .await;
    result.map_err(warp::reject::custom)
}

/// One record as seed 002 shows it, fields in its order.
#[derive(Serialize)]
struct FeedbackJson {
    #[serde(rename = "OriginalMessageId")]
    original_message_id: Option<String>,
    #[serde(rename = "EnqueuedTimeUtc")]
    enqueued_time_utc: String,
    #[serde(rename = "StatusCode")]
    status_code: u8,
    #[serde(rename = "Description")]
    description: &'static str,
    #[serde(rename = "DeviceId")]
    device_id: String,
    #[serde(rename = "DeviceGenerationId")]
    device_generation_id: String,
}

async fn receive_feedback(ctx: Context, p: Principal) -> Reply_ {
    let result = async {
        p.require_hub(Permission::ServiceConnect)?;
        let (settings, at) = (ctx.c2d.settings, ctx.clock.now());
        let got: Option<FeedbackMessage> = ctx
            .store
            .run(move |s| s.receive_feedback(at, &settings))
            .await?;
        let Some(f) = got else {
            return Ok(no_content());
        };
        ctx.c2d
            .scheduled(TimerKind::Lock, UnixMillis(at.0 + settings.lock_timeout_ms));
        ctx.c2d.scheduled(
            TimerKind::Expiry,
            UnixMillis(f.enqueued.0 + settings.feedback_ttl_ms),
        );
        let body: Vec<FeedbackJson> = f
            .records
            .iter()
            .map(|r| FeedbackJson {
                original_message_id: r.original_message_id.clone(),
                enqueued_time_utc: c2d_message::iso(r.enqueued_time),
                status_code: r.status.code(),
                description: r.status.description(),
                device_id: r.device_id.clone(),
                device_generation_id: r.device_generation_id.clone(),
            })
            .collect();
        let json = serde_json::to_vec(&body).map_err(|e| ApiError::format(e.to_string()))?;
        let mut response = Response::new(json.into());
        let h = response.headers_mut();
        let mut set = |k: &'static str, v: String| {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        };
        set("content-type", FEEDBACK_CONTENT_TYPE.into());
        set("etag", format!("\"{}\"", f.lock_token));
        set("iothub-enqueuedtime", c2d_message::iso(f.enqueued));
        set("iothub-deliverycount", f.delivery_count.to_string());
        set("iothub-sequencenumber", f.sequence.to_string());
        set("iothub-userid", ctx.settings.hub_name.clone());
        Ok::<_, ApiError>(response)
    }
    .await;
    result.map_err(warp::reject::custom)
}

async fn settle_feedback(ctx: Context, token: String, p: Principal, action: Settle) -> Reply_ {
    let result = async {
        p.require_hub(Permission::ServiceConnect)?;
        let (settings, at) = (ctx.c2d.settings, ctx.clock.now());
        ctx.store
            .run(move |s| s.settle_feedback(&token, action, at, &settings))
            .await?;
        Ok::<_, ApiError>(no_content())
    }
    .await;
    result.map_err(warp::reject::custom)
}

fn no_content() -> warp::reply::Response {
    warp::reply::with_status(warp::reply(), StatusCode::NO_CONTENT).into_response()
}
