//! Device provisioning records (DPS-2 to DPS-5): the hub's provisioning settings (ID scope and
//! provisioning policies), individual enrollments and enrollment groups, and the registration
//! state of every registration id that was assigned.
//!
//! The engine keeps the records and applies the assignment rules
//! ([`Store::assign_registration`](crate::Store::assign_registration)); proving who a device
//! is (SAS signatures, certificate chains) is the server's, done before it calls the engine.
//!
//! Records live in `meta`: `dps/enr/{registrationId}`, `dps/grp/{groupId}`,
//! `dps/reg/{registrationId}`. The ID scope and the policies are part of
//! [`HubSettings`](crate::hub::HubSettings).
//!
//! # Invariants
//! - Enrollment changes are serialised by one lock and conditional on the etag when one is
//!   given; every write gives a new etag.
//! - A registration state exists only for a registration that was assigned: it is written in
//!   the same batch as the device identity (and initial twin) the assignment created.
//! - Stored symmetric-key attestations always hold both keys (generated when not supplied).
//! - Offline exports carry every record ([`archive`]); a restore writes them back verbatim.

mod archive;
mod enrollments;
mod registrations;

use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::error::{StorageError, ValidationError};
use crate::model::{SymmetricKeys, UnixMillis};

pub(crate) use enrollments::EnrollmentLock;
pub use enrollments::{
    AttestationSpec, BulkEnrollmentError, BulkMode, EnrollmentPage, EnrollmentWrite,
};
pub(crate) use registrations::registration_key;
pub use registrations::RegistrationPage;

const ENROLLMENT_PREFIX: &[u8] = b"dps/enr/";
const GROUP_PREFIX: &[u8] = b"dps/grp/";
const REGISTRATION_PREFIX: &[u8] = b"dps/reg/";
/// The enrollment groups' generation (see `Store::enrollment_groups_generation`); it shares
/// none of the prefixes above, so no scan of enrollments, groups or registrations reads it.
const GROUPS_GENERATION_KEY: &[u8] = b"dps/groups-generation";

/// Longest registration or enrollment group id, in characters.
pub const MAX_REGISTRATION_ID_LEN: usize = 128;
/// Most enrollments in one bulk operation (as DPS).
pub const MAX_BULK_ENROLLMENTS: usize = 10;

/// What a provisioning policy may do (DPS's rights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ProvisioningRights {
    pub service_config: bool,
    pub enrollment_read: bool,
    pub enrollment_write: bool,
    pub registration_status_read: bool,
    pub registration_status_write: bool,
}

impl ProvisioningRights {
    pub const ALL: ProvisioningRights = ProvisioningRights {
        service_config: true,
        enrollment_read: true,
        enrollment_write: true,
        registration_status_read: true,
        registration_status_write: true,
    };
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisioningPolicy {
    pub name: String,
    pub primary_key: String,
    pub secondary_key: String,
    pub rights: ProvisioningRights,
}

impl ProvisioningPolicy {
    /// The connection string the provisioning service SDKs read for this policy, with the
    /// service reached at `host_name`.
    pub fn connection_string(&self, host_name: &str) -> String {
        format!(
            "HostName={host_name};SharedAccessKeyName={};SharedAccessKey={}",
            self.name, self.primary_key
        )
    }
}

/// The hub's provisioning service: fixed at initialisation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisioningSettings {
    /// `0ne` and 8 upper-case hex digits.
    pub id_scope: String,
    pub policies: Vec<ProvisioningPolicy>,
}

impl ProvisioningSettings {
    /// A new ID scope and the two policies a new provisioning service is given here.
    pub fn generate() -> Self {
        let mut scope = [0u8; 4];
        rand::thread_rng().fill_bytes(&mut scope);
        let policy = |name: &str, rights| ProvisioningPolicy {
            name: name.into(),
            primary_key: crate::model::generate_key(),
            secondary_key: crate::model::generate_key(),
            rights,
        };
        ProvisioningSettings {
            id_scope: format!(
                "0ne{:02X}{:02X}{:02X}{:02X}",
                scope[0], scope[1], scope[2], scope[3]
            ),
            policies: vec![
                policy("provisioningserviceowner", ProvisioningRights::ALL),
                policy(
                    "enrollmentread",
                    ProvisioningRights {
                        enrollment_read: true,
                        registration_status_read: true,
                        ..Default::default()
                    },
                ),
            ],
        }
    }

    pub fn policy(&self, name: &str) -> Option<&ProvisioningPolicy> {
        self.policies.iter().find(|p| p.name == name)
    }
}

/// Whether a record is an individual enrollment or an enrollment group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EnrollmentKind {
    Individual,
    Group,
}

impl EnrollmentKind {
    fn prefix(self) -> &'static [u8] {
        match self {
            EnrollmentKind::Individual => ENROLLMENT_PREFIX,
            EnrollmentKind::Group => GROUP_PREFIX,
        }
    }

    fn key(self, id: &str) -> Vec<u8> {
        let mut k = self.prefix().to_vec();
        k.extend_from_slice(id.as_bytes());
        k
    }
}

/// X.509 attestation: for an individual enrollment the device's own certificates, for a group
/// the signing certificates (a root or intermediate CA) and/or the names of CAs registered
/// with the hub. Certificates are DER.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct X509Attestation {
    pub primary: Option<Vec<u8>>,
    pub secondary: Option<Vec<u8>>,
    pub ca_reference_primary: Option<String>,
    pub ca_reference_secondary: Option<String>,
}

/// How an enrollment's devices prove themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Attestation {
    SymmetricKey(SymmetricKeys),
    X509(X509Attestation),
}

/// What a second registration of the same registration id keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReprovisionPolicy {
    pub update_hub_assignment: bool,
    pub migrate_device_data: bool,
}

impl Default for ReprovisionPolicy {
    fn default() -> Self {
        ReprovisionPolicy {
            update_hub_assignment: true,
            migrate_device_data: true,
        }
    }
}

/// An individual enrollment (`id` = registration id) or an enrollment group (`id` = group id).
/// JSON parts (the initial twin's sections, the optional pass-through fields) are kept as the
/// service sent them, as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrollment {
    pub kind: EnrollmentKind,
    pub id: String,
    pub attestation: Attestation,
    /// Individual enrollments only; `None` means the registration id.
    pub device_id: Option<String>,
    pub enabled: bool,
    /// `{...}` tags of the initial twin, JSON text.
    pub initial_tags: Option<String>,
    /// `{...}` desired properties of the initial twin, JSON text.
    pub initial_desired: Option<String>,
    pub iot_edge: bool,
    pub reprovision: ReprovisionPolicy,
    /// Fields this hub keeps but does not act on (`allocationPolicy`, `iotHubs`,
    /// `iotHubHostName`, `customAllocationDefinition`, `optionalDeviceInformation`), as a JSON
    /// object's text.
    pub passthrough: String,
    pub created: UnixMillis,
    pub last_updated: UnixMillis,
    pub etag: String,
}

/// Where a registration stands (DPS's `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegistrationStatus {
    Assigned,
    Disabled,
    Failed,
}

/// What a (re)assignment did to the device's data (DPS's `substatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Substatus {
    InitialAssignment,
    DeviceDataMigrated,
    DeviceDataReset,
}

/// The registration state of one registration id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationRecord {
    pub registration_id: String,
    /// The enrollment that admitted it.
    pub enrollment_kind: EnrollmentKind,
    pub enrollment_id: String,
    pub device_id: String,
    pub assigned_hub: String,
    pub status: RegistrationStatus,
    pub substatus: Substatus,
    /// The `payload` the device sent with its last registration, JSON text.
    pub payload: Option<String>,
    /// The id of the operation that produced this state.
    pub operation_id: String,
    pub created: UnixMillis,
    pub last_updated: UnixMillis,
    pub etag: String,
}

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProvisioningError {
    #[error("enrollment {0} not found")]
    EnrollmentNotFound(String),
    #[error("enrollment group {0} not found")]
    GroupNotFound(String),
    #[error("an enrollment {0} already exists")]
    AlreadyExists(String),
    #[error("enrollment {0} is disabled")]
    EnrollmentDisabled(String),
    #[error("registration {0} not found")]
    RegistrationNotFound(String),
    #[error("precondition failed: etag {given} does not match the current etag {current}")]
    EtagMismatch { given: String, current: String },
    /// The enrollment changed (or went) between the device's attestation and its assignment.
    #[error("enrollment {0} changed while the registration was being assigned; register again")]
    EnrollmentChanged(String),
    #[error("{count} enrollments in one bulk operation; at most {max} are allowed")]
    TooManyInBulk { count: usize, max: usize },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The assignment's identity write was refused (e.g. an enrollment's device id names a
    /// module limit or an invalid id).
    #[error("the device could not be assigned: {0}")]
    Registry(#[from] crate::error::RegistryError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<crate::error::EtagMismatch> for ProvisioningError {
    fn from(e: crate::error::EtagMismatch) -> Self {
        ProvisioningError::EtagMismatch {
            given: e.given,
            current: e.current,
        }
    }
}

/// Checks a registration id or enrollment group id against DPS's rules: ASCII letters and
/// digits and `- . _ :`, at most 128 characters, ending in a letter, digit or `-`.
///
/// # Errors
/// [`ValidationError`] naming `field`.
pub fn validate_registration_id(field: &'static str, id: &str) -> Result<(), ValidationError> {
    if id.is_empty() || id.len() > MAX_REGISTRATION_ID_LEN {
        return Err(ValidationError::new(
            field,
            format!("must be 1 to {MAX_REGISTRATION_ID_LEN} characters long"),
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-._:".contains(*c)))
    {
        return Err(ValidationError::new(
            field,
            format!("contains {c:?}; only ASCII letters, digits and - . _ : are allowed"),
        ));
    }
    if id.ends_with(['.', '_', ':']) {
        return Err(ValidationError::new(
            field,
            "must end with a letter, a digit or -",
        ));
    }
    Ok(())
}
