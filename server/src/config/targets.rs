//! `[routing.endpoints.webhook]`, `[routing.endpoints.nats]`, `[routing.endpoints.mqtt]`,
//! `[routing.endpoints.storage_container]`: a
//! custom endpoint's delivery target declared in the configuration file (docs/routing.md,
//! "Endpoints outside the hub"). Secrets (signing key, password) and CA certificates are read
//! from files named here, so the configuration file itself holds none.

use std::path::PathBuf;
use std::time::Duration;

use ferrohub_engine::delivery::{
    BrokerTarget, DeliveryTarget, StorageEncoding, StorageTarget, WebhookTarget,
};
use serde::Deserialize;

/// `[routing.endpoints.webhook]`: what `PUT /routing/endpoints/{name}/webhook` takes, with the
/// signing key and CA read from files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub url: String,
    /// A file holding the base64 signing key (16 to 64 bytes), kept out of this file.
    pub signing_key_file: PathBuf,
    /// A PEM CA certificate the receiver's certificate chains to.
    pub ca_file: Option<PathBuf>,
    #[serde(default = "webhook_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(default = "webhook_dead_letter_after", with = "humantime_serde")]
    pub dead_letter_after: Duration,
}

fn webhook_timeout() -> Duration {
    Duration::from_secs(10)
}

fn webhook_dead_letter_after() -> Duration {
    Duration::from_secs(3600)
}

impl WebhookConfig {
    /// The target it names, its files read.
    ///
    /// # Errors
    /// A file that cannot be read, named.
    pub fn target(&self) -> Result<DeliveryTarget, String> {
        Ok(DeliveryTarget::Webhook(WebhookTarget {
            url: self.url.clone(),
            signing_key: read(&self.signing_key_file)?.trim().to_string(),
            ca_certificate: self.ca_file.as_ref().map(read).transpose()?,
            timeout_ms: self.timeout.as_millis() as u64,
            dead_letter_after_ms: self.dead_letter_after.as_millis() as u64,
        }))
    }
}

/// `[routing.endpoints.nats]` (`subject`) or `[routing.endpoints.mqtt]` (`topic`): what
/// `PUT /routing/endpoints/{name}/nats|mqtt` takes, with the password and CA read from files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    pub url: String,
    /// NATS: the subject, with `{deviceId}` in it.
    pub subject: Option<String>,
    /// MQTT: the topic, with `{deviceId}` in it.
    pub topic: Option<String>,
    pub username: Option<String>,
    /// A file holding the password (NATS without a username: the token).
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    #[serde(default = "webhook_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    #[serde(default = "webhook_dead_letter_after", with = "humantime_serde")]
    pub dead_letter_after: Duration,
}

impl BrokerConfig {
    /// The target it names (`nats` reads `subject`, `mqtt` reads `topic`), its files read.
    ///
    /// # Errors
    /// A missing subject or topic, or a file that cannot be read, named.
    pub fn target(&self, nats: bool) -> Result<DeliveryTarget, String> {
        let topic = if nats { &self.subject } else { &self.topic };
        let topic = topic.clone().ok_or(if nats {
            "nats.subject is required"
        } else {
            "mqtt.topic is required"
        })?;
        let target = BrokerTarget {
            url: self.url.clone(),
            topic,
            username: self.username.clone(),
            password: self
                .password_file
                .as_ref()
                .map(|p| read(p).map(|s| s.trim().to_string()))
                .transpose()?,
            ca_certificate: self.ca_file.as_ref().map(read).transpose()?,
            timeout_ms: self.timeout.as_millis() as u64,
            dead_letter_after_ms: self.dead_letter_after.as_millis() as u64,
        };
        Ok(if nats {
            DeliveryTarget::Nats(target)
        } else {
            DeliveryTarget::Mqtt(target)
        })
    }
}

fn read(path: &PathBuf) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// `[routing.endpoints.storage_container]`: what `PUT /routing/endpoints/{name}/storageContainer`
/// takes, with the connection string read from a file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// A file holding the account's connection string.
    pub connection_string_file: PathBuf,
    pub container_name: String,
    #[serde(default = "default_file_name_format")]
    pub file_name_format: String,
    #[serde(default = "default_batch_frequency", with = "humantime_serde")]
    pub batch_frequency: Duration,
    /// Bytes.
    #[serde(default = "default_max_chunk_size")]
    pub max_chunk_size: u64,
    /// `avro`, `avroDeflate` or `json`.
    #[serde(default = "default_encoding")]
    pub encoding: String,
}

fn default_file_name_format() -> String {
    ferrohub_engine::delivery::DEFAULT_FILE_NAME_FORMAT.into()
}

fn default_batch_frequency() -> Duration {
    Duration::from_secs(300)
}

fn default_max_chunk_size() -> u64 {
    314_572_800
}

fn default_encoding() -> String {
    "avro".into()
}

impl StorageConfig {
    /// The target it names, its file read.
    ///
    /// # Errors
    /// An unknown encoding, or a file that cannot be read.
    pub fn target(&self) -> Result<DeliveryTarget, String> {
        let encoding = StorageEncoding::parse(&self.encoding).ok_or_else(|| {
            format!(
                "storage_container.encoding {:?} is not avro, avroDeflate or json",
                self.encoding
            )
        })?;
        Ok(DeliveryTarget::Storage(StorageTarget {
            connection_string: read(&self.connection_string_file)?.trim().to_string(),
            container_name: self.container_name.clone(),
            encoding,
            file_name_format: self.file_name_format.clone(),
            batch_frequency_secs: u32::try_from(self.batch_frequency.as_secs()).unwrap_or(u32::MAX),
            max_chunk_size_bytes: self.max_chunk_size,
        }))
    }
}
