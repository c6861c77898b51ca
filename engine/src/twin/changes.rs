//! Twin change records (TWN-9, EVT-4): every twin change writes, in the same atomic batch as the
//! twin, a record of what changed, so the change notifications of routing can be produced from
//! them without loss after a crash.
//!
//! # Invariants
//! - Records are keyed by a hub-wide sequence number, assigned and submitted to the committer
//!   under one lock, so the committed records are always a gap-free prefix in key order.
//! - A record's body is the seed 004 shape: the twin `version`, and the changed parts with their
//!   `$metadata` (`$lastUpdated`, `$lastUpdatedVersion`) and section `$version`; a replacement
//!   carries the whole twin.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use ferrohub_migrations::cf;

use super::document::{json_text, Section};
use crate::error::StorageError;
use crate::model::UnixMillis;
use crate::Store;

/// IoT Hub's `opType` of a twin change notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TwinOp {
    UpdateTwin,
    ReplaceTwin,
}

impl TwinOp {
    pub fn name(self) -> &'static str {
        match self {
            TwinOp::UpdateTwin => "updateTwin",
            TwinOp::ReplaceTwin => "replaceTwin",
        }
    }
}

/// One stored change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TwinChange {
    pub sequence: u64,
    pub device_id: String,
    pub module_id: Option<String>,
    pub op: TwinOp,
    pub time: UnixMillis,
    /// The notification body, with times as Unix milliseconds (the server formats them).
    #[serde(with = "json_text")]
    pub body: Map<String, Value>,
}

pub(crate) fn key(sequence: u64) -> Vec<u8> {
    sequence.to_be_bytes().to_vec()
}

/// The changed members of a section with their metadata and the section's `$version`.
pub(crate) fn changed_section(
    section: &Section,
    patch: &Map<String, Value>,
    metadata_version: bool,
) -> Value {
    let ms = |t: UnixMillis| t.0.to_string();
    let mut out = patch.clone();
    let mut meta = Map::new();
    meta.insert(
        "$lastUpdated".into(),
        Value::String(ms(section.metadata.last_updated)),
    );
    if metadata_version {
        meta.insert(
            "$lastUpdatedVersion".into(),
            Value::from(section.metadata.last_updated_version),
        );
    }
    for k in patch.keys() {
        if let Some(node) = section.metadata.children.get(k) {
            meta.insert(k.clone(), node.to_json(&ms, metadata_version));
        }
    }
    out.insert("$metadata".into(), Value::Object(meta));
    out.insert("$version".into(), Value::from(section.version));
    Value::Object(out)
}

impl Store {
    /// Change records with sequence numbers from `from`, at most `max`, in order.
    ///
    /// # Errors
    /// Storage errors (a corrupt record is reported, not skipped).
    pub fn read_twin_changes(
        &self,
        from: u64,
        max: usize,
    ) -> Result<Vec<TwinChange>, StorageError> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        self.raw
            .scan_records::<TwinChange>(cf::TWIN_CHANGES, &key(from), None, |_, c| {
                out.push(c);
                out.len() < max
            })?;
        Ok(out)
    }
}
