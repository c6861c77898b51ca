//! Who may use the console's own API: every route checks its caller here, after the REST
//! API's authentication (a hub-scoped policy token).
//!
//! # Invariants
//! - Only hub-scoped policy tokens reach the console's API; device- and module-scoped ones
//!   are refused, whatever rights their keys hold.
//! - Keys (the hub's policies', the provisioning service's) go only to a policy holding all
//!   four hub rights, what `iothubowner` holds.

use ferrohub_engine::hub::Permissions;

use crate::auth::{AuthError, Permission, Principal};
use crate::rest::error::ApiError;

/// What the hub itself reports (metrics, its log, the policy list) is for the service side:
/// a policy with RegistryRead or ServiceConnect, never one that only connects devices (the
/// `device` policy is the credential field gateways carry).
pub fn require_service_side(p: &Principal) -> Result<(), ApiError> {
    require_policy(p)?;
    if p.require(Permission::RegistryRead).is_err() {
        p.require(Permission::ServiceConnect)?;
    }
    Ok(())
}

/// Any hub-scoped policy may use the console; the rights decide what it can do there.
pub fn require_policy(p: &Principal) -> Result<(), ApiError> {
    if p.scope != crate::auth::Scope::Hub {
        return Err(AuthError::DeviceScoped.into());
    }
    match p.signer {
        crate::auth::Signer::Policy(_) => Ok(()),
        crate::auth::Signer::Identity { .. } => Err(AuthError::DeviceScoped.into()),
    }
}

/// Keys are shown only to a policy holding all four rights (what `iothubowner` holds).
pub fn require_every_right(p: &Principal) -> Result<(), ApiError> {
    require_policy(p)?;
    for right in [
        Permission::RegistryRead,
        Permission::RegistryWrite,
        Permission::ServiceConnect,
        Permission::DeviceConnect,
    ] {
        p.require(right)?;
    }
    Ok(())
}

/// A policy's rights by IoT Hub's names (RegistryWrite implies RegistryRead, as there).
pub fn right_names(p: &Permissions) -> Vec<&'static str> {
    [
        (p.registry_read || p.registry_write, "RegistryRead"),
        (p.registry_write, "RegistryWrite"),
        (p.service_connect, "ServiceConnect"),
        (p.device_connect, "DeviceConnect"),
    ]
    .into_iter()
    .filter_map(|(held, name)| held.then_some(name))
    .collect()
}
