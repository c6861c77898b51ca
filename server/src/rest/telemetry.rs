//! HTTPS device telemetry (HDV-1, D2C-5): `POST /devices/{id}/messages/events` and the module
//! form, one message per request, or a batch with content type
//! `application/vnd.microsoft.iothub.json` (a JSON array of `{body, base64Encoded, properties}`).
//! Answered 204 only after the events are durable.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use ferrohub_engine::d2c::NewEvent;
use ferrohub_engine::model::{Identity, Status};
use ferrohub_engine::RegistryError;
use warp::filters::BoxedFilter;
use warp::http::HeaderMap;
use warp::Filter;

use super::error::ApiError;
use super::reply::{no_content, one_of, Handled, Response};
use super::{caller, Context, PathId};
use crate::auth::{AuthError, Permission, Principal, Scope, Signer};
use crate::ids::ModuleId;
use crate::telemetry::{self, AuthMethod, DeviceMessage, MAX_MESSAGE_BYTES};

/// Most messages in one batch (IoT Hub: 500).
const MAX_BATCH: usize = 500;
const BATCH_CONTENT_TYPE: &str = "application/vnd.microsoft.iothub.json";

/// The telemetry route table; a device's events path is the module's without a module.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let body = || warp::body::content_length_limit(MAX_MESSAGE_BYTES as u64 + 64 * 1024).and(warp::body::bytes());
    let device = warp::path!("devices" / PathId / "messages" / "events").map(|d: PathId| (d, None));
    let module = warp::path!("devices" / PathId / "modules" / PathId / "messages" / "events").map(|d: PathId, m: PathId| (d, Some(m)));
    one_of([
        device.and(warp::post()).and(caller()).and(warp::header::headers_cloned()).and(body()).then(send_handler).boxed(),
        module.and(warp::post()).and(caller()).and(warp::header::headers_cloned()).and(body()).then(send_handler).boxed(),
    ])
}

/// The caller may send for this identity: its own key, or DeviceConnect at hub scope or
/// scoped to it.
pub(crate) fn authorise(
    p: &Principal,
    device_id: &str,
    module_id: Option<&str>,
) -> Result<bool, AuthError> {
    p.require(Permission::DeviceConnect)?;
    let hub_policy = matches!(p.signer, Signer::Policy(_));
    match &p.scope {
        Scope::Hub => Ok(hub_policy),
        Scope::Device {
            device_id: d,
            module_id: m,
        } if d == device_id && m.as_deref() == module_id => Ok(hub_policy),
        Scope::Device { .. } => Err(AuthError::Forbidden("DeviceConnect for this identity")),
    }
}

fn header_properties(headers: &HeaderMap) -> Result<Vec<(String, Option<String>)>, ApiError> {
    const SYSTEM: &[(&str, &str)] = &[
        ("iothub-messageid", "$.mid"),
        ("iothub-correlationid", "$.cid"),
        ("iothub-userid", "$.uid"),
        ("iothub-to", "$.to"),
        ("iothub-expiry", "$.exp"),
        ("iothub-creationtimeutc", "$.ctime"),
        ("content-type", "$.ct"),
        ("content-encoding", "$.ce"),
    ];
    let mut props = Vec::new();
    for (name, value) in headers {
        let value = value
            .to_str()
            .map_err(|_| ApiError::argument(format!("header {name} is not ASCII")))?
            .to_string();
        let name = name.as_str();
        if let Some((_, key)) = SYSTEM.iter().find(|(h, _)| *h == name) {
            props.push((key.to_string(), Some(value)));
        } else if let Some(app) = name.strip_prefix("iothub-app-") {
            props.push((app.to_string(), Some(value)));
        }
    }
    Ok(props)
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BatchItem {
    #[serde(default)]
    body: serde_json::Value,
    #[serde(default)]
    base64_encoded: bool,
    #[serde(default)]
    properties: std::collections::BTreeMap<String, String>,
}

fn batch_messages(body: &[u8]) -> Result<Vec<DeviceMessage>, ApiError> {
    let items: Vec<BatchItem> =
        serde_json::from_slice(body).map_err(|e| ApiError::format(format!("batch body: {e}")))?;
    if items.len() > MAX_BATCH {
        return Err(ApiError::argument(format!(
            "{} messages in one batch; at most {MAX_BATCH}",
            items.len()
        )));
    }
    items
        .into_iter()
        .map(|i| {
            let body = match (&i.body, i.base64_encoded) {
                (serde_json::Value::String(s), true) => B64
                    .decode(s)
                    .map_err(|_| ApiError::format("batch body is not base64"))?,
                (serde_json::Value::String(s), false) => s.clone().into_bytes(),
                (other, _) => other.to_string().into_bytes(),
            };
            let properties = i
                .properties
                .into_iter()
                .map(|(k, v)| (k, Some(v)))
                .collect();
            Ok(DeviceMessage { properties, body })
        })
        .collect()
}

async fn send_handler(
    (device, module): (PathId, Option<PathId>),
    ctx: Context,
    p: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> Handled {
    let (device_id, module_id) = (device.0, module.map(|m| m.0));
    let hub_policy = authorise(&p, &device_id, module_id.as_deref())?;
    let (d, m) = (device_id.clone(), module_id.clone());
    let identity: Identity = ctx
        .store
        .run(move |s| {
            let device = s.get_device(&d)?;
            if device.status == Status::Disabled {
                return Err(RegistryError::Invalid(
                    ferrohub_engine::ValidationError::Invalid {
                        field: "deviceId".into(),
                        reason: "the device is disabled".into(),
                    },
                ));
            }
            match &m {
                Some(m) => s.get_module(&d, m),
                None => Ok(device),
            }
        })
        .await
        .map_err(|e| match e {
            RegistryError::Invalid(_) => {
                ApiError::Unauthorized(AuthError::Disabled(device_id.clone()))
            }
            other => ApiError::Registry(other),
        })?;
    ctx.note_request_activity(&crate::ids::Identity::new(
        device_id.as_str(),
        module_id.as_deref(),
    ));
    let is_batch = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(BATCH_CONTENT_TYPE));
    let messages = if is_batch {
        batch_messages(&body)?
    } else {
        vec![DeviceMessage {
            properties: header_properties(&headers)?,
            body: body.to_vec(),
        }]
    };
    let method = AuthMethod::for_identity(&identity, hub_policy);
    let events: Vec<NewEvent> = messages
        .into_iter()
        .map(|m| {
            telemetry::to_event(&identity, method, m).map_err(|e| ApiError::TooLarge(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let lane = ctx.telemetry_lane();
    ctx.append_telemetry(&lane, events, module_id.map(ModuleId::new))
        .await
        .await?;
    Ok(no_content())
}
