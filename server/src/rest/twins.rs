//! Service-side twin operations (TWN-3, `compat` §B2): `GET`, `PATCH` (merge) and `PUT`
//! (replace) on `/twins/{id}` and `/twins/{id}/modules/{mid}`, with the twin etag in `If-Match`
//! (quoted; `"*"` or absent is unconditional). Reads need ServiceConnect or RegistryRead,
//! writes ServiceConnect. Reported properties in a request are read-only and ignored, as are
//! `$metadata` and `$version`.

use ferrohub_engine::model::IfMatch;
use ferrohub_engine::twin::store::TwinWrite;
use serde_json::{Map, Value};
use warp::filters::BoxedFilter;
use warp::Filter;

use super::error::ApiError;
use super::reply::{json_with_etag, one_of, Handled, Response};
use super::{caller, if_match, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
pub use crate::hub::twin_rows::{metadata_time, twin_json};

/// The writable parts of a Twin request body.
fn twin_write(body: &Value) -> Result<TwinWrite, ApiError> {
    let object = |v: &Value, what: &str| -> Result<Map<String, Value>, ApiError> {
        v.as_object()
            .cloned()
            .ok_or_else(|| ApiError::format(format!("{what} must be a JSON object")))
    };
    let root = object(body, "the twin")?;
    let tags = match root.get("tags") {
        None | Some(Value::Null) => None,
        Some(t) => Some(object(t, "tags")?),
    };
    let desired = match root.get("properties") {
        None | Some(Value::Null) => None,
        Some(p) => match object(p, "properties")?.get("desired") {
            None | Some(Value::Null) => None,
            Some(d) => {
                let mut d = object(d, "properties.desired")?;
                d.remove("$metadata");
                d.remove("$version");
                Some(d)
            }
        },
    };
    Ok(TwinWrite { tags, desired })
}

#[derive(Clone, Copy)]
enum Write {
    Patch,
    Replace,
}

/// PATCH merges, PUT replaces.
fn write_kind() -> impl Filter<Extract = (Write,), Error = warp::Rejection> + Clone {
    let patch = warp::patch().map(|| Write::Patch);
    patch.or(warp::put().map(|| Write::Replace)).unify()
}

/// The twin route table; a device twin is the module twin without a module.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let device = || warp::path!("twins" / PathId).map(|d: PathId| (d, None));
    let module = || warp::path!("twins" / PathId / "modules" / PathId).map(|d: PathId, m: PathId| (d, Some(m)));
    one_of([
        device().and(warp::get()).and(caller()).then(get_handler).boxed(),
        module().and(warp::get()).and(caller()).then(get_handler).boxed(),
        device().and(write_kind()).and(caller()).and(if_match()).and(json_body()).then(write_handler).boxed(),
        module().and(write_kind()).and(caller()).and(if_match()).and(json_body()).then(write_handler).boxed(),
    ])
}

/// A twin's path: the device, and the module when it is a module twin.
type TwinPath = (PathId, Option<PathId>);

async fn get_handler((device, module): TwinPath, ctx: Context, p: Principal) -> Handled {
    if p.require_hub(Permission::ServiceConnect).is_err() {
        p.require_hub(Permission::RegistryRead)?;
    }
    let twin = ctx
        .store
        .run(move |s| s.get_twin(&device.0, module.as_ref().map(|m| m.0.as_str())))
        .await?;
    Ok(json_with_etag(&twin_json(&twin), &twin.record.etag))
}

async fn write_handler(
    (device, module): TwinPath,
    kind: Write,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
    body: Value,
) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    let write = twin_write(&body)?;
    let cond = cond.unwrap_or(IfMatch::Any);
    let now = ctx.clock.now();
    let call = crate::hub::calls::WriteTwin {
        device_id: device.0,
        module_id: module.map(|m| m.0),
        write,
        replace: matches!(kind, Write::Replace),
        if_match: cond,
        now,
    };
    let outcome = ctx.write(call).await?;
    ctx.push_desired(&outcome);
    Ok(json_with_etag(
        &twin_json(&outcome.twin),
        &outcome.twin.record.etag,
    ))
}
