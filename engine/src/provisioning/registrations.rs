//! Registration states: read, delete under an etag, and list those of one enrollment group.
//! They are written only by an assignment
//! ([`Store::assign_registration`](crate::Store::assign_registration)).

use ferrohub_migrations::cf;

use super::{EnrollmentKind, ProvisioningError, RegistrationRecord, REGISTRATION_PREFIX};
use crate::error::StorageError;
use crate::keys;
use crate::model::IfMatch;
use crate::raw::Batch;
use crate::Store;

pub(crate) fn registration_key(registration_id: &str) -> Vec<u8> {
    let mut k = REGISTRATION_PREFIX.to_vec();
    k.extend_from_slice(registration_id.as_bytes());
    k
}

/// One page of a group's registrations, and the id to continue after when more remain.
#[derive(Debug, Clone)]
pub struct RegistrationPage {
    pub items: Vec<RegistrationRecord>,
    pub continuation: Option<String>,
}

impl Store {
    /// # Errors
    /// `RegistrationNotFound` or storage errors.
    pub fn get_registration(
        &self,
        registration_id: &str,
    ) -> Result<RegistrationRecord, ProvisioningError> {
        self.raw
            .get_record(cf::META, &registration_key(registration_id))?
            .ok_or_else(|| ProvisioningError::RegistrationNotFound(registration_id.to_string()))
    }

    /// Deletes a registration state: the device stays in the registry, and its next
    /// registration is a first assignment again.
    ///
    /// # Errors
    /// `RegistrationNotFound`, `EtagMismatch`, storage.
    pub fn delete_registration(
        &self,
        registration_id: &str,
        if_match: &IfMatch,
    ) -> Result<(), ProvisioningError> {
        let _guard = self.enrollment_lock.0.write();
        let current = self.get_registration(registration_id)?;
        if_match.check(&current.etag)?;
        let mut batch = Batch::default();
        batch.delete(cf::META, registration_key(registration_id));
        self.raw.commit(batch)?;
        Ok(())
    }

    /// Up to `limit` registrations admitted by enrollment group `group_id`, in registration id
    /// order after `after`. A scan of every registration: groups are listed by operators, not
    /// on any device's path.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_group_registrations(
        &self,
        group_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<RegistrationPage, StorageError> {
        let start = match after {
            Some(a) => {
                let mut k = registration_key(a);
                k.push(0);
                k
            }
            None => REGISTRATION_PREFIX.to_vec(),
        };
        let mut items = Vec::new();
        let mut more = false;
        self.raw.scan_records::<RegistrationRecord>(
            cf::META,
            &start,
            keys::prefix_end(REGISTRATION_PREFIX),
            |_, r| {
                if r.enrollment_kind != EnrollmentKind::Group || r.enrollment_id != group_id {
                    return true;
                }
                if items.len() == limit {
                    more = true;
                    return false;
                }
                items.push(r);
                true
            },
        )?;
        let continuation = if more {
            items.last().map(|r| r.registration_id.clone())
        } else {
            None
        };
        Ok(RegistrationPage {
            items,
            continuation,
        })
    }
}
