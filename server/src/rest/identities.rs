//! Registry endpoints (REG-2, REG-3, REG-5): devices, modules and bulk changes, with the exact
//! success codes the service SDK accepts (`compat` §B2): PUT 200, DELETE 204, bulk 200 or 400.

use ferrohub_engine::identity::{BulkItem, BulkItemError, ImportMode};
use ferrohub_engine::model::{IfMatch, MAX_BULK_IDENTITIES};
use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

use super::error::ApiError;
use super::identity_json::{BulkItemJson, DeviceJson, IdentityBody, ModuleJson};
use super::{authenticated, if_match, json_body, json_reply, Context, PathId};
use crate::auth::{Permission, Principal};

type Response = warp::reply::Response;

/// Most devices `GET /devices` returns, as IoT Hub.
const MAX_LIST: usize = 1000;

fn reply(r: Result<Response, ApiError>) -> Result<Response, Rejection> {
    r.map_err(warp::reject::custom)
}

fn with_etag(mut resp: Response, etag: &str) -> Response {
    if let Ok(v) = format!("\"{etag}\"").parse() {
        resp.headers_mut().insert("etag", v);
    }
    resp
}

fn no_content() -> Response {
    warp::reply::with_status(warp::reply(), StatusCode::NO_CONTENT).into_response()
}

#[derive(serde::Deserialize)]
struct ListQuery {
    top: Option<usize>,
}

pub fn routes(ctx: Context) -> impl Filter<Extract = (Response,), Error = Rejection> + Clone {
    let auth = authenticated(ctx.clone());
    let with_ctx = warp::any().map(move || ctx.clone());

    let device = warp::path!("devices" / PathId);
    let get_device = device
        .and(warp::get())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(get_device_handler);
    let put_device = device
        .and(warp::put())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(if_match())
        .and(json_body::<IdentityBody>())
        .and_then(put_device_handler);
    let delete_device = device
        .and(warp::delete())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(if_match())
        .and_then(delete_device_handler);

    let devices = warp::path!("devices");
    let list_devices = devices
        .and(warp::get())
        .and(warp::query::<ListQuery>())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(list_devices_handler);
    let bulk = devices
        .and(warp::post())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(json_body::<Vec<BulkItemJson>>())
        .and_then(bulk_handler);

    let modules = warp::path!("devices" / PathId / "modules");
    let list_modules = modules
        .and(warp::get())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(list_modules_handler);
    let module = warp::path!("devices" / PathId / "modules" / PathId);
    let get_module = module
        .and(warp::get())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(get_module_handler);
    let put_module = module
        .and(warp::put())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(if_match())
        .and(json_body::<IdentityBody>())
        .and_then(put_module_handler);
    let delete_module = module
        .and(warp::delete())
        .and(with_ctx)
        .and(auth)
        .and(if_match())
        .and_then(delete_module_handler);

    get_device
        .or(put_device)
        .unify()
        .or(delete_device)
        .unify()
        .or(list_devices)
        .unify()
        .or(bulk)
        .unify()
        .or(list_modules)
        .unify()
        .or(get_module)
        .unify()
        .or(put_module)
        .unify()
        .or(delete_module)
        .unify()
}

async fn get_device_handler(id: PathId, ctx: Context, p: Principal) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryRead)?;
            let d = ctx.store.run(move |s| s.get_device(&id.0)).await?;
            Ok(with_etag(json_reply(&DeviceJson::from(&d)), &d.etag))
        }
        .await,
    )
}

/// PUT without `If-Match` creates (409 if the id exists); with `If-Match` it updates.
async fn put_device_handler(
    id: PathId,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
    body: IdentityBody,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryWrite)?;
            if let Some(body_id) = &body.device_id {
                if body_id != &id.0 {
                    return Err(ApiError::argument(format!(
                        "deviceId {body_id:?} in the body does not match {:?} in the path",
                        id.0
                    )));
                }
            }
            let spec = body.to_spec()?;
            let now = ctx.clock.now();
            let d = ctx
                .store
                .run(move |s| match cond {
                    None => s.create_device(&id.0, &spec, now),
                    Some(c) => s.update_device(&id.0, &spec, &c, now),
                })
                .await?;
            // REG-4: a disabled device loses its open connections (and its modules').
            if d.status == ferrohub_engine::model::Status::Disabled {
                ctx.connections.kick_device(&d.device_id);
            }
            Ok(with_etag(json_reply(&DeviceJson::from(&d)), &d.etag))
        }
        .await,
    )
}

async fn delete_device_handler(
    id: PathId,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryWrite)?;
            let cond = cond.unwrap_or(IfMatch::Any);
            let device_id = id.0.clone();
            let at = ctx.clock.now();
            ctx.store
                .run(move |s| s.delete_device(&id.0, &cond, at))
                .await?;
            ctx.connections.kick_device(&device_id);
            Ok(no_content())
        }
        .await,
    )
}

async fn list_devices_handler(
    q: ListQuery,
    ctx: Context,
    p: Principal,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryRead)?;
            let limit = q.top.unwrap_or(MAX_LIST).clamp(1, MAX_LIST);
            let devices = ctx.store.run(move |s| s.list_devices(limit)).await?;
            Ok(json_reply(
                &devices.iter().map(DeviceJson::from).collect::<Vec<_>>(),
            ))
        }
        .await,
    )
}

async fn list_modules_handler(
    id: PathId,
    ctx: Context,
    p: Principal,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryRead)?;
            let modules = ctx.store.run(move |s| s.list_modules(&id.0)).await?;
            Ok(json_reply(
                &modules.iter().map(ModuleJson::from).collect::<Vec<_>>(),
            ))
        }
        .await,
    )
}

async fn get_module_handler(
    id: PathId,
    mid: PathId,
    ctx: Context,
    p: Principal,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryRead)?;
            let m = ctx.store.run(move |s| s.get_module(&id.0, &mid.0)).await?;
            Ok(with_etag(json_reply(&ModuleJson::from(&m)), &m.etag))
        }
        .await,
    )
}

async fn put_module_handler(
    id: PathId,
    mid: PathId,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
    body: IdentityBody,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryWrite)?;
            for (field, given, path) in [
                ("deviceId", &body.device_id, &id.0),
                ("moduleId", &body.module_id, &mid.0),
            ] {
                if let Some(g) = given {
                    if g != path {
                        return Err(ApiError::argument(format!(
                            "{field} {g:?} in the body does not match {path:?} in the path"
                        )));
                    }
                }
            }
            let spec = body.to_spec()?;
            let now = ctx.clock.now();
            let m = ctx
                .store
                .run(move |s| match cond {
                    None => s.create_module(&id.0, &mid.0, &spec, now),
                    Some(c) => s.update_module(&id.0, &mid.0, &spec, &c),
                })
                .await?;
            Ok(with_etag(json_reply(&ModuleJson::from(&m)), &m.etag))
        }
        .await,
    )
}

async fn delete_module_handler(
    id: PathId,
    mid: PathId,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::RegistryWrite)?;
            let cond = cond.unwrap_or(IfMatch::Any);
            let client_id = format!("{}/{}", id.0, mid.0);
            let at = ctx.clock.now();
            ctx.store
                .run(move |s| s.delete_module(&id.0, &mid.0, &cond, at))
                .await?;
            ctx.connections.kick_client(&client_id);
            Ok(no_content())
        }
        .await,
    )
}

fn import_mode(s: Option<&str>) -> Result<ImportMode, String> {
    Ok(match s.unwrap_or("createOrUpdate") {
        "create" => ImportMode::Create,
        "update" => ImportMode::Update,
        "updateIfMatchETag" => ImportMode::UpdateIfMatchETag,
        "createOrUpdate" => ImportMode::CreateOrUpdate,
        "createOrUpdateIfMatchETag" => ImportMode::CreateOrUpdateIfMatchETag,
        "delete" => ImportMode::Delete,
        "deleteIfMatchETag" => ImportMode::DeleteIfMatchETag,
        other => return Err(format!("importMode {other:?} is not supported")),
    })
}

fn mode_name(m: ImportMode) -> &'static str {
    match m {
        ImportMode::Create => "create",
        ImportMode::Update => "update",
        ImportMode::UpdateIfMatchETag => "updateIfMatchETag",
        ImportMode::CreateOrUpdate => "createOrUpdate",
        ImportMode::CreateOrUpdateIfMatchETag => "createOrUpdateIfMatchETag",
        ImportMode::Delete => "delete",
        ImportMode::DeleteIfMatchETag => "deleteIfMatchETag",
    }
}

/// `POST /devices`: 200 with `isSuccessful: true`, or 400 listing each failed item.
async fn bulk_handler(
    ctx: Context,
    p: Principal,
    items: Vec<BulkItemJson>,
) -> Result<Response, Rejection> {
    reply(
        async {
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
                let parsed = import_mode(item.import_mode.as_deref())
                    .map_err(ApiError::argument)
                    .and_then(|mode| Ok((mode, item.identity.to_spec()?)));
                match parsed {
                    Ok((mode, spec)) => valid.push(BulkItem {
                        device_id: item.id,
                        module_id: item.module_id,
                        mode,
                        etag: item.etag,
                        spec,
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
            let to_kick: Vec<String> = valid
                .iter()
                .filter(|i| {
                    matches!(i.mode, ImportMode::Delete | ImportMode::DeleteIfMatchETag)
                        || i.spec.status == ferrohub_engine::model::Status::Disabled
                })
                .map(|i| match &i.module_id {
                    Some(m) => format!("{}/{m}", i.device_id),
                    None => i.device_id.clone(),
                })
                .collect();
            let failed: Vec<BulkItemError> = ctx.store.run(move |s| s.bulk(&valid, now)).await?;
            for client_id in to_kick {
                let failed_here = failed.iter().any(|f| match &f.module_id {
                    Some(m) => format!("{}/{m}", f.device_id) == client_id,
                    None => f.device_id == client_id,
                });
                if !failed_here {
                    match client_id.split_once('/') {
                        Some(_) => ctx.connections.kick_client(&client_id),
                        None => drop(ctx.connections.kick_device(&client_id)),
                    }
                }
            }
            for f in failed {
                errors.push(error_json(
                    &f.device_id,
                    f.module_id.as_deref(),
                    mode_name(f.mode),
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
            Ok(warp::reply::with_status(warp::reply::json(&body), status).into_response())
        }
        .await,
    )
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
