//! The global partition numbering that the built-in endpoint and the custom endpoints share:
//! which range of partitions each endpoint owns, and which partition a device's events take in
//! it. The `d2c` module (partition heads, appends, reads) and the `endpoints` module (custom
//! endpoint records) both build on these types; this module depends on neither, so the two
//! import it instead of each other.
//!
//! # Invariants
//! - Global partitions are `0..MAX_PARTITIONS`: the built-in endpoint has `0..count`, a custom
//!   endpoint `base..base + partitions`; ranges never overlap.
//! - A device's partition within an endpoint depends only on its id and the endpoint's count.

use serde::{Deserialize, Serialize};

use crate::model::UnixMillis;

/// Every partition of every endpoint, by global partition number.
pub const MAX_PARTITIONS: u16 = 256;

/// Where an endpoint's partitions are in the global numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSlot {
    pub base: u16,
    pub partitions: u16,
    /// Random per created endpoint (0 for the built-in one): a slot of a deleted endpoint never
    /// equals that of a later endpoint given the same partition range.
    #[serde(default)]
    pub id: u64,
}

impl EndpointSlot {
    /// The global partition of a device's events in this endpoint.
    pub fn partition_of(&self, device_id: &str) -> u16 {
        self.base + partition_of(device_id, self.partitions)
    }

    pub fn contains(&self, global: u16) -> bool {
        (self.base..self.base + self.partitions).contains(&global)
    }
}

/// The partition of a device: stable across versions and restarts.
pub fn partition_of(device_id: &str, partition_count: u16) -> u16 {
    (crc32fast::hash(device_id.as_bytes()) % partition_count.max(1) as u32) as u16
}

/// A custom endpoint, as stored in `d2c_state` under `endpoint/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub name: String,
    pub slot: EndpointSlot,
    pub created: UnixMillis,
    /// Where its events are delivered outside the hub, if anywhere (`crate::delivery`).
    /// Endpoints stored before targets existed read as `None`.
    #[serde(default)]
    pub delivery: Option<crate::delivery::DeliveryTarget>,
}
