//! `/console/api/provisioning...`: what the console's provisioning pages need to reach the
//! hub's Device Provisioning Service API, which authorises with the provisioning service's own
//! policies (`provisioningserviceowner`, `enrollmentread`), not the hub's.
//!
//! - `GET provisioning` (RegistryRead or ServiceConnect): the ID scope, the global endpoint a
//!   device registers at (this hub's host name) and the provisioning policies with their
//!   rights.
//! - `GET provisioning/policies/{name}/keys`: a provisioning policy's keys and connection
//!   string, for a caller holding every hub right (what `iothubowner` holds; the same bar as
//!   the hub policies' keys), never cached. The console signs its enrollment calls with them.
//!
//! # Invariants
//! - Keys leave only through the second route, only to a policy holding all four hub rights.
//! - Nothing here writes: enrollments are created, changed and deleted through the DPS service
//!   API itself, so the console is one more client of the same rules.

use ferrohub_engine::provisioning::ProvisioningRights;
use serde_json::json;

use super::access::{require_every_right, require_service_side};
use crate::auth::Principal;
use crate::rest::error::ApiError;
use crate::rest::reply::{json as json_reply, Handled};
use crate::rest::{Context, PathId};

/// The rights' names as DPS lists them on a policy.
fn rights(r: &ProvisioningRights) -> Vec<&'static str> {
    [
        (r.service_config, "ServiceConfig"),
        (r.enrollment_read, "EnrollmentRead"),
        (r.enrollment_write, "EnrollmentWrite"),
        (r.registration_status_read, "RegistrationStatusRead"),
        (r.registration_status_write, "RegistrationStatusWrite"),
    ]
    .into_iter()
    .filter_map(|(held, name)| held.then_some(name))
    .collect()
}

pub async fn overview_handler(ctx: Context, p: Principal) -> Handled {
    require_service_side(&p)?;
    // What the provisioning service itself authorises with, so the two cannot differ.
    let provisioning = ctx.provisioning.settings();
    let policies: Vec<_> = provisioning
        .policies
        .iter()
        .map(
            |policy| json!({ "keyName": policy.name, "rights": rights(&policy.rights).join(", ") }),
        )
        .collect();
    Ok(json_reply(&json!({
        "idScope": provisioning.id_scope,
        "globalEndpoint": ctx.provisioning.host_name(),
        "policies": policies,
    })))
}

pub async fn keys_handler(name: PathId, ctx: Context, p: Principal) -> Handled {
    require_every_right(&p)?;
    let policy = ctx
        .provisioning
        .settings()
        .policy(&name.0)
        .ok_or_else(|| ApiError::NotFound(format!("provisioning policy {:?}", name.0)))?;
    // The form `ferrohub connection-string --provisioning` prints and the service SDKs read.
    let connection_string = policy.connection_string(ctx.provisioning.host_name());
    let mut response = json_reply(&json!({
        "primaryKey": policy.primary_key,
        "secondaryKey": policy.secondary_key,
        "connectionString": connection_string,
    }));
    response.headers_mut().insert(
        "cache-control",
        warp::http::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}
