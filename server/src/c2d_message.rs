//! C2D messages on the wire, shared by the HTTPS and MQTT endpoints: `iothub-ack` names,
//! timestamps, the size limit, and the property list a device sees (C2D-1, MQT-9, HDV-2).

use ferrohub_engine::c2d::{Ack, C2dMessage, Delivered};
use ferrohub_engine::UnixMillis;

/// Largest C2D message body (IoT Hub: 64 KB).
pub const MAX_C2D_BYTES: usize = 64 * 1024;

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
