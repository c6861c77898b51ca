//! AMQP messages of the device links, in and out: telemetry as the hub's device message (the
//! same mapping as the MQTT property bag), C2D deliveries, twin replies and desired-property
//! pushes, method calls. Bodies are data sections.

use fe2o3_amqp::types::messaging::{
    annotations::OwnedKey, ApplicationProperties, Body, Data, Message, MessageAnnotations,
    MessageId, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, OrderedMap, SimpleValue, Symbol, Timestamp, Value};
use ferrohub_engine::c2d::Delivered;

use crate::amqp::message::{body_bytes, id_text, simple_text, BadMessage};
use crate::amqp::replies::Reply;
use crate::clock::iso7;
use crate::telemetry::DeviceMessage;

fn data(body: Vec<u8>) -> Body<Value> {
    Body::Data(vec![Data(Binary::from(body))].into())
}

fn annotations(pairs: Vec<(&str, Value)>) -> MessageAnnotations {
    let mut map = OrderedMap::new();
    for (k, v) in pairs {
        map.insert(OwnedKey::Symbol(Symbol::from(k)), v);
    }
    MessageAnnotations(map)
}

/// A message annotation as text (string or symbol), e.g. a twin request's `operation`.
pub fn annotation_text<'a>(message: &'a Message<Body<Value>>, name: &str) -> Option<&'a str> {
    let map = &message.message_annotations.as_ref()?.0;
    match map.get(&OwnedKey::Symbol(Symbol::from(name)))? {
        Value::String(s) => Some(s.as_str()),
        Value::Symbol(s) => Some(s.0.as_str()),
        _ => None,
    }
}

/// The request's correlation id, to echo as is.
pub fn correlation(message: &Message<Body<Value>>) -> Option<MessageId> {
    message
        .properties
        .as_ref()
        .and_then(|p| p.correlation_id.clone())
}

/// Telemetry from a device: system properties mapped as the MQTT property bag's keys, every
/// application property kept as text.
///
/// # Errors
/// [`BadMessage`] for a body that is not bytes (a sequence, a typed value).
pub fn telemetry(message: &Message<Body<Value>>) -> Result<DeviceMessage, BadMessage> {
    let mut properties: Vec<(String, Option<String>)> = Vec::new();
    if let Some(p) = &message.properties {
        let mut put = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                properties.push((key.to_string(), Some(v)));
            }
        };
        put("$.mid", p.message_id.as_ref().map(id_text));
        put("$.cid", p.correlation_id.as_ref().map(id_text));
        put(
            "$.uid",
            p.user_id
                .as_ref()
                .map(|u| String::from_utf8_lossy(u).into_owned()),
        );
        put("$.ct", p.content_type.as_ref().map(|s| s.0.clone()));
        put("$.ce", p.content_encoding.as_ref().map(|s| s.0.clone()));
        put(
            "$.exp",
            p.absolute_expiry_time
                .as_ref()
                .map(|t| iso7(ferrohub_engine::UnixMillis(t.milliseconds()))),
        );
        put("$.to", p.to.clone());
    }
    // The Node SDK moves these to message annotations; they are system properties of the
    // stored event, as over MQTT.
    for (annotation, key) in [
        ("dt-subject", "$.sub"),
        ("iothub-interface-id", "$.ifid"),
        ("dt-dataschema", "$.schema"),
    ] {
        if let Some(v) = annotation_text(message, annotation) {
            properties.push((key.to_string(), Some(v.to_string())));
        }
    }
    if let Some(app) = &message.application_properties {
        for (name, value) in app.0.iter() {
            let key = match name.as_str() {
                "dt-subject" => "$.sub".to_string(),
                "dt-dataschema" => "$.schema".to_string(),
                "iothub-outputname" => "$.on".to_string(),
                other => other.to_string(),
            };
            properties.push((key, Some(simple_text(value))));
        }
    }
    Ok(DeviceMessage {
        properties,
        body: body_bytes(&message.body)?,
    })
}

/// A C2D message as the device receives it.
pub fn c2d_delivery(device_id: &str, d: &Delivered) -> Message<Body<Value>> {
    let m = &d.message;
    let mut app = OrderedMap::new();
    for (k, v) in &m.properties {
        app.insert(k.clone(), SimpleValue::String(v.clone()));
    }
    Message::builder()
        .properties(Properties {
            message_id: m.message_id.clone().map(MessageId::String),
            correlation_id: m.correlation_id.clone().map(MessageId::String),
            user_id: m.user_id.clone().map(|u| Binary::from(u.into_bytes())),
            to: Some(format!("/devices/{device_id}/messages/deviceBound")),
            content_type: m.content_type.clone().map(Symbol::from),
            content_encoding: m.content_encoding.clone().map(Symbol::from),
            absolute_expiry_time: Some(Timestamp::from_milliseconds(d.expiry.0)),
            creation_time: Some(Timestamp::from_milliseconds(d.enqueued.0)),
            ..Default::default()
        })
        .message_annotations(annotations(vec![
            (
                "iothub-enqueuedtime",
                Value::Timestamp(Timestamp::from_milliseconds(d.enqueued.0)),
            ),
            ("iothub-deliverycount", Value::Uint(d.delivery_count)),
            ("iothub-sequencenumber", Value::Ulong(d.sequence)),
        ]))
        .application_properties(ApplicationProperties(app))
        .body(data(m.body.clone()))
        .build()
}

/// A twin reply: `status` (and `version` after a reported patch) as message annotations.
pub fn twin_reply(
    correlation: Option<MessageId>,
    status: i32,
    version: Option<u64>,
    body: Vec<u8>,
) -> Reply {
    let mut pairs = vec![("status", Value::Int(status))];
    if let Some(v) = version {
        pairs.push(("version", Value::Long(i64::try_from(v).unwrap_or(i64::MAX))));
    }
    Message::builder()
        .properties(Properties {
            correlation_id: correlation,
            ..Default::default()
        })
        .message_annotations(annotations(pairs))
        .body(data(body))
        .build()
}

/// A desired-property change pushed to the device: the patch as sent, with `$version`; no
/// correlation id.
pub fn desired_push(version: u64, body: Vec<u8>) -> Reply {
    Message::builder()
        .message_annotations(annotations(vec![(
            "version",
            Value::Long(i64::try_from(version).unwrap_or(i64::MAX)),
        )]))
        .body(data(body))
        .build()
}

/// A direct method call: the method name as `IoThub-methodname`, the call's id as the
/// correlation id the answer echoes.
pub fn method_request(rid: &str, method: &str, payload: Vec<u8>) -> Reply {
    let mut app = OrderedMap::new();
    app.insert(
        "IoThub-methodname".to_string(),
        SimpleValue::String(method.to_string()),
    );
    Message::builder()
        .properties(Properties {
            correlation_id: Some(MessageId::String(rid.to_string())),
            ..Default::default()
        })
        .application_properties(ApplicationProperties(app))
        .body(data(payload))
        .build()
}
