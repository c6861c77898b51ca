//! The IoT Plug and Play digital twin API (PNP-2), as `azure-iot-hub`'s and `azure-iothub`'s
//! `DigitalTwinClient` call it (api-version 2020-09-30 or 2021-04-12; any is accepted):
//!
//! - `GET /digitaltwins/{id}`: the digital twin (`ferrohub_engine::twin::pnp::view`), 200 with
//!   the twin's etag in `ETag`. ServiceConnect or RegistryRead.
//! - `PATCH /digitaltwins/{id}`: a JSON Patch array, optional `If-Match`; applied as one
//!   desired-properties patch, so the device gets the ordinary desired notification; 202 with
//!   the new `ETag` and a `Location`, no body (both SDKs accept only 202). ServiceConnect.
//! - `POST /digitaltwins/{id}/commands/{cmd}` and
//!   `POST /digitaltwins/{id}/components/{component}/commands/{cmd}`, query
//!   `connectTimeoutInSeconds` / `responseTimeoutInSeconds`: the direct method `cmd` or
//!   `component*cmd`; 200 with the device's payload as the body and its status in
//!   `x-ms-command-statuscode`, and `x-ms-request-id`; the direct-method errors (404 404103
//!   not online, 504 504101 no answer) as for `/twins/{id}/methods`. ServiceConnect.
//!
//! Digital twins are a device's: IoT Hub has no module path for them, and neither does this.

use ferrohub_engine::model::IfMatch;
use serde_json::Value;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Reply};

use super::error::ApiError;
use super::methods::{call, Called};
use super::reply::{json, json_with_etag, one_of, set_etag, Handled, Response};
use super::{caller, if_match, json_body, url_query_param, Context, PathId, MAX_BODY_BYTES};
use crate::auth::{Permission, Principal};
use crate::hub::twin_rows::format_time;

/// The digital twin route table.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let query = || warp::query::raw().or(warp::any().map(String::new)).unify();
    one_of([
        warp::path!("digitaltwins" / PathId).and(warp::get()).and(caller()).then(get_handler).boxed(),
        warp::path!("digitaltwins" / PathId).and(warp::patch()).and(caller()).and(if_match()).and(json_body()).then(patch_handler).boxed(),
        warp::path!("digitaltwins" / PathId / "commands" / PathId)
            .map(|d: PathId, c: PathId| (d, None::<PathId>, c))
            .and(warp::post()).and(caller()).and(query()).and(payload()).then(command_handler).boxed(),
        warp::path!("digitaltwins" / PathId / "components" / PathId / "commands" / PathId)
            .map(|d: PathId, component: PathId, c: PathId| (d, Some(component), c))
            .and(warp::post()).and(caller()).and(query()).and(payload()).then(command_handler).boxed(),
    ])
}

/// A command's payload: any JSON, or nothing (`null`).
fn payload() -> impl Filter<Extract = (Value,), Error = warp::Rejection> + Clone {
    warp::body::content_length_limit(MAX_BODY_BYTES)
        .and(warp::body::bytes())
        .and_then(|bytes: bytes::Bytes| async move {
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Ok(Value::Null);
            }
            serde_json::from_slice(&bytes).map_err(|e| {
                warp::reject::custom(ApiError::format(format!("the body is not valid JSON: {e}")))
            })
        })
}

async fn get_handler(id: PathId, ctx: Context, p: Principal) -> Handled {
    if p.require_hub(Permission::ServiceConnect).is_err() {
        p.require_hub(Permission::RegistryRead)?;
    }
    let (view, twin) = ctx
        .store
        .run(move |s| s.get_digital_twin(&id.0, None, &|t| format_time(Some(t))))
        .await?;
    Ok(json_with_etag(&view, &twin.record.etag))
}

async fn patch_handler(
    id: PathId,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
    body: Value,
) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    let cond = cond.unwrap_or(IfMatch::Any);
    let now = ctx.clock.now();
    let call = crate::hub::calls::PatchDigitalTwin {
        device_id: id.0.clone(),
        patch: body,
        if_match: cond,
        now,
    };
    let outcome = ctx.write(call).await?;
    ctx.push_desired(&outcome);
    let mut response =
        warp::reply::with_status(warp::reply(), StatusCode::ACCEPTED).into_response();
    set_etag(&mut response, &outcome.twin.record.etag);
    let location = format!(
        "/digitaltwins/{}",
        percent_encoding::utf8_percent_encode(&id.0, percent_encoding::NON_ALPHANUMERIC)
    );
    if let Ok(v) = location.parse() {
        response.headers_mut().insert("location", v);
    }
    Ok(response)
}

/// `name` as a timeout query parameter: absent, or a whole number of seconds.
fn timeout(query: &str, name: &str) -> Result<Option<u64>, ApiError> {
    url_query_param(query, name)
        .map(|v| {
            v.trim().parse::<u64>().map_err(|_| {
                ApiError::argument(format!(
                    "{name} must be a whole number of seconds, not {v:?}"
                ))
            })
        })
        .transpose()
}

async fn command_handler(
    (device, component, command): (PathId, Option<PathId>, PathId),
    ctx: Context,
    p: Principal,
    query: String,
    payload: Value,
) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    let response_timeout = timeout(&query, "responseTimeoutInSeconds")?;
    let connect_timeout = timeout(&query, "connectTimeoutInSeconds")?;
    if component
        .as_ref()
        .is_some_and(|c| c.0.is_empty() || c.0.contains('*'))
        || command.0.contains('*')
    {
        return Err(ApiError::argument(
            "component and command names may not be empty or hold '*'",
        ));
    }
    // The Plug and Play convention names a component's command `component*command`.
    let method = match component {
        Some(c) => format!("{}*{}", c.0, command.0),
        None => command.0,
    };
    let called = call(
        &ctx,
        (device.0, None),
        method,
        &payload,
        (response_timeout, connect_timeout),
    )
    .await?;
    Ok(match called {
        Called::Answered { status, payload } => {
            let mut response = json(&payload);
            let headers = response.headers_mut();
            if let Ok(v) = status.to_string().parse() {
                headers.insert("x-ms-command-statuscode", v);
            }
            let request_id = format!("{:032x}", rand::random::<u128>());
            if let Ok(v) = request_id.parse() {
                headers.insert("x-ms-request-id", v);
            }
            response
        }
        Called::Failed(response) => response,
    })
}
