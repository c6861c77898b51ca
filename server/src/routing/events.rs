//! Non-telemetry events (EVT-1..EVT-4, TWN-9): each record of the engine's notification outbox
//! shaped as seed 004's event (system and application properties, body). The hub's event
//! router task (`hub::event_router`) reads the outbox, shapes, routes and appends.
//!
//! # Invariants
//! - Connection state events carry the record's hub-wide sequence number as 64 upper-case hex
//!   digits: strictly increasing, also across restarts, and comparable as strings.

use ferrohub_engine::d2c::{NewEvent, SystemProperty};
use ferrohub_engine::notifications::{EventSource, Notification, NotificationOp};
use ferrohub_engine::UnixMillis;
use serde_json::{Map, Value};

use crate::clock::iso7;

/// `iothub-message-source` and `iothub-message-schema` of a source.
fn source_names(source: EventSource) -> (&'static str, &'static str) {
    match source {
        EventSource::TwinChangeEvents => ("twinChangeEvents", "twinChangeNotification"),
        EventSource::DeviceLifecycleEvents => {
            ("deviceLifecycleEvents", "deviceLifecycleNotification")
        }
        EventSource::DeviceConnectionStateEvents => (
            "deviceConnectionStateEvents",
            "deviceConnectionStateNotification",
        ),
        EventSource::DigitalTwinChangeEvents => {
            ("digitalTwinChangeEvents", "digitalTwinChangeNotification")
        }
        EventSource::DeviceMessages => ("Telemetry", ""),
    }
}

/// Replaces the stored millisecond times of a digital twin patch with ISO 8601: only
/// `lastUpdateTime` at a metadata position (`[/comp]/$metadata/prop/lastUpdateTime`, or inside a
/// value that is a whole `$metadata`, one property's metadata, or a whole component), never a
/// device's own value that happens to have that name.
fn format_patch_times(ops: &mut [Value]) {
    fn ms_to_iso(v: &mut Value) {
        if let Some(ms) = v.as_str().and_then(|s| s.parse::<i64>().ok()) {
            *v = Value::String(iso7(UnixMillis(ms)));
        }
    }
    // One property's metadata: `{"lastUpdateTime", "desiredValue", ...}`.
    fn entry(v: &mut Value) {
        if let Some(t) = v.get_mut("lastUpdateTime") {
            ms_to_iso(t);
        }
    }
    // A whole `$metadata`: property name -> entry (`$model` is not an entry).
    fn metadata(v: &mut Value) {
        if let Value::Object(map) = v {
            map.iter_mut()
                .filter(|(k, _)| !k.starts_with('$'))
                .for_each(|(_, e)| entry(e));
        }
    }
    for op in ops.iter_mut() {
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let steps: Vec<&str> = path.split('/').skip(1).collect();
        let Some(value) = op.get_mut("value") else {
            continue;
        };
        let at_metadata = steps.iter().position(|s| *s == "$metadata");
        match at_metadata.map(|i| &steps[i + 1..]) {
            Some([]) => metadata(value),
            Some([_]) => entry(value),
            Some([_, "lastUpdateTime"]) => ms_to_iso(value),
            Some(_) => {}
            // A whole component (names never hold `$`, so this is its own `$metadata`).
            None if steps.len() == 1 => {
                if let Some(m) = value.get_mut("$metadata") {
                    metadata(m);
                }
            }
            None => {}
        }
    }
}

/// Replaces stored millisecond times (`"$lastUpdated": "1654122470261"`) with ISO 8601.
fn format_times(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "$lastUpdated" {
                    if let Some(ms) = v.as_str().and_then(|s| s.parse::<i64>().ok()) {
                        *v = Value::String(iso7(UnixMillis(ms)));
                        continue;
                    }
                }
                format_times(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(format_times),
        _ => {}
    }
}

/// The event of one notification, before routing.
pub fn to_event(n: &Notification, hub_name: &str) -> NewEvent {
    let source = n.op.source();
    let (message_source, schema) = source_names(source);
    let digital = source == EventSource::DigitalTwinChangeEvents;
    let content_type = if digital {
        "application/json-patch+json"
    } else {
        "application/json"
    };
    let mut system: Vec<SystemProperty> = vec![
        ("content-type".into(), content_type.into()),
        ("content-encoding".into(), "utf-8".into()),
        (
            "correlation-id".into(),
            format!("{:011x}", rand::random::<u64>() & 0xfff_ffff_ffff).into(),
        ),
        ("user-id".into(), hub_name.to_string().into()),
        (
            "iothub-connection-device-id".into(),
            n.device_id.clone().into(),
        ),
    ];
    if let (Some(m), false) = (
        &n.module_id,
        source == EventSource::DeviceConnectionStateEvents,
    ) {
        system.push(("iothub-connection-module-id".into(), m.clone().into()));
    }
    system.push(("iothub-message-source".into(), message_source.into()));
    let mut application = vec![
        ("hubName".to_string(), hub_name.to_string()),
        ("deviceId".to_string(), n.device_id.clone()),
    ];
    if let Some(m) = &n.module_id {
        application.push(("moduleId".into(), m.clone()));
    }
    application.push(("opType".into(), n.op.name().into()));
    application.push(("iothub-message-schema".into(), schema.into()));
    application.push(("operationTimestamp".into(), iso7(n.time)));
    let model = n.body.get("modelId").and_then(Value::as_str);
    if let (true, Some(model)) = (digital, model) {
        application.push(("dt-dataschema".into(), model.to_string()));
        system.push(("dt-dataschema".into(), model.to_string().into()));
    }
    let body = match n.op {
        NotificationOp::DigitalTwinUpdate | NotificationOp::DigitalTwinReplace => {
            let mut ops = match n.body.get("patch") {
                Some(Value::Array(ops)) => ops.clone(),
                _ => Vec::new(),
            };
            format_patch_times(&mut ops);
            Value::Array(ops)
        }
        NotificationOp::DeviceConnected | NotificationOp::DeviceDisconnected => {
            let mut b = Map::new();
            b.insert(
                "sequenceNumber".into(),
                Value::String(format!("{:064X}", n.sequence)),
            );
            Value::Object(b)
        }
        _ => {
            let mut b = Value::Object(n.body.clone());
            format_times(&mut b);
            b
        }
    };
    NewEvent {
        device_id: n.device_id.clone(),
        endpoints: None,
        system_properties: system,
        application_properties: application,
        body: serde_json::to_vec(&body).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_sequence_numbers_are_64_hex_digits_ordered_as_strings() {
        let n = |seq| Notification {
            sequence: seq,
            device_id: "d".into(),
            module_id: None,
            op: NotificationOp::DeviceConnected,
            time: UnixMillis(0),
            body: Map::new(),
        };
        let body = |seq| -> String {
            let e = to_event(&n(seq), "hub");
            let v: Value = serde_json::from_slice(&e.body).unwrap_or_default();
            v["sequenceNumber"].as_str().unwrap_or_default().to_string()
        };
        assert_eq!(body(10).len(), 64);
        assert!(body(9) < body(10) && body(255) < body(256));
    }

    #[test]
    fn a_digital_twin_change_is_a_json_patch_with_its_model() {
        let body = serde_json::json!({
            "modelId": "dtmi:com:example:T;1",
            "patch": [
                {"op": "add", "path": "/$metadata/temp", "value": {"lastUpdateTime": "0"}},
                {"op": "replace", "path": "/c/$metadata/x/lastUpdateTime", "value": "0"},
                {"op": "replace", "path": "/temp", "value": 21},
                {"op": "add", "path": "/fw", "value": {"lastUpdateTime": "20240115"}},
                {"op": "add", "path": "/c", "value": {"x": 1, "$metadata": {"x": {"lastUpdateTime": "0"}}}},
                {"op": "add", "path": "/c/lastUpdateTime", "value": "0"},
            ],
        });
        let n = Notification {
            sequence: 1,
            device_id: "d".into(),
            module_id: None,
            op: NotificationOp::DigitalTwinUpdate,
            time: UnixMillis(0),
            body: body.as_object().unwrap().clone(),
        };
        let e = to_event(&n, "hub");
        let system = |k: &str| {
            e.system_properties
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_string())
        };
        let app = |k: &str| {
            e.application_properties
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            system("content-type").as_deref(),
            Some("application/json-patch+json")
        );
        assert_eq!(system("content-encoding").as_deref(), Some("utf-8"));
        assert_eq!(
            system("iothub-message-source").as_deref(),
            Some("digitalTwinChangeEvents")
        );
        assert_eq!(
            app("iothub-message-schema").as_deref(),
            Some("digitalTwinChangeNotification")
        );
        assert_eq!(app("opType").as_deref(), Some("updateTwin"));
        assert_eq!(
            app("dt-dataschema").as_deref(),
            Some("dtmi:com:example:T;1")
        );
        assert_eq!(app("hubName").as_deref(), Some("hub"));
        let ops: Value = serde_json::from_slice(&e.body).unwrap();
        let zero = "1970-01-01T00:00:00.0000000Z";
        assert_eq!(ops[0]["value"]["lastUpdateTime"], zero);
        assert_eq!(ops[1]["value"], zero);
        assert_eq!(ops[2]["value"], 21);
        assert_eq!(
            ops[3]["value"]["lastUpdateTime"], "20240115",
            "a device's value is its own"
        );
        assert_eq!(ops[4]["value"]["$metadata"]["x"]["lastUpdateTime"], zero);
        assert_eq!(ops[5]["value"], "0");
    }

    #[test]
    fn times_in_bodies_become_iso() {
        let mut v = serde_json::json!({"properties": {"desired": {"$metadata": {"$lastUpdated": "1654122470261", "x": {"$lastUpdated": "0"}}}}});
        format_times(&mut v);
        assert_eq!(
            v["properties"]["desired"]["$metadata"]["$lastUpdated"],
            "2022-06-01T22:27:50.2610000Z"
        );
        assert_eq!(
            v["properties"]["desired"]["$metadata"]["x"]["$lastUpdated"],
            "1970-01-01T00:00:00.0000000Z"
        );
    }
}
