//! `[routing.endpoints.webhook]`: a custom endpoint's webhook target declared in the
//! configuration file (docs/routing.md, "Webhook endpoints").

use std::path::PathBuf;
use std::time::Duration;

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
    pub fn target(&self) -> Result<ferrohub_engine::delivery::DeliveryTarget, String> {
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
        };
        Ok(ferrohub_engine::delivery::DeliveryTarget::Webhook(
            ferrohub_engine::delivery::WebhookTarget {
                url: self.url.clone(),
                signing_key: read(&self.signing_key_file)?.trim().to_string(),
                ca_certificate: self.ca_file.as_ref().map(read).transpose()?,
                timeout_ms: self.timeout.as_millis() as u64,
                dead_letter_after_ms: self.dead_letter_after.as_millis() as u64,
            },
        ))
    }
}
