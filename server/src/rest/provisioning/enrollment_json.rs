//! Enrollments as DPS's service API writes them (`IndividualEnrollment`, `EnrollmentGroup`,
//! api-version 2021-10-01) and reads them back.
//!
//! - Symmetric keys are answered only by a write and by `attestationmechanism`, as DPS does:
//!   reads and queries leave them out.
//! - X.509 certificates are answered as their `info` (subject, issuer, thumbprints, validity,
//!   serial): a write that carries an `info` and no `certificate` keeps the stored certificate,
//!   so a read object can be written back.
//! - TPM attestation is refused (not supported here).

use ferrohub_engine::model::KeysSpec;
use ferrohub_engine::provisioning::{
    Attestation, AttestationSpec, Enrollment, EnrollmentKind, EnrollmentWrite, ReprovisionPolicy,
    X509Attestation,
};
use serde_json::{json, Map, Value};

use crate::clock::iso7;
use crate::x509;

/// Why a body was refused: a 400 with this message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub String);

fn shape(msg: impl Into<String>) -> ShapeError {
    ShapeError(msg.into())
}

fn string_at<'a>(v: &'a Value, field: &str) -> Result<Option<&'a str>, ShapeError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(shape(format!("{field} must be a string"))),
    }
}

fn bool_at(v: &Value, field: &str, default: bool) -> Result<bool, ShapeError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(shape(format!("{field} must be true or false"))),
    }
}

/// A twin collection without the service's `$` members, as JSON text.
fn collection(v: Option<&Value>, field: &str) -> Result<Option<String>, ShapeError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => {
            let kept: Map<String, Value> = m
                .iter()
                // `$metadata` and `$version` are the service's; a member named `version` or
                // `count` is a user's tag or property like any other.
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Ok(Some(Value::Object(kept).to_string()))
        }
        Some(_) => Err(shape(format!("{field} must be an object"))),
    }
}

/// One `X509Certificates` slot: the certificate's DER, the stored one when only `info` came,
/// or none.
fn certificate_slot(
    v: Option<&Value>,
    field: &str,
    stored: Option<&Vec<u8>>,
) -> Result<Option<Vec<u8>>, ShapeError> {
    let Some(slot) = v.filter(|s| !s.is_null()) else {
        return Ok(None);
    };
    match string_at(slot, "certificate")? {
        Some(text) => x509::parse_certificate_text(text)
            .map(Some)
            .map_err(|e| shape(format!("{field}.certificate: {e}"))),
        None if slot.get("info").is_some() => Ok(stored.cloned()),
        None => Err(shape(format!("{field} has no certificate"))),
    }
}

fn x509_spec(
    x: &Value,
    kind: EnrollmentKind,
    previous: Option<&X509Attestation>,
) -> Result<X509Attestation, ShapeError> {
    let certs_field = match kind {
        EnrollmentKind::Individual => "clientCertificates",
        EnrollmentKind::Group => "signingCertificates",
    };
    let certs = x.get(certs_field).filter(|c| !c.is_null());
    let field = |slot: &str| format!("attestation.x509.{certs_field}.{slot}");
    let refs = x.get("caReferences").filter(|c| !c.is_null());
    Ok(X509Attestation {
        primary: certificate_slot(
            certs.and_then(|c| c.get("primary")),
            &field("primary"),
            previous.and_then(|p| p.primary.as_ref()),
        )?,
        secondary: certificate_slot(
            certs.and_then(|c| c.get("secondary")),
            &field("secondary"),
            previous.and_then(|p| p.secondary.as_ref()),
        )?,
        ca_reference_primary: refs
            .map(|r| string_at(r, "primary"))
            .transpose()?
            .flatten()
            .map(str::to_string),
        ca_reference_secondary: refs
            .map(|r| string_at(r, "secondary"))
            .transpose()?
            .flatten()
            .map(str::to_string),
    })
}

/// Reads an enrollment body for `id` (from the path); `previous` is the stored enrollment, if
/// any, whose certificates an `info`-only slot keeps.
///
/// # Errors
/// [`ShapeError`] naming the field.
pub fn parse_enrollment(
    body: &Value,
    kind: EnrollmentKind,
    id: &str,
    previous: Option<&Enrollment>,
) -> Result<EnrollmentWrite, ShapeError> {
    if !body.is_object() {
        return Err(shape("the body must be a JSON object"));
    }
    let id_field = match kind {
        EnrollmentKind::Individual => "registrationId",
        EnrollmentKind::Group => "enrollmentGroupId",
    };
    if let Some(given) = string_at(body, id_field)? {
        if given != id {
            return Err(shape(format!(
                "{id_field} {given:?} in the body is not {id:?} of the path"
            )));
        }
    }
    let attestation = body
        .get("attestation")
        .filter(|a| a.is_object())
        .ok_or_else(|| shape("attestation is required"))?;
    let kind_name = string_at(attestation, "type")?.unwrap_or_default();
    let attestation = match kind_name {
        "symmetricKey" => {
            let keys = attestation
                .get("symmetricKey")
                .cloned()
                .unwrap_or(Value::Null);
            let key = |f: &str| -> Result<Option<String>, ShapeError> {
                Ok(string_at(&keys, f)?
                    .filter(|k| !k.is_empty())
                    .map(str::to_string))
            };
            AttestationSpec::SymmetricKey(KeysSpec {
                primary_key: key("primaryKey")?,
                secondary_key: key("secondaryKey")?,
            })
        }
        "x509" => {
            let x = attestation
                .get("x509")
                .filter(|x| x.is_object())
                .ok_or_else(|| shape("attestation.x509 is required for type x509"))?;
            let stored = previous.and_then(|p| match &p.attestation {
                Attestation::X509(x) => Some(x),
                Attestation::SymmetricKey(_) => None,
            });
            AttestationSpec::X509(x509_spec(x, kind, stored)?)
        }
        "tpm" => {
            return Err(shape(
                "TPM attestation is not supported by this provisioning service",
            ))
        }
        other => {
            return Err(shape(format!(
                "attestation.type {other:?} is not symmetricKey or x509"
            )))
        }
    };
    let device_id = match kind {
        EnrollmentKind::Individual => string_at(body, "deviceId")?
            .filter(|d| !d.is_empty())
            .map(str::to_string),
        EnrollmentKind::Group => None,
    };
    let enabled = match string_at(body, "provisioningStatus")? {
        None | Some("enabled") => true,
        Some("disabled") => false,
        Some(other) => {
            return Err(shape(format!(
                "provisioningStatus {other:?} is not enabled or disabled"
            )))
        }
    };
    let twin = body.get("initialTwin").filter(|t| !t.is_null());
    if twin.is_some_and(|t| !t.is_object()) {
        return Err(shape("initialTwin must be an object"));
    }
    let initial_tags = collection(twin.and_then(|t| t.get("tags")), "initialTwin.tags")?;
    let initial_desired = collection(
        twin.and_then(|t| t.get("properties"))
            .and_then(|p| p.get("desired")),
        "initialTwin.properties.desired",
    )?;
    let iot_edge = match body.get("capabilities").filter(|c| !c.is_null()) {
        Some(c) => bool_at(c, "iotEdge", false)?,
        None => false,
    };
    let reprovision = match body.get("reprovisionPolicy").filter(|r| !r.is_null()) {
        Some(r) => ReprovisionPolicy {
            update_hub_assignment: bool_at(r, "updateHubAssignment", true)?,
            migrate_device_data: bool_at(r, "migrateDeviceData", true)?,
        },
        None => ReprovisionPolicy::default(),
    };
    let mut passthrough = Map::new();
    for field in [
        "allocationPolicy",
        "iotHubs",
        "iotHubHostName",
        "customAllocationDefinition",
        "optionalDeviceInformation",
    ] {
        if let Some(v) = body.get(field).filter(|v| !v.is_null()) {
            passthrough.insert(field.into(), v.clone());
        }
    }
    Ok(EnrollmentWrite {
        kind,
        id: id.to_string(),
        attestation,
        device_id,
        enabled,
        initial_tags,
        initial_desired,
        iot_edge,
        reprovision,
        passthrough: Value::Object(passthrough).to_string(),
    })
}

fn certificate_info(der: &[u8]) -> Value {
    let (sha1, sha256) = x509::thumbprints(&rustls::pki_types::CertificateDer::from(der.to_vec()));
    match x509_parser::parse_x509_certificate(der) {
        Ok((_, c)) => {
            let time = |t: x509_parser::time::ASN1Time| {
                iso7(ferrohub_engine::UnixMillis(t.timestamp() * 1000))
            };
            json!({
                "subjectName": c.subject().to_string(),
                "sha1Thumbprint": sha1,
                "sha256Thumbprint": sha256,
                "issuerName": c.issuer().to_string(),
                "notBeforeUtc": time(c.validity().not_before),
                "notAfterUtc": time(c.validity().not_after),
                "serialNumber": c.raw_serial_as_string().replace(':', "").to_ascii_uppercase(),
                "version": c.version().0 + 1,
            })
        }
        Err(_) => json!({"sha1Thumbprint": sha1, "sha256Thumbprint": sha256}),
    }
}

/// The `attestation` member; `with_keys` shows symmetric keys (writes, `attestationmechanism`).
pub fn attestation_json(e: &Enrollment, with_keys: bool) -> Value {
    match &e.attestation {
        Attestation::SymmetricKey(k) => {
            let keys = if with_keys {
                json!({"primaryKey": k.primary_key, "secondaryKey": k.secondary_key})
            } else {
                json!({})
            };
            json!({"type": "symmetricKey", "symmetricKey": keys})
        }
        Attestation::X509(x) => {
            let slot =
                |der: &Option<Vec<u8>>| der.as_ref().map(|d| json!({"info": certificate_info(d)}));
            let mut certs = Map::new();
            if let Some(p) = slot(&x.primary) {
                certs.insert("primary".into(), p);
            }
            if let Some(s) = slot(&x.secondary) {
                certs.insert("secondary".into(), s);
            }
            let mut body = Map::new();
            if !certs.is_empty() {
                let field = match e.kind {
                    EnrollmentKind::Individual => "clientCertificates",
                    EnrollmentKind::Group => "signingCertificates",
                };
                body.insert(field.into(), Value::Object(certs));
            }
            if x.ca_reference_primary.is_some() || x.ca_reference_secondary.is_some() {
                body.insert(
                    "caReferences".into(),
                    json!({"primary": x.ca_reference_primary, "secondary": x.ca_reference_secondary}),
                );
            }
            json!({"type": "x509", "x509": body})
        }
    }
}

/// An enrollment as the service API answers it; `registration_state` for an individual one
/// that was assigned.
pub fn enrollment_json(
    e: &Enrollment,
    with_keys: bool,
    host_name: &str,
    registration_state: Option<Value>,
) -> Value {
    let mut v = Map::new();
    match e.kind {
        EnrollmentKind::Individual => {
            v.insert("registrationId".into(), json!(e.id));
            if let Some(d) = &e.device_id {
                v.insert("deviceId".into(), json!(d));
            }
            if let Some(state) = registration_state {
                v.insert("registrationState".into(), state);
            }
        }
        EnrollmentKind::Group => {
            v.insert("enrollmentGroupId".into(), json!(e.id));
        }
    }
    v.insert("attestation".into(), attestation_json(e, with_keys));
    v.insert("capabilities".into(), json!({"iotEdge": e.iot_edge}));
    if e.initial_tags.is_some() || e.initial_desired.is_some() {
        let parse = |t: &Option<String>| {
            t.as_deref()
                .and_then(|t| serde_json::from_str::<Value>(t).ok())
                .unwrap_or_else(|| json!({}))
        };
        v.insert(
            "initialTwin".into(),
            json!({"tags": parse(&e.initial_tags), "properties": {"desired": parse(&e.initial_desired)}}),
        );
    }
    v.insert("etag".into(), json!(e.etag));
    v.insert(
        "provisioningStatus".into(),
        json!(if e.enabled { "enabled" } else { "disabled" }),
    );
    v.insert(
        "reprovisionPolicy".into(),
        json!({
            "updateHubAssignment": e.reprovision.update_hub_assignment,
            "migrateDeviceData": e.reprovision.migrate_device_data,
        }),
    );
    v.insert("createdDateTimeUtc".into(), json!(iso7(e.created)));
    v.insert("lastUpdatedDateTimeUtc".into(), json!(iso7(e.last_updated)));
    let passthrough: Map<String, Value> = serde_json::from_str(&e.passthrough).unwrap_or_default();
    v.insert("allocationPolicy".into(), json!("hashed"));
    v.insert("iotHubs".into(), json!([host_name]));
    for (k, val) in passthrough {
        v.insert(k, val);
    }
    Value::Object(v)
}
