//! Version 9: a record of `d2c_log` may hold several consecutive events of one partition,
//! their frames back to back (the engine's `d2c::pack`). Nothing on disk changes: a record
//! written before holds one event, a pack of one. The version exists so that a hub older than
//! this, which reads a record as one frame, refuses such a database instead of reporting
//! every pack as corrupt.

use crate::{Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 9,
    name: "D2C events packed per partition and batch",
    apply,
};

fn apply(_db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    Ok(())
}
