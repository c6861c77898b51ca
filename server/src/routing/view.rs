//! What a routing condition sees of an event about to be stored: system properties by their
//! routing keywords, application properties, the body when it is JSON, and the device's twin
//! (read lazily, only when a condition or enrichment asks).

use std::cell::OnceCell;

use ferrohub_engine::d2c::NewEvent;
use ferrohub_engine::twin::store::TwinRecord;
use ferrohub_engine::UnixMillis;
use serde_json::{Map, Value};

use super::query::MessageView;

/// Routing keywords and the stored system property names they read.
const SYSTEM: &[(&str, &str)] = &[
    ("contentType", "content-type"),
    ("contentEncoding", "content-encoding"),
    ("messageId", "message-id"),
    ("correlationId", "correlation-id"),
    ("userId", "user-id"),
    ("connectionDeviceId", "iothub-connection-device-id"),
    ("connectionModuleId", "iothub-connection-module-id"),
    ("connectionAuthMethod", "iothub-connection-auth-method"),
    (
        "connectionDeviceGenerationId",
        "iothub-connection-auth-generation-id",
    ),
    ("messageSource", "iothub-message-source"),
];

/// The stored system property a routing keyword reads (`messageId` → `message-id`); a name
/// that is no keyword is its own stored name.
pub fn stored_system_name(keyword: &str) -> &str {
    SYSTEM
        .iter()
        .find(|(k, _)| *k == keyword)
        .map_or(keyword, |(_, v)| *v)
}

/// A twin as routing reads it: `tags` and `properties.{desired,reported}`.
pub type TwinDoc = Value;

/// Where routing reads a device's or module's twin. Routing itself never touches storage:
/// the hub passes a source that reads the engine, behind its seam.
pub trait TwinSource {
    /// The twin of the identity, shaped by [`twin_doc`]; `None` if there is none.
    fn twin(&self, device_id: &str, module_id: Option<&str>) -> Option<TwinDoc>;
}

/// No twins at all: conditions on `$twin` are undefined.
pub struct NoTwins;

impl TwinSource for NoTwins {
    fn twin(&self, _: &str, _: Option<&str>) -> Option<TwinDoc> {
        None
    }
}

/// A stored twin as routing sees it.
pub fn twin_doc(record: &TwinRecord) -> TwinDoc {
    let mut properties = Map::new();
    properties.insert("desired".into(), Value::Object(record.desired.body.clone()));
    properties.insert(
        "reported".into(),
        Value::Object(record.reported.body.clone()),
    );
    let mut doc = Map::new();
    doc.insert("tags".into(), Value::Object(record.tags.clone()));
    doc.insert("properties".into(), Value::Object(properties));
    Value::Object(doc)
}

/// One event seen by conditions and enrichments.
pub struct EventView<'a> {
    pub event: &'a NewEvent,
    pub module_id: Option<&'a str>,
    /// When the event is being routed (`$enqueuedTime`); formatted only when a condition
    /// reads it, since most messages are routed without looking.
    pub enqueued: UnixMillis,
    twins: &'a dyn TwinSource,
    body: OnceCell<Option<Value>>,
    twin: OnceCell<Option<TwinDoc>>,
}

impl<'a> EventView<'a> {
    pub fn new(
        event: &'a NewEvent,
        module_id: Option<&'a str>,
        enqueued: UnixMillis,
        twins: &'a dyn TwinSource,
    ) -> Self {
        EventView {
            event,
            module_id,
            enqueued,
            twins,
            body: OnceCell::new(),
            twin: OnceCell::new(),
        }
    }

    fn stored_system(&self, name: &str) -> Option<&str> {
        self.event
            .system_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_ref())
    }

    /// The twin value at `path` (`tags.x`, `properties.reported.y`), if defined.
    pub fn twin_value(&self, path: &[String]) -> Option<Value> {
        let twin = self.twin.get_or_init(|| self.load_twin()).as_ref()?;
        let mut node = twin;
        for step in path {
            node = node.as_object()?.get(step)?;
        }
        Some(node.clone())
    }

    /// Reads the twin synchronously: a point read, only for conditions or enrichments that
    /// name `$twin` (never on the plain routing path).
    fn load_twin(&self) -> Option<TwinDoc> {
        self.twins.twin(&self.event.device_id, self.module_id)
    }
}

/// Whether a body with these properties is JSON that conditions may query.
fn queryable_json(content_type: Option<&str>, content_encoding: Option<&str>) -> bool {
    let ct = content_type.unwrap_or_default().to_ascii_lowercase();
    let ce = content_encoding.unwrap_or_default().to_ascii_lowercase();
    ct.split(';').next().map(str::trim) == Some("application/json")
        && matches!(ce.as_str(), "utf-8" | "utf-16" | "utf-32")
}

impl MessageView for EventView<'_> {
    fn system_property(&self, name: &str) -> Option<Value> {
        if name == "enqueuedTime" {
            return Some(Value::String(crate::clock::iso7(self.enqueued)));
        }
        self.stored_system(stored_system_name(name))
            .map(|v| Value::String(v.to_string()))
    }

    fn application_property(&self, name: &str) -> Option<Value> {
        self.event
            .application_properties
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| Value::String(v.clone()))
    }

    fn body(&self) -> Option<&Value> {
        self.body
            .get_or_init(|| {
                if !queryable_json(
                    self.stored_system("content-type"),
                    self.stored_system("content-encoding"),
                ) {
                    return None;
                }
                // utf-16/32 bodies would need transcoding; IoT Hub devices send utf-8.
                serde_json::from_slice(&self.event.body).ok()
            })
            .as_ref()
    }

    fn twin(&self, path: &[String]) -> Option<Value> {
        self.twin_value(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_bodies_in_utf_encodings_are_queryable() {
        assert!(queryable_json(Some("application/json"), Some("utf-8")));
        assert!(queryable_json(
            Some("Application/JSON; charset=utf-8"),
            Some("UTF-8")
        ));
        assert!(!queryable_json(Some("application/json"), None));
        assert!(!queryable_json(Some("text/plain"), Some("utf-8")));
    }

    #[test]
    fn view_maps_keywords_to_stored_names_and_parses_the_body() {
        let event = NewEvent {
            device_id: "d".into(),
            system_properties: vec![
                ("content-type".into(), "application/json".into()),
                ("content-encoding".into(), "utf-8".into()),
                ("iothub-connection-device-id".into(), "d".into()),
            ],
            application_properties: vec![("level".into(), "high".into())],
            body: br#"{"t": 21.5}"#.to_vec(),
            ..NewEvent::default()
        };
        let v = EventView::new(&event, None, UnixMillis(1_767_225_600_000), &NoTwins);
        assert_eq!(
            v.system_property("connectionDeviceId"),
            Some(Value::from("d"))
        );
        assert_eq!(v.application_property("level"), Some(Value::from("high")));
        assert_eq!(
            v.body().and_then(|b| b.get("t")).cloned(),
            Some(Value::from(21.5))
        );
        assert_eq!(v.twin(&["tags".into()]), None, "no twin source: no twin");
    }
}
