//! Twin change bodies (TWN-9, EVT-4) for the notification outbox (`crate::notifications`):
//! the twin `version`, and the changed parts with their `$metadata` (`$lastUpdated`,
//! `$lastUpdatedVersion`) and section `$version`; a replacement carries the whole twin.

use serde_json::{Map, Value};

use super::document::Section;
use super::pnp;
use super::record::TwinRecord;
use crate::model::{Identity, UnixMillis};
use crate::notifications::{NotificationOp, PendingNotification};
use crate::Store;

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

impl Store {
    /// Whether Plug and Play twin writes record digital twin changes from now on (PNP-5); off
    /// until the hub says a route takes them.
    pub fn record_digital_twin_changes(&self, on: bool) {
        self.digital_twin_changes
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The digital twin view a write of `record` starts from, when the write is to record its
    /// digital twin change: the twin has a model id and changes are being recorded.
    pub(crate) fn digital_view_before(
        &self,
        dt_id: &str,
        record: &TwinRecord,
    ) -> Option<Map<String, Value>> {
        if !self
            .digital_twin_changes
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return None;
        }
        let model = record.model_id.as_deref()?;
        Some(pnp::view(dt_id, Some(model), record, &stored_time))
    }
}

/// A time as stored notification bodies carry it: Unix milliseconds in a string.
fn stored_time(t: UnixMillis) -> String {
    t.0.to_string()
}

/// The digital twin change record of a write of `ids` that took the view from `before` to
/// `after`'s (`op` the twin operation: update or replacement); none without a view before or
/// when nothing in the view changed. Body `{"patch": [JSON Patch], "modelId"}`.
pub(crate) fn digital_twin_change(
    (device_id, module_id): (&str, Option<&str>),
    before: Option<Map<String, Value>>,
    after: &TwinRecord,
    op: NotificationOp,
    now: UnixMillis,
) -> Option<PendingNotification> {
    let before = before?;
    let model = after.model_id.as_deref()?;
    let patch = pnp::diff::diff(
        before,
        pnp::view(device_id, Some(model), after, &stored_time),
    );
    if patch.is_empty() {
        return None;
    }
    let mut body = Map::new();
    body.insert("patch".into(), Value::Array(patch));
    body.insert("modelId".into(), Value::String(model.to_string()));
    Some(PendingNotification {
        device_id: device_id.to_string(),
        module_id: module_id.map(str::to_string),
        op: match op {
            NotificationOp::ReplaceTwin => NotificationOp::DigitalTwinReplace,
            _ => NotificationOp::DigitalTwinUpdate,
        },
        time: now,
        body,
    })
}
