//! Delivery of custom endpoints to receivers outside the hub (docs/routing.md, "Endpoints
//! outside the hub"). A custom endpoint may name a [`DeliveryTarget`]: its events stay stored
//! in its partitions exactly as for any custom endpoint (so a message a route matched is as
//! durable as the acknowledgement the device got), and the hub's delivery task hands them to
//! the target partition by partition, in order, moving the partition's delivery cursor here
//! once the target accepted them.
//!
//! # Invariants
//! - A target belongs to its endpoint's record: it is stored, replicated and deleted with the
//!   endpoint, and changing it never touches the endpoint's events.
//! - A partition's cursor is the sequence number of the next event to deliver; it only moves
//!   forward (`Store::advance_delivery_cursor` ignores a position behind it), so a delivery
//!   that raced a newer one never repeats what was already accepted.
//! - Cursors are deleted with their endpoint, in the same batch.

use ferrohub_migrations::cf;
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::keys;

/// Where an endpoint's events are delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryTarget {
    Webhook(WebhookTarget),
    /// Published to a NATS JetStream stream (the stream must capture the subject).
    Nats(BrokerTarget),
    /// Published with QoS 1 to an MQTT 5 broker.
    Mqtt(BrokerTarget),
    /// Written in batches to blobs of an Azure Storage container, as IoT Hub's storage
    /// endpoints write them.
    Storage(StorageTarget),
}

/// An Azure Storage container (or the emulator), written as IoT Hub writes its storage
/// endpoints: one blob per partition per batch, named by `file_name_format`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageTarget {
    /// `AccountName`, `AccountKey`, and `BlobEndpoint` or `DefaultEndpointsProtocol` /
    /// `EndpointSuffix`.
    pub connection_string: String,
    pub container_name: String,
    pub encoding: StorageEncoding,
    /// With every one of [`FILE_NAME_TOKENS`].
    pub file_name_format: String,
    /// A batch is written this long after its first message was enqueued...
    pub batch_frequency_secs: u32,
    /// ...or once it holds this many bytes, whichever comes first.
    pub max_chunk_size_bytes: u64,
}

/// How a storage endpoint writes its blobs (IoT Hub's `encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StorageEncoding {
    /// An Avro object container file, blocks uncompressed.
    Avro,
    /// The same with deflate-compressed blocks.
    AvroDeflate,
    /// One JSON object per line.
    Json,
}

impl StorageEncoding {
    /// IoT Hub's name for it (`avro`, `avroDeflate`, `json`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            StorageEncoding::Avro => "avro",
            StorageEncoding::AvroDeflate => "avroDeflate",
            StorageEncoding::Json => "json",
        }
    }

    /// From IoT Hub's name, in any case.
    #[must_use]
    pub fn parse(name: &str) -> Option<StorageEncoding> {
        [
            StorageEncoding::Avro,
            StorageEncoding::AvroDeflate,
            StorageEncoding::Json,
        ]
        .into_iter()
        .find(|e| e.name().eq_ignore_ascii_case(name))
    }
}

/// What a storage endpoint's file name format must hold, as IoT Hub requires.
pub const FILE_NAME_TOKENS: [&str; 7] = [
    "{iothub}",
    "{partition}",
    "{YYYY}",
    "{MM}",
    "{DD}",
    "{HH}",
    "{mm}",
];
/// IoT Hub's default file name format.
pub const DEFAULT_FILE_NAME_FORMAT: &str = "{iothub}/{partition}/{YYYY}/{MM}/{DD}/{HH}/{mm}";
/// IoT Hub's limits, in seconds and bytes.
pub const BATCH_FREQUENCY_SECS: std::ops::RangeInclusive<u32> = 60..=720;
pub const MAX_CHUNK_SIZE_BYTES: std::ops::RangeInclusive<u64> = 10_485_760..=524_288_000;

/// An HTTP(S) receiver: each event is POSTed to `url` with its properties as headers and an
/// HMAC-SHA256 signature of the body made with `signing_key`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookTarget {
    pub url: String,
    /// Base64; the receiver checks `x-ferrohub-signature: sha256=<hex>` with it.
    pub signing_key: String,
    /// A PEM CA certificate the receiver's certificate chains to, trusted besides the
    /// machine's roots (a receiver with its own PKI).
    pub ca_certificate: Option<String>,
    /// How long one POST may take before it counts as failed.
    pub timeout_ms: u64,
    /// How long an event is retried before it is dead-lettered (counted, logged and skipped)
    /// so the events behind it move again.
    pub dead_letter_after_ms: u64,
}

/// A message broker (NATS JetStream or MQTT): each event is published to `topic` with
/// [`DEVICE_ID_PLACEHOLDER`] replaced by the sending device's id, and counts as delivered
/// once the broker acknowledged it (a JetStream publish acknowledgement, an MQTT PUBACK).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerTarget {
    /// `nats://` or `tls://` (NATS); `mqtt://` or `mqtts://` (MQTT).
    pub url: String,
    /// The NATS subject or MQTT topic, with `{deviceId}` in it.
    pub topic: String,
    pub username: Option<String>,
    /// With a username, a password; without one (NATS only), a token.
    pub password: Option<String>,
    /// As [`WebhookTarget::ca_certificate`].
    pub ca_certificate: Option<String>,
    /// How long one publish may wait for the broker's acknowledgement.
    pub timeout_ms: u64,
    /// As [`WebhookTarget::dead_letter_after_ms`].
    pub dead_letter_after_ms: u64,
}

/// Where a broker target's topic takes the device id.
pub const DEVICE_ID_PLACEHOLDER: &str = "{deviceId}";

/// Bounds of the delivery settings, in milliseconds (every kind of target).
pub const WEBHOOK_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 1_000..=60_000;
pub const WEBHOOK_DEAD_LETTER_MS: std::ops::RangeInclusive<u64> = 10_000..=7 * 24 * 3_600_000;

impl DeliveryTarget {
    /// The target's kind as the API names it (`webhook`, `nats`, `mqtt`).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            DeliveryTarget::Webhook(_) => "webhook",
            DeliveryTarget::Nats(_) => "nats",
            DeliveryTarget::Mqtt(_) => "mqtt",
            DeliveryTarget::Storage(_) => "storageContainer",
        }
    }

    /// How long an event is retried before it is dead-lettered.
    #[must_use]
    pub fn dead_letter_after_ms(&self) -> u64 {
        match self {
            DeliveryTarget::Webhook(w) => w.dead_letter_after_ms,
            DeliveryTarget::Nats(b) | DeliveryTarget::Mqtt(b) => b.dead_letter_after_ms,
            // A batch is retried until it is written: what waits stays bounded by retention.
            DeliveryTarget::Storage(_) => *WEBHOOK_DEAD_LETTER_MS.end(),
        }
    }

    /// Where it delivers, without credentials (for logs).
    #[must_use]
    pub fn shown(&self) -> String {
        match self {
            DeliveryTarget::Webhook(w) => w.url.clone(),
            DeliveryTarget::Nats(b) | DeliveryTarget::Mqtt(b) => format!("{} {}", b.url, b.topic),
            DeliveryTarget::Storage(s) => {
                format!("container {} ({})", s.container_name, s.encoding.name())
            }
        }
    }

    /// Checks what can be checked without reaching the receiver.
    ///
    /// # Errors
    /// [`ValidationError`] naming the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self {
            DeliveryTarget::Webhook(w) => {
                let scheme_ok = w.url.starts_with("https://") || w.url.starts_with("http://");
                if !scheme_ok || w.url.len() > 2048 || w.url.chars().any(char::is_whitespace) {
                    return Err(ValidationError::new(
                        "webhook.url",
                        "must be an http:// or https:// URL without spaces, at most 2048 characters",
                    ));
                }
                use base64::Engine as _;
                let key = base64::engine::general_purpose::STANDARD.decode(&w.signing_key);
                if !key.is_ok_and(|k| (16..=64).contains(&k.len())) {
                    return Err(ValidationError::new(
                        "webhook.signingKey",
                        "must be base64 of 16 to 64 bytes",
                    ));
                }
                validate_times("webhook", w.timeout_ms, w.dead_letter_after_ms)
            }
            DeliveryTarget::Nats(b) => {
                validate_broker("nats", b, &["nats://", "tls://"], &['*', '>'])?;
                let subject = b.topic.replace(DEVICE_ID_PLACEHOLDER, "d");
                if subject.starts_with('.') || subject.ends_with('.') || subject.contains("..") {
                    return Err(ValidationError::new(
                        "nats.subject",
                        "must not begin or end with '.' nor hold an empty token",
                    ));
                }
                if b.topic.starts_with('$') || b.topic.starts_with("_INBOX") {
                    return Err(ValidationError::new(
                        "nats.subject",
                        "must not begin with '$' or '_INBOX' (the server's own subjects)",
                    ));
                }
                Ok(())
            }
            DeliveryTarget::Mqtt(b) => {
                validate_broker("mqtt", b, &["mqtt://", "mqtts://"], &['+', '#'])?;
                if b.password.is_some() && b.username.is_none() {
                    return Err(ValidationError::new(
                        "mqtt.password",
                        "needs a username (MQTT has no token)",
                    ));
                }
                if b.topic.starts_with('$') {
                    return Err(ValidationError::new(
                        "mqtt.topic",
                        "must not begin with '$' (the broker's own topics)",
                    ));
                }
                Ok(())
            }
            DeliveryTarget::Storage(s) => validate_storage(s),
        }
    }
}

/// IoT Hub's rules for a storage container endpoint.
fn validate_storage(s: &StorageTarget) -> Result<(), ValidationError> {
    let has = |key: &str| {
        s.connection_string
            .split(';')
            .filter_map(|p| p.split_once('='))
            .any(|(k, v)| k.trim().eq_ignore_ascii_case(key) && !v.trim().is_empty())
    };
    if !has("AccountName") || !has("AccountKey") {
        return Err(ValidationError::new(
            "storageContainer.connectionString",
            "must be an Azure Storage connection string with AccountName and AccountKey",
        ));
    }
    let name = &s.container_name;
    let name_ok = (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if !name_ok {
        return Err(ValidationError::new(
            "storageContainer.containerName",
            "must be 3 to 63 lowercase letters, digits and single hyphens, beginning and ending with a letter or digit",
        ));
    }
    let missing: Vec<&str> = FILE_NAME_TOKENS
        .iter()
        .copied()
        .filter(|t| !s.file_name_format.contains(t))
        .collect();
    if !missing.is_empty() || s.file_name_format.len() > 512 {
        return Err(ValidationError::new(
            "storageContainer.fileNameFormat",
            format!(
                "must hold every one of {} (missing: {}), at most 512 characters",
                FILE_NAME_TOKENS.join(" "),
                missing.join(" ")
            ),
        ));
    }
    if !BATCH_FREQUENCY_SECS.contains(&s.batch_frequency_secs) {
        return Err(ValidationError::new(
            "storageContainer.batchFrequencyInSeconds",
            "must be 60 to 720",
        ));
    }
    if !MAX_CHUNK_SIZE_BYTES.contains(&s.max_chunk_size_bytes) {
        return Err(ValidationError::new(
            "storageContainer.maxChunkSizeInBytes",
            "must be 10485760 to 524288000 (10 to 500 MB)",
        ));
    }
    Ok(())
}

/// What NATS and MQTT targets share: the URL's scheme, a topic that names the device and no
/// wildcard, credentials of a sane size, the times.
fn validate_broker(
    kind: &'static str,
    b: &BrokerTarget,
    schemes: &[&str],
    wildcards: &[char],
) -> Result<(), ValidationError> {
    let field = |name: &str| -> &'static str {
        match (kind, name) {
            ("nats", "url") => "nats.url",
            ("nats", "topic") => "nats.subject",
            ("nats", _) => "nats.username",
            ("mqtt", "url") => "mqtt.url",
            ("mqtt", "topic") => "mqtt.topic",
            _ => "mqtt.username",
        }
    };
    // Credentials go in their own fields: a URL holding them would show them back.
    let url_ok = schemes.iter().any(|s| {
        b.url
            .strip_prefix(s)
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '@', '?', '#']))
    });
    if !url_ok || b.url.len() > 2048 || b.url.chars().any(char::is_whitespace) {
        return Err(ValidationError::new(
            field("url"),
            &format!(
                "must be {} and host:port, without a path or credentials",
                schemes.join(" or ")
            ),
        ));
    }
    let rest = b.topic.replace(DEVICE_ID_PLACEHOLDER, "");
    if !b.topic.contains(DEVICE_ID_PLACEHOLDER)
        || b.topic.len() > 256
        || rest
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || wildcards.contains(&c))
        || rest.contains(['{', '}'])
    {
        return Err(ValidationError::new(
            field("topic"),
            &format!(
                "must hold {DEVICE_ID_PLACEHOLDER}, at most 256 characters, without spaces, braces or the wildcards {}",
                wildcards.iter().collect::<String>()
            ),
        ));
    }
    let too_long = |v: &Option<String>| v.as_ref().is_some_and(|v| v.len() > 1024);
    if too_long(&b.username) || too_long(&b.password) {
        return Err(ValidationError::new(
            field("username"),
            "username and password are at most 1024 characters",
        ));
    }
    validate_times(kind, b.timeout_ms, b.dead_letter_after_ms)
}

fn validate_times(
    kind: &'static str,
    timeout_ms: u64,
    dead_letter_ms: u64,
) -> Result<(), ValidationError> {
    let (timeout_field, dead_letter_field) = match kind {
        "nats" => ("nats.timeoutSeconds", "nats.deadLetterAfterSeconds"),
        "mqtt" => ("mqtt.timeoutSeconds", "mqtt.deadLetterAfterSeconds"),
        _ => ("webhook.timeoutSeconds", "webhook.deadLetterAfterSeconds"),
    };
    if !WEBHOOK_TIMEOUT_MS.contains(&timeout_ms) {
        return Err(ValidationError::new(timeout_field, "must be 1 to 60"));
    }
    if !WEBHOOK_DEAD_LETTER_MS.contains(&dead_letter_ms) {
        return Err(ValidationError::new(
            dead_letter_field,
            "must be 10 to 604800 (7 days)",
        ));
    }
    Ok(())
}

const CURSOR_PREFIX: &[u8] = b"delivery/";

fn cursor_prefix(endpoint: &str) -> Vec<u8> {
    let mut k = CURSOR_PREFIX.to_vec();
    k.extend_from_slice(endpoint.as_bytes());
    k.push(b'/');
    k
}

pub(crate) fn cursor_key(endpoint: &str, partition: u16) -> Vec<u8> {
    let mut k = cursor_prefix(endpoint);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// Adds the deletion of an endpoint's delivery cursors to `batch`.
pub(crate) fn stage_delete_cursors(batch: &mut crate::raw::Batch, endpoint: &str) {
    let prefix = cursor_prefix(endpoint);
    if let Some(end) = keys::prefix_end(&prefix) {
        batch.delete_range(cf::D2C_STATE, prefix, end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broker(url: &str, topic: &str) -> BrokerTarget {
        BrokerTarget {
            url: url.into(),
            topic: topic.into(),
            username: None,
            password: None,
            ca_certificate: None,
            timeout_ms: 5_000,
            dead_letter_after_ms: 60_000,
        }
    }

    fn refused_field(target: DeliveryTarget) -> String {
        match target.validate() {
            Err(ValidationError::Invalid { field, .. }) => field.into_owned(),
            Ok(()) => "accepted".into(),
        }
    }

    #[test]
    fn broker_targets_name_the_device_and_no_wildcard() {
        let nats = |url: &str, subject: &str| DeliveryTarget::Nats(broker(url, subject));
        let mqtt = |url: &str, topic: &str| DeliveryTarget::Mqtt(broker(url, topic));
        assert!(nats("nats://127.0.0.1:4222", "hub.{deviceId}.telemetry")
            .validate()
            .is_ok());
        assert!(nats("tls://n:4222", "{deviceId}").validate().is_ok());
        assert!(mqtt("mqtts://b:8883", "hub/{deviceId}/telemetry")
            .validate()
            .is_ok());
        assert_eq!(
            refused_field(nats("http://n:4222", "a.{deviceId}")),
            "nats.url"
        );
        assert_eq!(
            refused_field(nats("nats://n:4222/x", "a.{deviceId}")),
            "nats.url"
        );
        assert_eq!(
            refused_field(nats("nats://n", "a.telemetry")),
            "nats.subject"
        );
        assert_eq!(
            refused_field(nats("nats://n", "a.*.{deviceId}")),
            "nats.subject"
        );
        assert_eq!(
            refused_field(nats("nats://n", "a..{deviceId}")),
            "nats.subject"
        );
        assert_eq!(
            refused_field(nats("nats://n", "{deviceId}.")),
            "nats.subject"
        );
        assert_eq!(
            refused_field(nats("nats://n", "$JS.API.{deviceId}")),
            "nats.subject"
        );
        assert_eq!(
            refused_field(nats("nats://u:p@n", "a.{deviceId}")),
            "nats.url"
        );
        assert_eq!(
            refused_field(mqtt("mqtt://b", "a/#/{deviceId}")),
            "mqtt.topic"
        );
        assert_eq!(
            refused_field(mqtt("mqtt://b", "$SYS/{deviceId}")),
            "mqtt.topic"
        );
        assert_eq!(
            refused_field(mqtt("mqtt://b", "a/{device}/{deviceId}")),
            "mqtt.topic"
        );
        assert_eq!(refused_field(mqtt("nats://b", "a/{deviceId}")), "mqtt.url");
        let mut token_only = broker("mqtt://b", "a/{deviceId}");
        token_only.password = Some("p".into());
        assert_eq!(
            refused_field(DeliveryTarget::Mqtt(token_only.clone())),
            "mqtt.password"
        );
        assert_eq!(
            refused_field(DeliveryTarget::Nats(broker("nats://b", "a.{deviceId}"))),
            "accepted"
        );
        let storage = StorageTarget {
            connection_string: "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=a2V5"
                .into(),
            container_name: "archive-1".into(),
            encoding: StorageEncoding::Avro,
            file_name_format: DEFAULT_FILE_NAME_FORMAT.into(),
            batch_frequency_secs: 300,
            max_chunk_size_bytes: 314_572_800,
        };
        assert_eq!(
            refused_field(DeliveryTarget::Storage(storage.clone())),
            "accepted"
        );
        let with = |change: fn(&mut StorageTarget)| {
            let mut s = storage.clone();
            change(&mut s);
            refused_field(DeliveryTarget::Storage(s))
        };
        assert_eq!(
            with(|s| s.connection_string = "AccountName=a".into()),
            "storageContainer.connectionString"
        );
        assert_eq!(
            with(|s| s.container_name = "Archive".into()),
            "storageContainer.containerName"
        );
        assert_eq!(
            with(|s| s.container_name = "a--b".into()),
            "storageContainer.containerName"
        );
        assert_eq!(
            with(|s| s.file_name_format = "{iothub}/{partition}/{YYYY}/{MM}/{DD}/{HH}".into()),
            "storageContainer.fileNameFormat"
        );
        assert_eq!(
            with(|s| s.file_name_format = "{mm}{HH}{DD}{MM}{YYYY}{partition}{iothub}.avro".into()),
            "accepted"
        );
        assert_eq!(
            with(|s| s.batch_frequency_secs = 59),
            "storageContainer.batchFrequencyInSeconds"
        );
        assert_eq!(
            with(|s| s.batch_frequency_secs = 721),
            "storageContainer.batchFrequencyInSeconds"
        );
        assert_eq!(
            with(|s| s.max_chunk_size_bytes = 10_485_759),
            "storageContainer.maxChunkSizeInBytes"
        );
        assert_eq!(
            StorageEncoding::parse("AVRODEFLATE"),
            Some(StorageEncoding::AvroDeflate)
        );
        assert_eq!(StorageEncoding::parse("xml"), None);
        token_only.timeout_ms = 0;
        token_only.username = Some("u".into());
        assert_eq!(
            refused_field(DeliveryTarget::Mqtt(token_only)),
            "mqtt.timeoutSeconds"
        );
    }
}
