//! Individual enrollments and enrollment groups: create-or-replace under an etag, read, delete,
//! list in id order with a continuation, and bulk operations in one commit.

use parking_lot::RwLock;

use ferrohub_migrations::cf;

use super::{
    validate_registration_id, Attestation, Enrollment, EnrollmentKind, ProvisioningError,
    ReprovisionPolicy, X509Attestation, GROUPS_GENERATION_KEY, MAX_BULK_ENROLLMENTS,
};
use crate::error::{StorageError, ValidationError};
use crate::keys;
use crate::model::{
    generate_key, next_etag, validate_id, validate_key, IfMatch, KeysSpec, SymmetricKeys,
    UnixMillis,
};
use crate::raw::Batch;
use crate::Store;

/// Enrollment changes hold it exclusively; assignments, which only read an enrollment, share
/// it, so registrations of different devices proceed together (each also holds its
/// registration id's and its device's stripe).
#[derive(Default)]
pub(crate) struct EnrollmentLock(pub(crate) RwLock<()>);

/// How the caller asks an enrollment to attest: symmetric keys may be left out (generated).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AttestationSpec {
    SymmetricKey(KeysSpec),
    X509(X509Attestation),
}

/// What a caller may set on an enrollment; the hub sets times and the etag.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EnrollmentWrite {
    pub kind: EnrollmentKind,
    pub id: String,
    pub attestation: AttestationSpec,
    pub device_id: Option<String>,
    pub enabled: bool,
    pub initial_tags: Option<String>,
    pub initial_desired: Option<String>,
    pub iot_edge: bool,
    pub reprovision: ReprovisionPolicy,
    pub passthrough: String,
}

/// One page of a listing, and the id to continue after when more remain.
#[derive(Debug, Clone)]
pub struct EnrollmentPage {
    pub items: Vec<Enrollment>,
    pub continuation: Option<String>,
}

/// A bulk operation's mode (DPS's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BulkMode {
    Create,
    Update,
    UpdateIfMatchEtag,
    Delete,
}

/// Why one item of a bulk operation was not applied.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct BulkEnrollmentError {
    pub id: String,
    pub error: ProvisioningError,
}

fn not_found(kind: EnrollmentKind, id: &str) -> ProvisioningError {
    match kind {
        EnrollmentKind::Individual => ProvisioningError::EnrollmentNotFound(id.to_string()),
        EnrollmentKind::Group => ProvisioningError::GroupNotFound(id.to_string()),
    }
}

impl EnrollmentWrite {
    /// Checks every field the caller set.
    ///
    /// # Errors
    /// The first [`ValidationError`] found.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let field = match self.kind {
            EnrollmentKind::Individual => "registrationId",
            EnrollmentKind::Group => "enrollmentGroupId",
        };
        validate_registration_id(field, &self.id)?;
        if let Some(d) = &self.device_id {
            if self.kind == EnrollmentKind::Group {
                return Err(ValidationError::new(
                    "deviceId",
                    "an enrollment group names no device id; each device takes its registration id",
                ));
            }
            validate_id("deviceId", d)?;
        }
        match &self.attestation {
            AttestationSpec::SymmetricKey(keys) => {
                for (f, k) in [
                    ("primaryKey", &keys.primary_key),
                    ("secondaryKey", &keys.secondary_key),
                ] {
                    if let Some(k) = k {
                        validate_key(f, k)?;
                    }
                }
            }
            AttestationSpec::X509(x) => {
                let has_cert = x.primary.is_some() || x.secondary.is_some();
                let has_ref =
                    x.ca_reference_primary.is_some() || x.ca_reference_secondary.is_some();
                match self.kind {
                    EnrollmentKind::Individual if !has_cert => return Err(ValidationError::new(
                        "attestation.x509.clientCertificates",
                        "an individual X.509 enrollment needs a primary or secondary certificate",
                    )),
                    EnrollmentKind::Individual if has_ref => {
                        return Err(ValidationError::new(
                            "attestation.x509.caReferences",
                            "an individual enrollment takes client certificates, not CA references",
                        ))
                    }
                    EnrollmentKind::Group if !has_cert && !has_ref => {
                        return Err(ValidationError::new(
                            "attestation.x509",
                            "an X.509 enrollment group needs signing certificates or CA references",
                        ))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The record to store: keys generated where missing, or kept from `previous` when the
    /// caller sent none.
    fn into_record(self, previous: Option<&Enrollment>, now: UnixMillis) -> Enrollment {
        let attestation = match self.attestation {
            AttestationSpec::SymmetricKey(spec) => {
                let kept = previous.and_then(|p| match &p.attestation {
                    Attestation::SymmetricKey(k) => Some(k),
                    Attestation::X509(_) => None,
                });
                let pick = |given: Option<String>, old: Option<&String>| {
                    given.or_else(|| old.cloned()).unwrap_or_else(generate_key)
                };
                Attestation::SymmetricKey(SymmetricKeys {
                    primary_key: pick(spec.primary_key, kept.map(|k| &k.primary_key)),
                    secondary_key: pick(spec.secondary_key, kept.map(|k| &k.secondary_key)),
                })
            }
            AttestationSpec::X509(x) => Attestation::X509(x),
        };
        Enrollment {
            kind: self.kind,
            id: self.id,
            attestation,
            device_id: self.device_id,
            enabled: self.enabled,
            initial_tags: self.initial_tags,
            initial_desired: self.initial_desired,
            iot_edge: self.iot_edge,
            reprovision: self.reprovision,
            passthrough: self.passthrough,
            created: previous.map_or(now, |p| p.created),
            last_updated: now,
            etag: next_etag(previous.map(|p| p.etag.as_str())),
        }
    }
}

/// Marks a batch that changes an enrollment group: the groups' generation gets a new value,
/// so whoever caches the groups (attestation) knows to read them again. A random value needs
/// no read of the old one; on a replica it arrives in the same applied batch as the change.
pub(super) fn stage_group_change(batch: &mut Batch, kind: EnrollmentKind) {
    if kind == EnrollmentKind::Group {
        batch.put_record(
            cf::META,
            GROUPS_GENERATION_KEY.to_vec(),
            &rand::random::<u64>(),
        );
    }
}

impl Store {
    /// The enrollment groups' generation: it changes with every committed change to any group
    /// (0 while none was ever written by this version). Equal values mean equal groups.
    ///
    /// # Errors
    /// Storage errors.
    pub fn enrollment_groups_generation(&self) -> Result<u64, StorageError> {
        Ok(self
            .raw
            .get_record::<u64>(cf::META, GROUPS_GENERATION_KEY)?
            .unwrap_or(0))
    }

    /// # Errors
    /// `EnrollmentNotFound` / `GroupNotFound` or storage errors.
    pub fn get_enrollment(
        &self,
        kind: EnrollmentKind,
        id: &str,
    ) -> Result<Enrollment, ProvisioningError> {
        self.raw
            .get_record(cf::META, &kind.key(id))?
            .ok_or_else(|| not_found(kind, id))
    }

    /// Creates an enrollment, or replaces one when `if_match` is given and holds (`*`: any
    /// version, or none).
    ///
    /// # Errors
    /// Validation, `AlreadyExists` (no `if_match`), `EnrollmentNotFound` / `GroupNotFound`,
    /// `EtagMismatch`, storage.
    pub fn put_enrollment(
        &self,
        write: EnrollmentWrite,
        if_match: Option<&IfMatch>,
        now: UnixMillis,
    ) -> Result<Enrollment, ProvisioningError> {
        write.validate()?;
        let _guard = self.enrollment_lock.0.write();
        let mut batch = Batch::default();
        let stored = self.stage_put_enrollment(&mut batch, write, if_match, now)?;
        self.raw.commit(batch)?;
        Ok(stored)
    }

    fn stage_put_enrollment(
        &self,
        batch: &mut Batch,
        write: EnrollmentWrite,
        if_match: Option<&IfMatch>,
        now: UnixMillis,
    ) -> Result<Enrollment, ProvisioningError> {
        let kind = write.kind;
        let current: Option<Enrollment> = self.raw.get_record(cf::META, &kind.key(&write.id))?;
        // As DPS: replacing needs `If-Match` (`*` for any version); an etag names a version
        // that must exist.
        match (&current, if_match) {
            (Some(_), None) => return Err(ProvisioningError::AlreadyExists(write.id)),
            (None, Some(IfMatch::Etag(_))) => return Err(not_found(kind, &write.id)),
            (Some(c), Some(m)) => m.check(&c.etag)?,
            _ => {}
        }
        let record = write.into_record(current.as_ref(), now);
        batch.put_record(cf::META, kind.key(&record.id), &record);
        stage_group_change(batch, kind);
        Ok(record)
    }

    /// Deletes an enrollment (its registrations and devices stay, as in DPS).
    ///
    /// # Errors
    /// `EnrollmentNotFound` / `GroupNotFound`, `EtagMismatch`, storage.
    pub fn delete_enrollment(
        &self,
        kind: EnrollmentKind,
        id: &str,
        if_match: &IfMatch,
    ) -> Result<(), ProvisioningError> {
        let _guard = self.enrollment_lock.0.write();
        let current = self.get_enrollment(kind, id)?;
        if_match.check(&current.etag)?;
        let mut batch = Batch::default();
        batch.delete(cf::META, kind.key(id));
        stage_group_change(&mut batch, kind);
        self.raw.commit(batch)?;
        Ok(())
    }

    /// Up to `limit` enrollments of one kind in id order, after `after`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_enrollments(
        &self,
        kind: EnrollmentKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<EnrollmentPage, StorageError> {
        let prefix = kind.prefix();
        let start = match after {
            // The first key after `after`: the same key with a zero byte appended.
            Some(a) => {
                let mut k = kind.key(a);
                k.push(0);
                k
            }
            None => prefix.to_vec(),
        };
        let mut items = Vec::new();
        let mut more = false;
        self.raw.scan_records::<Enrollment>(
            cf::META,
            &start,
            keys::prefix_end(prefix),
            |_, e| {
                if items.len() == limit {
                    more = true;
                    return false;
                }
                items.push(e);
                true
            },
        )?;
        let continuation = more.then(|| items.last().map(|e: &Enrollment| e.id.clone()));
        Ok(EnrollmentPage {
            items,
            continuation: continuation.flatten(),
        })
    }

    /// Applies up to [`MAX_BULK_ENROLLMENTS`] enrollment changes in one commit; items that fail
    /// are left out and reported, the others applied.
    ///
    /// # Errors
    /// `TooManyInBulk` or storage errors (nothing applied).
    pub fn bulk_enrollments(
        &self,
        items: Vec<(BulkMode, EnrollmentWrite, Option<String>)>,
        now: UnixMillis,
    ) -> Result<Vec<BulkEnrollmentError>, ProvisioningError> {
        if items.len() > MAX_BULK_ENROLLMENTS {
            return Err(ProvisioningError::TooManyInBulk {
                count: items.len(),
                max: MAX_BULK_ENROLLMENTS,
            });
        }
        let _guard = self.enrollment_lock.0.write();
        let mut batch = Batch::default();
        let mut errors = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (mode, write, etag) in items {
            let id = write.id.clone();
            let result = if !seen.insert((write.kind, id.clone())) {
                Err(ProvisioningError::Invalid(ValidationError::new(
                    "registrationId",
                    format!("{id} appears more than once in the operation"),
                )))
            } else {
                self.stage_bulk_item(&mut batch, mode, write, etag, now)
            };
            match result {
                Ok(()) => {}
                Err(ProvisioningError::Storage(e)) => return Err(e.into()),
                Err(error) => errors.push(BulkEnrollmentError { id, error }),
            }
        }
        self.raw.commit(batch)?;
        Ok(errors)
    }

    fn stage_bulk_item(
        &self,
        batch: &mut Batch,
        mode: BulkMode,
        write: EnrollmentWrite,
        etag: Option<String>,
        now: UnixMillis,
    ) -> Result<(), ProvisioningError> {
        let kind = write.kind;
        match mode {
            BulkMode::Delete => {
                let current = self.get_enrollment(kind, &write.id)?;
                if let Some(e) = etag.filter(|e| !e.is_empty() && e != "*") {
                    IfMatch::Etag(e).check(&current.etag)?;
                }
                batch.delete(cf::META, kind.key(&write.id));
                stage_group_change(batch, kind);
            }
            BulkMode::Create => {
                write.validate()?;
                self.stage_put_enrollment(batch, write, None, now)?;
            }
            BulkMode::Update => {
                write.validate()?;
                self.stage_put_enrollment(batch, write, Some(&IfMatch::Any), now)?;
            }
            BulkMode::UpdateIfMatchEtag => {
                write.validate()?;
                let m = IfMatch::Etag(etag.unwrap_or_default());
                self.stage_put_enrollment(batch, write, Some(&m), now)?;
            }
        }
        Ok(())
    }
}
