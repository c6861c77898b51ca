//! The IoT Hub query language: twin and job queries (REST `/devices/query`) and routing
//! conditions, parsed and then evaluated against rows and messages of every shape.

use serde_json::{json, Value};

use crate::routing::query::{Aggregation, Condition, MessageView, Statement};

/// Twin and job rows with members of every JSON type where queries look.
fn rows() -> Vec<Value> {
    vec![
        json!({
            "deviceId": "dev-1", "status": "enabled", "version": 3,
            "tags": {"location": {"region": "US", "floor": 2}, "list": [1, "a", null]},
            "properties": {"desired": {"fw": "1.0", "n": 1.5}, "reported": {"fw": null, "ok": true}},
            "capabilities": {"iotEdge": false}
        }),
        json!({"deviceId": "dev-2", "moduleId": "m", "tags": null, "properties": {}}),
        json!({"deviceId": "dev-3", "jobId": "j", "status": "completed", "outcome": {"x": [{}]}}),
        json!({}),
    ]
}

/// A routed message with system and application properties, a JSON body and a twin.
struct FuzzMessage {
    body: Value,
    twin: Value,
}

impl MessageView for FuzzMessage {
    fn system_property(&self, name: &str) -> Option<Value> {
        match name {
            "contentType" => Some(json!("application/json")),
            "contentEncoding" => Some(json!("utf-8")),
            "connectionDeviceId" | "iothub-connection-device-id" => Some(json!("dev-1")),
            "enqueuedTime" => Some(json!("2026-11-23T00:00:00.000Z")),
            _ => None,
        }
    }

    fn application_property(&self, name: &str) -> Option<Value> {
        match name {
            "level" => Some(json!("critical")),
            "n" => Some(json!("12")),
            _ => None,
        }
    }

    fn body(&self) -> Option<&Value> {
        Some(&self.body)
    }

    fn twin(&self, path: &[String]) -> Option<Value> {
        path.iter()
            .try_fold(&self.twin, |v, step| v.get(step.as_str()))
            .cloned()
    }
}

/// A query and a routing condition from the same text, each run as the hub runs it.
pub fn query(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(statement) = Statement::parse(text) {
        let _ = statement.index_probes();
        let _ = statement.item_type();
        if statement.aggregated() {
            let mut aggregation = Aggregation::new(&statement);
            for row in rows() {
                if statement.matches(&row) {
                    aggregation.add(&row);
                }
            }
            let _ = aggregation.finish();
        } else {
            for row in rows() {
                if statement.matches(&row) {
                    let _ = statement.project(row);
                }
            }
        }
    }
    if let Ok(condition) = Condition::parse(text) {
        let _ = condition.reads_twin();
        for (body, twin) in rows().into_iter().zip(rows().into_iter().rev()) {
            let _ = condition.matches(&FuzzMessage { body, twin });
        }
    }
}
