//! Provisioning records in offline exports and restores: every enrollment, group and
//! registration state, written back verbatim (etags, times and operation ids kept).

use ferrohub_migrations::cf;

use super::{
    registration_key, Enrollment, EnrollmentKind, RegistrationRecord, ENROLLMENT_PREFIX,
    GROUP_PREFIX, REGISTRATION_PREFIX,
};
use crate::error::StorageError;
use crate::keys;
use crate::raw::Batch;
use crate::Store;

/// Records written per commit by a restore.
const RESTORE_BATCH: usize = 1000;

impl Store {
    /// Every enrollment and group (individual ones first), and every registration state.
    ///
    /// # Errors
    /// Storage errors.
    pub fn export_provisioning(
        &self,
    ) -> Result<(Vec<Enrollment>, Vec<RegistrationRecord>), StorageError> {
        let mut enrollments = Vec::new();
        for prefix in [ENROLLMENT_PREFIX, GROUP_PREFIX] {
            self.raw.scan_records::<Enrollment>(
                cf::META,
                prefix,
                keys::prefix_end(prefix),
                |_, e| {
                    enrollments.push(e);
                    true
                },
            )?;
        }
        let mut registrations = Vec::new();
        self.raw.scan_records::<RegistrationRecord>(
            cf::META,
            REGISTRATION_PREFIX,
            keys::prefix_end(REGISTRATION_PREFIX),
            |_, r| {
                registrations.push(r);
                true
            },
        )?;
        Ok((enrollments, registrations))
    }

    /// Writes exported records back as they were.
    ///
    /// # Errors
    /// Storage errors (what was committed before stays).
    pub fn restore_provisioning(
        &self,
        enrollments: &[Enrollment],
        registrations: &[RegistrationRecord],
    ) -> Result<(), StorageError> {
        let _guard = self.enrollment_lock.0.write();
        for chunk in enrollments.chunks(RESTORE_BATCH) {
            let mut batch = Batch::default();
            for e in chunk {
                let kind: EnrollmentKind = e.kind;
                batch.put_record(cf::META, kind.key(&e.id), e);
                super::enrollments::stage_group_change(&mut batch, kind);
            }
            self.raw.commit(batch)?;
        }
        for chunk in registrations.chunks(RESTORE_BATCH) {
            let mut batch = Batch::default();
            for r in chunk {
                batch.put_record(cf::META, registration_key(&r.registration_id), r);
            }
            self.raw.commit(batch)?;
        }
        Ok(())
    }
}
