//! The HTTPS REST API: every module's route table, the filters every route shares (the
//! authenticated caller, ids in paths, JSON bodies, `If-Match`), [`reply`] (how a handler's
//! result becomes the response) and the one `recover` that turns failures into IoT Hub errors.
//!
//! # Invariants
//! - Every route authenticates before it touches the store, and checks its permission.
//! - Path ids are percent-decoded exactly once, here.

mod backups;
mod c2d;
mod certificates;
mod configurations;
mod digital_twins;
pub mod error;
pub(crate) mod events;
mod files;
mod identities;
pub mod identity_json;
pub mod jobs;
mod methods;
pub(crate) mod provisioning;
mod query;
pub mod reply;
mod routing;
mod routing_targets;
mod scheduled_jobs;
mod statistics;
mod telemetry;
pub mod twins;

use std::str::FromStr;

use ferrohub_engine::model::IfMatch;
use percent_encoding::percent_decode_str;
use serde::de::DeserializeOwned;
use warp::filters::BoxedFilter;
use warp::{Filter, Rejection};

use crate::auth::{AuthError, Principal};
use crate::hub::throttle::{Operation, Throttled};
use crate::hub::{AuthFailure, HubContext};
use crate::ids::DeviceId;
use error::ApiError;
use std::time::Duration;

/// Largest REST body accepted (bulk requests of 100 identities fit easily).
const MAX_BODY_BYTES: u64 = 4 << 20;

/// What every handler may use.
pub type Context = HubContext;

/// An id taken from a path segment, percent-decoded.
#[derive(Debug, Clone)]
pub struct PathId(pub String);

/// The client's address, put into each request's extensions by the HTTPS listener.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

impl FromStr for PathId {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        percent_decode_str(s)
            .decode_utf8()
            .map(|c| PathId(c.into_owned()))
            .map_err(|_| ())
    }
}

async fn authenticate(
    ctx: Context,
    header: Option<String>,
    query: String,
) -> Result<Principal, Rejection> {
    let token = header.or_else(|| url_query_param(&query, "authorization"));
    let result = async {
        let token = token.ok_or(AuthError::Missing)?;
        ctx.auth.service_token(&token).await.map_err(|e| match e {
            AuthFailure::Refused(reason) => ApiError::Unauthorized(reason),
            AuthFailure::Unavailable(e) => ApiError::Storage(e),
        })
    }
    .await;
    result.map_err(warp::reject::custom)
}

fn url_query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.eq_ignore_ascii_case(name).then(|| {
            percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Extracts the authenticated caller (token in `Authorization` or the `authorization` query).
pub fn authenticated(
    ctx: Context,
) -> impl Filter<Extract = (Principal,), Error = Rejection> + Clone {
    warp::header::optional::<String>("authorization")
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and_then(move |header, query| authenticate(ctx.clone(), header, query))
}

/// A JSON body of type `T`: malformed JSON and wrong shapes are distinct 400s.
pub fn json_body<T: DeserializeOwned + Send>(
) -> impl Filter<Extract = (T,), Error = Rejection> + Clone {
    warp::body::content_length_limit(MAX_BODY_BYTES)
        .and(warp::body::bytes())
        .and_then(|bytes: bytes::Bytes| async move {
            let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
                warp::reject::custom(ApiError::format(format!("the body is not valid JSON: {e}")))
            })?;
            serde_json::from_value::<T>(value).map_err(|e| {
                warp::reject::custom(ApiError::format(format!(
                    "the body has the wrong shape: {e}"
                )))
            })
        })
}

/// `If-Match`, quoted or not: `None` when absent; empty or `*` is unconditional.
pub fn if_match() -> impl Filter<Extract = (Option<IfMatch>,), Error = Rejection> + Clone {
    warp::header::optional::<String>("if-match").map(|h: Option<String>| {
        h.map(|raw| {
            let v = raw.trim().trim_start_matches("W/").trim_matches('"');
            if v.is_empty() || v == "*" {
                IfMatch::Any
            } else {
                IfMatch::Etag(v.to_string())
            }
        })
    })
}

/// What every handler gets first: the context, and the caller authenticated from the request.
/// On a cluster follower an authenticated read then waits until the node holds every write
/// acknowledged before it came ([`crate::hub::cluster::Cluster::caught_up_for_read`]), wherever
/// it was written: only once the caller is known, so an anonymous request costs NATS nothing.
pub fn caller(
    ctx: Context,
) -> impl Filter<Extract = (Context, Principal), Error = Rejection> + Clone {
    let with_ctx = {
        let ctx = ctx.clone();
        warp::any().map(move || ctx.clone())
    };
    with_ctx
        .and(authenticated(ctx))
        .and(warp::method())
        .and(warp::path::full())
        .and_then(
            |ctx: Context, p: Principal, method: warp::http::Method, path: warp::path::FullPath| async move {
                if is_read(&method, path.as_str()) {
                    ctx.caught_up_for_read().await;
                }
                Ok::<_, Rejection>((ctx, p))
            },
        )
        .untuple_one()
}

/// Every route of the REST API, module by module, then the one `recover`.
pub fn routes(ctx: Context) -> BoxedFilter<(warp::reply::Response,)> {
    throttle(ctx.clone())
        .and(table(ctx))
        .recover(error::recover)
        .unify()
        .map(not_a_page)
        .boxed()
}

/// No REST answer is ever a page on the hub's origin, whatever content type a sender chose
/// for it (a C2D body read over HTTPS keeps its sender's): browsers neither sniff it nor run
/// it in the origin the web console keeps its key in. Clients of the API ignore both headers.
fn not_a_page(mut response: warp::reply::Response) -> warp::reply::Response {
    use warp::http::HeaderValue;
    let headers = response.headers_mut();
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static("sandbox; default-src 'none'; frame-ancestors 'none'"),
    );
    response
}

/// The operation a request is throttled as (seed 002's table), by method and path.
fn classify(method: &warp::http::Method, path: &str) -> Option<Operation> {
    use warp::http::Method;
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["devices", _, "messages", "deviceBound"] if method == Method::POST => {
            Some(Operation::C2dSend)
        }
        ["devices", _, "messages", "deviceBound", ..] => Some(Operation::C2dReceive),
        ["devices", _, "messages", "events"]
        | ["devices", _, "modules", _, "messages", "events"] => Some(Operation::D2cSend),
        ["devices", _, "files", ..] => None,
        ["devices", "query"] if method == Method::POST => Some(Operation::Query),
        ["twins", _, "methods"] | ["twins", _, "modules", _, "methods"] => Some(Operation::Method),
        ["twins", ..] if method == Method::GET => Some(Operation::TwinRead),
        ["twins", ..] => Some(Operation::TwinUpdate),
        ["digitaltwins", _, "commands", _]
        | ["digitaltwins", _, "components", _, "commands", _] => Some(Operation::Method),
        ["digitaltwins", ..] if method == Method::GET => Some(Operation::TwinRead),
        ["digitaltwins", ..] => Some(Operation::TwinUpdate),
        ["jobs", "v2", "query"] => Some(Operation::Query),
        ["jobs", ..] => Some(Operation::Jobs),
        ["devices", ..] | ["statistics", "devices"] | ["configurations", ..] => {
            Some(Operation::Registry)
        }
        _ => None,
    }
}

/// Whether an operation's messages count against the daily quota (IoT Hub meters messages,
/// twin operations and method calls).
fn metered(op: Operation) -> bool {
    matches!(
        op,
        Operation::D2cSend
            | Operation::C2dSend
            | Operation::TwinRead
            | Operation::TwinUpdate
            | Operation::Method
    )
}

/// Admits the request under its operation's throttle (D2C sends under the device's fair
/// share), or refuses it with 429 and Retry-After; then counts a metered request against the
/// daily quota (403 IotHubQuotaExceeded when used up).
fn throttle(ctx: Context) -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::method()
        .and(warp::path::full())
        .and(warp::header::optional::<u64>("content-length"))
        .and_then(
            move |method: warp::http::Method, path: warp::path::FullPath, length: Option<u64>| {
                let ctx = ctx.clone();
                async move {
                    let Some(op) = classify(&method, path.as_str()) else {
                        return Ok(());
                    };
                    let throttles = &ctx.throttles;
                    let admitted = if op == Operation::D2cSend {
                        let device = path.as_str().trim_matches('/').split('/').nth(1);
                        let device = DeviceId::new(device.unwrap_or_default());
                        throttles
                            .d2c
                            .admit(&device, &mut Default::default(), Duration::ZERO)
                            .await
                            .map(drop)
                            .map_err(|r| Throttled {
                                operation: op,
                                retry_after: r.retry_after(),
                            })
                    } else {
                        throttles.admit(op).await
                    };
                    admitted.map_err(|t| warp::reject::custom(ApiError::Throttled(t)))?;
                    if metered(op) {
                        let bytes = length.unwrap_or(0) as usize;
                        throttles
                            .quota
                            .charge(ctx.clock.now(), bytes)
                            .map_err(|q| warp::reject::custom(ApiError::QuotaExceeded(q)))?;
                    }
                    Ok::<(), Rejection>(())
                }
            },
        )
        .untuple_one()
}

/// The requests that read the registry, twins, jobs or enrollments: GETs and HEADs, and the
/// POSTs that only read (the queries: `/devices/query`, the provisioning service's
/// `/enrollments/query`, `/enrollmentGroups/query`, `/registrations/{id}/query`). Not the
/// message paths: the read API's long polls (`/events/...`, `/endpoints/...`) and a device's
/// C2D and feedback receives (`.../messages/deviceBound`, `.../messages/serviceBound`), which
/// are writes (a lock) made on the writer anyway.
fn is_read(method: &warp::http::Method, path: &str) -> bool {
    use warp::http::Method;
    let message_path = path.starts_with("/events/")
        || path.starts_with("/endpoints/")
        || path.contains("/messages/deviceBound")
        || path.contains("/messages/serviceBound");
    !message_path
        && (method == Method::GET
            || method == Method::HEAD
            || (method == Method::POST && path.trim_end_matches('/').ends_with("/query")))
}

fn table(ctx: Context) -> BoxedFilter<(warp::reply::Response,)> {
    reply::first_of([
        query::routes(ctx.clone()),
        identities::routes(ctx.clone()),
        statistics::routes(ctx.clone()),
        backups::routes(ctx.clone()),
        telemetry::routes(ctx.clone()),
        events::routes(ctx.clone()),
        certificates::routes(ctx.clone()),
        twins::routes(ctx.clone()),
        methods::routes(ctx.clone()),
        digital_twins::routes(ctx.clone()),
        c2d::routes(ctx.clone()),
        scheduled_jobs::routes(ctx.clone()),
        configurations::routes(ctx.clone()),
        jobs::routes(ctx.clone()),
        files::routes(ctx.clone()),
        provisioning::routes(ctx.clone()),
        routing::routes(ctx),
    ])
    .boxed()
}
