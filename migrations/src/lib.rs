//! ferrohub storage schema: the record frame, the schema version, and the ordered steps that
//! bring a database from any earlier version to [`LATEST_VERSION`].
//!
//! # Layout
//! - [`record`]: the checksummed record frame every stored value uses.
//! - [`SchemaTarget`]: what a step may do to a database. The engine implements it over RocksDB;
//!   this crate never names RocksDB, so steps stay testable and the engine stays the only owner
//!   of the database.
//! - `m0001_initial`, `m0002_registry_counters`, ...: one file per step.
//!
//! # Invariants
//! - Versions are dense, start at 1, and each step moves exactly one version forward.
//! - A step is idempotent: a crash between its work and the version bump re-runs it safely,
//!   because the staged writes and the new version commit in one atomic, synced batch.
//! - A database whose recorded version is newer than [`LATEST_VERSION`] is never touched.
//!
//! This crate does not open databases, decide column family options or run anything by itself.

pub mod record;

mod m0001_initial;
pub mod m0002_registry_counters;
mod m0003_telemetry;
mod m0004_twins;
mod m0005_c2d;
mod m0006_twin_index;
pub mod m0007_d2c_segments;
mod m0008_heads_from_log;
mod m0009_d2c_packs;

/// Column family names as they exist on disk. Steps and the engine use these constants only.
pub mod cf {
    /// Schema version and hub-wide settings (hub name, policies).
    pub const META: &str = "meta";
    /// Device identities, keyed by device id.
    pub const DEVICES: &str = "devices";
    /// Module identities, keyed by device id then module id.
    pub const MODULES: &str = "modules";
    /// Registry statistics as merge-operator counters (since version 2).
    pub const COUNTERS: &str = "counters";
    /// D2C events of versions 3 to 6, keyed by partition then sequence number. Version 7
    /// moves them into [`D2C_LOG`] and drops this column family.
    pub const D2C_EVENTS: &str = "d2c_events";
    /// D2C events, keyed by segment, partition and sequence number (since version 7).
    pub const D2C_LOG: &str = "d2c_log";
    /// D2C partition heads, consumer groups and checkpoints (since version 3).
    pub const D2C_STATE: &str = "d2c_state";
    /// Persistent MQTT sessions (CleanSession=0), keyed by client id (since version 3).
    pub const SESSIONS: &str = "sessions";
    /// Device and module twins (since version 4).
    pub const TWINS: &str = "twins";
    /// Twin change records, keyed by a hub-wide sequence number (since version 4).
    pub const TWIN_CHANGES: &str = "twin_changes";
    /// C2D messages of every queue, keyed by queue then sequence number (since version 5).
    pub const C2D_MESSAGES: &str = "c2d_messages";
    /// C2D queue heads: next sequence number and depth, keyed by queue (since version 5).
    pub const C2D_HEADS: &str = "c2d_heads";
    /// C2D deadlines (lock expiry, TTL), keyed by kind then deadline (since version 5).
    pub const C2D_TIMERS: &str = "c2d_timers";
    /// Feedback records not yet packed into a feedback message, keyed by sequence (since 5).
    pub const C2D_FEEDBACK: &str = "c2d_feedback";
    /// Twin query index entries: collection, path, value, identity (since version 6).
    pub const TWIN_INDEX: &str = "twin_index";

    /// Every column family of the latest version.
    pub const ALL: [&str; 14] = [
        META,
        DEVICES,
        MODULES,
        COUNTERS,
        D2C_LOG,
        D2C_STATE,
        SESSIONS,
        TWINS,
        TWIN_CHANGES,
        C2D_MESSAGES,
        C2D_HEADS,
        C2D_TIMERS,
        C2D_FEEDBACK,
        TWIN_INDEX,
    ];
}

/// Key of the schema version in [`cf::META`]; the value is a framed `u32`.
pub const VERSION_KEY: &[u8] = b"schema_version";

/// Errors a step or the runner can report.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("database is at schema version {found}, newer than this build understands ({latest}); use a newer ferrohub")]
    TooNew { found: u32, latest: u32 },
    #[error("migration m{version:04} ({name}) failed: {reason}")]
    Step {
        version: u32,
        name: &'static str,
        reason: String,
    },
    #[error("storage error during migration: {0}")]
    Storage(String),
}

/// A scan's callback: a key and its raw (framed) value.
pub type Visitor<'a, R> = dyn FnMut(&[u8], &[u8]) -> Result<R, MigrationError> + 'a;

/// What a migration step may do. Writes are staged and committed by [`SchemaTarget::commit`]
/// atomically with the new version.
pub trait SchemaTarget {
    /// Creates a column family if it does not exist yet.
    fn ensure_column_family(&mut self, name: &str) -> Result<(), MigrationError>;
    /// Visits every key and raw (framed) value of a column family in key order.
    fn scan(&self, cf: &str, visit: &mut Visitor<'_, ()>) -> Result<(), MigrationError>;
    /// Visits keys and raw values of a column family in key order from `from` (inclusive)
    /// while `visit` returns `true`.
    fn scan_from(
        &self,
        cf: &str,
        from: &[u8],
        visit: &mut Visitor<'_, bool>,
    ) -> Result<(), MigrationError>;
    /// Stages a put of a raw (already framed) value.
    fn stage_put(&mut self, cf: &str, key: &[u8], value: Vec<u8>);
    /// Commits the writes staged so far, durably, without changing the schema version. A step
    /// that copies more than fits in memory calls it between chunks; such a step must be
    /// idempotent, since a crash re-runs it from the start.
    fn checkpoint(&mut self) -> Result<(), MigrationError>;
    /// Drops a column family and its data if it exists. Not atomic with the staged writes: a
    /// step calls it only after a checkpoint made what replaces the data durable.
    fn drop_column_family(&mut self, name: &str) -> Result<(), MigrationError>;
    /// Commits the staged writes together with `version` as the new schema version, durably.
    fn commit(&mut self, version: u32) -> Result<(), MigrationError>;
}

/// One schema step.
pub struct Migration {
    pub version: u32,
    pub name: &'static str,
    pub apply: fn(&mut dyn SchemaTarget) -> Result<(), MigrationError>,
}

/// Every step, in order.
pub const MIGRATIONS: &[Migration] = &[
    m0001_initial::MIGRATION,
    m0002_registry_counters::MIGRATION,
    m0003_telemetry::MIGRATION,
    m0004_twins::MIGRATION,
    m0005_c2d::MIGRATION,
    m0006_twin_index::MIGRATION,
    m0007_d2c_segments::MIGRATION,
    m0008_heads_from_log::MIGRATION,
    m0009_d2c_packs::MIGRATION,
];

/// The version this build writes.
pub const LATEST_VERSION: u32 = MIGRATIONS.len() as u32;

/// Progress callback: `(version, name)` just before a step runs.
pub type Progress<'a> = &'a mut dyn FnMut(u32, &'static str);

/// Brings a database at `current` (0 = empty) up to `target`, committing after each step.
///
/// # Errors
/// [`MigrationError::TooNew`] when `current > LATEST_VERSION` (nothing is changed), or the first
/// failing step's error (earlier steps stay committed; re-running resumes after them).
pub fn migrate(
    db: &mut dyn SchemaTarget,
    current: u32,
    target: u32,
    progress: Progress<'_>,
) -> Result<u32, MigrationError> {
    if current > LATEST_VERSION {
        return Err(MigrationError::TooNew {
            found: current,
            latest: LATEST_VERSION,
        });
    }
    let target = target.min(LATEST_VERSION);
    let mut version = current;
    for step in MIGRATIONS
        .iter()
        .filter(|m| m.version > current && m.version <= target)
    {
        progress(step.version, step.name);
        (step.apply)(db)?;
        db.commit(step.version)?;
        version = step.version;
    }
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_dense_and_ordered() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as u32 + 1, "{}", m.name);
        }
    }
}
