//! Twin change bodies (TWN-9, EVT-4) for the notification outbox (`crate::notifications`):
//! the twin `version`, and the changed parts with their `$metadata` (`$lastUpdated`,
//! `$lastUpdatedVersion`) and section `$version`; a replacement carries the whole twin.

use serde_json::{Map, Value};

use super::document::Section;
use super::record::TwinRecord;
use crate::model::{Identity, UnixMillis};

/// The changed members of a section with their metadata and the section's `$version`.
pub(crate) fn changed_section(
    section: &Section,
    patch: &Map<String, Value>,
    metadata_version: bool,
) -> Value {
    let ms = |t: UnixMillis| t.0.to_string();
    let mut out = patch.clone();
    let mut meta = Map::new();
    meta.insert(
        "$lastUpdated".into(),
        Value::String(ms(section.metadata.last_updated)),
    );
    if metadata_version {
        meta.insert(
            "$lastUpdatedVersion".into(),
            Value::from(section.metadata.last_updated_version),
        );
    }
    for k in patch.keys() {
        if let Some(node) = section.metadata.children.get(k) {
            meta.insert(k.clone(), node.to_json(&ms, metadata_version));
        }
    }
    out.insert("$metadata".into(), Value::Object(meta));
    out.insert("$version".into(), Value::from(section.version));
    Value::Object(out)
}

/// The whole twin as lifecycle events carry it (seed 004): ids, etag, version, tags when there
/// are any, and both property sections with their metadata.
/// `desired_versions` adds `$lastUpdatedVersion` to desired metadata (twin change events have
/// it, lifecycle events do not).
pub(crate) fn whole_twin(
    identity: &Identity,
    record: &TwinRecord,
    desired_versions: bool,
) -> Map<String, Value> {
    let ms = |t: UnixMillis| t.0.to_string();
    let mut body = Map::new();
    body.insert("deviceId".into(), Value::from(identity.device_id.clone()));
    if let Some(m) = &identity.module_id {
        body.insert("moduleId".into(), Value::from(m.clone()));
    }
    body.insert("etag".into(), Value::from(record.etag.clone()));
    body.insert("version".into(), Value::from(record.version));
    if !record.tags.is_empty() {
        body.insert("tags".into(), Value::Object(record.tags.clone()));
    }
    let mut properties = Map::new();
    properties.insert(
        "desired".into(),
        record.desired.to_json(&ms, desired_versions),
    );
    properties.insert("reported".into(), record.reported.to_json(&ms, false));
    body.insert("properties".into(), Value::Object(properties));
    body
}
