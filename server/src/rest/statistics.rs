//! `GET /statistics/devices` (RegistryRead) and `GET /statistics/service` (ServiceConnect).

use warp::filters::BoxedFilter;
use warp::Filter;

use super::reply::{json, one_of, Handled, Response};
use super::{caller, Context};
use crate::auth::{Permission, Principal};

/// The statistics route table.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    one_of([
        warp::path!("statistics" / "devices").and(warp::get()).and(caller()).then(registry_statistics_handler).boxed(),
        warp::path!("statistics" / "service").and(warp::get()).and(caller()).then(service_statistics_handler).boxed(),
    ])
}

async fn registry_statistics_handler(ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let s = ctx.store.run(|s| s.registry_statistics()).await?;
    Ok(json(&serde_json::json!({
        "totalDeviceCount": s.total_device_count,
        "enabledDeviceCount": s.enabled_device_count,
        "disabledDeviceCount": s.disabled_device_count,
    })))
}

async fn service_statistics_handler(ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    Ok(json(
        &serde_json::json!({ "connectedDeviceCount": connected_devices(&ctx).await }),
    ))
}

/// Devices connected now: to this node, or in a cluster to every node that answers.
async fn connected_devices(ctx: &Context) -> u64 {
    match &ctx.live {
        Some(live) => match live.connected_devices_everywhere().await {
            Some(n) => n,
            None => ctx.connections.connected_devices(),
        },
        None => ctx.connections.connected_devices(),
    }
}
