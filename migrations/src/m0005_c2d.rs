//! Version 5: cloud-to-device queues. New column families only: per-device message queues and
//! the feedback queue, their heads (next sequence number and depth), the deadline index that
//! the lock-expiry and TTL sweepers walk, and pending feedback records.

use crate::{cf, Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 5,
    name: "cloud-to-device queues",
    apply,
};

fn apply(db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    for name in [
        cf::C2D_MESSAGES,
        cf::C2D_HEADS,
        cf::C2D_TIMERS,
        cf::C2D_FEEDBACK,
    ] {
        db.ensure_column_family(name)?;
    }
    Ok(())
}
