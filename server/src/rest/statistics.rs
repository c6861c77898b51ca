//! `GET /statistics/devices` (RegistryRead) and `GET /statistics/service` (ServiceConnect).

use warp::{Filter, Rejection};

use super::error::ApiError;
use super::{authenticated, json_reply, Context};
use crate::auth::{Permission, Principal};

pub fn routes(
    ctx: Context,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Rejection> + Clone {
    let c = ctx.clone();
    let devices = warp::path!("statistics" / "devices")
        .and(warp::get())
        .and(authenticated(ctx.clone()))
        .and_then(move |p: Principal| registry_statistics_handler(c.clone(), p));
    let c = ctx.clone();
    let service = warp::path!("statistics" / "service")
        .and(warp::get())
        .and(authenticated(ctx))
        .and_then(move |p: Principal| service_statistics_handler(c.clone(), p));
    devices.or(service).unify()
}

async fn registry_statistics_handler(
    ctx: Context,
    p: Principal,
) -> Result<warp::reply::Response, Rejection> {
    let result = async {
        p.require_hub(Permission::RegistryRead)?;
        let s = ctx.store.run(|s| s.registry_statistics()).await?;
        Ok::<_, ApiError>(json_reply(&serde_json::json!({
            "totalDeviceCount": s.total_device_count,
            "enabledDeviceCount": s.enabled_device_count,
            "disabledDeviceCount": s.disabled_device_count,
        })))
    }
    .await;
    result.map_err(warp::reject::custom)
}

async fn service_statistics_handler(
    ctx: Context,
    p: Principal,
) -> Result<warp::reply::Response, Rejection> {
    p.require_hub(Permission::ServiceConnect)
        .map_err(|e| warp::reject::custom(ApiError::from(e)))?;
    Ok(json_reply(
        &serde_json::json!({ "connectedDeviceCount": ctx.connections.connected_devices() }),
    ))
}
