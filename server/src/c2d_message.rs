//! C2D messages on the wire, shared by the HTTPS, MQTT and AMQP endpoints: `iothub-ack` names,
//! timestamps, the size limit, and the property list a device sees (C2D-1, MQT-9, HDV-2).

use ferrohub_engine::c2d::{Ack, C2dMessage, Delivered, FeedbackMessage};
use ferrohub_engine::UnixMillis;
use serde::Serialize;

/// The content type of a feedback message (HTTPS and AMQP).
pub const FEEDBACK_CONTENT_TYPE: &str = "application/vnd.microsoft.iothub.feedback.json";

/// Largest C2D message body (IoT Hub: 64 KB).
pub const MAX_C2D_BYTES: usize = 64 * 1024;

/// Refuses a message whose body and application properties exceed [`MAX_C2D_BYTES`]; the
/// error says by how much.
pub fn check_size(message: &C2dMessage) -> Result<(), String> {
    let size = message.body.len()
        + message
            .properties
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    if size > MAX_C2D_BYTES {
        return Err(format!(
            "the message is {size} bytes with its properties; at most {MAX_C2D_BYTES}"
        ));
    }
    Ok(())
}

pub fn ack_name(ack: Ack) -> &'static str {
    match ack {
        Ack::None => "none",
        Ack::Positive => "positive",
        Ack::Negative => "negative",
        Ack::Full => "full",
    }
}

pub fn parse_ack(text: &str) -> Option<Ack> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "none" => Some(Ack::None),
        "positive" => Some(Ack::Positive),
        "negative" => Some(Ack::Negative),
        "full" => Some(Ack::Full),
        _ => None,
    }
}

/// ISO 8601 UTC with milliseconds, as IoT Hub writes times.
pub fn iso(t: UnixMillis) -> String {
    chrono::DateTime::from_timestamp_millis(t.0)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Parses an ISO 8601 / RFC 3339 instant (`iothub-expiry`).
pub fn parse_iso(text: &str) -> Option<UnixMillis> {
    chrono::DateTime::parse_from_rfc3339(text.trim())
        .ok()
        .map(|t| UnixMillis(t.timestamp_millis()))
}

/// The system properties a device receives, under their MQTT bag names, in the order IoT Hub
/// sends them, then the application properties.
pub fn device_properties(device_id: &str, d: &Delivered) -> Vec<(String, Option<String>)> {
    let m: &C2dMessage = &d.message;
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    let mut push = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            out.push((k.to_string(), Some(v)));
        }
    };
    push("$.mid", m.message_id.clone());
    push(
        "$.to",
        Some(format!("/devices/{device_id}/messages/deviceBound")),
    );
    push("$.cid", m.correlation_id.clone());
    push("$.ct", m.content_type.clone());
    push("$.ce", m.content_encoding.clone());
    push("$.exp", m.expiry.map(iso));
    push("$.uid", m.user_id.clone());
    if m.ack != Ack::None {
        push("iothub-ack", Some(ack_name(m.ack).to_string()));
    }
    out.extend(
        m.properties
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone()))),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_and_times_round_trip() {
        for a in [Ack::None, Ack::Positive, Ack::Negative, Ack::Full] {
            assert_eq!(parse_ack(ack_name(a)), Some(a));
        }
        assert_eq!(parse_ack("Full"), Some(Ack::Full));
        assert_eq!(parse_ack("sometimes"), None);
        let t = UnixMillis(1_700_000_000_123);
        assert_eq!(iso(t), "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_iso(&iso(t)), Some(t));
        assert_eq!(
            parse_iso("2030-01-01T00:00:00+01:00").map(|t| t.0),
            Some(1_893_452_400_000)
        );
        assert_eq!(parse_iso("tomorrow"), None);
    }
}

/// One feedback record as seed 002 shows it, fields in its order.
#[derive(Serialize)]
struct FeedbackJson<'a> {
    #[serde(rename = "OriginalMessageId")]
    original_message_id: Option<&'a str>,
    #[serde(rename = "EnqueuedTimeUtc")]
    enqueued_time_utc: String,
    #[serde(rename = "StatusCode")]
    status_code: u8,
    #[serde(rename = "Description")]
    description: &'static str,
    #[serde(rename = "DeviceId")]
    device_id: &'a str,
    #[serde(rename = "DeviceGenerationId")]
    device_generation_id: &'a str,
}

/// A feedback message's body: its records as a JSON array.
pub fn feedback_body(f: &FeedbackMessage) -> Vec<u8> {
    let records: Vec<FeedbackJson<'_>> = f
        .records
        .iter()
        .map(|r| FeedbackJson {
            original_message_id: r.original_message_id.as_deref(),
            enqueued_time_utc: iso(r.enqueued_time),
            status_code: r.status.code(),
            description: r.status.description(),
            device_id: &r.device_id,
            device_generation_id: &r.device_generation_id,
        })
        .collect();
    serde_json::to_vec(&records).expect("feedback records serialise")
}
