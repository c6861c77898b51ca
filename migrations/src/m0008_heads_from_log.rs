//! Version 8: D2C appends stop writing the partition head; a store recovers it at open from
//! the stored head and the partition's newest event in `d2c_log` (the engine's `d2c::heads`).
//! Nothing on disk changes. The version exists so that a hub older than this, which trusts the
//! stored head alone, refuses such a database instead of reusing sequence numbers.

use crate::{Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 8,
    name: "partition heads recovered from the log",
    apply,
};

fn apply(_db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    Ok(())
}
