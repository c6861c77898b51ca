//! IoT Hub's JSON shapes for device and module identities (`compat` §B3), both ways.
//!
//! Requests are tolerant the way the service is: every field optional (the request structs are
//! `#[serde(default)]` as a whole), read-only fields ignored, unknown fields ignored; a field of
//! the wrong JSON type is a 400.

use ferrohub_engine::identity::ImportMode;
use ferrohub_engine::model::{AuthType, Identity, IdentitySpec, KeysSpec, Status, Thumbprints};
use serde::{Deserialize, Serialize};

use super::error::ApiError;
pub use crate::hub::twin_rows::{auth_type_name, connection_state, format_time, status_name};

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SymmetricKeyJson {
    pub primary_key: Option<String>,
    pub secondary_key: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ThumbprintJson {
    pub primary_thumbprint: Option<String>,
    pub secondary_thumbprint: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AuthenticationJson {
    pub symmetric_key: Option<SymmetricKeyJson>,
    pub x509_thumbprint: Option<ThumbprintJson>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CapabilitiesJson {
    pub iot_edge: Option<bool>,
}

/// A device or module as a request body (the settable subset; the rest is ignored).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IdentityBody {
    pub device_id: Option<String>,
    pub module_id: Option<String>,
    pub status: Option<String>,
    pub status_reason: Option<String>,
    pub authentication: Option<AuthenticationJson>,
    pub capabilities: Option<CapabilitiesJson>,
    pub device_scope: Option<String>,
    pub parent_scopes: Option<Vec<String>>,
    pub managed_by: Option<String>,
    pub etag: Option<String>,
}

fn parse_status(s: Option<&str>) -> Result<Status, ApiError> {
    match s.map(str::to_ascii_lowercase).as_deref() {
        None | Some("enabled") => Ok(Status::Enabled),
        Some("disabled") => Ok(Status::Disabled),
        Some(other) => Err(ApiError::argument(format!(
            "status must be enabled or disabled, not {other:?}"
        ))),
    }
}

fn parse_auth_type(a: Option<&AuthenticationJson>) -> Result<AuthType, ApiError> {
    let has_thumbprint = a
        .and_then(|a| a.x509_thumbprint.as_ref())
        .is_some_and(|t| t.primary_thumbprint.is_some() || t.secondary_thumbprint.is_some());
    match a.and_then(|a| a.kind.as_deref()) {
        None if has_thumbprint => Ok(AuthType::SelfSigned),
        None | Some("sas") => Ok(AuthType::Sas),
        Some("selfSigned") => Ok(AuthType::SelfSigned),
        Some("certificateAuthority") => Ok(AuthType::CertificateAuthority),
        Some("none") => Ok(AuthType::None),
        Some(other) => Err(ApiError::argument(format!(
            "authentication.type must be sas, selfSigned, certificateAuthority or none, not {other:?}"
        ))),
    }
}

impl IdentityBody {
    /// The engine's view of what the caller asked for.
    pub fn to_spec(&self) -> Result<IdentitySpec, ApiError> {
        let auth = self.authentication.as_ref();
        let keys = auth.and_then(|a| a.symmetric_key.as_ref());
        let prints = auth.and_then(|a| a.x509_thumbprint.as_ref());
        let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        Ok(IdentitySpec {
            status: parse_status(self.status.as_deref())?,
            status_reason: self.status_reason.clone(),
            auth_type: parse_auth_type(auth)?,
            keys: KeysSpec {
                primary_key: keys.and_then(|k| non_empty(&k.primary_key)),
                secondary_key: keys.and_then(|k| non_empty(&k.secondary_key)),
            },
            thumbprints: Thumbprints {
                primary: prints.and_then(|t| non_empty(&t.primary_thumbprint)),
                secondary: prints.and_then(|t| non_empty(&t.secondary_thumbprint)),
            },
            iot_edge: self
                .capabilities
                .as_ref()
                .and_then(|c| c.iot_edge)
                .unwrap_or(false),
            device_scope: self.device_scope.clone(),
            parent_scopes: self.parent_scopes.clone().unwrap_or_default(),
            managed_by: self.managed_by.clone(),
        })
    }
}

fn auth_json(i: &Identity) -> AuthenticationJson {
    let a = &i.authentication;
    AuthenticationJson {
        symmetric_key: Some(SymmetricKeyJson {
            primary_key: a.symmetric_keys.as_ref().map(|k| k.primary_key.clone()),
            secondary_key: a.symmetric_keys.as_ref().map(|k| k.secondary_key.clone()),
        }),
        x509_thumbprint: Some(ThumbprintJson {
            primary_thumbprint: a.thumbprints.as_ref().and_then(|t| t.primary.clone()),
            secondary_thumbprint: a.thumbprints.as_ref().and_then(|t| t.secondary.clone()),
        }),
        kind: Some(auth_type_name(a.kind).to_string()),
    }
}

/// The Device model.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceJson {
    device_id: String,
    generation_id: String,
    etag: String,
    connection_state: &'static str,
    status: &'static str,
    status_reason: Option<String>,
    connection_state_updated_time: String,
    status_updated_time: String,
    last_activity_time: String,
    cloud_to_device_message_count: u32,
    authentication: AuthenticationJson,
    capabilities: CapabilitiesJson,
    device_scope: Option<String>,
    parent_scopes: Vec<String>,
    /// The Plug and Play model the device announced (PNP-1); absent for other devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    model_id: Option<String>,
}

impl From<&Identity> for DeviceJson {
    fn from(d: &Identity) -> Self {
        DeviceJson {
            device_id: d.device_id.clone(),
            generation_id: d.generation_id.clone(),
            etag: d.etag.clone(),
            connection_state: connection_state(d.connection_state),
            status: status_name(d.status),
            status_reason: d.status_reason.clone(),
            connection_state_updated_time: format_time(d.connection_state_updated_time),
            status_updated_time: format_time(Some(d.status_updated_time)),
            last_activity_time: format_time(d.last_activity_time),
            cloud_to_device_message_count: d.cloud_to_device_message_count,
            authentication: auth_json(d),
            capabilities: CapabilitiesJson {
                iot_edge: Some(d.iot_edge),
            },
            device_scope: d.device_scope.clone(),
            parent_scopes: d.parent_scopes.clone(),
            model_id: d.model_id.clone(),
        }
    }
}

/// The Module model.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModuleJson {
    module_id: String,
    managed_by: Option<String>,
    device_id: String,
    generation_id: String,
    etag: String,
    connection_state: &'static str,
    connection_state_updated_time: String,
    last_activity_time: String,
    cloud_to_device_message_count: u32,
    authentication: AuthenticationJson,
    #[serde(skip_serializing_if = "Option::is_none")]
    model_id: Option<String>,
}

impl From<&Identity> for ModuleJson {
    fn from(m: &Identity) -> Self {
        ModuleJson {
            module_id: m.module_id.clone().unwrap_or_default(),
            managed_by: m.managed_by.clone(),
            device_id: m.device_id.clone(),
            generation_id: m.generation_id.clone(),
            etag: m.etag.clone(),
            connection_state: connection_state(m.connection_state),
            connection_state_updated_time: format_time(m.connection_state_updated_time),
            last_activity_time: format_time(m.last_activity_time),
            cloud_to_device_message_count: m.cloud_to_device_message_count,
            authentication: auth_json(m),
            model_id: m.model_id.clone(),
        }
    }
}

/// The `importMode` of a bulk item or import line (`createOrUpdate` when absent).
pub fn import_mode(s: Option<&str>) -> Result<ImportMode, String> {
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

/// The wire name of an import mode.
pub fn import_mode_name(m: ImportMode) -> &'static str {
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

/// One item of `POST /devices` (ExportImportDevice).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BulkItemJson {
    pub id: String,
    #[serde(default)]
    pub module_id: Option<String>,
    #[serde(default, rename = "eTag")]
    pub etag: Option<String>,
    #[serde(default)]
    pub import_mode: Option<String>,
    #[serde(flatten)]
    pub identity: IdentityBody,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrohub_engine::model::UnixMillis;

    #[test]
    fn never_is_year_one() {
        assert_eq!(format_time(None), "0001-01-01T00:00:00Z");
        assert_eq!(
            format_time(Some(UnixMillis(1_700_000_000_123))),
            "2023-11-14T22:13:20.1230000Z"
        );
    }

    #[test]
    fn sdk_create_body_with_empty_keys_generates() {
        let body: IdentityBody = serde_json::from_str(
            r#"{"deviceId":"d","status":"enabled","authentication":{"symmetricKey":{},"type":"sas"},"capabilities":{"iotEdge":false}}"#,
        )
        .unwrap();
        let spec = body.to_spec().unwrap();
        assert_eq!(spec.auth_type, AuthType::Sas);
        assert_eq!(spec.keys, KeysSpec::default());
    }

    #[test]
    fn wrong_types_do_not_parse() {
        assert!(serde_json::from_str::<IdentityBody>(r#"{"status": 5}"#).is_err());
        assert!(serde_json::from_str::<IdentityBody>(r#"[1,2]"#).is_err());
    }
}
