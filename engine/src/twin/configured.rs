//! Writing what automatic device configurations (ADM) make of a twin: their desired
//! properties and the twin's `configurations` map, decided by the server's reconciler from a
//! twin it read.
//!
//! # Invariants
//! - A write applies only to the twin the decision was made from: the etag must still be the
//!   one read, otherwise nothing is stored and the caller decides again.
//! - Desired changes go through the same path as a service PATCH (version, `$metadata`,
//!   change record); a change of the map alone changes neither version nor etag (IoT Hub
//!   keeps `configurations` outside the versioned sections).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use ferrohub_migrations::cf;

use super::record::AppliedConfiguration;
use super::store::{service_change, TwinOutcome, TwinWrite};
use crate::error::TwinError;
use crate::keys;
use crate::model::{IfMatch, UnixMillis};
use crate::raw::Batch;
use crate::Store;

/// What a reconciler decided for one twin.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfiguredTwin {
    /// The desired patch to apply (`null` removes), if any.
    pub desired: Option<Map<String, Value>>,
    pub configurations: BTreeMap<String, AppliedConfiguration>,
}

impl Store {
    /// Applies `decision` to the twin of a device or module if its etag is still `etag`.
    /// Returns the outcome when desired properties changed (to push to the device).
    ///
    /// # Errors
    /// [`TwinError::EtagMismatch`] when the twin changed since it was read; not found,
    /// [`TwinError::Invalid`] (TWN-7) or storage. On error nothing is stored.
    pub fn apply_configured_twin(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        etag: &str,
        decision: &ConfiguredTwin,
        now: UnixMillis,
    ) -> Result<Option<TwinOutcome>, TwinError> {
        let _guard = self.stripes.lock(device_id);
        let identity = self.load_identity(device_id, module_id)?;
        let mut batch = Batch::default();
        match &decision.desired {
            Some(patch) => {
                let write = TwinWrite {
                    tags: None,
                    desired: Some(patch.clone()),
                };
                write.check_patch()?;
                let configurations = decision.configurations.clone();
                let patch_change = service_change(&write, true);
                let (notes, outcome) = self.stage_twin(
                    identity,
                    &IfMatch::Etag(etag.to_string()),
                    move |record, now| {
                        record.configurations = configurations;
                        patch_change(record, now)
                    },
                    now,
                    &mut batch,
                )?;
                self.commit_with_notifications(batch, notes)?;
                Ok(Some(outcome))
            }
            None => {
                let mut record = self.load_twin_record(&identity)?;
                IfMatch::Etag(etag.to_string()).check(&record.etag)?;
                if record.configurations == decision.configurations {
                    return Ok(None);
                }
                record.configurations = decision.configurations.clone();
                batch.put_record(cf::TWINS, keys::twin(device_id, module_id), &record);
                self.raw.commit(batch)?;
                Ok(None)
            }
        }
    }
}
