//! Version 1: the initial layout — hub metadata, device and module identities.

use crate::{cf, Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 1,
    name: "initial layout",
    apply,
};

fn apply(db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    for name in [cf::META, cf::DEVICES, cf::MODULES] {
        db.ensure_column_family(name)?;
    }
    Ok(())
}
