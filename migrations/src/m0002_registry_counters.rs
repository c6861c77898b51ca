//! Version 2: registry statistics become counters kept by a RocksDB merge operator, so reading
//! statistics no longer scans every identity and writers never contend on one counter record.
//!
//! The step creates [`cf::COUNTERS`] and writes the totals computed from the identities already
//! stored. It is idempotent: it recomputes from scratch and overwrites.

use serde::{Deserialize, Serialize};

use crate::{cf, record, Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 2,
    name: "registry counters",
    apply,
};

/// Key of the device statistics in [`cf::COUNTERS`].
pub const DEVICE_COUNTERS_KEY: &[u8] = b"devices";

/// Device counts; also the merge operand, where the fields are signed deltas.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounters {
    pub total: i64,
    pub enabled: i64,
    pub disabled: i64,
}

fn apply(db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    db.ensure_column_family(cf::COUNTERS)?;
    let mut counters = DeviceCounters::default();
    db.scan(cf::DEVICES, &mut |key, value| {
        // Read generically by field name: the step must not depend on today's identity struct.
        let device: serde_json::Value =
            record::decode(value).map_err(|e| MigrationError::Step {
                version: 2,
                name: MIGRATION.name,
                reason: format!("device record {:?}: {e}", String::from_utf8_lossy(key)),
            })?;
        counters.total += 1;
        if device.get("status").and_then(|s| s.as_str()) == Some("disabled") {
            counters.disabled += 1;
        } else {
            counters.enabled += 1;
        }
        Ok(())
    })?;
    db.stage_put(cf::COUNTERS, DEVICE_COUNTERS_KEY, record::encode(&counters));
    Ok(())
}
