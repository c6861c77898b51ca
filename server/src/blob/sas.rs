//! Blob service SAS grants signed with a storage account key (FUP-1).
//!
//! Azure Storage checks a service SAS against a string-to-sign whose canonicalized resource is
//! `/blob/{account}/{container}/{blob name}` with the blob name *as stored*: decoded, not as it
//! appears percent-encoded in a request's path. Signing the encoded path works only for names
//! that need no encoding (plain ASCII without spaces or reserved characters), which is why the
//! hub signs its grants here rather than through `object_store`'s signer.
//!
//! # Invariants
//! - A grant names exactly one blob (`sr=b`): the signature covers the decoded name, so it
//!   authorises no other blob, whatever the client's URL encoding.
//! - The start time lies five minutes before `now` so a storage clock slightly behind the hub's
//!   still accepts a fresh grant; the expiry is `now + ttl`.

use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The storage service version the grants are signed for (its string-to-sign layout).
pub const SIGNED_VERSION: &str = "2023-11-03";

/// How far before `now` a grant's validity starts.
const CLOCK_SKEW: chrono::Duration = chrono::Duration::minutes(5);

/// What a grant allows on its blob (`sp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobPermission {
    /// Create and write the blob (upload).
    Write,
}

impl BlobPermission {
    fn letters(self) -> &'static str {
        match self {
            BlobPermission::Write => "w",
        }
    }
}

/// One blob's SAS query string (`sv=...&sig=...`, without the leading `?`).
///
/// `key` is the account key as decoded from base64; `blob_name` the name as stored.
pub fn blob_sas(
    account: &str,
    key: &[u8],
    container: &str,
    blob_name: &str,
    permission: BlobPermission,
    now: DateTime<Utc>,
    ttl: std::time::Duration,
) -> String {
    let start = (now - CLOCK_SKEW).to_rfc3339_opts(SecondsFormat::Secs, true);
    let ttl = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(365));
    let expiry = (now + ttl).to_rfc3339_opts(SecondsFormat::Secs, true);
    let resource = format!("/blob/{account}/{container}/{blob_name}");
    let permissions = permission.letters();
    // Fields of the service SAS string-to-sign for versions 2020-12-06 and later, in order:
    // permissions, start, expiry, resource, identifier, IP, protocol, version, resource type,
    // snapshot time, encryption scope, then the five response-header overrides.
    let string_to_sign = [
        permissions,
        &start,
        &expiry,
        &resource,
        "",
        "",
        "",
        SIGNED_VERSION,
        "b",
        "",
        "",
        "",
        "",
        "",
        "",
        "",
    ]
    .join("\n");
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(string_to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("sv", SIGNED_VERSION)
        .append_pair("st", &start)
        .append_pair("se", &expiry)
        .append_pair("sr", "b")
        .append_pair("sp", permissions)
        .append_pair("sig", &signature)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn query_value<'a>(query: &'a str, name: &str) -> Option<std::borrow::Cow<'a, str>> {
        url::form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    #[test]
    fn signs_the_decoded_name_and_carries_the_fields_it_signed() {
        let now = Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap();
        let key = b"0123456789abcdef";
        let q = blob_sas(
            "acct",
            key,
            "up",
            "dev:1/logs/été #1.bin",
            BlobPermission::Write,
            now,
            std::time::Duration::from_secs(3600),
        );
        assert_eq!(query_value(&q, "st").unwrap(), "2026-11-27T11:55:00Z");
        assert_eq!(query_value(&q, "se").unwrap(), "2026-11-27T13:00:00Z");
        assert_eq!(query_value(&q, "sr").unwrap(), "b");
        assert_eq!(query_value(&q, "sp").unwrap(), "w");
        assert_eq!(query_value(&q, "sv").unwrap(), SIGNED_VERSION);
        let expected = format!(
            "w\n2026-11-27T11:55:00Z\n2026-11-27T13:00:00Z\n/blob/acct/up/dev:1/logs/été #1.bin\n\n\n\n{SIGNED_VERSION}\nb\n\n\n\n\n\n\n"
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(expected.as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        assert_eq!(query_value(&q, "sig").unwrap(), sig);
    }

    #[test]
    fn another_name_gets_another_signature() {
        let now = Utc.with_ymd_and_hms(2026, 11, 27, 12, 0, 0).unwrap();
        let sign = |name: &str| {
            blob_sas(
                "acct",
                b"k",
                "up",
                name,
                BlobPermission::Write,
                now,
                std::time::Duration::from_secs(60),
            )
        };
        assert_ne!(sign("d/a.bin"), sign("d/b.bin"));
        assert_ne!(sign("d/é.bin"), sign("d/%C3%A9.bin"));
    }
}
