//! Registry endpoints (REG-2, REG-3, REG-5): devices, modules and bulk changes, with the exact
//! success codes the service SDK accepts (`compat` §B2): PUT 200, DELETE 204, bulk 200 or 400.

use ferrohub_engine::identity::{BulkItem, BulkItemError, ImportMode};
use ferrohub_engine::model::{Identity, IfMatch, MAX_BULK_IDENTITIES};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::error::ApiError;
use super::identity_json::{self, BulkItemJson, DeviceJson, IdentityBody, ModuleJson};
use super::reply::{json, json_with_etag, json_with_status, no_content, one_of, Handled, Response};
use super::{caller, if_match, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::calls;
use crate::ids::Identity as ConnectedIdentity;

/// Most devices `GET /devices` returns, as IoT Hub.
const MAX_LIST: usize = 1000;

#[derive(serde::Deserialize)]
struct ListQuery {
    top: Option<usize>,
}

/// An identity's path: the device, and the module when it is a module.
type IdentityPath = (PathId, Option<PathId>);

/// The registry's route table: path, method, what the handler reads, handler. A device is
/// the module routes' identity without a module.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let devices = || warp::path!("devices");
    let device = || warp::path!("devices" / PathId).map(|d: PathId| (d, None));
    let modules = || warp::path!("devices" / PathId / "modules");
    let module = || warp::path!("devices" / PathId / "modules" / PathId).map(|d: PathId, m: PathId| (d, Some(m)));
    one_of([
        device().and(warp::get()).and(caller()).then(get_handler).boxed(),
        device().and(warp::put()).and(caller()).and(if_match()).and(json_body()).then(put_handler).boxed(),
        device().and(warp::delete()).and(caller()).and(if_match()).then(delete_handler).boxed(),
        devices().and(warp::get()).and(warp::query()).and(caller()).then(list_devices_handler).boxed(),
        devices().and(warp::post()).and(caller()).and(json_body()).then(bulk_handler).boxed(),
        modules().and(warp::get()).and(caller()).then(list_modules_handler).boxed(),
        module().and(warp::get()).and(caller()).then(get_handler).boxed(),
        module().and(warp::put()).and(caller()).and(if_match()).and(json_body()).then(put_handler).boxed(),
        module().and(warp::delete()).and(caller()).and(if_match()).then(delete_handler).boxed(),
    ])
}

/// A device as the Device model, a module as the Module model, with the identity's etag.
fn identity_reply(i: &Identity) -> Response {
    match i.module_id {
        None => json_with_etag(&DeviceJson::from(i), &i.etag),
        Some(_) => json_with_etag(&ModuleJson::from(i), &i.etag),
    }
}

/// The device or module a path names: whose connections to close.
fn connected_identity(device: &PathId, module: &Option<PathId>) -> ConnectedIdentity {
    ConnectedIdentity::new(device.0.clone(), module.as_ref().map(|m| m.0.clone()))
}

async fn get_handler((id, module): IdentityPath, ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let i = ctx
        .store
        .run(move |s| match module {
            None => s.get_device(&id.0),
            Some(m) => s.get_module(&id.0, &m.0),
        })
        .await?;
    Ok(identity_reply(&i))
}

async fn list_devices_handler(q: ListQuery, ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let limit = q.top.unwrap_or(MAX_LIST).clamp(1, MAX_LIST);
    let devices = ctx.store.run(move |s| s.list_devices(limit)).await?;
    Ok(json(
        &devices.iter().map(DeviceJson::from).collect::<Vec<_>>(),
    ))
}

async fn list_modules_handler(id: PathId, ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let modules = ctx.store.run(move |s| s.list_modules(&id.0)).await?;
    Ok(json(
        &modules.iter().map(ModuleJson::from).collect::<Vec<_>>(),
    ))
}

/// PUT without `If-Match` creates (409 if the id exists); with `If-Match` it updates. Ids the
/// body names must be the ones in the path.
async fn put_handler(
    (id, module): IdentityPath,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
    body: IdentityBody,
) -> Handled {
    p.require_hub(Permission::RegistryWrite)?;
    let mut named = vec![("deviceId", &body.device_id, &id)];
    if let Some(m) = &module {
        named.push(("moduleId", &body.module_id, m));
    }
    for (field, given, path) in named {
        if let Some(g) = given {
            if g != &path.0 {
                return Err(ApiError::argument(format!(
                    "{field} {g:?} in the body does not match {:?} in the path",
                    path.0
                )));
            }
        }
    }
    let spec = body.to_spec()?;
    let now = ctx.clock.now();
    let device_id = id.0;
    let i = match (module, cond) {
        (None, None) => {
            ctx.write(calls::CreateDevice {
                device_id,
                spec,
                now,
            })
            .await
        }
        (None, Some(if_match)) => {
            let call = calls::UpdateDevice {
                device_id,
                spec,
                if_match,
                now,
            };
            ctx.write(call).await
        }
        (Some(m), None) => {
            let call = calls::CreateModule {
                device_id,
                module_id: m.0,
                spec,
                now,
            };
            ctx.write(call).await
        }
        (Some(m), Some(if_match)) => {
            let call = calls::UpdateModule {
                device_id,
                module_id: m.0,
                spec,
                if_match,
            };
            ctx.write(call).await
        }
    }?;
    // REG-4: a disabled device loses its open connections (and its modules').
    if i.module_id.is_none() && i.status == ferrohub_engine::model::Status::Disabled {
        ctx.connections
            .kick(&ConnectedIdentity::for_device(i.device_id.clone()));
    }
    Ok(identity_reply(&i))
}

async fn delete_handler(
    (id, module): IdentityPath,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
) -> Handled {
    p.require_hub(Permission::RegistryWrite)?;
    let cond = cond.unwrap_or(IfMatch::Any);
    let who = connected_identity(&id, &module);
    let call = calls::DeleteIdentity {
        device_id: id.0,
        module_id: module.map(|m| m.0),
        if_match: cond,
        now: ctx.clock.now(),
    };
    ctx.write(call).await?;
    ctx.connections.kick(&who);
    Ok(no_content())
}

/// `POST /devices`: 200 with `isSuccessful: true`, or 400 listing each failed item.
async fn bulk_handler(ctx: Context, p: Principal, items: Vec<BulkItemJson>) -> Handled {
    p.require_hub(Permission::RegistryWrite)?;
    if items.len() > MAX_BULK_IDENTITIES {
        return Err(ApiError::Registry(
            ferrohub_engine::RegistryError::TooManyInBulk {
                count: items.len(),
                max: MAX_BULK_IDENTITIES,
            },
        ));
    }
    let mut errors = Vec::new();
    let mut valid = Vec::new();
    for item in items {
        let parsed = identity_json::import_mode(item.import_mode.as_deref())
            .map_err(ApiError::argument)
            .and_then(|mode| Ok((mode, item.identity.to_spec()?)));
        match parsed {
            Ok((mode, spec)) => valid.push(BulkItem {
                device_id: item.id,
                module_id: item.module_id,
                mode,
                etag: item.etag,
                spec,
                twin: None,
            }),
            Err(e) => errors.push(error_json(
                &item.id,
                item.module_id.as_deref(),
                item.import_mode.as_deref().unwrap_or(""),
                &e,
            )),
        }
    }
    let now = ctx.clock.now();
    let to_kick: Vec<ConnectedIdentity> = valid
        .iter()
        .filter(|i| {
            matches!(i.mode, ImportMode::Delete | ImportMode::DeleteIfMatchETag)
                || i.spec.status == ferrohub_engine::model::Status::Disabled
        })
        .map(|i| ConnectedIdentity::new(i.device_id.clone(), i.module_id.clone()))
        .collect();
    let failed: Vec<BulkItemError> = ctx
        .write(calls::BulkIdentities { items: valid, now })
        .await?;
    for who in to_kick {
        let failed_here = failed
            .iter()
            .any(|f| *who.device_id == f.device_id && who.module() == f.module_id.as_deref());
        if !failed_here {
            ctx.connections.kick(&who);
        }
    }
    for f in failed {
        errors.push(error_json(
            &f.device_id,
            f.module_id.as_deref(),
            identity_json::import_mode_name(f.mode),
            &ApiError::Registry(f.error),
        ));
    }
    let ok = errors.is_empty();
    let body = serde_json::json!({ "isSuccessful": ok, "errors": errors, "warnings": [] });
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    Ok(json_with_status(&body, status))
}

fn error_json(
    device_id: &str,
    module_id: Option<&str>,
    operation: &str,
    e: &ApiError,
) -> serde_json::Value {
    let (_, name, _) = e.status_and_code();
    serde_json::json!({
        "deviceId": device_id,
        "moduleId": module_id,
        "errorCode": name,
        "errorStatus": e.to_string(),
        "operation": operation,
    })
}
