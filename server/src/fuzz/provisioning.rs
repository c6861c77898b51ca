//! DPS enrollment service bodies: individual enrollments and enrollment groups as the service
//! SDKs `PUT` them (`/enrollments/{id}`, `/enrollmentGroups/{id}`), and the bulk operation's
//! body (`POST /enrollments`, `/enrollmentGroups`), read by the REST layer's own functions
//! (`rest/provisioning/enrollment_json.rs`, `rest/provisioning/service.rs`).
//!
//! # Invariants
//! - A refused body has a message (a bulk body: DPS's 400 with code 400004), never a panic.
//! - An accepted body is for its path's kind and id, and names no other id; a group names no
//!   device id; no key or device id is an empty string; the initial twin's sections are JSON
//!   objects without the service's `$` members; what passes through is DPS's five fields, none
//!   of them `null`.
//! - The stored enrollment decides nothing but certificate slots sent as `info` only, which
//!   keep its certificates.
//! - What the engine would store (`validate` passes), answered as a write answers it
//!   (`enrollment_json` with keys) and sent back as it came, reads back to the same write,
//!   except for what the answer fills in: both keys, both initial twin sections once either is
//!   set, `allocationPolicy` and `iotHubs`.
//! - A bulk item reads as the same body alone would; a delete item is never refused.

use ferrohub_engine::model::{KeysSpec, SymmetricKeys};
use ferrohub_engine::provisioning::{
    Attestation, AttestationSpec, BulkMode, Enrollment, EnrollmentKind, EnrollmentWrite,
    ReprovisionPolicy, X509Attestation,
};
use ferrohub_engine::UnixMillis;
use serde_json::{json, Map, Value};
use warp::http::StatusCode;

use super::HOST;
use crate::rest::error::ApiError;
use crate::rest::provisioning::enrollment_json::{enrollment_json as answer, parse_enrollment};
use crate::rest::provisioning::service::{bulk_item, bulk_item_id, bulk_request};

/// The id of the path when the body names none.
const PATH_ID: &str = "fuzz-enrollment-1";

/// Another path's id: a body naming an id is accepted only for its own.
const OTHER_ID: &str = "fuzz-enrollment-2";

/// The keys stored for a symmetric-key write that sent none (the engine generates random
/// ones; fixed here, so a run is repeatable).
const STORED_PRIMARY: &str = "cHJpbWFyeSBrZXkgb2YgYSBmdXp6ZWQgZW5yb2xsbWVudA==";
const STORED_SECONDARY: &str = "c2Vjb25kYXJ5IGtleSBvZiBhIGZ1enplZCBlbnJvbGxtZW50";

/// The fields DPS keeps and this hub does not act on.
const PASSTHROUGH: [&str; 5] = [
    "allocationPolicy",
    "iotHubs",
    "iotHubHostName",
    "customAllocationDefinition",
    "optionalDeviceInformation",
];

const KINDS: [EnrollmentKind; 2] = [EnrollmentKind::Individual, EnrollmentKind::Group];

fn id_field(kind: EnrollmentKind) -> &'static str {
    match kind {
        EnrollmentKind::Individual => "registrationId",
        EnrollmentKind::Group => "enrollmentGroupId",
    }
}

/// An enrollment body as the REST layer reads it (`json_body`), under both kinds: `PUT` for
/// its own id (the one it names, else a fixed one) with and without a stored enrollment,
/// `PUT` for another id, and as a bulk body.
pub fn enrollment_json(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for kind in KINDS {
        let named = body.get(id_field(kind));
        let id = named.and_then(Value::as_str).unwrap_or(PATH_ID);
        put(&body, kind, id);
        if parse_enrollment(&body, kind, OTHER_ID, None).is_ok() {
            assert!(
                matches!(named, None | Some(Value::Null))
                    || named.and_then(Value::as_str) == Some(OTHER_ID),
                "accepted for {OTHER_ID:?} a body naming {named:?}"
            );
        }
        bulk(&body, kind);
    }
}

fn put(body: &Value, kind: EnrollmentKind, id: &str) {
    let stored = stored_x509(kind);
    match (
        parse_enrollment(body, kind, id, None),
        parse_enrollment(body, kind, id, Some(&stored)),
    ) {
        (Ok(fresh), Ok(over)) => {
            check_write(&fresh, kind, id);
            check_write(&over, kind, id);
            check_kept(&fresh, &over, &stored);
            round_trip(&fresh);
            round_trip(&over);
        }
        (Err(fresh), Err(over)) => {
            assert!(!fresh.0.is_empty(), "a refusal without a message");
            assert_eq!(fresh.0, over.0, "the stored enrollment changed the refusal");
        }
        (fresh, over) => panic!(
            "the stored enrollment decided whether {body} is accepted: {fresh:?} without it, \
             {over:?} with it"
        ),
    }
}

/// A stored X.509 enrollment whose certificates an `info`-only slot keeps.
fn stored_x509(kind: EnrollmentKind) -> Enrollment {
    Enrollment {
        kind,
        id: PATH_ID.into(),
        attestation: Attestation::X509(X509Attestation {
            primary: Some(b"stored primary certificate".to_vec()),
            secondary: Some(b"stored secondary certificate".to_vec()),
            ca_reference_primary: None,
            ca_reference_secondary: None,
        }),
        device_id: None,
        enabled: true,
        initial_tags: None,
        initial_desired: None,
        iot_edge: false,
        reprovision: ReprovisionPolicy::default(),
        passthrough: "{}".into(),
        created: UnixMillis(1),
        last_updated: UnixMillis(2),
        etag: "MQ==".into(),
    }
}

fn check_write(write: &EnrollmentWrite, kind: EnrollmentKind, id: &str) {
    assert_eq!((write.kind, write.id.as_str()), (kind, id), "{write:?}");
    match kind {
        EnrollmentKind::Group => assert_eq!(write.device_id, None, "a group with a device id"),
        EnrollmentKind::Individual => assert!(
            write.device_id.as_deref().is_none_or(|d| !d.is_empty()),
            "an empty device id"
        ),
    }
    if let AttestationSpec::SymmetricKey(keys) = &write.attestation {
        for key in [&keys.primary_key, &keys.secondary_key] {
            assert!(key.as_deref().is_none_or(|k| !k.is_empty()), "an empty key");
        }
    }
    for section in [&write.initial_tags, &write.initial_desired]
        .into_iter()
        .flatten()
    {
        let Ok(Value::Object(members)) = serde_json::from_str::<Value>(section) else {
            panic!("an initial twin section {section:?} that is not a JSON object");
        };
        assert!(
            !members.keys().any(|k| k.starts_with('$')),
            "a service member kept in {section}"
        );
    }
    let Ok(Value::Object(passed)) = serde_json::from_str::<Value>(&write.passthrough) else {
        panic!(
            "pass-through fields {:?} that are not a JSON object",
            write.passthrough
        );
    };
    for (field, value) in &passed {
        assert!(
            PASSTHROUGH.contains(&field.as_str()) && !value.is_null(),
            "{field}: {value} passed through"
        );
    }
}

/// `over` (read with `stored` as the previous enrollment) differs from `fresh` (read without
/// one) only where a certificate slot came as `info` alone: there it has the stored one.
fn check_kept(fresh: &EnrollmentWrite, over: &EnrollmentWrite, stored: &Enrollment) {
    let (AttestationSpec::X509(a), AttestationSpec::X509(b), Attestation::X509(s)) =
        (&fresh.attestation, &over.attestation, &stored.attestation)
    else {
        assert_eq!(fresh, over, "the stored enrollment changed a write");
        return;
    };
    for (without, with, kept) in [
        (&a.primary, &b.primary, &s.primary),
        (&a.secondary, &b.secondary, &s.secondary),
    ] {
        assert!(
            without == with || (without.is_none() && with == kept),
            "a certificate slot read as {without:?} without the stored enrollment, {with:?} with it"
        );
    }
    assert_eq!(
        (&a.ca_reference_primary, &a.ca_reference_secondary),
        (&b.ca_reference_primary, &b.ca_reference_secondary)
    );
    let same_attestation = EnrollmentWrite {
        attestation: fresh.attestation.clone(),
        ..over.clone()
    };
    assert_eq!(
        &same_attestation, fresh,
        "the stored enrollment changed a write"
    );
}

/// The record the engine stores for `write` (`EnrollmentWrite::into_record`, with fixed keys
/// where it would generate them).
fn stored_from(write: &EnrollmentWrite) -> Enrollment {
    let attestation = match &write.attestation {
        AttestationSpec::SymmetricKey(keys) => Attestation::SymmetricKey(SymmetricKeys {
            primary_key: keys
                .primary_key
                .clone()
                .unwrap_or_else(|| STORED_PRIMARY.into()),
            secondary_key: keys
                .secondary_key
                .clone()
                .unwrap_or_else(|| STORED_SECONDARY.into()),
        }),
        AttestationSpec::X509(x) => Attestation::X509(x.clone()),
    };
    Enrollment {
        kind: write.kind,
        id: write.id.clone(),
        attestation,
        device_id: write.device_id.clone(),
        enabled: write.enabled,
        initial_tags: write.initial_tags.clone(),
        initial_desired: write.initial_desired.clone(),
        iot_edge: write.iot_edge,
        reprovision: write.reprovision,
        passthrough: write.passthrough.clone(),
        created: UnixMillis(1_700_000_000_000),
        last_updated: UnixMillis(1_700_000_000_123),
        etag: "Mg==".into(),
    }
}

/// `write` as the answer to it reads back: the stored keys, both initial twin sections once
/// either is set, and the default allocation policy and hubs.
fn filled_in(write: &EnrollmentWrite, stored: &Enrollment) -> EnrollmentWrite {
    let mut want = write.clone();
    if let Attestation::SymmetricKey(keys) = &stored.attestation {
        want.attestation = AttestationSpec::SymmetricKey(KeysSpec {
            primary_key: Some(keys.primary_key.clone()),
            secondary_key: Some(keys.secondary_key.clone()),
        });
    }
    if want.initial_tags.is_some() || want.initial_desired.is_some() {
        want.initial_tags = Some(want.initial_tags.take().unwrap_or_else(|| "{}".into()));
        want.initial_desired = Some(want.initial_desired.take().unwrap_or_else(|| "{}".into()));
    }
    let mut passed: Map<String, Value> =
        serde_json::from_str(&want.passthrough).unwrap_or_default();
    passed
        .entry("allocationPolicy")
        .or_insert_with(|| json!("hashed"));
    passed.entry("iotHubs").or_insert_with(|| json!([HOST]));
    want.passthrough = Value::Object(passed).to_string();
    want
}

/// An accepted write the engine would store, answered and sent back, reads back the same.
fn round_trip(write: &EnrollmentWrite) {
    if write.validate().is_err() {
        return;
    }
    let stored = stored_from(write);
    let text = answer(&stored, true, HOST, None).to_string();
    let sent: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the answer {text} does not parse: {e}"));
    let back = parse_enrollment(&sent, write.kind, &write.id, Some(&stored))
        .unwrap_or_else(|e| panic!("the answer {text} is refused when sent back: {e}"));
    let want = filled_in(write, &stored);
    let json_of = |t: &Option<String>| {
        t.as_deref().map(|t| {
            serde_json::from_str::<Value>(t).unwrap_or_else(|e| panic!("{t} read back: {e}"))
        })
    };
    assert_eq!(
        json_of(&back.initial_tags),
        json_of(&want.initial_tags),
        "initial tags, answered as {text}"
    );
    assert_eq!(
        json_of(&back.initial_desired),
        json_of(&want.initial_desired),
        "initial desired properties, answered as {text}"
    );
    assert_eq!(
        json_of(&Some(back.passthrough.clone())),
        json_of(&Some(want.passthrough.clone())),
        "pass-through fields, answered as {text}"
    );
    let rest = |w: &EnrollmentWrite| EnrollmentWrite {
        initial_tags: None,
        initial_desired: None,
        passthrough: String::new(),
        ..w.clone()
    };
    assert_eq!(rest(&back), rest(&want), "answered as {text}");
}

/// A bulk body as `bulk` reads it before the store (no enrollment stored yet).
fn bulk(body: &Value, kind: EnrollmentKind) {
    let (mode, items) = match bulk_request(body, kind) {
        Ok(asked) => asked,
        Err(e) => return check_refusal(&e),
    };
    for item in items {
        let id = match bulk_item_id(item, kind) {
            Ok(id) => id,
            Err(e) => return check_refusal(&e),
        };
        match bulk_item(mode, kind, item, id, None) {
            Ok((write, etag)) => {
                assert_eq!((write.kind, write.id.as_str()), (kind, id), "{write:?}");
                match parse_enrollment(item, kind, id, None) {
                    Ok(alone) => assert_eq!(write, alone, "a bulk item read otherwise than alone"),
                    Err(e) => assert_eq!(
                        mode,
                        BulkMode::Delete,
                        "a bulk item accepted that alone is refused: {e}"
                    ),
                }
                if let Some(etag) = etag {
                    assert!(
                        !etag.starts_with('"') && !etag.ends_with('"'),
                        "etag {etag:?} kept its quotes"
                    );
                }
            }
            Err(e) => {
                assert_ne!(mode, BulkMode::Delete, "a delete item refused: {e:?}");
                check_refusal(&e);
            }
        }
    }
}

/// A bulk refusal is DPS's 400 for a malformed body, with a message.
fn check_refusal(e: &ApiError) {
    match e {
        ApiError::Provisioning {
            status,
            code,
            message,
            ..
        } => {
            assert_eq!(
                (*status, *code),
                (StatusCode::BAD_REQUEST, 400_004),
                "{message}"
            );
            assert!(!message.is_empty(), "a refusal without a message");
        }
        other => panic!("a bulk body refused as {other:?}"),
    }
}
