//! Non-telemetry events (EVT-1..EVT-4, TWN-9): the task that reads the engine's notification
//! outbox in order, shapes each record as seed 004's event (system and application properties,
//! body), routes it, and appends the routed events together with its cursor.
//!
//! # Invariants
//! - Records are handled strictly in sequence order and each exactly once: the cursor moves
//!   in the batch that stores their events (see `ferrohub_engine::endpoints`).
//! - Connection state events carry the record's hub-wide sequence number as 64 upper-case hex
//!   digits: strictly increasing, also across restarts, and comparable as strings.

use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::d2c::NewEvent;
use ferrohub_engine::notifications::{EventSource, Notification, NotificationOp};
use serde_json::{Map, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::hub::HubContext;
use crate::rest::now;

/// Records routed per batch.
const BATCH: usize = 256;
/// The longest the task sleeps without looking (the wake-up is the mechanism).
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// ISO 8601 with seven fractional digits, as IoT Hub writes event times.
pub fn iso7(ms: i64) -> String {
    use chrono::Timelike;
    let t = chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
    // chrono has no 7-digit fraction: seconds, then hundreds of nanoseconds.
    format!(
        "{}.{:07}Z",
        t.format("%Y-%m-%dT%H:%M:%S"),
        t.nanosecond() / 100
    )
}

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
        EventSource::DeviceMessages => ("Telemetry", ""),
    }
}

/// Replaces stored millisecond times (`"$lastUpdated": "1654122470261"`) with ISO 8601.
fn format_times(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if k == "$lastUpdated" {
                    if let Some(ms) = v.as_str().and_then(|s| s.parse::<i64>().ok()) {
                        *v = Value::String(iso7(ms));
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
    let mut system = vec![
        ("content-type".to_string(), "application/json".to_string()),
        ("content-encoding".to_string(), "utf-8".to_string()),
        (
            "correlation-id".to_string(),
            format!("{:011x}", rand::random::<u64>() & 0xfff_ffff_ffff),
        ),
        ("user-id".to_string(), hub_name.to_string()),
        (
            "iothub-connection-device-id".to_string(),
            n.device_id.clone(),
        ),
    ];
    if let (Some(m), false) = (
        &n.module_id,
        source == EventSource::DeviceConnectionStateEvents,
    ) {
        system.push(("iothub-connection-module-id".into(), m.clone()));
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
    application.push(("operationTimestamp".into(), iso7(n.time.0)));
    let body = match n.op {
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

/// Routes the outbox until shutdown. `wake` is notified by the engine after new records.
pub async fn run(ctx: HubContext, wake: Arc<Notify>, shutdown: CancellationToken) {
    let mut cursor = match ctx.store.run(|s| s.router_cursor()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the router cursor; non-telemetry events stop");
            return;
        }
    };
    loop {
        let from = cursor;
        let router = Arc::clone(&ctx.routing);
        let routed = ctx
            .store
            .run(move |s| {
                let notes = s.read_notifications(from, BATCH)?;
                let Some(last) = notes.last() else {
                    return Ok(None);
                };
                let next = last.sequence + 1;
                let at = now();
                let events: Vec<NewEvent> = notes
                    .iter()
                    .flat_map(|n| {
                        let event = to_event(n, router.hub_name());
                        router.route(s, event, n.module_id.as_deref(), n.op.source(), iso7(at.0))
                    })
                    .filter(|e| e.endpoints.as_ref().is_none_or(|v| !v.is_empty()))
                    .collect();
                let appended = s.append_routed_notifications(events, at, next)?;
                Ok::<_, ferrohub_engine::d2c::D2cError>(Some((next, appended)))
            })
            .await;
        match routed {
            Ok(Some((next, appended))) => {
                for a in appended {
                    ctx.d2c.appended(a.partition, a.sequence_number);
                }
                cursor = next;
            }
            Ok(None) => {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep(IDLE_CHECK) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "routing non-telemetry events failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrohub_engine::UnixMillis;

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
