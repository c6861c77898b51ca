//! Assignment of a provisioning registration (DPS-3): the device identity the enrollment
//! describes, its initial twin, and the registration state, in one atomic commit.
//!
//! # Invariants
//! - The enrollment is read under the enrollment lock (shared: enrollment changes hold it
//!   exclusively) and must still carry the etag the caller attested against, so a
//!   registration is never assigned by an enrollment that was changed, disabled or deleted
//!   after the device proved itself.
//! - One registration id is assigned by one caller at a time (its stripe in
//!   `registration_stripes`, taken before the device's stripe, the only order both are
//!   taken in); registrations of other ids run alongside and share the group commit.
//! - The identity, its twin and the registration state commit together: a crash leaves either
//!   all of them or none.
//! - The initial twin is applied only when the device is created here, or when the
//!   reprovision policy resets the device's data.

use ferrohub_migrations::cf;
use serde_json::{Map, Value};

use super::Txn;
use crate::error::ValidationError;
use crate::model::{next_etag, validate_id, Identity, IdentitySpec, IfMatch, UnixMillis};
use crate::provisioning::{
    registration_key, EnrollmentKind, ProvisioningError, RegistrationRecord, RegistrationStatus,
    Substatus,
};
use crate::twin::store::TwinWrite;
use crate::Store;

/// A registration the server attested, to be assigned.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Assignment {
    pub enrollment_kind: EnrollmentKind,
    pub enrollment_id: String,
    /// The etag of the enrollment the device's credentials were checked against.
    pub enrollment_etag: String,
    pub registration_id: String,
    /// The identity's authentication (keys or thumbprint) the device connects with.
    pub credentials: IdentitySpec,
    pub payload: Option<String>,
    pub operation_id: String,
    pub assigned_hub: String,
}

fn json_object(
    field: &'static str,
    text: &Option<String>,
) -> Result<Option<Map<String, Value>>, ValidationError> {
    match text {
        None => Ok(None),
        Some(t) => match serde_json::from_str::<Value>(t) {
            Ok(Value::Object(m)) => Ok(Some(m)),
            _ => Err(ValidationError::new(field, "must be a JSON object")),
        },
    }
}

impl Store {
    /// Assigns a registration: creates the device (with the enrollment's initial twin) or
    /// updates the one that exists, as the reprovision policy says, and records the
    /// registration state.
    ///
    /// # Errors
    /// `EnrollmentChanged` (register again), `EnrollmentDisabled`, `Registry` (the identity
    /// write was refused), storage errors. Nothing is written on error.
    pub fn assign_registration(
        &self,
        assignment: Assignment,
        now: UnixMillis,
    ) -> Result<RegistrationRecord, ProvisioningError> {
        // Shared: enrollment changes wait, other registrations do not. The registration id's
        // stripe makes the read of its previous state and the write of the new one one step.
        let _enrollments = self.enrollment_lock.0.read();
        let _registration = self.registration_stripes.lock(&assignment.registration_id);
        let enrollment = self
            .get_enrollment(assignment.enrollment_kind, &assignment.enrollment_id)
            .map_err(|e| match e {
                ProvisioningError::Storage(s) => ProvisioningError::Storage(s),
                _ => ProvisioningError::EnrollmentChanged(assignment.enrollment_id.clone()),
            })?;
        if enrollment.etag != assignment.enrollment_etag {
            return Err(ProvisioningError::EnrollmentChanged(enrollment.id));
        }
        if !enrollment.enabled {
            return Err(ProvisioningError::EnrollmentDisabled(enrollment.id));
        }
        let device_id = enrollment
            .device_id
            .clone()
            .unwrap_or_else(|| assignment.registration_id.clone());
        validate_id("deviceId", &device_id)?;
        let initial = TwinWrite {
            tags: json_object("initialTwin.tags", &enrollment.initial_tags)?,
            desired: json_object(
                "initialTwin.properties.desired",
                &enrollment.initial_desired,
            )?,
        };
        let previous: Option<RegistrationRecord> = self
            .raw
            .get_record(cf::META, &registration_key(&assignment.registration_id))?;

        let _device = self.stripes.lock(&device_id);
        let mut txn = Txn::new(self);
        let existing = txn.device(&device_id)?;
        let substatus = match existing {
            None => {
                let mut spec = assignment.credentials.clone();
                spec.iot_edge = enrollment.iot_edge;
                let created = txn.create_device(&device_id, &spec, now)?;
                txn.stage_twin_replace(&created, &initial, now)?;
                Substatus::InitialAssignment
            }
            Some(current) => {
                let updated = txn.update_device(
                    &device_id,
                    &credentials_on(&current, &assignment.credentials, enrollment.iot_edge),
                    &IfMatch::Any,
                    now,
                )?;
                let policy = enrollment.reprovision;
                match &previous {
                    None => Substatus::InitialAssignment,
                    Some(p) if !policy.update_hub_assignment => p.substatus,
                    Some(_) if policy.migrate_device_data => Substatus::DeviceDataMigrated,
                    Some(_) => {
                        txn.stage_twin_replace(&updated, &reset(initial), now)?;
                        Substatus::DeviceDataReset
                    }
                }
            }
        };
        let record = RegistrationRecord {
            registration_id: assignment.registration_id.clone(),
            enrollment_kind: enrollment.kind,
            enrollment_id: enrollment.id.clone(),
            device_id,
            assigned_hub: assignment.assigned_hub,
            status: RegistrationStatus::Assigned,
            substatus,
            payload: assignment.payload,
            operation_id: assignment.operation_id,
            created: previous.as_ref().map_or(now, |p| p.created),
            last_updated: now,
            etag: next_etag(previous.as_ref().map(|p| p.etag.as_str())),
        };
        txn.batch
            .put_record(cf::META, registration_key(&record.registration_id), &record);
        txn.commit()?;
        Ok(record)
    }
}

/// The existing device's settings with the enrollment's credentials and edge capability.
fn credentials_on(current: &Identity, credentials: &IdentitySpec, iot_edge: bool) -> IdentitySpec {
    IdentitySpec {
        status: current.status,
        status_reason: current.status_reason.clone(),
        auth_type: credentials.auth_type,
        keys: credentials.keys.clone(),
        thumbprints: credentials.thumbprints.clone(),
        iot_edge,
        device_scope: current.device_scope.clone(),
        parent_scopes: current.parent_scopes.clone(),
        managed_by: current.managed_by.clone(),
    }
}

/// A data reset replaces tags and desired properties whole: with the initial twin's, or with
/// nothing where the enrollment has none.
fn reset(initial: TwinWrite) -> TwinWrite {
    TwinWrite {
        tags: Some(initial.tags.unwrap_or_default()),
        desired: Some(initial.desired.unwrap_or_default()),
    }
}
