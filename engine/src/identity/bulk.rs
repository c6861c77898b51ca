//! Bulk registry changes (`POST /devices` and import jobs): many items, one atomic commit,
//! failures reported per item.
//!
//! # Invariants
//! - An item's identity and the twin it carries are staged in the same batch: an import never
//!   leaves an identity without the tags and desired properties its line gave.
//! - An id named twice in one request is refused for its later items.

use ferrohub_migrations::cf;

use super::Txn;
use crate::error::{RegistryError, ValidationError};
use crate::keys;
use crate::model::{next_etag, Identity, IdentitySpec, IfMatch, UnixMillis, MAX_BULK_IDENTITIES};
use crate::notifications::{NotificationOp, PendingNotification};
use crate::twin::limits::{check_section, check_size, SectionKind};
use crate::twin::store::TwinWrite;
use crate::Store;

/// What a bulk item asks for (the `importMode` of IoT Hub).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ImportMode {
    Create,
    Update,
    UpdateIfMatchETag,
    CreateOrUpdate,
    CreateOrUpdateIfMatchETag,
    Delete,
    DeleteIfMatchETag,
}

/// One item of a bulk registry request.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BulkItem {
    pub device_id: String,
    pub module_id: Option<String>,
    pub mode: ImportMode,
    pub etag: Option<String>,
    pub spec: IdentitySpec,
    /// Tags and desired properties that replace the identity's (import jobs); applied in the
    /// same batch as the identity, so an import never leaves an identity without its twin.
    pub twin: Option<TwinWrite>,
}

/// Why one bulk item was not applied.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct BulkItemError {
    pub device_id: String,
    pub module_id: Option<String>,
    pub mode: ImportMode,
    pub error: RegistryError,
}

/// The TWN-7 checks of a whole-section replacement.
fn check_twin_write(write: &TwinWrite) -> Result<(), ValidationError> {
    if let Some(tags) = &write.tags {
        check_section(SectionKind::Tags, tags, false)?;
        check_size(SectionKind::Tags, tags)?;
    }
    if let Some(desired) = &write.desired {
        check_section(SectionKind::Desired, desired, false)?;
        check_size(SectionKind::Desired, desired)?;
    }
    Ok(())
}

impl Txn<'_> {
    pub(super) fn apply_bulk_item(
        &mut self,
        item: &BulkItem,
        now: UnixMillis,
    ) -> Result<(), RegistryError> {
        use ImportMode::*;
        let etag_match = || match &item.etag {
            Some(e) => Ok(IfMatch::Etag(e.clone())),
            None => Err(RegistryError::Invalid(ValidationError::new(
                "eTag",
                "is required for this importMode",
            ))),
        };
        let d = item.device_id.as_str();
        // The twin is checked before anything is staged: a refused item must leave no trace.
        if let Some(twin) = &item.twin {
            check_twin_write(twin)?;
        }
        // createOrUpdate modes resolve to create or update by what exists now.
        let exists = match &item.module_id {
            None => self.device(d)?.is_some(),
            Some(m) => self.module(d, m)?.is_some(),
        };
        let mode = match (item.mode, exists) {
            (CreateOrUpdate | CreateOrUpdateIfMatchETag, false) => Create,
            (CreateOrUpdate, true) => Update,
            (CreateOrUpdateIfMatchETag, true) => UpdateIfMatchETag,
            (mode, _) => mode,
        };
        let written = match (&item.module_id, mode) {
            (None, Create) => self.create_device(d, &item.spec, now).map(Some),
            (None, Update) => self
                .update_device(d, &item.spec, &IfMatch::Any, now)
                .map(Some),
            (None, UpdateIfMatchETag) => self
                .update_device(d, &item.spec, &etag_match()?, now)
                .map(Some),
            (None, Delete) => self.delete_device(d, &IfMatch::Any, now).map(|()| None),
            (None, DeleteIfMatchETag) => self.delete_device(d, &etag_match()?, now).map(|()| None),
            (Some(m), Create) => self.create_module(d, m, &item.spec, now).map(Some),
            (Some(m), Update) => self
                .update_module(d, m, &item.spec, &IfMatch::Any)
                .map(Some),
            (Some(m), UpdateIfMatchETag) => self
                .update_module(d, m, &item.spec, &etag_match()?)
                .map(Some),
            (Some(m), Delete) => self.delete_module(d, m, &IfMatch::Any, now).map(|()| None),
            (Some(m), DeleteIfMatchETag) => {
                self.delete_module(d, m, &etag_match()?, now).map(|()| None)
            }
            (_, CreateOrUpdate | CreateOrUpdateIfMatchETag) => unreachable!("resolved above"),
        }?;
        if let (Some(identity), Some(twin)) = (written, &item.twin) {
            self.stage_twin_replace(&identity, twin, now)?;
        }
        Ok(())
    }

    /// Replaces tags and/or desired properties of an identity written in this transaction.
    pub(super) fn stage_twin_replace(
        &mut self,
        identity: &Identity,
        write: &TwinWrite,
        now: UnixMillis,
    ) -> Result<(), RegistryError> {
        if write.tags.is_none() && write.desired.is_none() {
            return Ok(());
        }
        let mut record = self.store.load_twin_record(identity)?;
        let digital_before = self.store.digital_view_before(&identity.device_id, &record);
        if let Some(tags) = &write.tags {
            record.tags = tags.clone();
        }
        if let Some(desired) = &write.desired {
            record.desired.replace(desired, now);
        }
        record.version += 1;
        record.etag = next_etag(Some(&record.etag));
        let module_id = identity.module_id.as_deref();
        self.batch.put_record(
            cf::TWINS,
            keys::twin(&identity.device_id, module_id),
            &record,
        );
        let mut body = crate::twin::changes::whole_twin(identity, &record, true);
        body.insert("version".into(), serde_json::Value::from(record.version));
        self.notes.push(PendingNotification {
            device_id: identity.device_id.clone(),
            module_id: module_id.map(str::to_string),
            op: NotificationOp::ReplaceTwin,
            time: now,
            body,
        });
        self.notes.extend(crate::twin::changes::digital_twin_change(
            (&identity.device_id, module_id),
            digital_before,
            &record,
            NotificationOp::ReplaceTwin,
            now,
        ));
        Ok(())
    }
}

impl Store {
    /// Applies many registry changes in one atomic commit. Items that fail are left out and
    /// reported; the others are applied. An id named twice is refused for its later items.
    ///
    /// # Errors
    /// [`RegistryError::TooManyInBulk`] (nothing applied) or storage errors (nothing applied).
    pub fn bulk(
        &self,
        items: &[BulkItem],
        now: UnixMillis,
    ) -> Result<Vec<BulkItemError>, RegistryError> {
        if items.len() > MAX_BULK_IDENTITIES {
            return Err(RegistryError::TooManyInBulk {
                count: items.len(),
                max: MAX_BULK_IDENTITIES,
            });
        }
        self.import_batch(items, now)
    }

    /// [`Store::bulk`] without the request-size limit, for import jobs: one commit per call,
    /// so the caller chooses how many lines share a sync.
    ///
    /// # Errors
    /// Storage errors (nothing applied).
    pub fn import_batch(
        &self,
        items: &[BulkItem],
        now: UnixMillis,
    ) -> Result<Vec<BulkItemError>, RegistryError> {
        let _guards = self
            .stripes
            .lock_many(items.iter().map(|i| i.device_id.as_str()));
        let mut txn = Txn::new(self);
        let mut errors = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for item in items {
            let result = if !seen.insert((item.device_id.clone(), item.module_id.clone())) {
                Err(RegistryError::Invalid(ValidationError::new(
                    "id",
                    format!("{} appears more than once in the request", item.device_id),
                )))
            } else {
                txn.apply_bulk_item(item, now)
            };
            if let Err(error) = result {
                if let RegistryError::Storage(e) = error {
                    return Err(RegistryError::Storage(e));
                }
                errors.push(BulkItemError {
                    device_id: item.device_id.clone(),
                    module_id: item.module_id.clone(),
                    mode: item.mode,
                    error,
                });
            }
        }
        txn.commit()?;
        Ok(errors)
    }
}
