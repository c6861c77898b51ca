//! Twins stored with their identities (TWN-1..TWN-5): read, service-side patch and replace of
//! tags and desired properties with the twin etag, and device-side reported patches.
//!
//! # Invariants
//! - A twin lives exactly as long as its identity: deleting a device or module deletes its twin
//!   record in the same batch; an identity without a record has the empty twin.
//! - Every change raises the twin `version` by one and gives a new `etag`; the changed section's
//!   `$version` rises by one (tags have no version of their own).
//! - Nothing is stored unless the whole change passes the TWN-7 limits, sizes computed on the
//!   result.
//! - Read-modify-write runs under the device's stripe lock, like every registry write, and
//!   builds on the last twin written: durable, or queued by a pipelined reported patch
//!   ([`Store::patch_reported_then`]) whose sync has not finished. Readers see durable twins
//!   only, and no write is answered before its sync.

use serde_json::{Map, Value};

use ferrohub_migrations::cf;

use super::changes;
use super::limits::{check_section, check_size, SectionKind};
pub use super::record::{Twin, TwinRecord};
use crate::error::{StorageError, TwinError};
use crate::keys;
use crate::model::{next_etag, Identity, IfMatch, UnixMillis};
use crate::notifications::{NotificationOp as TwinOp, PendingNotification};
use crate::raw::Batch;
use crate::Store;

/// What a service-side write asks for: `None` leaves a part alone.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct TwinWrite {
    pub tags: Option<Map<String, Value>>,
    pub desired: Option<Map<String, Value>>,
}

/// The result of a write, with what changed in desired (for notifications).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TwinOutcome {
    pub twin: Twin,
    /// The desired change as the service sent it, with the new desired version; `None` when
    /// desired did not change.
    pub desired_change: Option<(Map<String, Value>, u64)>,
}

/// What a change did: the desired change to notify, the operation, and the change record's
/// body (without `version`, added once the twin version is known).
pub(super) struct Applied {
    pub(super) desired_change: Option<(Map<String, Value>, u64)>,
    pub(super) op: TwinOp,
    pub(super) body: Map<String, Value>,
    /// The change touched the reported section and nothing else of the record (a device's
    /// patch); the twin index hook then reads nothing unless reported paths are indexed.
    pub(super) reported_only: bool,
}

impl Store {
    pub(super) fn load_identity(
        &self,
        device_id: &str,
        module_id: Option<&str>,
    ) -> Result<Identity, TwinError> {
        self.find_identity(device_id, module_id)?
            .ok_or_else(|| TwinError::NotFound {
                device_id: device_id.to_string(),
                module_id: module_id.map(str::to_string),
            })
    }

    /// The twin record a write of `identity` builds on: the last one written, durable or
    /// still in a pipelined batch. The caller holds the device's stripe lock.
    pub(crate) fn load_twin_record(&self, identity: &Identity) -> Result<TwinRecord, StorageError> {
        let key = keys::twin(&identity.device_id, identity.module_id.as_deref());
        let stored = self.raw.get_for_update::<TwinRecord>(cf::TWINS, &key)?;
        Ok(stored.unwrap_or_else(|| empty_twin(identity)))
    }

    /// The durable twin record of `identity`, for readers.
    fn read_twin_record(&self, identity: &Identity) -> Result<TwinRecord, StorageError> {
        let key = keys::twin(&identity.device_id, identity.module_id.as_deref());
        let stored = self.raw.get_record::<TwinRecord>(cf::TWINS, &key)?;
        Ok(stored.unwrap_or_else(|| empty_twin(identity)))
    }

    /// The twin of a device (`module_id` `None`) or module.
    ///
    /// # Errors
    /// [`TwinError::NotFound`] or storage errors.
    pub fn get_twin(&self, device_id: &str, module_id: Option<&str>) -> Result<Twin, TwinError> {
        let identity = self.load_identity(device_id, module_id)?;
        let record = self.read_twin_record(&identity)?;
        Ok(Twin { identity, record })
    }

    fn write_twin(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        if_match: &IfMatch,
        change: impl FnOnce(&mut TwinRecord, UnixMillis) -> Result<Applied, TwinError>,
        now: UnixMillis,
    ) -> Result<TwinOutcome, TwinError> {
        let _guard = self.stripes.lock(device_id);
        let identity = self.load_identity(device_id, module_id)?;
        let mut batch = Batch::default();
        let (notes, outcome) = self.stage_twin(identity, if_match, change, now, &mut batch)?;
        self.commit_with_notifications(batch, notes)?;
        Ok(outcome)
    }

    /// Applies `change` to the stored twin of `identity` and stages the new record in
    /// `batch`; returns the change notifications to commit with it. The caller holds the
    /// device's stripe lock.
    pub(super) fn stage_twin(
        &self,
        identity: Identity,
        if_match: &IfMatch,
        change: impl FnOnce(&mut TwinRecord, UnixMillis) -> Result<Applied, TwinError>,
        now: UnixMillis,
        batch: &mut Batch,
    ) -> Result<(Vec<PendingNotification>, TwinOutcome), TwinError> {
        let mut record = self.load_twin_record(&identity)?;
        let digital_before = self.digital_view_before(&identity.device_id, &record);
        let (notes, desired_change) = stage_change(
            (&identity.device_id, identity.module_id.as_deref()),
            &mut record,
            if_match,
            change,
            now,
            batch,
            |record| changes::whole_twin(&identity, record, true),
            digital_before,
        )?;
        Ok((
            notes,
            TwinOutcome {
                twin: Twin { identity, record },
                desired_change,
            },
        ))
    }

    /// Stages a device's reported patch in `batch`; returns the change notification and the
    /// new reported `$version`. The caller holds the device's stripe lock.
    ///
    /// A twin record lives exactly as long as its identity, so a record that exists vouches
    /// for the identity, which is then not read (nor the queue depth read with it): only a
    /// twin without a record yet needs the identity, for NotFound and the initial etag.
    fn stage_reported(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        patch: &Map<String, Value>,
        now: UnixMillis,
        batch: &mut Batch,
    ) -> Result<(Vec<PendingNotification>, u64), TwinError> {
        let key = keys::twin(device_id, module_id);
        let mut record = match self.raw.get_for_update::<TwinRecord>(cf::TWINS, &key)? {
            Some(record) => record,
            None => empty_twin(&self.load_identity(device_id, module_id)?),
        };
        let digital_before = self.digital_view_before(device_id, &record);
        let (notes, _) = stage_change(
            (device_id, module_id),
            &mut record,
            &IfMatch::Any,
            reported_change(patch),
            now,
            batch,
            // A reported patch is an update, never a replacement.
            |_| Map::new(),
            digital_before,
        )?;
        Ok((notes, record.reported.version))
    }

    /// Stages a service-side patch of `identity`'s twin in `batch` (for writers that commit
    /// many twins at once, under the stripe locks they hold). `write` was checked with
    /// [`TwinWrite::check_patch`].
    ///
    /// # Errors
    /// [`TwinError::Invalid`] when the result breaks the TWN-7 limits, or storage.
    pub(crate) fn stage_twin_patch(
        &self,
        identity: Identity,
        write: &TwinWrite,
        now: UnixMillis,
        batch: &mut Batch,
    ) -> Result<(Vec<PendingNotification>, TwinOutcome), TwinError> {
        self.stage_twin(
            identity,
            &IfMatch::Any,
            service_change(write, true),
            now,
            batch,
        )
    }

    /// Service-side partial update (PATCH): tags and desired merge (`null` removes).
    ///
    /// # Errors
    /// Not found, [`TwinError::EtagMismatch`], [`TwinError::Invalid`] (TWN-7) or storage;
    /// on any error nothing is stored.
    pub fn update_twin(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        write: &TwinWrite,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<TwinOutcome, TwinError> {
        self.service_write(device_id, module_id, write, if_match, now, true)
    }

    /// Service-side replacement (PUT): the given parts replace tags and desired whole.
    ///
    /// # Errors
    /// As [`Store::update_twin`].
    pub fn replace_twin(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        write: &TwinWrite,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<TwinOutcome, TwinError> {
        self.service_write(device_id, module_id, write, if_match, now, false)
    }

    /// `merge`: a patch (`null` removes); otherwise the given parts are replaced.
    fn service_write(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        write: &TwinWrite,
        if_match: &IfMatch,
        now: UnixMillis,
        merge: bool,
    ) -> Result<TwinOutcome, TwinError> {
        write.check(merge)?;
        self.write_twin(
            device_id,
            module_id,
            if_match,
            service_change(write, merge),
            now,
        )
    }

    /// Device-side reported patch; returns the new reported `$version`.
    ///
    /// # Errors
    /// Not found, [`TwinError::Invalid`] (TWN-7) or storage; on error nothing is stored.
    pub fn patch_reported(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        patch: &Map<String, Value>,
        now: UnixMillis,
    ) -> Result<u64, TwinError> {
        check_section(SectionKind::Reported, patch, true)?;
        let _guard = self.stripes.lock(device_id);
        let mut batch = Batch::default();
        let (notes, version) = self.stage_reported(device_id, module_id, patch, now, &mut batch)?;
        self.commit_with_notifications(batch, notes)?;
        Ok(version)
    }

    /// Device-side reported patch without waiting for its sync: the patch is checked, applied
    /// and queued for the group committer, and `done` gets the new reported `$version` on the
    /// commit thread once it is durable (or the storage error that lost it). The next write of
    /// the same twin builds on this one at once, so a device's patches share syncs as its
    /// telemetry does.
    ///
    /// # Errors
    /// Not found, [`TwinError::Invalid`] (TWN-7) or storage, before anything is queued; `done`
    /// is then dropped unrun. Without waiting (`Store::without_waiting`) the device's stripe
    /// is only tried.
    pub fn patch_reported_then(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        patch: &Map<String, Value>,
        now: UnixMillis,
        done: impl FnOnce(Result<u64, StorageError>) + Send + 'static,
    ) -> Result<(), TwinError> {
        check_section(SectionKind::Reported, patch, true)?;
        let _guard = self.stripes.lock_unless_waiting(device_id)?;
        let mut batch = Batch::default();
        let (notes, version) = self.stage_reported(device_id, module_id, patch, now, &mut batch)?;
        self.submit_with_notifications_then(batch, notes, move |r| done(r.map(|()| version)))?;
        Ok(())
    }
}

/// Applies `change` to `record`, the twin of `ids` (device, module) a write builds on, and
/// stages the result in `batch`: checked against the TWN-7 limits, with the next version and
/// etag. Returns the change notifications (the twin's, then for a Plug and Play twin whose
/// digital twin changed, the digital twin's) and the desired change. `whole_twin` gives the
/// body of a replacement's notification.
fn stage_change(
    (device_id, module_id): (&str, Option<&str>),
    record: &mut TwinRecord,
    if_match: &IfMatch,
    change: impl FnOnce(&mut TwinRecord, UnixMillis) -> Result<Applied, TwinError>,
    now: UnixMillis,
    batch: &mut Batch,
    whole_twin: impl FnOnce(&TwinRecord) -> Map<String, Value>,
    digital_before: Option<Map<String, Value>>,
) -> Result<(Vec<PendingNotification>, Option<(Map<String, Value>, u64)>), TwinError> {
    if_match.check(&record.etag)?;
    let Applied {
        desired_change,
        op,
        mut body,
        reported_only,
    } = change(record, now)?;
    check_size(SectionKind::Tags, &record.tags)?;
    check_size(SectionKind::Desired, &record.desired.body)?;
    check_size(SectionKind::Reported, &record.reported.body)?;
    record.version += 1;
    record.etag = next_etag(Some(&record.etag));
    if op == TwinOp::ReplaceTwin {
        // replaceTwin carries the whole twin with its ids and new etag (seed 004).
        body = whole_twin(record);
    }
    body.insert("version".into(), Value::from(record.version));
    let key = keys::twin(device_id, module_id);
    batch.put_record(cf::TWINS, key.clone(), &*record);
    batch.note_twin_write(&key, reported_only);
    let mut notes = vec![PendingNotification {
        device_id: device_id.to_string(),
        module_id: module_id.map(str::to_string),
        op,
        time: now,
        body,
    }];
    notes.extend(changes::digital_twin_change(
        (device_id, module_id),
        digital_before,
        record,
        op,
        now,
    ));
    Ok((notes, desired_change))
}

/// The change a device's reported patch makes.
fn reported_change(
    patch: &Map<String, Value>,
) -> impl FnOnce(&mut TwinRecord, UnixMillis) -> Result<Applied, TwinError> + '_ {
    move |r, now| {
        r.reported.patch(patch, now);
        let mut properties = Map::new();
        properties.insert(
            "reported".into(),
            changes::changed_section(&r.reported, patch, false),
        );
        let mut body = Map::new();
        body.insert("properties".into(), Value::Object(properties));
        Ok(Applied {
            desired_change: None,
            op: TwinOp::UpdateTwin,
            body,
            reported_only: true,
        })
    }
}

/// The change a service-side write makes: `merge` patches (`null` removes), otherwise the
/// given parts are replaced.
pub(super) fn service_change(
    write: &TwinWrite,
    merge: bool,
) -> impl FnOnce(&mut TwinRecord, UnixMillis) -> Result<Applied, TwinError> + '_ {
    move |r, now| {
        let mut body = Map::new();
        let mut properties = Map::new();
        if let Some(t) = &write.tags {
            if merge {
                merge_plain(&mut r.tags, t);
            } else {
                r.tags = t.clone();
            }
        }
        let desired_change = write.desired.as_ref().map(|d| {
            let version = if merge {
                r.desired.patch(d, now)
            } else {
                r.desired.replace(d, now)
            };
            (d.clone(), version)
        });
        if merge {
            if let Some(t) = &write.tags {
                body.insert("tags".into(), Value::Object(t.clone()));
            }
            if let Some(d) = &write.desired {
                properties.insert(
                    "desired".into(),
                    changes::changed_section(&r.desired, d, true),
                );
            }
        }
        // replaceTwin's body is built once the new etag and version are known.
        if !properties.is_empty() {
            body.insert("properties".into(), Value::Object(properties));
        }
        let op = if merge {
            TwinOp::UpdateTwin
        } else {
            TwinOp::ReplaceTwin
        };
        Ok(Applied {
            desired_change,
            op,
            body,
            reported_only: false,
        })
    }
}

impl TwinWrite {
    /// Checks the parts of a patch against the TWN-7 limits (depth, names, values).
    ///
    /// # Errors
    /// [`TwinError::Invalid`].
    pub fn check_patch(&self) -> Result<(), TwinError> {
        self.check(true)
    }

    fn check(&self, merge: bool) -> Result<(), TwinError> {
        if let Some(t) = &self.tags {
            check_section(SectionKind::Tags, t, merge)?;
        }
        if let Some(d) = &self.desired {
            check_section(SectionKind::Desired, d, merge)?;
        }
        Ok(())
    }
}

/// The twin of an identity that has no record yet.
fn empty_twin(identity: &Identity) -> TwinRecord {
    TwinRecord {
        etag: initial_etag(identity),
        model_id: identity.model_id.clone(),
        ..TwinRecord::empty(identity.status_updated_time)
    }
}

/// The etag of a twin that has no record yet: stable for the identity's generation.
fn initial_etag(identity: &Identity) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{}:1", identity.generation_id))
}

/// Merge-patch for tags (no metadata): `null` removes, objects merge, anything else replaces.
fn merge_plain(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(inner) => {
                let slot = target
                    .entry(k.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Value::Object(child) = slot {
                    merge_plain(child, inner);
                }
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
}
