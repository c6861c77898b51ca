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
}

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

/// Bounds of the webhook settings, in milliseconds.
pub const WEBHOOK_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 1_000..=60_000;
pub const WEBHOOK_DEAD_LETTER_MS: std::ops::RangeInclusive<u64> = 10_000..=7 * 24 * 3_600_000;

impl DeliveryTarget {
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
                if !WEBHOOK_TIMEOUT_MS.contains(&w.timeout_ms) {
                    return Err(ValidationError::new(
                        "webhook.timeoutSeconds",
                        "must be 1 to 60",
                    ));
                }
                if !WEBHOOK_DEAD_LETTER_MS.contains(&w.dead_letter_after_ms) {
                    return Err(ValidationError::new(
                        "webhook.deadLetterAfterSeconds",
                        "must be 10 to 604800 (7 days)",
                    ));
                }
                Ok(())
            }
        }
    }
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
