//! The routing REST API (EVT-5, EVT-6), documented in `docs/routing.md`. Changes apply at
//! once: the new configuration is compiled and checked, stored, then swapped in.
//!
//! - `GET /routing` (RegistryRead): routes, fallback, enrichments, endpoints.
//! - `PUT|DELETE /routing/routes/{name}`, `PUT /routing/fallback`,
//!   `PUT|DELETE /routing/enrichments/{key}`, `PUT|DELETE /routing/endpoints/{name}`
//!   (RegistryWrite).
//! - `PUT|DELETE /routing/endpoints/{name}/{webhook|nats|mqtt|storageContainer}` (RegistryWrite): where a custom
//!   endpoint's events are delivered outside the hub; `GET /routing/endpointsHealth`
//!   (RegistryRead): how those deliveries fare, as IoT Hub's `routingEndpointsHealth`.

use ferrohub_engine::endpoints::{Endpoint, BUILTIN_ENDPOINT};
use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::notifications::EventSource;
use ferrohub_engine::routing::{Enrichment, Route, RoutingConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::error::ApiError;
use super::reply::{json, json_with_status, no_content, one_of, Handled, Response};
use super::routing_targets::{TargetJson, KINDS};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::calls::{
    ChangeRouting, CreateEndpoint, DeleteEndpoint, EndpointsHealth, RemoveEndpointTarget,
    RoutingEdit, SetEndpointDelivery,
};
use crate::hub::twin_rows::format_time;
use crate::routing::RouteError;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RouteJson {
    #[serde(default)]
    name: String,
    source: String,
    #[serde(default = "true_condition")]
    condition: String,
    endpoint_names: Vec<String>,
    #[serde(default = "yes")]
    is_enabled: bool,
}

fn true_condition() -> String {
    "true".into()
}

fn yes() -> bool {
    true
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnrichmentJson {
    #[serde(default)]
    key: String,
    value: String,
    endpoint_names: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FallbackJson {
    is_enabled: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EndpointJson {
    #[serde(default)]
    name: String,
    partition_count: u16,
    /// Where the endpoint's events are delivered outside the hub (at most one).
    #[serde(flatten)]
    target: TargetJson,
}

fn endpoint_json(e: &Endpoint, with_key: bool) -> EndpointJson {
    EndpointJson {
        name: e.name.clone(),
        partition_count: e.slot.partitions,
        target: TargetJson::shown(e.delivery.as_ref(), with_key),
    }
}

fn route_json(r: &Route) -> RouteJson {
    RouteJson {
        name: r.name.clone(),
        source: r.source.name().into(),
        condition: r.condition.clone(),
        endpoint_names: r.endpoints.clone(),
        is_enabled: r.enabled,
    }
}

fn enrichment_json(e: &Enrichment) -> EnrichmentJson {
    EnrichmentJson {
        key: e.key.clone(),
        value: e.value.clone(),
        endpoint_names: e.endpoints.clone(),
    }
}

/// The built-in endpoint, then every custom one, as the stored slots say now.
fn endpoints_json(store: &ferrohub_engine::Store) -> Vec<EndpointJson> {
    let builtin = store
        .endpoint_slot(BUILTIN_ENDPOINT)
        .map_or(0, |s| s.partitions);
    let mut endpoints = vec![EndpointJson {
        name: BUILTIN_ENDPOINT.into(),
        partition_count: builtin,
        target: TargetJson::default(),
    }];
    endpoints.extend(
        store
            .list_endpoints()
            .iter()
            .map(|e| endpoint_json(e, false)),
    );
    endpoints
}

fn config_json(c: &RoutingConfig, endpoints: Vec<EndpointJson>) -> serde_json::Value {
    serde_json::json!({
        "routes": c.routes.iter().map(route_json).collect::<Vec<_>>(),
        "fallbackRoute": FallbackJson { is_enabled: c.fallback_enabled },
        "enrichments": c.enrichments.iter().map(enrichment_json).collect::<Vec<_>>(),
        "endpoints": endpoints,
    })
}

/// Makes one change of the stored configuration (on the writer, which compiles, stores and
/// installs it: see `hub::calls::ChangeRouting`).
async fn change(ctx: &Context, edit: RoutingEdit) -> Result<RoutingConfig, ApiError> {
    Ok(ctx.write(ChangeRouting { edit }).await?)
}

fn authorise(p: &Principal, write: bool) -> Result<(), ApiError> {
    Ok(p.require_hub(if write {
        Permission::RegistryWrite
    } else {
        Permission::RegistryRead
    })?)
}

/// The routing API's route table: path, method, inputs, handler. Routes and enrichments are
/// both named items of a list in the configuration, so they share their handlers.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let route = || warp::path!("routing" / "routes" / PathId);
    let enrichment = || warp::path!("routing" / "enrichments" / PathId);
    let endpoint = || warp::path!("routing" / "endpoints" / PathId);
    let target = || warp::path!("routing" / "endpoints" / PathId / String);
    one_of([
        warp::path!("routing").and(warp::get()).and(caller()).then(get_handler).boxed(),
        route().and(warp::put()).and(caller()).and(json_body()).then(put_item_handler::<Route>).boxed(),
        route().and(warp::delete()).and(caller()).then(delete_item_handler::<Route>).boxed(),
        warp::path!("routing" / "fallback").and(warp::put()).and(caller()).and(json_body()).then(put_fallback_handler).boxed(),
        enrichment().and(warp::put()).and(caller()).and(json_body()).then(put_item_handler::<Enrichment>).boxed(),
        enrichment().and(warp::delete()).and(caller()).then(delete_item_handler::<Enrichment>).boxed(),
        endpoint().and(warp::put()).and(caller()).and(json_body()).then(put_endpoint_handler).boxed(),
        endpoint().and(warp::delete()).and(caller()).then(delete_endpoint_handler).boxed(),
        target().and(warp::put()).and(caller()).and(json_body()).then(put_target_handler).boxed(),
        target().and(warp::delete()).and(caller()).then(delete_target_handler).boxed(),
        warp::path!("routing" / "endpointsHealth").and(warp::get()).and(caller()).then(health_handler).boxed(),
    ])
}

/// A named item of one of the configuration's lists (routes, enrichments): what the shared
/// handlers need to add, replace or remove one.
trait ListItem: Sized + Send + 'static {
    /// The edit that adds it, or replaces the item of its name.
    fn put(self) -> RoutingEdit;
    /// The edit that removes the item called `name`.
    fn delete(name: String) -> RoutingEdit;
    /// Its JSON shape, both ways.
    type Json: Serialize + DeserializeOwned + Send;
    fn to_json(&self) -> Self::Json;
    /// The item a `PUT` asks for; the path names it (a name in the body is ignored).
    fn from_json(name: String, body: Self::Json) -> Result<Self, ApiError>;
}

impl ListItem for Route {
    fn put(self) -> RoutingEdit {
        RoutingEdit::PutRoute(self)
    }
    fn delete(name: String) -> RoutingEdit {
        RoutingEdit::DeleteRoute(name)
    }
    type Json = RouteJson;
    fn to_json(&self) -> RouteJson {
        route_json(self)
    }
    fn from_json(name: String, body: RouteJson) -> Result<Self, ApiError> {
        let source = EventSource::parse(&body.source).ok_or_else(|| {
            ApiError::argument(format!(
                "source {:?} is not DeviceMessages, TwinChangeEvents, DeviceLifecycleEvents, DeviceConnectionStateEvents or DigitalTwinChangeEvents",
                body.source
            ))
        })?;
        Ok(Route {
            name,
            source,
            condition: body.condition,
            endpoints: body.endpoint_names,
            enabled: body.is_enabled,
        })
    }
}

impl ListItem for Enrichment {
    fn put(self) -> RoutingEdit {
        RoutingEdit::PutEnrichment(self)
    }
    fn delete(name: String) -> RoutingEdit {
        RoutingEdit::DeleteEnrichment(name)
    }
    type Json = EnrichmentJson;
    fn from_json(key: String, body: EnrichmentJson) -> Result<Self, ApiError> {
        Ok(Enrichment {
            key,
            value: body.value,
            endpoints: body.endpoint_names,
        })
    }
    fn to_json(&self) -> EnrichmentJson {
        enrichment_json(self)
    }
}

async fn get_handler(ctx: Context, p: Principal) -> Handled {
    authorise(&p, false)?;
    let (c, endpoints) = ctx
        .store
        .run(|s| Ok::<_, RouteError>((s.routing_config()?, endpoints_json(s))))
        .await?;
    Ok(json(&config_json(&c, endpoints)))
}

/// Adds the item the path names, or replaces the one of that name; answers with it.
async fn put_item_handler<T: ListItem>(
    path: PathId,
    ctx: Context,
    p: Principal,
    body: T::Json,
) -> Handled {
    authorise(&p, true)?;
    let item = T::from_json(path.0, body)?;
    let answer = item.to_json();
    change(&ctx, item.put()).await?;
    Ok(json(&answer))
}

/// Removes the item the path names; 404 when there is none.
async fn delete_item_handler<T: ListItem>(path: PathId, ctx: Context, p: Principal) -> Handled {
    authorise(&p, true)?;
    change(&ctx, T::delete(path.0)).await?;
    Ok(no_content())
}

async fn put_fallback_handler(ctx: Context, p: Principal, body: FallbackJson) -> Handled {
    authorise(&p, true)?;
    let on = body.is_enabled;
    change(&ctx, RoutingEdit::Fallback(on)).await?;
    Ok(json(&FallbackJson { is_enabled: on }))
}

async fn put_endpoint_handler(
    name: PathId,
    ctx: Context,
    p: Principal,
    body: EndpointJson,
) -> Handled {
    authorise(&p, true)?;
    let call = CreateEndpoint {
        name: name.0.clone(),
        partitions: body.partition_count,
        delivery: body.target.checked_target()?,
        now: ctx.clock.now(),
    };
    let e = ctx.write(call).await?;
    Ok(json_with_status(
        &endpoint_json(&e, true),
        StatusCode::CREATED,
    ))
}

/// `webhook`, `nats`, `mqtt` or `storageContainer`, as the path names it; 404 for anything
/// else.
fn target_kind(kind: &str) -> Result<&'static str, ApiError> {
    KINDS.into_iter().find(|k| *k == kind).ok_or_else(|| {
        ApiError::NotFound(format!(
            "/routing/endpoints/{{name}}/{kind}: not a target kind (webhook, nats, mqtt, storageContainer)"
        ))
    })
}

/// Sets where an existing endpoint's events are delivered (replacing any target it had);
/// its events stay.
async fn put_target_handler(
    name: PathId,
    kind: String,
    ctx: Context,
    p: Principal,
    body: serde_json::Value,
) -> Handled {
    authorise(&p, true)?;
    let kind = target_kind(&kind)?;
    let call = SetEndpointDelivery {
        name: name.0,
        delivery: TargetJson::of_kind(kind, body)?.checked_target()?,
    };
    let e = ctx.write(call).await?;
    Ok(json(&endpoint_json(&e, true)))
}

/// Removes the endpoint's target when it is of the kind the path names (404 otherwise); the
/// endpoint and its events stay.
async fn delete_target_handler(name: PathId, kind: String, ctx: Context, p: Principal) -> Handled {
    authorise(&p, true)?;
    let kind = target_kind(&kind)?;
    let removed = ctx
        .write(RemoveEndpointTarget {
            name: name.0.clone(),
            kind: kind.to_string(),
        })
        .await?;
    if !removed {
        return Err(ApiError::NotFound(format!(
            "endpoint {} has no {kind} target",
            name.0
        )));
    }
    Ok(no_content())
}

/// IoT Hub's `routingEndpointsHealth`: each endpoint outside the hub with its health, as the
/// node that delivers (the writer) sees it.
async fn health_handler(ctx: Context, p: Principal) -> Handled {
    authorise(&p, false)?;
    let time = |t: Option<UnixMillis>| t.map(|t| format_time(Some(t)));
    let value: Vec<serde_json::Value> = ctx
        .write(EndpointsHealth {})
        .await?
        .into_iter()
        .map(|h| {
            serde_json::json!({
                "endpointId": h.endpoint,
                "healthStatus": h.status,
                "lastKnownError": h.last_known_error,
                "lastKnownErrorTime": time(h.last_known_error_time),
                "lastSuccessfulSendAttemptTime": time(h.last_successful_send_attempt_time),
                "lastSendAttemptTime": time(h.last_send_attempt_time),
            })
        })
        .collect();
    Ok(json(&serde_json::json!({ "value": value })))
}

async fn delete_endpoint_handler(name: PathId, ctx: Context, p: Principal) -> Handled {
    authorise(&p, true)?;
    ctx.write(DeleteEndpoint { name: name.0 }).await?;
    Ok(no_content())
}
