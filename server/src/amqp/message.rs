//! AMQP messages in and out of the hub's C2D shapes (`compat` §B5, AMQ-2, AMQ-3).
//!
//! A C2D send maps exactly as the HTTPS send does: `to` names the device, message and
//! correlation ids, content type and encoding and `user-id` carry over, `absolute-expiry-time`
//! is the expiry, the application property `iothub-ack` is the feedback request and every
//! other application property is kept, as text, in order.

use fe2o3_amqp::types::messaging::{Body, Message, MessageId};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use ferrohub_engine::c2d::C2dMessage;
use ferrohub_engine::UnixMillis;

use crate::c2d_message;
use crate::ids::DeviceId;

/// Why an AMQP message cannot be a C2D message.
#[derive(Debug, thiserror::Error)]
pub enum BadMessage {
    #[error("{0}")]
    Field(String),
    #[error("{0}")]
    TooLarge(String),
}

/// The device and the C2D message an AMQP message on `/messages/devicebound` asks for.
///
/// # Errors
/// [`BadMessage`] naming the field that is missing or malformed, or the size.
pub fn c2d_from_amqp(message: &Message<Body<Value>>) -> Result<(DeviceId, C2dMessage), BadMessage> {
    let properties = message.properties.as_ref();
    let to = properties
        .and_then(|p| p.to.as_deref())
        .ok_or_else(|| BadMessage::Field("the message has no 'to' property".into()))?;
    let device_id = device_of(to).ok_or_else(|| {
        BadMessage::Field(format!(
            "'to' is {to:?}, not /devices/{{deviceId}}/messages/devicebound"
        ))
    })?;
    let mut ack = Default::default();
    let mut app = Vec::new();
    if let Some(application) = &message.application_properties {
        for (name, value) in application.0.iter() {
            let text = simple_text(value);
            if name.eq_ignore_ascii_case("iothub-ack") {
                ack = c2d_message::parse_ack(&text).ok_or_else(|| {
                    BadMessage::Field(format!(
                        "iothub-ack {text:?} is not none, positive, negative or full"
                    ))
                })?;
            } else {
                app.push((name.clone(), text));
            }
        }
    }
    let c2d = C2dMessage {
        message_id: properties.and_then(|p| p.message_id.as_ref()).map(id_text),
        correlation_id: properties
            .and_then(|p| p.correlation_id.as_ref())
            .map(id_text),
        user_id: properties
            .and_then(|p| p.user_id.as_ref())
            .map(|u| String::from_utf8_lossy(u).into_owned()),
        ack,
        expiry: properties
            .and_then(|p| p.absolute_expiry_time.as_ref())
            .map(|t| UnixMillis(t.milliseconds())),
        content_type: properties
            .and_then(|p| p.content_type.as_ref())
            .map(|s| s.0.clone()),
        content_encoding: properties
            .and_then(|p| p.content_encoding.as_ref())
            .map(|s| s.0.clone()),
        properties: app,
        body: body_bytes(&message.body)?,
    };
    c2d_message::check_size(&c2d).map_err(BadMessage::TooLarge)?;
    Ok((device_id, c2d))
}

/// `/devices/{id}/messages/devicebound` (the id percent-decoded, as in a REST path).
fn device_of(to: &str) -> Option<DeviceId> {
    let rest = to.strip_prefix("/devices/")?;
    let (id, tail) = rest.split_once('/')?;
    if !tail.eq_ignore_ascii_case("messages/devicebound") || id.is_empty() {
        return None;
    }
    let id = percent_encoding::percent_decode_str(id)
        .decode_utf8()
        .ok()?;
    Some(DeviceId::new(id.into_owned()))
}

/// A message or correlation id as the text IoT Hub shows for it.
pub fn id_text(id: &MessageId) -> String {
    match id {
        MessageId::String(s) => s.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(u) => uuid_text(u.as_inner()),
        MessageId::Binary(b) => String::from_utf8_lossy(b).into_owned(),
    }
}

fn uuid_text(b: &[u8; 16]) -> String {
    let n = u128::from_be_bytes(*b);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        n >> 96,
        (n >> 80) & 0xffff,
        (n >> 64) & 0xffff,
        (n >> 48) & 0xffff,
        n & 0xffff_ffff_ffff
    )
}

/// An application property's value as text: strings as they are, numbers and booleans as
/// written in JSON.
pub(crate) fn simple_text(value: &SimpleValue) -> String {
    match value {
        SimpleValue::String(s) => s.clone(),
        SimpleValue::Symbol(s) => s.0.clone(),
        SimpleValue::Null => String::new(),
        SimpleValue::Bool(b) => b.to_string(),
        SimpleValue::Ubyte(n) => n.to_string(),
        SimpleValue::Ushort(n) => n.to_string(),
        SimpleValue::Uint(n) => n.to_string(),
        SimpleValue::Ulong(n) => n.to_string(),
        SimpleValue::Byte(n) => n.to_string(),
        SimpleValue::Short(n) => n.to_string(),
        SimpleValue::Int(n) => n.to_string(),
        SimpleValue::Long(n) => n.to_string(),
        SimpleValue::Float(n) => n.to_string(),
        SimpleValue::Double(n) => n.to_string(),
        SimpleValue::Char(c) => c.to_string(),
        SimpleValue::Timestamp(t) => t.milliseconds().to_string(),
        SimpleValue::Uuid(u) => uuid_text(u.as_inner()),
        SimpleValue::Binary(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

/// The body's bytes: data sections joined, or a string or binary value.
pub(crate) fn body_bytes(body: &Body<Value>) -> Result<Vec<u8>, BadMessage> {
    match body {
        Body::Data(sections) => Ok(sections.iter().flat_map(|d| d.0.iter().copied()).collect()),
        Body::Value(v) => match &v.0 {
            Value::Binary(b) => Ok(b.to_vec()),
            Value::String(s) => Ok(s.as_bytes().to_vec()),
            Value::Null => Ok(Vec::new()),
            other => Err(BadMessage::Field(format!(
                "the body is an AMQP value of type {}; a message body is data, a string or binary",
                value_kind(other)
            ))),
        },
        Body::Empty => Ok(Vec::new()),
        Body::Sequence(_) => Err(BadMessage::Field(
            "the body is an AMQP sequence; a message body is data, a string or binary".into(),
        )),
    }
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Array(_) => "array",
        Value::Described(_) => "described",
        _ => "scalar",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_names_the_device() {
        assert_eq!(
            device_of("/devices/d%201/messages/devicebound").unwrap(),
            "d 1"
        );
        assert_eq!(device_of("/devices/d1/messages/deviceBound").unwrap(), "d1");
        assert!(device_of("/devices//messages/devicebound").is_none());
        assert!(device_of("/devices/d1/messages/events").is_none());
        assert!(device_of("devices/d1").is_none());
    }

    #[test]
    fn uuids_print_as_guids() {
        let b: [u8; 16] = *b"\x12\x34\x56\x78\x9a\xbc\xde\xf0\x01\x23\x45\x67\x89\xab\xcd\xef";
        assert_eq!(uuid_text(&b), "12345678-9abc-def0-0123-456789abcdef");
    }
}
