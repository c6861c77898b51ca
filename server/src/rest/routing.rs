//! The routing REST API (EVT-5, EVT-6), documented in `docs/routing.md`. Changes apply at
//! once: the new configuration is compiled and checked, stored, then swapped in.
//!
//! - `GET /routing` (RegistryRead): routes, fallback, enrichments, endpoints.
//! - `PUT|DELETE /routing/routes/{name}`, `PUT /routing/fallback`,
//!   `PUT|DELETE /routing/enrichments/{key}`, `PUT|DELETE /routing/endpoints/{name}`
//!   (RegistryWrite).

use ferrohub_engine::endpoints::BUILTIN_ENDPOINT;
use ferrohub_engine::notifications::EventSource;
use ferrohub_engine::routing::{Enrichment, Route, RoutingConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::error::ApiError;
use super::reply::{json, json_with_status, no_content, one_of, Handled, Response};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::calls::{ChangeRouting, CreateEndpoint, DeleteEndpoint, RoutingEdit};
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
    }];
    endpoints.extend(store.list_endpoints().into_iter().map(|e| EndpointJson {
        name: e.name,
        partition_count: e.slot.partitions,
    }));
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
    one_of([
        warp::path!("routing").and(warp::get()).and(caller()).then(get_handler).boxed(),
        route().and(warp::put()).and(caller()).and(json_body()).then(put_item_handler::<Route>).boxed(),
        route().and(warp::delete()).and(caller()).then(delete_item_handler::<Route>).boxed(),
        warp::path!("routing" / "fallback").and(warp::put()).and(caller()).and(json_body()).then(put_fallback_handler).boxed(),
        enrichment().and(warp::put()).and(caller()).and(json_body()).then(put_item_handler::<Enrichment>).boxed(),
        enrichment().and(warp::delete()).and(caller()).then(delete_item_handler::<Enrichment>).boxed(),
        endpoint().and(warp::put()).and(caller()).and(json_body()).then(put_endpoint_handler).boxed(),
        endpoint().and(warp::delete()).and(caller()).then(delete_endpoint_handler).boxed(),
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
        now: ctx.clock.now(),
    };
    let e = ctx.write(call).await?;
    let answer = EndpointJson {
        name: e.name,
        partition_count: e.slot.partitions,
    };
    Ok(json_with_status(&answer, StatusCode::CREATED))
}

async fn delete_endpoint_handler(name: PathId, ctx: Context, p: Principal) -> Handled {
    authorise(&p, true)?;
    ctx.write(DeleteEndpoint { name: name.0 }).await?;
    Ok(no_content())
}
