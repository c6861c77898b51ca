//! The twin as data: the stored record and the twin as read (record plus identity).
//! The `store` module reads and writes it; the `changes` module describes its changes for the
//! notification outbox. Both import this module, neither imports the other.
//!
//! # Invariants
//! - A new twin has version 1 and empty sections; `version` and `etag` change with every write.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::document::{json_text, Section};
use crate::model::{next_etag, Identity, UnixMillis};

/// A stored twin (identity fields come from the identity record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TwinRecord {
    #[serde(with = "json_text")]
    pub tags: Map<String, Value>,
    pub desired: Section,
    pub reported: Section,
    pub version: u64,
    pub etag: String,
    /// The automatic device configurations that target this twin (ADM), by id. Last, and
    /// defaulted, so records written before it existed still read.
    #[serde(default)]
    pub configurations: BTreeMap<String, AppliedConfiguration>,
    /// The identity's Plug and Play model id, kept beside the twin (written with the identity
    /// in one batch) so a twin write knows without reading the identity whether it changes a
    /// digital twin (PNP-5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
}

/// What one configuration is to a twin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedConfiguration {
    /// `Applied` when it sets at least one desired property, otherwise `Targeted`.
    pub status: String,
    /// The desired paths (dotted, below `properties.desired`) it sets.
    pub owned: Vec<String>,
}

impl TwinRecord {
    /// The twin of a new identity.
    pub fn empty(created: UnixMillis) -> Self {
        TwinRecord {
            tags: Map::new(),
            desired: Section::new(created),
            reported: Section::new(created),
            version: 1,
            etag: next_etag(None),
            configurations: BTreeMap::new(),
            model_id: None,
        }
    }
}

/// A twin with the identity it belongs to.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Twin {
    pub identity: Identity,
    pub record: TwinRecord,
}
