//! Identity records and the rules that make them valid.
//!
//! Records here are what is stored (named MessagePack, see `ferrohub_migrations::record`).
//! Wire shapes (IoT Hub JSON) belong to the server; the engine knows only these types.
//!
//! # Invariants
//! - Every stored identity passed [`validate_id`] and [`IdentitySpec::validate`].
//! - A stored `sas` identity always has both keys (generated when not supplied).
//! - `etag` changes on every write of the record; `generation_id` is fixed at creation.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;

/// Milliseconds since the Unix epoch (UTC). The engine never reads the clock; callers pass it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UnixMillis(pub i64);

/// Longest device or module id, in characters (all ASCII).
pub const MAX_ID_LEN: usize = 128;
/// Longest status reason, in characters.
pub const MAX_STATUS_REASON_LEN: usize = 128;
/// Most modules one device may have.
pub const MAX_MODULES_PER_DEVICE: usize = 50;
/// Most identities in one bulk registry request.
pub const MAX_BULK_IDENTITIES: usize = 100;
/// Symmetric keys decode to between this many bytes...
pub const MIN_KEY_BYTES: usize = 16;
/// ...and this many.
pub const MAX_KEY_BYTES: usize = 64;

const ID_PUNCTUATION: &str = "-:.+%_#*?!(),=@;$'";

/// Checks a device or module id against the IoT Hub rules.
///
/// # Errors
/// [`ValidationError`] naming `field` when the id is empty, too long or has a character outside
/// ASCII alphanumerics and `- : . + % _ # * ? ! ( ) , = @ ; $ '`.
pub fn validate_id(field: &'static str, id: &str) -> Result<(), ValidationError> {
    if id.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if id.len() > MAX_ID_LEN {
        return Err(ValidationError::new(
            field,
            format!(
                "is {} characters long; at most {MAX_ID_LEN} are allowed",
                id.chars().count()
            ),
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || ID_PUNCTUATION.contains(*c)))
    {
        return Err(ValidationError::new(
            field,
            format!("contains {c:?}; only ASCII letters, digits and {ID_PUNCTUATION} are allowed"),
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    #[default]
    Enabled,
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionState {
    #[default]
    Disconnected,
    Connected,
}

/// How an identity proves itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum AuthType {
    #[default]
    Sas,
    SelfSigned,
    CertificateAuthority,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymmetricKeys {
    pub primary_key: String,
    pub secondary_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Thumbprints {
    pub primary: Option<String>,
    pub secondary: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authentication {
    pub kind: AuthType,
    pub symmetric_keys: Option<SymmetricKeys>,
    pub thumbprints: Option<Thumbprints>,
}

/// A device identity (`module_id == None`) or a module identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub device_id: String,
    pub module_id: Option<String>,
    pub generation_id: String,
    pub etag: String,
    pub status: Status,
    pub status_reason: Option<String>,
    pub status_updated_time: UnixMillis,
    pub connection_state: ConnectionState,
    pub connection_state_updated_time: Option<UnixMillis>,
    pub last_activity_time: Option<UnixMillis>,
    pub cloud_to_device_message_count: u32,
    pub authentication: Authentication,
    pub iot_edge: bool,
    pub device_scope: Option<String>,
    pub parent_scopes: Vec<String>,
    pub managed_by: Option<String>,
    /// The IoT Plug and Play model (a DTMI) the device or module announced when it last
    /// connected with one (PNP-1). Last, and defaulted, so records written before it read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
}

/// The symmetric-key part of a request: either key may be left out and is then generated.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeysSpec {
    pub primary_key: Option<String>,
    pub secondary_key: Option<String>,
}

/// What a caller may set on an identity. Everything else is the hub's.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IdentitySpec {
    pub status: Status,
    pub status_reason: Option<String>,
    pub auth_type: AuthType,
    pub keys: KeysSpec,
    pub thumbprints: Thumbprints,
    pub iot_edge: bool,
    pub device_scope: Option<String>,
    pub parent_scopes: Vec<String>,
    pub managed_by: Option<String>,
}

impl IdentitySpec {
    /// Checks every field the caller set.
    ///
    /// # Errors
    /// The first [`ValidationError`] found.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(reason) = &self.status_reason {
            let n = reason.chars().count();
            if n > MAX_STATUS_REASON_LEN {
                return Err(ValidationError::new(
                    "statusReason",
                    format!("is {n} characters long; at most {MAX_STATUS_REASON_LEN} are allowed"),
                ));
            }
        }
        for (field, key) in [
            ("primaryKey", &self.keys.primary_key),
            ("secondaryKey", &self.keys.secondary_key),
        ] {
            if let Some(k) = key {
                validate_key(field, k)?;
            }
        }
        for (field, t) in [
            ("primaryThumbprint", &self.thumbprints.primary),
            ("secondaryThumbprint", &self.thumbprints.secondary),
        ] {
            if let Some(t) = t {
                validate_thumbprint(field, t)?;
            }
        }
        if self.auth_type == AuthType::SelfSigned && self.thumbprints.primary.is_none() {
            return Err(ValidationError::new(
                "primaryThumbprint",
                "is required for selfSigned authentication",
            ));
        }
        Ok(())
    }

    /// The authentication record to store: keys generated where missing, or kept from
    /// `previous` when the caller sent none (an update that does not mention keys keeps them).
    pub(crate) fn authentication(&self, previous: Option<&Authentication>) -> Authentication {
        match self.auth_type {
            AuthType::Sas => {
                let kept = previous.and_then(|p| p.symmetric_keys.as_ref());
                let pick = |given: &Option<String>, old: Option<&String>| {
                    given
                        .clone()
                        .or_else(|| old.cloned())
                        .unwrap_or_else(generate_key)
                };
                Authentication {
                    kind: AuthType::Sas,
                    symmetric_keys: Some(SymmetricKeys {
                        primary_key: pick(&self.keys.primary_key, kept.map(|k| &k.primary_key)),
                        secondary_key: pick(
                            &self.keys.secondary_key,
                            kept.map(|k| &k.secondary_key),
                        ),
                    }),
                    thumbprints: None,
                }
            }
            AuthType::SelfSigned => Authentication {
                kind: AuthType::SelfSigned,
                symmetric_keys: None,
                thumbprints: Some(Thumbprints {
                    primary: self
                        .thumbprints
                        .primary
                        .as_ref()
                        .map(|t| t.to_ascii_uppercase()),
                    secondary: self
                        .thumbprints
                        .secondary
                        .as_ref()
                        .map(|t| t.to_ascii_uppercase()),
                }),
            },
            kind @ (AuthType::CertificateAuthority | AuthType::None) => Authentication {
                kind,
                symmetric_keys: None,
                thumbprints: None,
            },
        }
    }
}

pub(crate) fn validate_key(field: &'static str, key: &str) -> Result<(), ValidationError> {
    let bytes = B64
        .decode(key)
        .map_err(|_| ValidationError::new(field, "is not valid base64"))?;
    if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&bytes.len()) {
        return Err(ValidationError::new(
            field,
            format!(
                "decodes to {} bytes; keys must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes",
                bytes.len()
            ),
        ));
    }
    Ok(())
}

fn validate_thumbprint(field: &'static str, t: &str) -> Result<(), ValidationError> {
    let ok = (t.len() == 40 || t.len() == 64) && t.chars().all(|c| c.is_ascii_hexdigit());
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            "must be 40 (SHA-1) or 64 (SHA-256) hexadecimal characters",
        ))
    }
}

/// A fresh 256-bit key, base64.
pub fn generate_key() -> String {
    let mut k = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut k);
    B64.encode(k)
}

/// A weak etag in IoT Hub's style: base64 of a decimal number. Never equal to `previous`.
pub(crate) fn next_etag(previous: Option<&str>) -> String {
    loop {
        let candidate = B64.encode(rand::random::<u32>().to_string());
        if Some(candidate.as_str()) != previous {
            return candidate;
        }
    }
}

/// A generation id: 18 random decimal digits, so a re-created device gets a different one.
pub(crate) fn new_generation_id() -> String {
    format!("{:018}", rand::random::<u64>() % 1_000_000_000_000_000_000)
}

/// `If-Match` as the registry understands it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum IfMatch {
    /// Absent or `*`: unconditional.
    Any,
    /// Must equal the current etag.
    Etag(String),
}

impl IfMatch {
    pub(crate) fn check(&self, current: &str) -> Result<(), crate::error::EtagMismatch> {
        match self {
            IfMatch::Any => Ok(()),
            IfMatch::Etag(e) if e == current => Ok(()),
            IfMatch::Etag(e) => Err(crate::error::EtagMismatch {
                given: e.clone(),
                current: current.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(validate_id("deviceId", "dev-1:a.b+c%d_e#f*g?h!i(j)k,l=m@n;o$p'q").is_ok());
        assert!(validate_id("deviceId", &"a".repeat(128)).is_ok());
        assert!(validate_id("deviceId", &"a".repeat(129)).is_err());
        assert!(validate_id("deviceId", "").is_err());
        assert!(validate_id("deviceId", "dev 1").is_err());
        assert!(validate_id("deviceId", "dev/1").is_err());
        assert!(validate_id("deviceId", "dév").is_err());
    }

    #[test]
    fn keys_are_generated_and_kept() {
        let spec = IdentitySpec::default();
        let a = spec.authentication(None);
        let keys = a.symmetric_keys.clone().unwrap();
        assert_eq!(B64.decode(&keys.primary_key).unwrap().len(), 32);
        assert_ne!(keys.primary_key, keys.secondary_key);
        assert_eq!(spec.authentication(Some(&a)), a);
    }

    #[test]
    fn bad_keys_and_reasons_are_refused() {
        let mut spec = IdentitySpec::default();
        spec.keys.primary_key = Some("not base64!".into());
        assert!(spec.validate().is_err());
        spec.keys.primary_key = Some(B64.encode([0u8; 8]));
        assert!(spec.validate().is_err());
        spec.keys.primary_key = None;
        spec.status_reason = Some("x".repeat(129));
        assert!(spec.validate().is_err());
        spec.status_reason = Some("é".repeat(128));
        assert!(spec.validate().is_ok());
    }

    #[test]
    fn etags_always_change() {
        let a = next_etag(None);
        for _ in 0..100 {
            assert_ne!(next_etag(Some(&a)), a);
        }
    }
}
