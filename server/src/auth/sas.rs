//! Shared access signature tokens (SEC-2), as the official SDKs produce them.
//!
//! `SharedAccessSignature sr={resource}&sig={signature}&se={expiry}[&skn={policy}]`, fields in
//! any order. The signature is HMAC-SHA256 with the base64-decoded key over
//! `{sr}\n{se}` where `sr` is taken *exactly as it appears in the token* (device SDKs sign the
//! percent-encoded form, the service SDK the `quote_plus` form); `sig` is plain
//! percent-decoded (hub tokens leave `/` unencoded, and `+` must stay `+`).
//!
//! Invariant: comparison of signatures is constant-time (`Mac::verify_slice`).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use percent_encoding::percent_decode_str;
use sha2::Sha256;

/// Why a token was refused. Every variant is a 401 to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SasError {
    #[error("the token is not a SharedAccessSignature")]
    NotSas,
    #[error("the token lacks the {0} field")]
    Missing(&'static str),
    #[error("the token's {0} field is malformed")]
    Malformed(&'static str),
    #[error("the token expired")]
    Expired,
    #[error("the token's signature does not match")]
    BadSignature,
}

/// A parsed token; `resource_raw` keeps the exact bytes that were signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SasToken {
    pub resource_raw: String,
    /// `sr` percent-decoded, for scope checks.
    pub resource: String,
    pub signature: Vec<u8>,
    pub expiry_raw: String,
    pub expiry: u64,
    pub key_name: Option<String>,
}

fn decode(field: &'static str, s: &str) -> Result<String, SasError> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| SasError::Malformed(field))
}

impl SasToken {
    /// Parses a token string.
    ///
    /// # Errors
    /// [`SasError::NotSas`], [`SasError::Missing`] or [`SasError::Malformed`].
    pub fn parse(token: &str) -> Result<SasToken, SasError> {
        let body = token
            .trim()
            .strip_prefix("SharedAccessSignature ")
            .ok_or(SasError::NotSas)?;
        let (mut sr, mut sig, mut se, mut skn) = (None, None, None, None);
        for pair in body.split('&') {
            let (k, v) = pair.split_once('=').ok_or(SasError::Malformed("pair"))?;
            match k {
                "sr" => sr = Some(v),
                "sig" => sig = Some(v),
                "se" => se = Some(v),
                "skn" => skn = Some(v),
                _ => {}
            }
        }
        let sr = sr.ok_or(SasError::Missing("sr"))?;
        let sig = decode("sig", sig.ok_or(SasError::Missing("sig"))?)?;
        let se = se.ok_or(SasError::Missing("se"))?;
        Ok(SasToken {
            resource_raw: sr.to_string(),
            resource: decode("sr", sr)?,
            signature: B64.decode(sig).map_err(|_| SasError::Malformed("sig"))?,
            expiry_raw: se.to_string(),
            expiry: se.parse().map_err(|_| SasError::Malformed("se"))?,
            key_name: skn.map(|s| decode("skn", s)).transpose()?,
        })
    }

    /// Checks expiry against `now_secs` and the signature against any of `keys` (base64).
    ///
    /// IoT Hub signs with the key's decoded bytes. Event Hubs and Service Bus clients sign
    /// with the key's text as it appears in the connection string, so a token for an Event
    /// Hubs audience (`sb://...`) may be signed either way.
    ///
    /// # Errors
    /// [`SasError::Expired`] or [`SasError::BadSignature`].
    pub fn verify<'k>(
        &self,
        now_secs: u64,
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Result<(), SasError> {
        if self.expiry <= now_secs {
            return Err(SasError::Expired);
        }
        let message = format!("{}\n{}", self.resource_raw, self.expiry_raw);
        let event_hubs = self.resource.starts_with("sb://");
        let signed_with = |key: &[u8]| {
            Hmac::<Sha256>::new_from_slice(key).is_ok_and(|mut mac| {
                mac.update(message.as_bytes());
                mac.verify_slice(&self.signature).is_ok()
            })
        };
        for key in keys {
            if B64.decode(key).is_ok_and(|k| signed_with(&k))
                || (event_hubs && signed_with(key.as_bytes()))
            {
                return Ok(());
            }
        }
        Err(SasError::BadSignature)
    }
}

/// Builds a token (for the CLI and tests): `sr` encoded with nothing kept safe, as devices do.
pub fn sign(resource: &str, key_b64: &str, expiry: u64, key_name: Option<&str>) -> Option<String> {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let sr = utf8_percent_encode(resource, NON_ALPHANUMERIC).to_string();
    let key = B64.decode(key_b64).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(format!("{sr}\n{expiry}").as_bytes());
    let sig =
        utf8_percent_encode(&B64.encode(mac.finalize().into_bytes()), NON_ALPHANUMERIC).to_string();
    let mut token = format!("SharedAccessSignature sr={sr}&sig={sig}&se={expiry}");
    if let Some(n) = key_name {
        token.push_str("&skn=");
        token.push_str(&utf8_percent_encode(n, NON_ALPHANUMERIC).to_string());
    }
    Some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1vZi1leGFjdGx5LTMyLWJ5dGVzISE=";

    #[test]
    fn signs_and_verifies() {
        let t = sign("localhost/devices/dev 1", KEY, 2_000, None).unwrap();
        let parsed = SasToken::parse(&t).unwrap();
        assert_eq!(parsed.resource, "localhost/devices/dev 1");
        assert_eq!(parsed.resource_raw, "localhost%2Fdevices%2Fdev%201");
        assert!(parsed.verify(1_000, [KEY]).is_ok());
        assert_eq!(parsed.verify(2_000, [KEY]), Err(SasError::Expired));
        assert_eq!(
            parsed.verify(1_000, ["AAAAAAAAAAAAAAAAAAAAAA=="]),
            Err(SasError::BadSignature)
        );
    }

    #[test]
    fn signature_is_over_sr_as_it_appears() {
        // The service SDK leaves `/` raw in sig and uses quote_plus for sr.
        let sr = "localhost%3A8443";
        let key = B64.decode(KEY).unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        mac.update(format!("{sr}\n5000").as_bytes());
        let sig = B64
            .encode(mac.finalize().into_bytes())
            .replace('+', "%2B")
            .replace('=', "%3D");
        let token = format!("SharedAccessSignature sr={sr}&sig={sig}&se=5000&skn=iothubowner");
        let parsed = SasToken::parse(&token).unwrap();
        assert_eq!(parsed.resource, "localhost:8443");
        assert_eq!(parsed.key_name.as_deref(), Some("iothubowner"));
        assert!(parsed.verify(10, [KEY]).is_ok());
    }

    #[test]
    fn event_hubs_audiences_may_be_signed_with_the_key_text() {
        let token_signed_with = |sr: &str, key: &[u8]| {
            let raw = percent_encoding::utf8_percent_encode(sr, percent_encoding::NON_ALPHANUMERIC)
                .to_string();
            let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
            mac.update(format!("{raw}\n5000").as_bytes());
            let sig = percent_encoding::utf8_percent_encode(
                &B64.encode(mac.finalize().into_bytes()),
                percent_encoding::NON_ALPHANUMERIC,
            )
            .to_string();
            SasToken::parse(&format!(
                "SharedAccessSignature sr={raw}&sig={sig}&se=5000&skn=service"
            ))
            .unwrap()
        };
        // As the Event Hubs SDKs sign: HMAC keyed by the key's text.
        let eh = token_signed_with("sb://localhost/ferrohub", KEY.as_bytes());
        assert!(eh.verify(10, [KEY]).is_ok());
        // The IoT Hub way still works for that audience.
        let decoded = B64.decode(KEY).unwrap();
        assert!(token_signed_with("sb://localhost/ferrohub", &decoded)
            .verify(10, [KEY])
            .is_ok());
        // The key's text is no key for IoT Hub audiences.
        assert_eq!(
            token_signed_with("localhost", KEY.as_bytes()).verify(10, [KEY]),
            Err(SasError::BadSignature)
        );
    }

    #[test]
    fn malformed_tokens_are_refused() {
        assert_eq!(SasToken::parse("Bearer x"), Err(SasError::NotSas));
        assert_eq!(
            SasToken::parse("SharedAccessSignature sig=a&se=1"),
            Err(SasError::Missing("sr"))
        );
        assert_eq!(
            SasToken::parse("SharedAccessSignature sr=a&sig=a&se=x"),
            Err(SasError::Malformed("sig"))
        );
        assert!(matches!(
            SasToken::parse("SharedAccessSignature sr=a&sig=AAAA&se=x"),
            Err(SasError::Malformed("se"))
        ));
    }
}
