//! Version 3: device-to-cloud partitions and persistent MQTT sessions. New column families only;
//! nothing existing changes.

use crate::{cf, Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 3,
    name: "telemetry and sessions",
    apply,
};

fn apply(db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    for name in [cf::D2C_EVENTS, cf::D2C_STATE, cf::SESSIONS] {
        db.ensure_column_family(name)?;
    }
    Ok(())
}
