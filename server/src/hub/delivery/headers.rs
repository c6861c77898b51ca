//! The properties of an event as name/value pairs, shared by every kind of target: HTTP
//! headers for a webhook, NATS headers, MQTT 5 user properties.
//!
//! # Invariants
//! - Every system property appears under its IoT Hub wire name, except `content-type` (the
//!   target's own content type) and `content-encoding` (as `iothub-content-encoding`: it names a
//!   character set, not an HTTP coding); `iothub-enqueuedtime` is added.
//! - Every application property appears as `x-property-{name}`, name and value
//!   percent-encoded (UTF-8), so any property survives in any of the three carriers.
//! - `x-ferrohub-endpoint`, `x-ferrohub-partition` and `x-ferrohub-sequence-number` are
//!   always there: with the partition, the sequence number tells a repeated delivery from a
//!   new message.
//! - A value a header cannot carry (outside printable ASCII: a line break would end a NATS
//!   header, or make an HTTP request fail) is percent-encoded rather than dropped; the
//!   content type too.

use ferrohub_engine::d2c::D2cEvent;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Kept as is in an encoded property: RFC 3986's unreserved characters.
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// An event's content type and its other properties as pairs.
pub struct EventHeaders {
    /// The message's `content-type`, else `application/octet-stream`.
    pub content_type: String,
    pub pairs: Vec<(String, String)>,
}

/// The headers of `event`, delivered for `endpoint`.
pub fn of(endpoint: &str, event: &D2cEvent) -> EventHeaders {
    let mut pairs = vec![
        ("x-ferrohub-endpoint".to_string(), endpoint.to_string()),
        (
            "x-ferrohub-partition".to_string(),
            event.partition.to_string(),
        ),
        (
            "x-ferrohub-sequence-number".to_string(),
            event.sequence_number.to_string(),
        ),
        (
            "iothub-enqueuedtime".to_string(),
            crate::hub::twin_rows::format_time(Some(event.enqueued_time)),
        ),
    ];
    let mut content_type = "application/octet-stream".to_string();
    for (name, value) in &event.system_properties {
        match name.as_str() {
            // A device chooses it: kept only as a header can carry it.
            "content-type" => content_type = header_safe(value),
            "content-encoding" => {
                pairs.push(("iothub-content-encoding".into(), header_safe(value)))
            }
            _ => pairs.push((name.clone(), header_safe(value))),
        }
    }
    for (name, value) in &event.application_properties {
        pairs.push((format!("x-property-{}", encode(name)), encode(value)));
    }
    EventHeaders {
        content_type,
        pairs,
    }
}

/// The sending device's id, from the event's system properties (`-` for an event without one).
pub fn device_id(event: &D2cEvent) -> &str {
    event
        .system_properties
        .iter()
        .find(|(name, _)| name == "iothub-connection-device-id")
        .map_or("-", |(_, value)| value.as_str())
}

/// `value` when every character is printable ASCII, else percent-encoded.
fn header_safe(value: &str) -> String {
    if value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        value.to_string()
    } else {
        encode(value)
    }
}

pub fn encode(text: &str) -> String {
    utf8_percent_encode(text, ENCODED).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn property_names_and_values_are_percent_encoded() {
        assert_eq!(super::encode("temp °C/x y"), "temp%20%C2%B0C%2Fx%20y");
        assert_eq!(super::encode("a-b.c_d~e"), "a-b.c_d~e");
        assert_eq!(super::header_safe("plain value/1"), "plain value/1");
        assert_eq!(super::header_safe("line\nbreak"), "line%0Abreak");
    }
}
