//! Version 4: device and module twins, and their change records. New column families only: an
//! identity without a twin record has the empty twin (versions 1), and its record is written on
//! the twin's first change.

use crate::{cf, Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 4,
    name: "twins",
    apply,
};

fn apply(db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    db.ensure_column_family(cf::TWINS)?;
    db.ensure_column_family(cf::TWIN_CHANGES)
}
