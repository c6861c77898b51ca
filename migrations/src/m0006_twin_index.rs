//! Version 6: the twin query index. A new column family only; the engine fills it from the
//! stored identities and twins when it opens a store whose index is not built for its
//! current definition (see the engine's `twin_index`), because building entries needs the
//! engine's record types.

use crate::{cf, Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 6,
    name: "twin query index",
    apply,
};

fn apply(db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    db.ensure_column_family(cf::TWIN_INDEX)
}
