//! The digital twin API over stored twins (PNP-2): read a device's digital twin, and apply a
//! digital twin JSON Patch as the desired-properties patch it means.
//!
//! # Invariants
//! - A patch is converted from the twin it will change, under the device's stripe lock, and
//!   written as one twin update: the If-Match etag, the TWN-7 limits and the desired change
//!   notification are those of an ordinary desired-properties patch, and on any error nothing
//!   is stored.

use serde_json::{Map, Value};

use super::pnp::{self, patch::desired_patch};
use super::record::Twin;
use super::store::{service_change, TwinOutcome, TwinWrite};
use crate::error::TwinError;
use crate::model::{IfMatch, UnixMillis};
use crate::raw::Batch;
use crate::Store;

impl Store {
    /// The digital twin of a device (`module_id` `None`) or module, with the twin it was
    /// rendered from (whose etag is the digital twin's).
    ///
    /// # Errors
    /// [`TwinError::NotFound`] or storage errors.
    pub fn get_digital_twin(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        fmt_time: &dyn Fn(UnixMillis) -> String,
    ) -> Result<(Map<String, Value>, Twin), TwinError> {
        let twin = self.get_twin(device_id, module_id)?;
        let view = pnp::view(
            device_id,
            twin.identity.model_id.as_deref(),
            &twin.record,
            fmt_time,
        );
        Ok((view, twin))
    }

    /// Applies a digital twin JSON Patch (`patch`, as the client sent it) as one desired
    /// properties patch, if `if_match` holds.
    ///
    /// # Errors
    /// [`TwinError::NotFound`], [`TwinError::EtagMismatch`], [`TwinError::Invalid`] for a
    /// patch that is not acceptable (or whose result breaks TWN-7), or storage.
    pub fn patch_digital_twin(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        patch: &Value,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<TwinOutcome, TwinError> {
        let _guard = self.stripes.lock(device_id);
        let identity = self.load_identity(device_id, module_id)?;
        let record = self.load_twin_record(&identity)?;
        if_match.check(&record.etag)?;
        let write = TwinWrite {
            tags: None,
            desired: Some(desired_patch(patch, &record)?),
        };
        write.check_patch()?;
        let mut batch = Batch::default();
        let (notes, outcome) = self.stage_twin(
            identity,
            if_match,
            service_change(&write, true),
            now,
            &mut batch,
        )?;
        self.commit_with_notifications(batch, notes)?;
        Ok(outcome)
    }
}
