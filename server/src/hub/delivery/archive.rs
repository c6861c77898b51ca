//! How a storage endpoint's blobs look (docs/routing.md, "Storage container endpoints"), as
//! IoT Hub writes them: the records, their encodings and the blob names.
//!
//! # Invariants
//! - A record has IoT Hub's four fields: `EnqueuedTimeUtc` (ISO 8601, UTC), `Properties` (the
//!   application properties, enrichments included), `SystemProperties` (IoT Hub's names for
//!   routing: `connectionDeviceId`, `contentType`, ...), `Body`.
//! - Avro files are object container files with IoT Hub's schema (record
//!   `Microsoft.Azure.Devices.Message`), readable by any Avro reader; JSON files hold one
//!   object per line, the body as JSON when the message says `application/json` in UTF-8 and
//!   parses, else base64 (IoT Hub's rule).
//! - A blob's name depends only on stored data (the batch's first event, and the event before
//!   it), so a batch written again after a crash replaces its own blob, never another.

use std::collections::HashMap;
use std::sync::LazyLock;

use apache_avro::types::Value;
use apache_avro::{Codec, DeflateSettings, Schema, Writer};
use base64::Engine as _;
use chrono::{DateTime, Datelike, Timelike, Utc};
use ferrohub_engine::d2c::D2cEvent;
use ferrohub_engine::delivery::StorageEncoding;
use ferrohub_engine::model::UnixMillis;

/// IoT Hub's Avro schema for routed messages.
static SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    Schema::parse_str(
        r#"{"type": "record", "name": "Message", "namespace": "Microsoft.Azure.Devices",
            "fields": [
              {"name": "EnqueuedTimeUtc", "type": "string"},
              {"name": "Properties", "type": {"type": "map", "values": "string"}},
              {"name": "SystemProperties", "type": {"type": "map", "values": "string"}},
              {"name": "Body", "type": ["null", "bytes"]}]}"#,
    )
    .expect("the schema is valid")
});

/// A batch being encoded; bytes are taken out as they are made, so a large batch streams.
pub enum BatchEncoder {
    Avro(Box<Writer<'static, Vec<u8>>>),
    Json(Vec<u8>),
}

impl BatchEncoder {
    pub fn new(encoding: StorageEncoding) -> BatchEncoder {
        match encoding {
            StorageEncoding::Avro => BatchEncoder::Avro(Box::new(Writer::with_codec(
                &SCHEMA,
                Vec::new(),
                Codec::Null,
            ))),
            StorageEncoding::AvroDeflate => BatchEncoder::Avro(Box::new(Writer::with_codec(
                &SCHEMA,
                Vec::new(),
                Codec::Deflate(DeflateSettings::default()),
            ))),
            StorageEncoding::Json => BatchEncoder::Json(Vec::new()),
        }
    }

    /// Adds one event.
    ///
    /// # Errors
    /// The record does not encode (it always should: every field is a string or bytes).
    pub fn append(&mut self, event: &D2cEvent) -> Result<(), String> {
        let enqueued = crate::hub::twin_rows::format_time(Some(event.enqueued_time));
        let properties: HashMap<String, String> =
            event.application_properties.iter().cloned().collect();
        let system = system_properties(event);
        match self {
            BatchEncoder::Avro(writer) => {
                let strings = |m: HashMap<String, String>| {
                    Value::Map(m.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
                };
                let record = Value::Record(vec![
                    ("EnqueuedTimeUtc".into(), Value::String(enqueued)),
                    ("Properties".into(), strings(properties)),
                    ("SystemProperties".into(), strings(system)),
                    (
                        "Body".into(),
                        Value::Union(1, Box::new(Value::Bytes(event.body.clone()))),
                    ),
                ]);
                writer
                    .append(record)
                    .map(drop)
                    .map_err(|e| format!("avro: {e}"))
            }
            BatchEncoder::Json(out) => {
                let line = serde_json::json!({
                    "EnqueuedTimeUtc": enqueued,
                    "Properties": properties,
                    "SystemProperties": system,
                    "Body": json_body(event),
                });
                serde_json::to_writer(&mut *out, &line).map_err(|e| format!("json: {e}"))?;
                out.push(b'\n');
                Ok(())
            }
        }
    }

    /// The bytes encoded since the last call (Avro: whole blocks).
    ///
    /// # Errors
    /// Avro's flush failed.
    pub fn take(&mut self) -> Result<Vec<u8>, String> {
        match self {
            BatchEncoder::Avro(writer) => {
                writer.flush().map_err(|e| format!("avro: {e}"))?;
                Ok(std::mem::take(writer.get_mut()))
            }
            BatchEncoder::Json(out) => Ok(std::mem::take(out)),
        }
    }
}

/// The system properties under the names IoT Hub's storage records use.
fn system_properties(event: &D2cEvent) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (name, value) in &event.system_properties {
        let renamed = match name.as_str() {
            "message-id" => "messageId",
            "correlation-id" => "correlationId",
            "user-id" => "userId",
            "content-type" => "contentType",
            "content-encoding" => "contentEncoding",
            "iothub-connection-device-id" => "connectionDeviceId",
            "iothub-connection-module-id" => "connectionModuleId",
            "iothub-connection-auth-method" => "connectionAuthMethod",
            "iothub-connection-auth-generation-id" => "connectionDeviceGenerationId",
            "iothub-message-source" => "messageSource",
            "dt-dataschema" => "dataSchema",
            "dt-subject" => "subject",
            other => other,
        };
        out.insert(renamed.to_string(), value.clone());
    }
    out.insert(
        "enqueuedTime".into(),
        crate::hub::twin_rows::format_time(Some(event.enqueued_time)),
    );
    out
}

/// The body as JSON when the message says it is JSON in UTF-8 and it parses; else base64.
fn json_body(event: &D2cEvent) -> serde_json::Value {
    let property = |wanted: &str| {
        event
            .system_properties
            .iter()
            .find(|(n, _)| n == wanted)
            .map(|(_, v)| v.to_ascii_lowercase())
    };
    let json = property("content-type").is_some_and(|t| t.starts_with("application/json"));
    let utf8 = property("content-encoding").is_some_and(|e| e == "utf-8");
    if json && utf8 {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&event.body) {
            return value;
        }
    }
    serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(&event.body))
}

/// A blob's name: `format` with the hub's name, the endpoint's partition index and the UTC
/// time of the batch's first event. `after_same_minute` (the event before the batch was
/// enqueued in the same minute, so the batch before may carry the same name) adds
/// `_{first sequence number}` before the name's extension.
pub fn blob_name(
    format: &str,
    hub: &str,
    partition_index: u16,
    first: &D2cEvent,
    after_same_minute: bool,
) -> String {
    let t: DateTime<Utc> =
        DateTime::from_timestamp_millis(first.enqueued_time.0).unwrap_or_default();
    let name = format
        .replace("{iothub}", hub)
        .replace("{partition}", &partition_index.to_string())
        .replace("{YYYY}", &format!("{:04}", t.year()))
        .replace("{MM}", &format!("{:02}", t.month()))
        .replace("{DD}", &format!("{:02}", t.day()))
        .replace("{HH}", &format!("{:02}", t.hour()))
        .replace("{mm}", &format!("{:02}", t.minute()));
    if !after_same_minute {
        return name;
    }
    let suffix = format!("_{}", first.sequence_number);
    let last_segment = name.rfind('/').map_or(0, |i| i + 1);
    match name[last_segment..].rfind('.').filter(|i| *i > 0) {
        Some(dot) => {
            let at = last_segment + dot;
            format!("{}{suffix}{}", &name[..at], &name[at..])
        }
        None => name + &suffix,
    }
}

/// Whether two times fall in the same UTC minute.
pub fn same_minute(a: UnixMillis, b: UnixMillis) -> bool {
    a.0.div_euclid(60_000) == b.0.div_euclid(60_000)
}

/// About what an event takes in a blob, to cut batches at the chunk size (a JSON line may
/// carry its body in base64: a third more).
pub fn approximate_size(event: &D2cEvent, encoding: StorageEncoding) -> u64 {
    let properties: usize = event
        .system_properties
        .iter()
        .chain(&event.application_properties)
        .map(|(n, v)| n.len() + v.len() + 4)
        .sum();
    let body = match encoding {
        StorageEncoding::Json => event.body.len().div_ceil(3) * 4,
        StorageEncoding::Avro | StorageEncoding::AvroDeflate => event.body.len(),
    };
    (body + properties + 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, ms: i64, ct: &str, body: &[u8]) -> D2cEvent {
        D2cEvent {
            partition: 3,
            sequence_number: seq,
            offset: 0,
            enqueued_time: UnixMillis(ms),
            system_properties: vec![
                ("iothub-connection-device-id".into(), "d1".into()),
                ("content-type".into(), ct.into()),
                ("content-encoding".into(), "UTF-8".into()),
            ],
            application_properties: vec![("kind".into(), "a".into())],
            body: body.to_vec(),
        }
    }

    #[test]
    fn names_follow_the_format_and_a_repeated_minute_is_told_apart() {
        // 2026-12-07T14:05:09Z
        let e = event(42, 1_796_652_309_000, "application/json", b"{}");
        let format = "{iothub}/{partition}/{YYYY}/{MM}/{DD}/{HH}/{mm}";
        assert_eq!(
            blob_name(format, "hub", 1, &e, false),
            "hub/1/2026/12/07/14/05"
        );
        assert_eq!(
            blob_name(format, "hub", 1, &e, true),
            "hub/1/2026/12/07/14/05_42"
        );
        let dotted = "a.b/{iothub}-{partition}-{YYYY}{MM}{DD}{HH}{mm}.avro";
        assert_eq!(
            blob_name(dotted, "h", 0, &e, true),
            "a.b/h-0-202612071405_42.avro"
        );
        assert!(same_minute(UnixMillis(60_000), UnixMillis(119_999)));
        assert!(!same_minute(UnixMillis(59_999), UnixMillis(60_000)));
    }

    #[test]
    fn json_lines_carry_json_bodies_as_json_and_others_as_base64() {
        let mut encoder = BatchEncoder::new(StorageEncoding::Json);
        encoder
            .append(&event(0, 0, "application/json", br#"{"t": 1}"#))
            .unwrap();
        encoder
            .append(&event(1, 0, "application/octet-stream", b"\x00\x01"))
            .unwrap();
        let text = String::from_utf8(encoder.take().unwrap()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["Body"], serde_json::json!({"t": 1}));
        assert_eq!(lines[1]["Body"], "AAE=");
        assert_eq!(lines[0]["SystemProperties"]["connectionDeviceId"], "d1");
        assert_eq!(lines[0]["Properties"]["kind"], "a");
        assert_eq!(lines[0]["EnqueuedTimeUtc"], "1970-01-01T00:00:00.0000000Z");
    }

    #[test]
    fn avro_files_read_back_with_the_schema() {
        for encoding in [StorageEncoding::Avro, StorageEncoding::AvroDeflate] {
            let mut encoder = BatchEncoder::new(encoding);
            let mut bytes = Vec::new();
            for seq in 0..3 {
                encoder
                    .append(&event(seq, 0, "text/plain", format!("m{seq}").as_bytes()))
                    .unwrap();
                bytes.extend(encoder.take().unwrap());
            }
            let reader = apache_avro::Reader::new(&bytes[..]).unwrap();
            let bodies: Vec<Value> = reader
                .map(|r| match r.unwrap() {
                    Value::Record(fields) => {
                        fields.into_iter().find(|(n, _)| n == "Body").unwrap().1
                    }
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(
                bodies,
                (0..3)
                    .map(|i| Value::Union(1, Box::new(Value::Bytes(format!("m{i}").into_bytes()))))
                    .collect::<Vec<_>>()
            );
        }
    }
}
