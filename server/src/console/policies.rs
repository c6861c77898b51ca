//! `/console/api/policies...`: the hub's shared access policies, read and changed (what IoT
//! Hub's portal offers under "Shared access policies"; its REST API has no call for them).
//!
//! - `GET policies` (RegistryRead or ServiceConnect): names and rights, no keys.
//! - `GET policies/{name}/keys`: both keys, never cached.
//! - `PUT policies/{name}` `{"rights": ["RegistryRead", ...]}`: adds the policy with new keys,
//!   or gives an existing one these rights (its keys kept).
//! - `POST policies/{name}/regenerate` `{"key": "primary" | "secondary"}`: a new key.
//! - `DELETE policies/{name}`.
//!
//! # Invariants
//! - Keys and changes only for a caller holding every hub right (what `iothubowner` holds).
//! - Changes are the engine's ([`ferrohub_engine::policies`]): refused ones (no right, a bad
//!   name, a 17th policy, none left holding every right, an unknown policy) change nothing and
//!   answer IoT Hub's 400 or 404 body. A change is a writer call, so in a cluster it is
//!   made once, in the log; the node that asked holds it before it answers, the others within
//!   [`crate::hub::policies::REFRESH_EVERY`].

use ferrohub_engine::hub::{HubSettings, Permissions};
use ferrohub_engine::policies::{PolicyChange, PolicyKey};
use serde::Deserialize;
use serde_json::{json, Value};

use super::access::{require_every_right, require_service_side, right_names};
use crate::auth::Principal;
use crate::hub::calls::ChangePolicy;
use crate::rest::error::ApiError;
use crate::rest::reply::{json as json_reply, Handled};
use crate::rest::{Context, PathId};

fn listed(settings: &HubSettings) -> Vec<Value> {
    settings
        .policies
        .iter()
        .map(|p| json!({ "keyName": p.name, "rights": right_names(&p.permissions).join(", ") }))
        .collect()
}

pub async fn list_handler(ctx: Context, p: Principal) -> Handled {
    require_service_side(&p)?;
    Ok(json_reply(&listed(&ctx.policies.current())))
}

pub async fn keys_handler(name: PathId, ctx: Context, p: Principal) -> Handled {
    require_every_right(&p)?;
    let settings = ctx.policies.current();
    let policy = settings
        .policy(&name.0)
        .ok_or_else(|| ApiError::NotFound(format!("shared access policy {:?}", name.0)))?;
    let mut response = json_reply(&json!({
        "primaryKey": policy.primary_key,
        "secondaryKey": policy.secondary_key,
    }));
    // Keys are never kept by a cache on the way.
    response.headers_mut().insert(
        "cache-control",
        warp::http::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}

#[derive(Debug, Deserialize)]
pub struct RightsBody {
    rights: Vec<String>,
}

/// IoT Hub's right names to permissions; RegistryWrite brings RegistryRead, as there.
fn permissions(rights: &[String]) -> Result<Permissions, ApiError> {
    let mut p = Permissions::default();
    for right in rights {
        match right.as_str() {
            "RegistryRead" => p.registry_read = true,
            "RegistryWrite" => {
                p.registry_read = true;
                p.registry_write = true;
            }
            "ServiceConnect" => p.service_connect = true,
            "DeviceConnect" => p.device_connect = true,
            other => {
                return Err(ApiError::argument(format!(
                    "unknown right {other:?}: RegistryRead, RegistryWrite, ServiceConnect or DeviceConnect"
                )))
            }
        }
    }
    Ok(p)
}

async fn change(ctx: &Context, change: PolicyChange) -> Handled {
    let settings = ctx.write(ChangePolicy { change }).await?;
    // Held here before the answer, on a follower as on the writer.
    ctx.policies.replace(&settings);
    Ok(json_reply(&listed(&settings)))
}

pub async fn put_handler(name: PathId, ctx: Context, p: Principal, body: RightsBody) -> Handled {
    require_every_right(&p)?;
    let permissions = permissions(&body.rights)?;
    change(
        &ctx,
        PolicyChange::Put {
            name: name.0,
            permissions,
        },
    )
    .await
}

#[derive(Debug, Deserialize)]
pub struct RegenerateBody {
    key: String,
}

pub async fn regenerate_handler(
    name: PathId,
    ctx: Context,
    p: Principal,
    body: RegenerateBody,
) -> Handled {
    require_every_right(&p)?;
    let key = match body.key.as_str() {
        "primary" => PolicyKey::Primary,
        "secondary" => PolicyKey::Secondary,
        other => {
            return Err(ApiError::argument(format!(
                "key {other:?}: \"primary\" or \"secondary\""
            )))
        }
    };
    change(&ctx, PolicyChange::RegenerateKey { name: name.0, key }).await
}

pub async fn remove_handler(name: PathId, ctx: Context, p: Principal) -> Handled {
    require_every_right(&p)?;
    change(&ctx, PolicyChange::Remove { name: name.0 }).await
}
