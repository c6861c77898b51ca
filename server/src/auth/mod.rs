//! Who is calling, and may they (SEC-1, SEC-2, SEC-4).
//!
//! A token is either signed with a hub policy key (`skn` names the policy) or with a device or
//! module key (no `skn`). Its `sr` fixes the scope: the hub (`host` or `host:port`), one device
//! (`host/devices/{id}[/...]`) or one module (`host/devices/{id}/modules/{mid}[/...]`).
//!
//! # Invariants
//! - A principal's permissions are those of its policy, or DeviceConnect alone for identity keys.
//! - A principal scoped to a device acts only for that device: [`Principal::require_hub`]
//!   refuses it on hub-wide endpoints such as the registry.
//! - Disabled identities never authenticate.

pub mod provisioning;
pub mod sas;

use ferrohub_engine::hub::{HubSettings, Permissions};
use ferrohub_engine::model::{AuthType, Identity, Status};

use sas::{SasError, SasToken};

/// What a token may act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Hub,
    Device {
        device_id: String,
        module_id: Option<String>,
    },
}

/// Who signed the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signer {
    Policy(String),
    Identity {
        device_id: String,
        module_id: Option<String>,
    },
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub signer: Signer,
    pub scope: Scope,
    pub permissions: Permissions,
}

/// Why a caller is refused. All are 401 (`IotHubUnauthorizedAccess`) on the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no authorization token was supplied")]
    Missing,
    #[error(transparent)]
    Token(#[from] SasError),
    #[error("the token's resource {0:?} does not belong to this hub")]
    WrongHub(String),
    #[error("the token's resource {0:?} is not a hub, device or module resource")]
    BadResource(String),
    #[error("unknown policy {0:?}")]
    UnknownPolicy(String),
    #[error("identity {0} is not registered or has no symmetric key")]
    UnknownIdentity(String),
    #[error("identity {0} is disabled")]
    Disabled(String),
    #[error("the token lacks the {0} permission")]
    Forbidden(&'static str),
    #[error("a token scoped to one device cannot call a hub-wide endpoint")]
    DeviceScoped,
    #[error("token resource {resource:?} is not {identity}")]
    OtherIdentity { resource: String, identity: String },
    #[error("{0}")]
    Certificate(String),
}

/// The host names a hub answers to: its settings, or one name (tests, fuzzing).
pub trait HostNames {
    /// Whether `host` (without a port) is one of them, ASCII case ignored.
    fn includes(&self, host: &str) -> bool;
    /// The name shown in errors.
    fn shown(&self) -> &str;
}

impl HostNames for &str {
    fn includes(&self, host: &str) -> bool {
        self.eq_ignore_ascii_case(host)
    }
    fn shown(&self) -> &str {
        self
    }
}

impl HostNames for &HubSettings {
    fn includes(&self, host: &str) -> bool {
        self.answers_to(host)
    }
    fn shown(&self) -> &str {
        &self.host_name
    }
}

/// Parses the scope out of a decoded `sr`, checking the host against ours.
///
/// Event Hubs clients of the built-in endpoint sign `sb://{host}/{entity}[/ConsumerGroups/..]`
/// audiences: any such path other than a device's is the hub's scope, and which entity a link
/// may read is decided where it attaches.
pub fn parse_scope(resource: &str, hosts: impl HostNames) -> Result<Scope, AuthError> {
    let event_hubs_form = resource.starts_with("sb://");
    let trimmed = resource
        .trim_start_matches("https://")
        .trim_start_matches("amqps://")
        .trim_start_matches("sb://");
    let (host, path) = trimmed.split_once('/').unwrap_or((trimmed, ""));
    let host_only = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    if !hosts.includes(host_only) {
        return Err(AuthError::WrongHub(resource.to_string()));
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        [] => Ok(Scope::Hub),
        ["devices", d, "modules", m, ..] => Ok(Scope::Device {
            device_id: (*d).into(),
            module_id: Some((*m).into()),
        }),
        ["devices", d, ..] => Ok(Scope::Device {
            device_id: (*d).into(),
            module_id: None,
        }),
        [_entity, ..] if event_hubs_form => Ok(Scope::Hub),
        // The built-in endpoint by IoT Hub's own name: monitoring tools and the Event Hubs
        // samples sign `{host}/messages/events` before they are redirected (AMQ-8).
        ["messages", "events", ..] => Ok(Scope::Hub),
        _ => Err(AuthError::BadResource(resource.to_string())),
    }
}

/// Authenticates a token signed with a policy key; returns `Ok(None)` if the token is not a
/// policy token (no `skn`), so the caller looks up the identity's keys instead.
pub fn authenticate_policy(
    token: &SasToken,
    hub: &HubSettings,
    now_secs: u64,
) -> Result<Option<Principal>, AuthError> {
    let Some(name) = &token.key_name else {
        return Ok(None);
    };
    let scope = parse_scope(&token.resource, hub)?;
    let policy = hub
        .policy(name)
        .ok_or_else(|| AuthError::UnknownPolicy(name.clone()))?;
    token.verify(
        now_secs,
        [policy.primary_key.as_str(), policy.secondary_key.as_str()],
    )?;
    Ok(Some(Principal {
        signer: Signer::Policy(name.clone()),
        scope,
        permissions: policy.permissions,
    }))
}

/// Authenticates a token signed with the key of `identity` (the device or module named by the
/// token's scope).
pub fn authenticate_identity(
    token: &SasToken,
    identity: &Identity,
    now_secs: u64,
) -> Result<Principal, AuthError> {
    let name = match &identity.module_id {
        Some(m) => format!("{}/{}", identity.device_id, m),
        None => identity.device_id.clone(),
    };
    let keys = match (
        &identity.authentication.kind,
        &identity.authentication.symmetric_keys,
    ) {
        (AuthType::Sas, Some(k)) => k,
        _ => return Err(AuthError::UnknownIdentity(name)),
    };
    token.verify(
        now_secs,
        [keys.primary_key.as_str(), keys.secondary_key.as_str()],
    )?;
    if identity.status == Status::Disabled {
        return Err(AuthError::Disabled(name));
    }
    Ok(Principal {
        signer: Signer::Identity {
            device_id: identity.device_id.clone(),
            module_id: identity.module_id.clone(),
        },
        scope: Scope::Device {
            device_id: identity.device_id.clone(),
            module_id: identity.module_id.clone(),
        },
        permissions: Permissions {
            device_connect: true,
            ..Permissions::default()
        },
    })
}

/// One permission an endpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    RegistryRead,
    RegistryWrite,
    ServiceConnect,
    DeviceConnect,
}

impl Principal {
    /// Checks a permission; RegistryReadWrite implies RegistryRead.
    pub fn require(&self, p: Permission) -> Result<(), AuthError> {
        let g = &self.permissions;
        let ok = match p {
            Permission::RegistryRead => g.registry_read || g.registry_write,
            Permission::RegistryWrite => g.registry_write,
            Permission::ServiceConnect => g.service_connect,
            Permission::DeviceConnect => g.device_connect,
        };
        if ok {
            Ok(())
        } else {
            Err(AuthError::Forbidden(match p {
                Permission::RegistryRead => "RegistryRead",
                Permission::RegistryWrite => "RegistryWrite",
                Permission::ServiceConnect => "ServiceConnect",
                Permission::DeviceConnect => "DeviceConnect",
            }))
        }
    }

    /// Checks a permission on a hub-wide endpoint.
    pub fn require_hub(&self, p: Permission) -> Result<(), AuthError> {
        if self.scope != Scope::Hub {
            return Err(AuthError::DeviceScoped);
        }
        self.require(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes() {
        assert_eq!(parse_scope("localhost", "localhost").unwrap(), Scope::Hub);
        assert_eq!(
            parse_scope("localhost/messages/events", "localhost").unwrap(),
            Scope::Hub
        );
        assert!(parse_scope("localhost/messages/devicebound", "localhost").is_err());
        assert_eq!(
            parse_scope("LOCALHOST:8443", "localhost").unwrap(),
            Scope::Hub
        );
        assert_eq!(
            parse_scope("localhost/devices/d1/messages/events", "localhost").unwrap(),
            Scope::Device {
                device_id: "d1".into(),
                module_id: None
            }
        );
        assert_eq!(
            parse_scope("localhost/devices/d1/modules/m1", "localhost").unwrap(),
            Scope::Device {
                device_id: "d1".into(),
                module_id: Some("m1".into())
            }
        );
        assert!(matches!(
            parse_scope("other/devices/d1", "localhost"),
            Err(AuthError::WrongHub(_))
        ));
        assert!(matches!(
            parse_scope("localhost/things", "localhost"),
            Err(AuthError::BadResource(_))
        ));
        assert_eq!(
            parse_scope(
                "sb://localhost/ferrohub/ConsumerGroups/$Default",
                "localhost"
            )
            .unwrap(),
            Scope::Hub
        );
        assert_eq!(
            parse_scope("sb://localhost/", "localhost").unwrap(),
            Scope::Hub
        );
        assert!(matches!(
            parse_scope("sb://other/ferrohub", "localhost"),
            Err(AuthError::WrongHub(_))
        ));
        assert!(matches!(
            parse_scope("https://localhost/ferrohub", "localhost"),
            Err(AuthError::BadResource(_))
        ));
    }

    #[test]
    fn read_write_implies_read() {
        let p = Principal {
            signer: Signer::Policy("registryReadWrite".into()),
            scope: Scope::Hub,
            permissions: Permissions {
                registry_write: true,
                ..Default::default()
            },
        };
        assert!(p.require_hub(Permission::RegistryRead).is_ok());
        assert!(p.require_hub(Permission::ServiceConnect).is_err());
        let scoped = Principal {
            scope: Scope::Device {
                device_id: "d".into(),
                module_id: None,
            },
            ..p
        };
        assert_eq!(
            scoped.require_hub(Permission::RegistryRead),
            Err(AuthError::DeviceScoped)
        );
    }
}
