//! The JSON shapes of an endpoint's delivery target (docs/routing.md, "Endpoints outside the
//! hub"): `webhook`, `nats`, `mqtt` or `storageContainer` (IoT Hub's storage endpoint
//! properties), in an endpoint's body or alone under `/routing/endpoints/{name}/{kind}`.
//!
//! # Invariants
//! - Secrets never leave in a read: the webhook's signing key is shown only in the answer to
//!   the request that set it (it may have been made there); broker passwords and storage
//!   connection strings never.
//! - Times are in seconds on the wire, milliseconds in the engine.

use ferrohub_engine::delivery::{
    BrokerTarget, DeliveryTarget, StorageEncoding, StorageTarget, WebhookTarget,
    DEFAULT_FILE_NAME_FORMAT,
};
use serde::{Deserialize, Serialize};

use super::error::ApiError;

/// The target fields of an endpoint: at most one is given.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetJson {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<BrokerJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<BrokerJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_container: Option<StorageJson>,
}

/// The kinds a path may name: `/routing/endpoints/{name}/{kind}`.
pub const KINDS: [&str; 4] = ["webhook", "nats", "mqtt", "storageContainer"];

/// A storage container target, with IoT Hub's property names and defaults.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageJson {
    /// Never shown back.
    #[serde(default, skip_serializing)]
    connection_string: String,
    container_name: String,
    #[serde(default = "default_file_name_format")]
    file_name_format: String,
    #[serde(default = "default_batch_frequency")]
    batch_frequency_in_seconds: u32,
    #[serde(default = "default_max_chunk")]
    max_chunk_size_in_bytes: u64,
    #[serde(default = "default_encoding")]
    encoding: String,
}

fn default_file_name_format() -> String {
    DEFAULT_FILE_NAME_FORMAT.into()
}

fn default_batch_frequency() -> u32 {
    300
}

fn default_max_chunk() -> u64 {
    314_572_800
}

fn default_encoding() -> String {
    "avro".into()
}

/// A webhook target as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookJson {
    url: String,
    /// Base64 of 16 to 64 bytes; made (32 random bytes) when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signing_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_certificate: Option<String>,
    #[serde(default = "default_timeout_seconds")]
    timeout_seconds: u64,
    #[serde(default = "default_dead_letter_seconds")]
    dead_letter_after_seconds: u64,
}

/// A NATS (`subject`) or MQTT (`topic`) target as the API shows it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokerJson {
    url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    /// Never shown back.
    #[serde(default, skip_serializing)]
    password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ca_certificate: Option<String>,
    #[serde(default = "default_timeout_seconds")]
    timeout_seconds: u64,
    #[serde(default = "default_dead_letter_seconds")]
    dead_letter_after_seconds: u64,
}

fn default_timeout_seconds() -> u64 {
    10
}

fn default_dead_letter_seconds() -> u64 {
    3600
}

impl TargetJson {
    /// The one `kind` body alone (`PUT /routing/endpoints/{name}/{kind}`).
    ///
    /// # Errors
    /// 400 when the body is not that kind's shape.
    pub fn of_kind(kind: &str, body: serde_json::Value) -> Result<TargetJson, ApiError> {
        serde_json::from_value(serde_json::json!({ kind: body }))
            .map_err(|e| ApiError::format(format!("{kind}: {e}")))
    }

    /// The target asked for, checked as far as the engine cannot (CA certificates).
    ///
    /// # Errors
    /// 400 when more than one kind is given, a broker lacks its subject or topic, or a CA
    /// certificate does not parse.
    pub fn checked_target(self) -> Result<Option<DeliveryTarget>, ApiError> {
        let given = [
            self.webhook.is_some(),
            self.nats.is_some(),
            self.mqtt.is_some(),
            self.storage_container.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(ApiError::argument(
                "an endpoint delivers to one target: give one of webhook, nats, mqtt or storageContainer",
            ));
        }
        let target = if let Some(w) = self.webhook {
            w.target()
        } else if let Some(b) = self.nats {
            let subject = b
                .subject
                .clone()
                .ok_or_else(|| ApiError::argument("nats.subject is required"))?;
            DeliveryTarget::Nats(b.target(subject))
        } else if let Some(b) = self.mqtt {
            let topic = b
                .topic
                .clone()
                .ok_or_else(|| ApiError::argument("mqtt.topic is required"))?;
            DeliveryTarget::Mqtt(b.target(topic))
        } else if let Some(s) = self.storage_container {
            DeliveryTarget::Storage(s.target()?)
        } else {
            return Ok(None);
        };
        crate::hub::delivery::sender::check(&target).map_err(ApiError::argument)?;
        Ok(Some(target))
    }

    /// How a stored target reads; `with_key` shows a webhook's signing key.
    pub fn shown(target: Option<&DeliveryTarget>, with_key: bool) -> TargetJson {
        match target {
            None => TargetJson::default(),
            Some(DeliveryTarget::Webhook(w)) => TargetJson {
                webhook: Some(WebhookJson {
                    url: w.url.clone(),
                    signing_key: with_key.then(|| w.signing_key.clone()),
                    ca_certificate: w.ca_certificate.clone(),
                    timeout_seconds: w.timeout_ms / 1000,
                    dead_letter_after_seconds: w.dead_letter_after_ms / 1000,
                }),
                ..TargetJson::default()
            },
            Some(DeliveryTarget::Nats(b)) => TargetJson {
                nats: Some(BrokerJson::shown(b, true)),
                ..TargetJson::default()
            },
            Some(DeliveryTarget::Mqtt(b)) => TargetJson {
                mqtt: Some(BrokerJson::shown(b, false)),
                ..TargetJson::default()
            },
            Some(DeliveryTarget::Storage(t)) => TargetJson {
                storage_container: Some(StorageJson {
                    connection_string: String::new(),
                    container_name: t.container_name.clone(),
                    file_name_format: t.file_name_format.clone(),
                    batch_frequency_in_seconds: t.batch_frequency_secs,
                    max_chunk_size_in_bytes: t.max_chunk_size_bytes,
                    encoding: t.encoding.name().into(),
                }),
                ..TargetJson::default()
            },
        }
    }
}

impl WebhookJson {
    fn target(self) -> DeliveryTarget {
        use base64::Engine as _;
        let key = self.signing_key.unwrap_or_else(|| {
            base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
        });
        DeliveryTarget::Webhook(WebhookTarget {
            url: self.url,
            signing_key: key,
            ca_certificate: self.ca_certificate,
            timeout_ms: self.timeout_seconds.saturating_mul(1000),
            dead_letter_after_ms: self.dead_letter_after_seconds.saturating_mul(1000),
        })
    }
}

impl BrokerJson {
    fn target(self, topic: String) -> BrokerTarget {
        BrokerTarget {
            url: self.url,
            topic,
            username: self.username,
            password: self.password,
            ca_certificate: self.ca_certificate,
            timeout_ms: self.timeout_seconds.saturating_mul(1000),
            dead_letter_after_ms: self.dead_letter_after_seconds.saturating_mul(1000),
        }
    }

    fn shown(b: &BrokerTarget, nats: bool) -> BrokerJson {
        BrokerJson {
            url: b.url.clone(),
            subject: nats.then(|| b.topic.clone()),
            topic: (!nats).then(|| b.topic.clone()),
            username: b.username.clone(),
            password: None,
            ca_certificate: b.ca_certificate.clone(),
            timeout_seconds: b.timeout_ms / 1000,
            dead_letter_after_seconds: b.dead_letter_after_ms / 1000,
        }
    }
}

impl StorageJson {
    fn target(self) -> Result<StorageTarget, ApiError> {
        let encoding = StorageEncoding::parse(&self.encoding).ok_or_else(|| {
            ApiError::argument(format!(
                "storageContainer.encoding {:?} is not avro, avroDeflate or json",
                self.encoding
            ))
        })?;
        Ok(StorageTarget {
            connection_string: self.connection_string,
            container_name: self.container_name,
            encoding,
            file_name_format: self.file_name_format,
            batch_frequency_secs: self.batch_frequency_in_seconds,
            max_chunk_size_bytes: self.max_chunk_size_in_bytes,
        })
    }
}
