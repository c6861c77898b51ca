//! Attestation (DPS-2): which enrollment admits a registration, and with which credentials the
//! device will connect to the hub.
//!
//! - SAS: the individual enrollment of the registration id if it has one (its keys), else the
//!   first enabled-or-not symmetric-key group whose derived primary or secondary key signed
//!   the token (groups in id order).
//! - X.509: the leaf's subject CN must be the registration id. The individual enrollment of
//!   that id must hold the leaf itself; else the first X.509 group whose signing certificates
//!   or referenced hub CAs the chain reaches.
//!
//! The device is created with the leaf's SHA-256 thumbprint (self-signed authentication), so
//! it connects with the same certificate whether or not its CA is registered with the hub.

use ferrohub_engine::hub::CertificateAuthority;
use ferrohub_engine::model::{AuthType, IdentitySpec, KeysSpec, Thumbprints};
use ferrohub_engine::provisioning::{Attestation, Enrollment};
use rustls::pki_types::CertificateDer;

use crate::auth::provisioning::{derive_device_key, names_registration};
use crate::auth::sas::SasToken;
use crate::x509;

/// How a device proves itself to the provisioning service.
#[derive(Debug, Clone)]
pub enum Credential {
    /// A SAS token (MQTT password, HTTP `Authorization`, AMQP PLAIN password).
    Sas(String),
    /// The TLS client certificate chain, leaf first.
    Certificate(Vec<CertificateDer<'static>>),
}

/// The enrollment that admitted a registration, and the identity credentials it gives.
#[derive(Debug, Clone)]
pub struct Attested {
    pub enrollment: Enrollment,
    pub credentials: IdentitySpec,
}

/// Everything attestation reads, gathered before it runs (it is pure and synchronous).
pub struct Candidates {
    pub individual: Option<Enrollment>,
    pub groups: Vec<Enrollment>,
    pub hub_cas: Vec<CertificateAuthority>,
}

/// Why attestation refused; each is DPS's 401.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error("{0}")]
    Token(String),
    #[error("the token is for {0:?}, not this registration")]
    OtherRegistration(String),
    #[error("no enrollment of this registration id or of any group accepts the token's signature")]
    NoSymmetricKeyMatch,
    #[error("the certificate's subject CN is {0:?}, not the registration id")]
    CertificateSubject(String),
    #[error("the certificate is not the one the individual enrollment holds")]
    NotEnrolledCertificate,
    #[error("the certificate chain reaches no enrollment group's signing certificate or CA")]
    NoGroupChain,
    #[error("the enrollment attests with {0}, not with this credential")]
    OtherMechanism(&'static str),
    #[error("the certificate cannot be read: {0}")]
    Certificate(String),
}

fn sas_spec(primary: String, secondary: String) -> IdentitySpec {
    IdentitySpec {
        auth_type: AuthType::Sas,
        keys: KeysSpec {
            primary_key: Some(primary),
            secondary_key: Some(secondary),
        },
        ..IdentitySpec::default()
    }
}

fn thumbprint_spec(leaf: &CertificateDer<'_>) -> IdentitySpec {
    let (_, sha256) = x509::thumbprints(leaf);
    IdentitySpec {
        auth_type: AuthType::SelfSigned,
        thumbprints: Thumbprints {
            primary: Some(sha256.clone()),
            secondary: Some(sha256),
        },
        ..IdentitySpec::default()
    }
}

/// Finds the enrollment that admits `registration_id` with `credential`.
///
/// # Errors
/// [`AttestError`] naming why nothing admits it.
pub fn attest(
    credential: &Credential,
    id_scope: &str,
    registration_id: &str,
    candidates: Candidates,
    now_secs: u64,
) -> Result<Attested, AttestError> {
    match credential {
        Credential::Sas(token) => {
            attest_sas(token, id_scope, registration_id, candidates, now_secs)
        }
        Credential::Certificate(chain) => {
            attest_certificate(chain, registration_id, candidates, now_secs)
        }
    }
}

fn attest_sas(
    token: &str,
    id_scope: &str,
    registration_id: &str,
    candidates: Candidates,
    now_secs: u64,
) -> Result<Attested, AttestError> {
    let token = SasToken::parse(token).map_err(|e| AttestError::Token(e.to_string()))?;
    if !names_registration(&token, id_scope, registration_id) {
        return Err(AttestError::OtherRegistration(token.resource));
    }
    if token.expiry <= now_secs {
        return Err(AttestError::Token("the token expired".into()));
    }
    if let Some(individual) = candidates.individual {
        let Attestation::SymmetricKey(keys) = &individual.attestation else {
            return Err(AttestError::OtherMechanism("X.509"));
        };
        token
            .verify(
                now_secs,
                [keys.primary_key.as_str(), keys.secondary_key.as_str()],
            )
            .map_err(|_| AttestError::NoSymmetricKeyMatch)?;
        let credentials = sas_spec(keys.primary_key.clone(), keys.secondary_key.clone());
        return Ok(Attested {
            enrollment: individual,
            credentials,
        });
    }
    for group in candidates.groups {
        let Attestation::SymmetricKey(keys) = &group.attestation else {
            continue;
        };
        let (Some(primary), Some(secondary)) = (
            derive_device_key(&keys.primary_key, registration_id),
            derive_device_key(&keys.secondary_key, registration_id),
        ) else {
            continue;
        };
        if token
            .verify(now_secs, [primary.as_str(), secondary.as_str()])
            .is_ok()
        {
            return Ok(Attested {
                enrollment: group,
                credentials: sas_spec(primary, secondary),
            });
        }
    }
    Err(AttestError::NoSymmetricKeyMatch)
}

fn attest_certificate(
    chain: &[CertificateDer<'static>],
    registration_id: &str,
    candidates: Candidates,
    now_secs: u64,
) -> Result<Attested, AttestError> {
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err(AttestError::Certificate("no client certificate".into()));
    };
    let cn = x509::common_name(leaf).map_err(|e| AttestError::Certificate(e.to_string()))?;
    if cn != registration_id {
        return Err(AttestError::CertificateSubject(cn));
    }
    let now = i64::try_from(now_secs).unwrap_or(i64::MAX);
    if let Some(individual) = candidates.individual {
        let Attestation::X509(x) = &individual.attestation else {
            return Err(AttestError::OtherMechanism("a symmetric key"));
        };
        let enrolled = [&x.primary, &x.secondary]
            .into_iter()
            .flatten()
            .any(|der| der.as_slice() == leaf.as_ref());
        if !enrolled {
            return Err(AttestError::NotEnrolledCertificate);
        }
        // The enrolled certificate is the leaf itself (the handshake proved its key): it
        // must still be valid now.
        valid_now(leaf, now_secs)?;
        return Ok(Attested {
            enrollment: individual,
            credentials: thumbprint_spec(leaf),
        });
    }
    for group in candidates.groups {
        let Attestation::X509(x) = &group.attestation else {
            continue;
        };
        let mut anchors: Vec<(&str, &[u8])> = [&x.primary, &x.secondary]
            .into_iter()
            .flatten()
            .map(|der| ("signing certificate", der.as_slice()))
            .collect();
        for name in [&x.ca_reference_primary, &x.ca_reference_secondary]
            .into_iter()
            .flatten()
        {
            if let Some(ca) = candidates.hub_cas.iter().find(|c| &c.name == name) {
                anchors.push((ca.name.as_str(), ca.der.as_slice()));
            }
        }
        if !anchors.is_empty() && x509::chains_to(leaf, intermediates, &anchors, now).is_ok() {
            return Ok(Attested {
                enrollment: group,
                credentials: thumbprint_spec(leaf),
            });
        }
    }
    Err(AttestError::NoGroupChain)
}

/// Whether the certificate's validity period covers now.
fn valid_now(leaf: &CertificateDer<'_>, now_secs: u64) -> Result<(), AttestError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| AttestError::Certificate(e.to_string()))?;
    let now = i64::try_from(now_secs).unwrap_or(i64::MAX);
    let validity = parsed.validity();
    if validity.not_before.timestamp() <= now && now <= validity.not_after.timestamp() {
        Ok(())
    } else {
        Err(AttestError::Certificate(
            "the certificate is not valid at this time".into(),
        ))
    }
}
