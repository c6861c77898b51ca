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
use serde::{Deserialize, Serialize};
use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

use super::error::ApiError;
use super::{authenticated, json_body, json_reply, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::routes::compile_stored;
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
        "enrichments": c.enrichments.iter().map(|e| EnrichmentJson {
            key: e.key.clone(), value: e.value.clone(), endpoint_names: e.endpoints.clone(),
        }).collect::<Vec<_>>(),
        "endpoints": endpoints,
    })
}

/// Edits the stored configuration, refusing any result that does not compile, and installs it.
async fn change(
    ctx: &Context,
    edit: impl FnOnce(&mut RoutingConfig) -> Result<(), RouteError> + Send + 'static,
) -> Result<RoutingConfig, ApiError> {
    let router = std::sync::Arc::clone(&ctx.routing);
    let config = ctx
        .store
        .run(move |s| {
            // Store and install under one lock: the live table is always the stored one's.
            let _order = router.lock_changes();
            let mut compiled = None;
            let config = s.update_routing_config(|cfg| {
                edit(cfg)?;
                compiled = Some(compile_stored(cfg, s)?);
                Ok::<_, RouteError>(())
            })?;
            if let Some(table) = compiled {
                router.install(table);
            }
            Ok::<_, RouteError>(config)
        })
        .await?;
    Ok(config)
}

fn authorise(p: &Principal, write: bool) -> Result<(), ApiError> {
    Ok(p.require_hub(if write {
        Permission::RegistryWrite
    } else {
        Permission::RegistryRead
    })?)
}

type Response = warp::reply::Response;

fn reply(r: Result<Response, ApiError>) -> Result<Response, Rejection> {
    r.map_err(warp::reject::custom)
}

pub fn routes(ctx: Context) -> impl Filter<Extract = (Response,), Error = Rejection> + Clone {
    let auth = authenticated(ctx.clone());
    let with_ctx = warp::any().map(move || ctx.clone());
    let get = warp::path!("routing")
        .and(warp::get())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(|ctx: Context, p: Principal| async move {
            reply(
                async {
                    authorise(&p, false)?;
                    let (c, endpoints) = ctx
                        .store
                        .run(|s| Ok::<_, RouteError>((s.routing_config()?, endpoints_json(s))))
                        .await?;
                    Ok(json_reply(&config_json(&c, endpoints)))
                }
                .await,
            )
        });
    let put_route = warp::path!("routing" / "routes" / PathId)
        .and(warp::put())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(json_body::<RouteJson>())
        .and_then(|name: PathId, ctx: Context, p: Principal, body: RouteJson| async move {
            reply(
                async {
                    authorise(&p, true)?;
                    let source = EventSource::parse(&body.source).ok_or_else(|| {
                        ApiError::argument(format!(
                            "source {:?} is not DeviceMessages, TwinChangeEvents, DeviceLifecycleEvents or DeviceConnectionStateEvents",
                            body.source
                        ))
                    })?;
                    let route = Route {
                        name: name.0.clone(),
                        source,
                        condition: body.condition,
                        endpoints: body.endpoint_names,
                        enabled: body.is_enabled,
                    };
                    let answer = route_json(&route);
                    change(&ctx, move |cfg| {
                        match cfg.routes.iter_mut().find(|r| r.name == route.name) {
                            Some(existing) => *existing = route,
                            None => cfg.routes.push(route),
                        }
                        Ok(())
                    })
                    .await?;
                    Ok(json_reply(&answer))
                }
                .await,
            )
        });
    let delete_route = warp::path!("routing" / "routes" / PathId)
        .and(warp::delete())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(|name: PathId, ctx: Context, p: Principal| async move {
            reply(
                async {
                    authorise(&p, true)?;
                    let missing = name.0.clone();
                    change(&ctx, move |cfg| {
                        let before = cfg.routes.len();
                        cfg.routes.retain(|r| r.name != name.0);
                        if cfg.routes.len() == before {
                            return Err(RouteError::NotFound(format!("route {missing}")));
                        }
                        Ok(())
                    })
                    .await?;
                    Ok(no_content())
                }
                .await,
            )
        });
    let put_fallback = warp::path!("routing" / "fallback")
        .and(warp::put())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(json_body::<FallbackJson>())
        .and_then(
            |ctx: Context, p: Principal, body: FallbackJson| async move {
                reply(
                    async {
                        authorise(&p, true)?;
                        let on = body.is_enabled;
                        change(&ctx, move |cfg| {
                            cfg.fallback_enabled = on;
                            Ok(())
                        })
                        .await?;
                        Ok(json_reply(&FallbackJson { is_enabled: on }))
                    }
                    .await,
                )
            },
        );
    let put_enrichment = warp::path!("routing" / "enrichments" / PathId)
        .and(warp::put())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(json_body::<EnrichmentJson>())
        .and_then(
            |key: PathId, ctx: Context, p: Principal, body: EnrichmentJson| async move {
                reply(
                    async {
                        authorise(&p, true)?;
                        let e = Enrichment {
                            key: key.0.clone(),
                            value: body.value,
                            endpoints: body.endpoint_names,
                        };
                        let answer = EnrichmentJson {
                            key: e.key.clone(),
                            value: e.value.clone(),
                            endpoint_names: e.endpoints.clone(),
                        };
                        change(&ctx, move |cfg| {
                            match cfg.enrichments.iter_mut().find(|x| x.key == e.key) {
                                Some(existing) => *existing = e,
                                None => cfg.enrichments.push(e),
                            }
                            Ok(())
                        })
                        .await?;
                        Ok(json_reply(&answer))
                    }
                    .await,
                )
            },
        );
    let delete_enrichment = warp::path!("routing" / "enrichments" / PathId)
        .and(warp::delete())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(|key: PathId, ctx: Context, p: Principal| async move {
            reply(
                async {
                    authorise(&p, true)?;
                    let missing = key.0.clone();
                    change(&ctx, move |cfg| {
                        let before = cfg.enrichments.len();
                        cfg.enrichments.retain(|e| e.key != key.0);
                        if cfg.enrichments.len() == before {
                            return Err(RouteError::NotFound(format!("enrichment {missing}")));
                        }
                        Ok(())
                    })
                    .await?;
                    Ok(no_content())
                }
                .await,
            )
        });
    let put_endpoint = warp::path!("routing" / "endpoints" / PathId)
        .and(warp::put())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(json_body::<EndpointJson>())
        .and_then(
            |name: PathId, ctx: Context, p: Principal, body: EndpointJson| async move {
                reply(
                    async {
                        authorise(&p, true)?;
                        let n = name.0.clone();
                        let at = ctx.clock.now();
                        let e = ctx
                            .store
                            .run(move |s| s.create_endpoint(&n, body.partition_count, at))
                            .await?;
                        Ok(warp::reply::with_status(
                            json_reply(&EndpointJson {
                                name: e.name,
                                partition_count: e.slot.partitions,
                            }),
                            StatusCode::CREATED,
                        )
                        .into_response())
                    }
                    .await,
                )
            },
        );
    let delete_endpoint = warp::path!("routing" / "endpoints" / PathId)
        .and(warp::delete())
        .and(with_ctx)
        .and(auth)
        .and_then(|name: PathId, ctx: Context, p: Principal| async move {
            reply(
                async {
                    authorise(&p, true)?;
                    let n = name.0.clone();
                    ctx.store.run(move |s| s.delete_endpoint(&n)).await?;
                    Ok(no_content())
                }
                .await,
            )
        });
    get.or(put_route)
        .unify()
        .or(delete_route)
        .unify()
        .or(put_fallback)
        .unify()
        .or(put_enrichment)
        .unify()
        .or(delete_enrichment)
        .unify()
        .or(put_endpoint)
        .unify()
        .or(delete_endpoint)
        .unify()
}

fn no_content() -> Response {
    warp::reply::with_status(warp::reply(), StatusCode::NO_CONTENT).into_response()
}
