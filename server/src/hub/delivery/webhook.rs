//! One webhook receiver: an event becomes one HTTP POST of its body, its properties in
//! headers, signed with the endpoint's key.
//!
//! What the receiver gets (docs/routing.md, "Webhook endpoints"):
//! - the body as stored; `Content-Type` from the message's `content-type` (else
//!   `application/octet-stream`);
//! - every system property under its IoT Hub wire name (`message-id`,
//!   `iothub-connection-device-id`, ...), `iothub-enqueuedtime` (ISO 8601), the message's
//!   `content-encoding` as `iothub-content-encoding` (it names a character set, not an HTTP
//!   coding);
//! - every application property as `x-property-{name}: {value}`, name and value
//!   percent-encoded (UTF-8), so any property survives as a header;
//! - `x-ferrohub-endpoint`, `x-ferrohub-partition`, `x-ferrohub-sequence-number` (with the
//!   partition, a key that tells a repeated delivery from a new message) and
//!   `x-ferrohub-signature: sha256={hex HMAC-SHA256 of the body with the signing key}`.
//!
//! Any 2xx answer accepts the event; anything else, a timeout or no connection is a failure
//! the caller retries.

use std::time::Duration;

use base64::Engine as _;
use ferrohub_engine::d2c::D2cEvent;
use ferrohub_engine::delivery::WebhookTarget;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A client for one webhook target.
pub struct WebhookSender {
    client: reqwest::Client,
    url: String,
    key: Vec<u8>,
    endpoint: String,
}

impl WebhookSender {
    /// # Errors
    /// The target's key or CA certificate does not load.
    pub fn new(endpoint: &str, target: &WebhookTarget) -> Result<WebhookSender, String> {
        let key = base64::engine::general_purpose::STANDARD
            .decode(&target.signing_key)
            .map_err(|e| format!("signing key: {e}"))?;
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_millis(target.timeout_ms))
            .connect_timeout(Duration::from_millis(target.timeout_ms))
            .pool_max_idle_per_host(4)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = &target.ca_certificate {
            for cert in ca_certificates(pem)? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(|e| format!("HTTP client: {e}"))?;
        Ok(WebhookSender {
            client,
            url: target.url.clone(),
            key,
            endpoint: endpoint.to_string(),
        })
    }

    /// POSTs one event; `Ok` once the receiver answered 2xx.
    ///
    /// # Errors
    /// What went wrong, for the endpoint's health and the log.
    pub async fn post(&self, event: &D2cEvent) -> Result<(), String> {
        let headers = super::headers::of(&self.endpoint, event);
        let mut request = self
            .client
            .post(&self.url)
            .header("x-ferrohub-signature", signature(&self.key, &event.body));
        for (name, value) in headers.pairs {
            request = request.header(name, value);
        }
        let answer = request
            .header(reqwest::header::CONTENT_TYPE, headers.content_type)
            .body(event.body.clone())
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered {status}"))
        }
    }
}

/// The certificates of a PEM bundle; at least one, or why not.
fn ca_certificates(pem: &str) -> Result<Vec<reqwest::Certificate>, String> {
    let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
        .map_err(|e| format!("caCertificate: {e}"))?;
    if certs.is_empty() {
        return Err("caCertificate: no PEM certificate in it".into());
    }
    Ok(certs)
}

/// Checks what the engine's validation cannot: that the CA certificate, if any, parses.
///
/// # Errors
/// Why it does not.
pub fn check(target: &WebhookTarget) -> Result<(), String> {
    match &target.ca_certificate {
        Some(pem) => ca_certificates(pem).map(drop),
        None => Ok(()),
    }
}

/// `sha256=` and the hex HMAC-SHA256 of `body` with `key`.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256=");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// A request error with its causes (reqwest's own message hides them).
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "no answer within the timeout".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_signature_is_the_hex_hmac_sha256_of_the_body() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
