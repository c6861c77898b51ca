//! Service-side twin operations (TWN-3, `compat` §B2): `GET`, `PATCH` (merge) and `PUT`
//! (replace) on `/twins/{id}` and `/twins/{id}/modules/{mid}`, with the twin etag in `If-Match`
//! (quoted; `"*"` or absent is unconditional). Reads need ServiceConnect or RegistryRead,
//! writes ServiceConnect. Reported properties in a request are read-only and ignored, as are
//! `$metadata` and `$version`.

use ferrohub_engine::model::{AuthType, IfMatch, Status};
use ferrohub_engine::twin::store::{Twin, TwinWrite};
use ferrohub_engine::UnixMillis;
use serde_json::{json, Map, Value};
use warp::{Filter, Rejection};

use super::error::ApiError;
use super::identity_json::format_time;
use super::{authenticated, if_match, json_body, json_reply, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::connections::Outbound;

type Response = warp::reply::Response;

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, the `$metadata` time format (TWN-6).
pub fn metadata_time(t: UnixMillis) -> String {
    chrono::DateTime::from_timestamp_millis(t.0)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

/// The Twin model.
pub fn twin_json(t: &Twin) -> Value {
    let i = &t.identity;
    let r = &t.record;
    let thumbprints = i.authentication.thumbprints.clone().unwrap_or_default();
    let mut out = json!({
        "deviceId": i.device_id,
        "etag": r.etag,
        "deviceEtag": i.etag,
        "status": match i.status { Status::Enabled => "enabled", Status::Disabled => "disabled" },
        "statusReason": i.status_reason,
        "statusUpdateTime": format_time(Some(i.status_updated_time)),
        "connectionState": match i.connection_state {
            ferrohub_engine::model::ConnectionState::Connected => "Connected",
            ferrohub_engine::model::ConnectionState::Disconnected => "Disconnected",
        },
        "lastActivityTime": format_time(i.last_activity_time),
        "cloudToDeviceMessageCount": i.cloud_to_device_message_count,
        "authenticationType": match i.authentication.kind {
            AuthType::Sas => "sas",
            AuthType::SelfSigned => "selfSigned",
            AuthType::CertificateAuthority => "certificateAuthority",
            AuthType::None => "none",
        },
        "x509Thumbprint": {"primaryThumbprint": thumbprints.primary, "secondaryThumbprint": thumbprints.secondary},
        "modelId": "",
        "version": r.version,
        "tags": Value::Object(r.tags.clone()),
        "properties": {
            "desired": r.desired.to_json(&metadata_time, true),
            "reported": r.reported.to_json(&metadata_time, false),
        },
        "capabilities": {"iotEdge": i.iot_edge},
    });
    if let Some(m) = &i.module_id {
        out["moduleId"] = Value::String(m.clone());
    }
    out
}

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

fn reply(r: Result<Response, ApiError>) -> Result<Response, Rejection> {
    r.map_err(warp::reject::custom)
}

fn with_etag(mut resp: Response, etag: &str) -> Response {
    if let Ok(v) = format!("\"{etag}\"").parse() {
        resp.headers_mut().insert("etag", v);
    }
    resp
}

#[derive(Clone, Copy)]
enum Write {
    Patch,
    Replace,
}

async fn get_handler(
    device: PathId,
    module: Option<PathId>,
    ctx: Context,
    p: Principal,
) -> Result<Response, Rejection> {
    reply(
        async {
            if p.require_hub(Permission::ServiceConnect).is_err() {
                p.require_hub(Permission::RegistryRead)?;
            }
            let twin = ctx
                .store
                .run(move |s| s.get_twin(&device.0, module.as_ref().map(|m| m.0.as_str())))
                .await?;
            Ok(with_etag(json_reply(&twin_json(&twin)), &twin.record.etag))
        }
        .await,
    )
}

async fn write_handler(
    kind: Write,
    device: PathId,
    module: Option<PathId>,
    ctx: Context,
    p: Principal,
    cond: Option<IfMatch>,
    body: Value,
) -> Result<Response, Rejection> {
    reply(
        async {
            p.require_hub(Permission::ServiceConnect)?;
            let write = twin_write(&body)?;
            let cond = cond.unwrap_or(IfMatch::Any);
            let now = ctx.clock.now();
            let outcome = ctx
                .store
                .run(move |s| {
                    let m = module.as_ref().map(|m| m.0.as_str());
                    match kind {
                        Write::Patch => s.update_twin(&device.0, m, &write, &cond, now),
                        Write::Replace => s.replace_twin(&device.0, m, &write, &cond, now),
                    }
                })
                .await?;
            // TWN-8: push the desired change, as the back-end sent it, to a connected device.
            if let Some((mut change, version)) = outcome.desired_change.clone() {
                change.insert("$version".into(), Value::from(version));
                let who = &outcome.twin.identity;
                let client_id = match &who.module_id {
                    Some(m) => format!("{}/{m}", who.device_id),
                    None => who.device_id.clone(),
                };
                let body = Value::Object(change).to_string().into_bytes();
                ctx.connections
                    .notify(&client_id, Outbound::DesiredPatch { version, body });
            }
            Ok(with_etag(
                json_reply(&twin_json(&outcome.twin)),
                &outcome.twin.record.etag,
            ))
        }
        .await,
    )
}

pub fn routes(ctx: Context) -> impl Filter<Extract = (Response,), Error = Rejection> + Clone {
    let auth = authenticated(ctx.clone());
    let with_ctx = warp::any().map(move || ctx.clone());
    let device = warp::path!("twins" / PathId);
    let module = warp::path!("twins" / PathId / "modules" / PathId);

    let get_device = device
        .and(warp::get())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(|d: PathId, ctx, p| get_handler(d, None, ctx, p));
    let get_module = module
        .and(warp::get())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(|d: PathId, m: PathId, ctx, p| get_handler(d, Some(m), ctx, p));
    let write_device = device
        .and(
            warp::patch()
                .map(|| Write::Patch)
                .or(warp::put().map(|| Write::Replace))
                .unify(),
        )
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(if_match())
        .and(json_body::<Value>())
        .and_then(|d: PathId, kind, ctx, p, c, b| write_handler(kind, d, None, ctx, p, c, b));
    let write_module = module
        .and(
            warp::patch()
                .map(|| Write::Patch)
                .or(warp::put().map(|| Write::Replace))
                .unify(),
        )
        .and(with_ctx)
        .and(auth)
        .and(if_match())
        .and(json_body::<Value>())
        .and_then(|d: PathId, m: PathId, kind, ctx, p, c, b| {
            write_handler(kind, d, Some(m), ctx, p, c, b)
        });
    get_device
        .or(get_module)
        .unify()
        .or(write_device)
        .unify()
        .or(write_module)
        .unify()
}
