//! Provisioning service writes (DPS-4, DPS-5): enrollments, registration records, and a
//! device's assignment (identity, twin and registration state in one commit).

use ferrohub_engine::identity::Assignment;
use ferrohub_engine::model::IfMatch;
use ferrohub_engine::provisioning::{
    BulkEnrollmentError, BulkMode, Enrollment, EnrollmentKind, EnrollmentWrite, ProvisioningError,
    RegistrationRecord,
};
use ferrohub_engine::UnixMillis;

use super::writer_call;

writer_call! {
    pub struct PutEnrollment {
        pub write: EnrollmentWrite,
        pub if_match: Option<IfMatch>,
        pub now: UnixMillis,
    }
    -> Result<Enrollment, ProvisioningError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.put_enrollment(c.write, c.if_match.as_ref(), c.now))
        .await
}

writer_call! {
    pub struct DeleteEnrollment { pub kind: EnrollmentKind, pub id: String, pub if_match: IfMatch }
    -> Result<(), ProvisioningError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.delete_enrollment(c.kind, &c.id, &c.if_match))
        .await
}

writer_call! {
    pub struct BulkEnrollments {
        pub items: Vec<(BulkMode, EnrollmentWrite, Option<String>)>,
        pub now: UnixMillis,
    }
    -> Result<Vec<BulkEnrollmentError>, ProvisioningError>;
    |ctx, c| ctx.store.run(move |s| s.bulk_enrollments(c.items, c.now)).await
}

writer_call! {
    pub struct DeleteRegistration { pub id: String, pub if_match: IfMatch }
    -> Result<(), ProvisioningError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.delete_registration(&c.id, &c.if_match))
        .await
}

writer_call! {
    /// A device the provisioning service attested, assigned to this hub.
    pub struct AssignRegistration { pub assignment: Assignment, pub now: UnixMillis }
    -> Result<RegistrationRecord, ProvisioningError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.assign_registration(c.assignment, c.now))
        .await
}
