//! A stored D2C event as the built-in endpoint delivers it to Event Hubs clients.
//!
//! - Body: one data section, the bytes as sent.
//! - Properties section, only when the device set one of them: the AMQP message properties a
//!   device can set (`message-id`,
//!   `correlation-id`, `user-id` as binary, `content-type`, `content-encoding`, `to`,
//!   `absolute-expiry-time` as a timestamp).
//! - Message annotations: `x-opt-sequence-number` (long), `x-opt-offset` (string),
//!   `x-opt-enqueued-time` and `iothub-enqueuedtime` (timestamps), and every other stored
//!   system property (`iothub-connection-device-id`, `iothub-connection-module-id`,
//!   `iothub-connection-auth-method`, `iothub-connection-auth-generation-id`,
//!   `iothub-message-source`, `dt-*` ...) as a string.
//! - Application properties, only when there are any: the event's application properties, as
//!   strings.
//! - No header, delivery annotations or footer, as Event Hubs sends none for these events.

use fe2o3_amqp::types::messaging::{
    annotations::OwnedKey, ApplicationProperties, Body, Data, Message, MessageAnnotations,
    MessageId, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, OrderedMap, SimpleValue, Symbol, Timestamp, Value};
use ferrohub_engine::d2c::D2cEvent;

pub type EventMessage = Message<Body<Value>>;

fn annotation(map: &mut OrderedMap<OwnedKey, Value>, name: &str, value: Value) {
    map.insert(OwnedKey::Symbol(Symbol::from(name)), value);
}

fn timestamp_of(text: &str) -> Option<Timestamp> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| Timestamp::from_milliseconds(t.timestamp_millis()))
}

/// The AMQP message for `event`.
pub fn event_message(event: &D2cEvent) -> EventMessage {
    let mut properties = Properties::default();
    let mut annotations = OrderedMap::new();
    annotation(
        &mut annotations,
        "x-opt-sequence-number",
        Value::Long(event.sequence_number as i64),
    );
    annotation(
        &mut annotations,
        "x-opt-offset",
        Value::String(event.offset.to_string()),
    );
    let enqueued = Timestamp::from_milliseconds(event.enqueued_time.0);
    annotation(
        &mut annotations,
        "x-opt-enqueued-time",
        Value::Timestamp(enqueued.clone()),
    );
    for (name, value) in &event.system_properties {
        match name.as_str() {
            "message-id" => properties.message_id = Some(MessageId::String(value.clone())),
            "correlation-id" => properties.correlation_id = Some(MessageId::String(value.clone())),
            "user-id" => properties.user_id = Some(Binary::from(value.as_bytes().to_vec())),
            "content-type" => properties.content_type = Some(Symbol::from(value.as_str())),
            "content-encoding" => properties.content_encoding = Some(Symbol::from(value.as_str())),
            "to" => properties.to = Some(value.clone()),
            // A time the device wrote that is not ISO 8601 has no AMQP form; it is dropped
            // rather than sent as a string where clients expect a timestamp.
            "absolute-expiry-time" => properties.absolute_expiry_time = timestamp_of(value),
            // Stamped from the enqueued time below, never from what was stored.
            "iothub-enqueuedtime" => {}
            other => annotation(&mut annotations, other, Value::String(value.clone())),
        }
    }
    annotation(
        &mut annotations,
        "iothub-enqueuedtime",
        Value::Timestamp(enqueued),
    );
    let application: OrderedMap<String, SimpleValue> = event
        .application_properties
        .iter()
        .map(|(k, v)| (k.clone(), SimpleValue::String(v.clone())))
        .collect();
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: Some(MessageAnnotations(annotations)),
        // Event Hubs leaves a section out when nothing in it is set; readers test the section's
        // presence (`if event.message.properties:`) before decoding its fields.
        properties: (properties != Properties::default()).then_some(properties),
        application_properties: (!application.is_empty())
            .then_some(ApplicationProperties(application)),
        body: Body::Data(vec![Data(Binary::from(event.body.clone()))].into()),
        footer: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrohub_engine::UnixMillis;

    fn annotation_of<'a>(m: &'a EventMessage, name: &str) -> Option<&'a Value> {
        m.message_annotations
            .as_ref()?
            .0
            .get(&OwnedKey::Symbol(Symbol::from(name)))
    }

    #[test]
    fn sections_with_nothing_set_are_left_out() {
        let event = D2cEvent {
            partition: 0,
            sequence_number: 1,
            offset: 0,
            enqueued_time: UnixMillis(1_700_000_000_000),
            system_properties: vec![("iothub-connection-device-id".into(), "dev1".into())],
            application_properties: vec![],
            body: b"hello".to_vec(),
        };
        let m = event_message(&event);
        assert!(m.properties.is_none());
        assert!(m.application_properties.is_none());
        assert!(m.header.is_none() && m.footer.is_none() && m.delivery_annotations.is_none());
        let with_type = D2cEvent {
            system_properties: vec![("content-type".into(), "text/plain".into())],
            ..event
        };
        let p = event_message(&with_type).properties.unwrap();
        assert_eq!(
            p,
            Properties {
                content_type: Some(Symbol::from("text/plain")),
                ..Properties::default()
            }
        );
    }

    #[test]
    fn an_event_carries_its_position_identity_and_properties() {
        let event = D2cEvent {
            partition: 1,
            sequence_number: 42,
            offset: 8192,
            enqueued_time: UnixMillis(1_700_000_000_123),
            system_properties: vec![
                ("message-id".into(), "m1".into()),
                ("content-type".into(), "application/json".into()),
                ("user-id".into(), "u".into()),
                ("absolute-expiry-time".into(), "2030-01-02T03:04:05Z".into()),
                ("iothub-connection-device-id".into(), "dev1".into()),
                ("iothub-connection-module-id".into(), "mod1".into()),
                ("iothub-message-source".into(), "Telemetry".into()),
            ],
            application_properties: vec![("temp".into(), "21".into())],
            body: b"{}".to_vec(),
        };
        let m = event_message(&event);
        assert_eq!(
            annotation_of(&m, "x-opt-sequence-number"),
            Some(&Value::Long(42))
        );
        assert_eq!(
            annotation_of(&m, "x-opt-offset"),
            Some(&Value::String("8192".into()))
        );
        assert_eq!(
            annotation_of(&m, "x-opt-enqueued-time"),
            Some(&Value::Timestamp(Timestamp::from_milliseconds(
                1_700_000_000_123
            )))
        );
        assert_eq!(
            annotation_of(&m, "iothub-enqueuedtime"),
            annotation_of(&m, "x-opt-enqueued-time")
        );
        assert_eq!(
            annotation_of(&m, "iothub-connection-device-id"),
            Some(&Value::String("dev1".into()))
        );
        assert_eq!(
            annotation_of(&m, "iothub-connection-module-id"),
            Some(&Value::String("mod1".into()))
        );
        assert_eq!(annotation_of(&m, "message-id"), None);
        let p = m.properties.as_ref().unwrap();
        assert_eq!(p.message_id, Some(MessageId::String("m1".into())));
        assert_eq!(p.content_type, Some(Symbol::from("application/json")));
        assert_eq!(p.user_id, Some(Binary::from(b"u".to_vec())));
        assert_eq!(
            p.absolute_expiry_time,
            Some(Timestamp::from_milliseconds(1_893_553_445_000))
        );
        assert_eq!(
            m.application_properties.as_ref().unwrap().0.get("temp"),
            Some(&SimpleValue::String("21".into()))
        );
        match &m.body {
            Body::Data(sections) => assert_eq!(sections[0].0.as_slice(), b"{}"),
            other => panic!("body {other:?}"),
        }
    }
}
