//! One line of `devices.txt` (seed 002, "Exportar/Importar identidades"): IoT Hub's
//! ExportImportDevice shape, both ways.
//!
//! An exported line carries everything IoT Hub's does (id, moduleId, eTag, status,
//! authentication, twinETag, tags, properties with `$metadata`/`$version`, capabilities,
//! scopes) plus what an exact restore needs and IoT Hub readers ignore: `generationId`,
//! `statusUpdatedTime`, `lastActivityTime`, `managedBy`, the twin `version`, and
//! `$lastUpdatedVersion` in reported metadata too.
//!
//! # Invariants
//! - [`restore_records`] of [`export_line`] gives back the stored records (connection state
//!   aside), metadata times to the millisecond.
//! - An import line never touches reported properties: devices own them.

use ferrohub_engine::archive::IdentityRecords;
use ferrohub_engine::identity::BulkItem;
#[cfg(test)]
use ferrohub_engine::identity::ImportMode;
use ferrohub_engine::model::{
    AuthType, Authentication, ConnectionState, Identity, Status, SymmetricKeys, Thumbprints,
    UnixMillis,
};
use ferrohub_engine::twin::document::{MetaNode, Section};
use ferrohub_engine::twin::record::TwinRecord;
use ferrohub_engine::twin::store::TwinWrite;
use serde_json::{json, Map, Value};

use super::super::identity_json::{
    auth_type_name, format_time, import_mode, status_name, IdentityBody,
};
use super::super::twins::metadata_time;

/// Why a line was not imported or restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub device_id: Option<String>,
    pub module_id: Option<String>,
    pub import_mode: Option<String>,
    pub message: String,
}

fn line_error(v: Option<&Value>, message: impl Into<String>) -> LineError {
    let s = |k: &str| {
        v.and_then(|v| v.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    LineError {
        device_id: s("id"),
        module_id: s("moduleId"),
        import_mode: s("importMode"),
        message: message.into(),
    }
}

/// The export line of one identity.
pub fn export_line(r: &IdentityRecords, exclude_keys: bool) -> Value {
    let i = &r.identity;
    let t = &r.twin;
    let authentication = if exclude_keys {
        Value::Null
    } else {
        let keys = i.authentication.symmetric_keys.as_ref();
        let prints = i.authentication.thumbprints.clone().unwrap_or_default();
        json!({
            "symmetricKey": {
                "primaryKey": keys.map(|k| k.primary_key.clone()),
                "secondaryKey": keys.map(|k| k.secondary_key.clone()),
            },
            "x509Thumbprint": {
                "primaryThumbprint": prints.primary,
                "secondaryThumbprint": prints.secondary,
            },
            "type": auth_type_name(i.authentication.kind),
        })
    };
    let mut out = json!({
        "id": i.device_id,
        "eTag": i.etag,
        "generationId": i.generation_id,
        "status": status_name(i.status),
        "statusReason": i.status_reason,
        "statusUpdatedTime": format_time(Some(i.status_updated_time)),
        "lastActivityTime": format_time(i.last_activity_time),
        "authentication": authentication,
        "twinETag": t.etag,
        "version": t.version,
        "tags": Value::Object(t.tags.clone()),
        "properties": {
            "desired": t.desired.to_json(&metadata_time, true),
            "reported": t.reported.to_json(&metadata_time, true),
        },
        "capabilities": {"iotEdge": i.iot_edge},
        "deviceScope": i.device_scope,
        "parentScopes": i.parent_scopes,
    });
    if let Some(m) = &i.module_id {
        out["moduleId"] = Value::String(m.clone());
        out["managedBy"] = json!(i.managed_by);
    }
    // Not in IoT Hub's export; kept so an offline restore keeps a Plug and Play model id.
    if let Some(model) = &i.model_id {
        out["modelId"] = Value::String(model.clone());
    }
    out
}

fn parse_time(s: &str) -> Result<Option<UnixMillis>, String> {
    if s.starts_with("0001-01-01") {
        return Ok(None);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|d| Some(UnixMillis(d.timestamp_millis())))
        .map_err(|e| format!("time {s:?}: {e}"))
}

fn meta_node(v: &Value) -> Result<MetaNode, String> {
    let obj = v.as_object().ok_or("$metadata node is not an object")?;
    let last_updated = obj
        .get("$lastUpdated")
        .and_then(Value::as_str)
        .ok_or("$metadata node without $lastUpdated")?;
    let mut children = std::collections::BTreeMap::new();
    for (k, child) in obj {
        if !k.starts_with('$') {
            children.insert(k.clone(), meta_node(child)?);
        }
    }
    Ok(MetaNode {
        last_updated: parse_time(last_updated)?.unwrap_or_default(),
        last_updated_version: obj
            .get("$lastUpdatedVersion")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        children,
    })
}

fn section(v: Option<&Value>, name: &str) -> Result<Section, String> {
    let obj = v
        .and_then(Value::as_object)
        .ok_or_else(|| format!("properties.{name} is missing"))?;
    let body: Map<String, Value> = obj
        .iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Section {
        body,
        version: obj
            .get("$version")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("properties.{name}.$version is missing"))?,
        metadata: meta_node(
            obj.get("$metadata")
                .ok_or_else(|| format!("properties.{name}.$metadata is missing"))?,
        )?,
    })
}

fn str_field<'a>(v: &'a Value, k: &str) -> Result<&'a str, String> {
    v.get(k)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{k} is missing or not a string"))
}

fn opt_str(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_string)
}

/// The stored records an exported line describes (offline restore).
///
/// # Errors
/// A [`LineError`] naming the first missing or malformed field.
pub fn restore_records(v: &Value) -> Result<IdentityRecords, LineError> {
    restore_inner(v).map_err(|m| line_error(Some(v), m))
}

fn restore_inner(v: &Value) -> Result<IdentityRecords, String> {
    let auth = v.get("authentication").filter(|a| !a.is_null()).ok_or(
        "authentication is null: this export was written without keys (excludeKeysInExport) and cannot restore identities",
    )?;
    let kind = match auth.get("type").and_then(Value::as_str).unwrap_or("sas") {
        "sas" => AuthType::Sas,
        "selfSigned" => AuthType::SelfSigned,
        "certificateAuthority" => AuthType::CertificateAuthority,
        "none" => AuthType::None,
        other => return Err(format!("authentication.type {other:?} is unknown")),
    };
    let key = |k: &str| {
        auth.get("symmetricKey")
            .and_then(|s| s.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let print = |k: &str| {
        auth.get("x509Thumbprint")
            .and_then(|s| s.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let authentication = Authentication {
        kind,
        symmetric_keys: match (kind, key("primaryKey"), key("secondaryKey")) {
            (AuthType::Sas, Some(primary_key), Some(secondary_key)) => Some(SymmetricKeys {
                primary_key,
                secondary_key,
            }),
            (AuthType::Sas, _, _) => return Err("a sas identity needs both keys".into()),
            _ => None,
        },
        thumbprints: (kind == AuthType::SelfSigned).then(|| Thumbprints {
            primary: print("primaryThumbprint"),
            secondary: print("secondaryThumbprint"),
        }),
    };
    let status = match str_field(v, "status")? {
        "enabled" => Status::Enabled,
        "disabled" => Status::Disabled,
        other => return Err(format!("status {other:?} is unknown")),
    };
    let identity = Identity {
        device_id: str_field(v, "id")?.to_string(),
        module_id: opt_str(v, "moduleId"),
        generation_id: str_field(v, "generationId")?.to_string(),
        etag: str_field(v, "eTag")?.to_string(),
        status,
        status_reason: opt_str(v, "statusReason"),
        status_updated_time: parse_time(str_field(v, "statusUpdatedTime")?)?.unwrap_or_default(),
        connection_state: ConnectionState::Disconnected,
        connection_state_updated_time: None,
        last_activity_time: match v.get("lastActivityTime").and_then(Value::as_str) {
            Some(t) => parse_time(t)?,
            None => None,
        },
        cloud_to_device_message_count: 0,
        authentication,
        iot_edge: v
            .pointer("/capabilities/iotEdge")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        device_scope: opt_str(v, "deviceScope"),
        parent_scopes: v
            .get("parentScopes")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        managed_by: opt_str(v, "managedBy"),
        model_id: opt_str(v, "modelId").filter(|m| ferrohub_engine::twin::pnp::is_valid_dtmi(m)),
    };
    let properties = v.get("properties");
    let twin = TwinRecord {
        tags: v
            .get("tags")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        desired: section(properties.and_then(|p| p.get("desired")), "desired")?,
        reported: section(properties.and_then(|p| p.get("reported")), "reported")?,
        version: v
            .get("version")
            .and_then(Value::as_u64)
            .ok_or("version (the twin's) is missing")?,
        etag: str_field(v, "twinETag")?.to_string(),
        // Configurations are not exported; the reconciler works them out again.
        configurations: Default::default(),
        model_id: identity.model_id.clone(),
    };
    Ok(IdentityRecords { identity, twin })
}

/// The registry change an import line asks for.
///
/// # Errors
/// A [`LineError`] for a line that is not JSON, has no id, or has fields of the wrong shape.
pub fn import_item(line: &str) -> Result<BulkItem, LineError> {
    let v: Value = serde_json::from_str(line)
        .map_err(|e| line_error(None, format!("the line is not JSON: {e}")))?;
    let fail = |m: String| line_error(Some(&v), m);
    if !v.is_object() {
        return Err(fail("the line is not a JSON object".into()));
    }
    let device_id = v
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| fail("id is missing".into()))?
        .to_string();
    let mode = import_mode(v.get("importMode").and_then(Value::as_str)).map_err(fail)?;
    let mut body: IdentityBody =
        serde_json::from_value(v.clone()).map_err(|e| fail(e.to_string()))?;
    // IdentityBody reads ETag as `etag`; ExportImportDevice spells it `eTag`.
    body.etag = opt_str(&v, "eTag");
    let spec = body.to_spec().map_err(|e| fail(e.to_string()))?;
    let object = |p: &str| -> Result<Option<Map<String, Value>>, LineError> {
        match v.pointer(p) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(
                m.iter()
                    .filter(|(k, _)| !k.starts_with('$'))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )),
            Some(_) => Err(fail(format!("{} must be an object", &p[1..]))),
        }
    };
    let tags = object("/tags")?;
    let desired = object("/properties/desired")?;
    let twin = (tags.is_some() || desired.is_some()).then_some(TwinWrite { tags, desired });
    Ok(BulkItem {
        device_id,
        module_id: opt_str(&v, "moduleId"),
        mode,
        etag: body.etag,
        spec,
        twin,
    })
}

/// The `importErrors.log` line of a refused input line.
pub fn error_log_line(line_number: u64, e: &LineError, code: &str) -> String {
    json!({
        "lineNumber": line_number,
        "deviceId": e.device_id,
        "moduleId": e.module_id,
        "importMode": e.import_mode,
        "errorCode": code,
        "errorStatus": e.message,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> IdentityRecords {
        let mut twin = TwinRecord::empty(UnixMillis(1_700_000_000_000));
        twin.tags.insert("plant".into(), json!({"line": 4}));
        twin.desired.patch(
            json!({"fan": {"speed": 3}, "mode": "eco"})
                .as_object()
                .unwrap(),
            UnixMillis(1_700_000_000_123),
        );
        twin.reported.patch(
            json!({"temp": 21.5}).as_object().unwrap(),
            UnixMillis(1_700_000_000_456),
        );
        twin.version = 3;
        IdentityRecords {
            identity: Identity {
                device_id: "dev-1".into(),
                module_id: None,
                generation_id: "638000000000000001".into(),
                etag: "MQ==".into(),
                status: Status::Disabled,
                status_reason: Some("maintenance".into()),
                status_updated_time: UnixMillis(1_700_000_000_001),
                connection_state: ConnectionState::Disconnected,
                connection_state_updated_time: None,
                last_activity_time: Some(UnixMillis(1_700_000_000_999)),
                cloud_to_device_message_count: 0,
                authentication: Authentication {
                    kind: AuthType::Sas,
                    symmetric_keys: Some(SymmetricKeys {
                        primary_key: "cHJpbWFyeWtleXByaW1hcnlrZXk=".into(),
                        secondary_key: "c2Vjb25kYXJ5a2V5c2Vjb25kYXJ5".into(),
                    }),
                    thumbprints: None,
                },
                iot_edge: true,
                device_scope: Some("ms-azure-iot-edge://x-1".into()),
                parent_scopes: vec!["ms-azure-iot-edge://x-1".into()],
                managed_by: None,
                model_id: None,
            },
            twin,
        }
    }

    #[test]
    fn restore_gives_back_what_was_exported() {
        let r = records();
        let line = export_line(&r, false);
        let text = line.to_string();
        let back = restore_records(&serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn excluded_keys_cannot_be_restored_but_can_be_imported() {
        let line = export_line(&records(), true);
        assert!(line["authentication"].is_null());
        let e = restore_records(&line).unwrap_err();
        assert!(e.message.contains("excludeKeysInExport"), "{}", e.message);
        let item = import_item(&line.to_string()).unwrap();
        assert_eq!(item.spec.keys.primary_key, None);
        let twin = item.twin.unwrap();
        assert_eq!(twin.desired.unwrap()["fan"], json!({"speed": 3}));
        assert_eq!(twin.tags.unwrap()["plant"], json!({"line": 4}));
    }

    #[test]
    fn import_lines_name_their_faults() {
        assert!(import_item("{not json")
            .unwrap_err()
            .message
            .contains("not JSON"));
        let e = import_item(r#"{"id":"a","importMode":"merge"}"#).unwrap_err();
        assert_eq!(e.device_id.as_deref(), Some("a"));
        assert!(e.message.contains("merge"));
        let e = import_item(r#"{"id":"a","status":"sleepy"}"#).unwrap_err();
        assert!(e.message.contains("status"));
        let e = import_item(r#"{"id":"a","tags":[1]}"#).unwrap_err();
        assert!(e.message.contains("tags"));
        let item =
            import_item(r#"{"id":"a","eTag":"MQ==","importMode":"deleteIfMatchETag"}"#).unwrap();
        assert_eq!(item.mode, ImportMode::DeleteIfMatchETag);
        assert_eq!(item.etag.as_deref(), Some("MQ=="));
    }
}
