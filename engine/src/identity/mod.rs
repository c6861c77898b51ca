//! The identity registry (REG-1..REG-5): devices and their modules.
//!
//! Every operation runs as a [`Txn`]: reads go through an overlay of what the operation has
//! already decided, writes are staged in one [`Batch`] with the statistics deltas, and the batch
//! commits atomically through the group committer. Single operations are transactions of one
//! step; a bulk request is one transaction of many steps whose failures are reported per item.
//!
//! # Invariants
//! - A device's modules never outlive it: deleting a device deletes them in the same batch.
//! - A device has at most [`MAX_MODULES_PER_DEVICE`] modules.
//! - The `counters` column family equals the counts of stored devices by status, because
//!   every change of a device's existence or status stages its delta in the same batch.
//! - The device's stripe lock is held from the first read until the commit returns, or, for
//!   a pipelined connection-state write ([`Store::record_connection_then`]), until the batch is
//!   queued: reads go through `raw::inflight`, so the next writer builds on it.

use std::collections::HashMap;

use ferrohub_migrations::cf;
use ferrohub_migrations::m0002_registry_counters::{DeviceCounters, DEVICE_COUNTERS_KEY};

use crate::error::{RegistryError, StorageError};
use crate::keys;
use crate::model::{
    new_generation_id, next_etag, validate_id, ConnectionState, Identity, IdentitySpec, IfMatch,
    Status, UnixMillis, MAX_MODULES_PER_DEVICE,
};
use crate::notifications::{NotificationOp, PendingNotification};
use crate::raw::Batch;
use crate::twin::record::TwinRecord;
use crate::Store;

mod bulk;
mod provisioned;

pub use provisioned::Assignment;
mod activity;
mod model_id;
pub use bulk::{BulkItem, BulkItemError, ImportMode};

/// Registry statistics (`GET /statistics/devices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegistryStatistics {
    pub total_device_count: u64,
    pub enabled_device_count: u64,
    pub disabled_device_count: u64,
}

fn counters_for(status: Status) -> DeviceCounters {
    match status {
        Status::Enabled => DeviceCounters {
            total: 1,
            enabled: 1,
            disabled: 0,
        },
        Status::Disabled => DeviceCounters {
            total: 1,
            enabled: 0,
            disabled: 1,
        },
    }
}

fn sub(a: DeviceCounters, b: DeviceCounters) -> DeviceCounters {
    DeviceCounters {
        total: a.total - b.total,
        enabled: a.enabled - b.enabled,
        disabled: a.disabled - b.disabled,
    }
}

fn add(a: DeviceCounters, b: DeviceCounters) -> DeviceCounters {
    DeviceCounters {
        total: a.total + b.total,
        enabled: a.enabled + b.enabled,
        disabled: a.disabled + b.disabled,
    }
}

/// A registry transaction: overlay + staged batch.
struct Txn<'a> {
    store: &'a Store,
    batch: Batch,
    devices: HashMap<String, Option<Identity>>,
    modules: HashMap<(String, String), Option<Identity>>,
    counters: DeviceCounters,
    /// Lifecycle and connection notifications committed with the batch.
    notes: Vec<PendingNotification>,
}

impl<'a> Txn<'a> {
    fn new(store: &'a Store) -> Self {
        Txn {
            store,
            batch: Batch::default(),
            devices: HashMap::new(),
            modules: HashMap::new(),
            counters: DeviceCounters::default(),
            notes: Vec::new(),
        }
    }

    fn device(&mut self, id: &str) -> Result<Option<Identity>, StorageError> {
        if let Some(d) = self.devices.get(id) {
            return Ok(d.clone());
        }
        let d: Option<Identity> = self
            .store
            .raw
            .get_for_update(cf::DEVICES, &keys::device(id))?;
        self.devices.insert(id.to_string(), d.clone());
        Ok(d)
    }

    fn module(
        &mut self,
        device_id: &str,
        module_id: &str,
    ) -> Result<Option<Identity>, StorageError> {
        let k = (device_id.to_string(), module_id.to_string());
        if let Some(m) = self.modules.get(&k) {
            return Ok(m.clone());
        }
        let m: Option<Identity> = self
            .store
            .raw
            .get_for_update(cf::MODULES, &keys::module(device_id, module_id))?;
        self.modules.insert(k, m.clone());
        Ok(m)
    }

    /// Module ids of a device as this transaction sees them.
    fn module_ids(&mut self, device_id: &str) -> Result<Vec<String>, StorageError> {
        let prefix = keys::modules_of(device_id);
        let mut ids = Vec::new();
        self.store.raw.scan_records::<Identity>(
            cf::MODULES,
            &prefix,
            keys::prefix_end(&prefix),
            |_, m| {
                if let Some(mid) = m.module_id {
                    ids.push(mid);
                }
                true
            },
        )?;
        for ((dev, mid), m) in &self.modules {
            if dev == device_id {
                match m {
                    Some(_) if !ids.contains(mid) => ids.push(mid.clone()),
                    None => ids.retain(|x| x != mid),
                    _ => {}
                }
            }
        }
        Ok(ids)
    }

    fn put_device(&mut self, previous: Option<&Identity>, device: Identity) {
        let before = previous.map(|p| counters_for(p.status)).unwrap_or_default();
        self.counters = add(self.counters, sub(counters_for(device.status), before));
        self.batch
            .put_record(cf::DEVICES, keys::device(&device.device_id), &device);
        self.devices.insert(device.device_id.clone(), Some(device));
    }

    fn put_module(&mut self, module: Identity) {
        let mid = module.module_id.clone().unwrap_or_default();
        self.batch
            .put_record(cf::MODULES, keys::module(&module.device_id, &mid), &module);
        self.modules
            .insert((module.device_id.clone(), mid), Some(module));
    }

    fn create_device(
        &mut self,
        id: &str,
        spec: &IdentitySpec,
        now: UnixMillis,
    ) -> Result<Identity, RegistryError> {
        validate_id("deviceId", id)?;
        spec.validate()?;
        if self.device(id)?.is_some() {
            return Err(RegistryError::DeviceAlreadyExists(id.to_string()));
        }
        let device = Identity {
            device_id: id.to_string(),
            module_id: None,
            generation_id: new_generation_id(),
            etag: next_etag(None),
            status: spec.status,
            status_reason: spec.status_reason.clone(),
            status_updated_time: now,
            connection_state: ConnectionState::Disconnected,
            connection_state_updated_time: None,
            last_activity_time: None,
            cloud_to_device_message_count: 0,
            authentication: spec.authentication(None),
            iot_edge: spec.iot_edge,
            device_scope: spec.device_scope.clone(),
            parent_scopes: spec.parent_scopes.clone(),
            managed_by: None,
            model_id: None,
        };
        self.put_device(None, device.clone());
        let twin = self.new_twin(&device)?;
        self.note_lifecycle(&device, &twin, NotificationOp::CreateDeviceIdentity, now);
        Ok(device)
    }

    fn update_device(
        &mut self,
        id: &str,
        spec: &IdentitySpec,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<Identity, RegistryError> {
        spec.validate()?;
        let current = self
            .device(id)?
            .ok_or_else(|| RegistryError::DeviceNotFound(id.to_string()))?;
        if_match.check(&current.etag)?;
        let mut next = current.clone();
        if next.status != spec.status {
            next.status_updated_time = now;
        }
        next.status = spec.status;
        next.status_reason = spec.status_reason.clone();
        next.authentication = spec.authentication(Some(&current.authentication));
        next.iot_edge = spec.iot_edge;
        next.device_scope = spec.device_scope.clone();
        next.parent_scopes = spec.parent_scopes.clone();
        next.etag = next_etag(Some(&current.etag));
        self.put_device(Some(&current), next.clone());
        Ok(next)
    }

    fn delete_device(
        &mut self,
        id: &str,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<(), RegistryError> {
        let current = self
            .device(id)?
            .ok_or_else(|| RegistryError::DeviceNotFound(id.to_string()))?;
        if_match.check(&current.etag)?;
        let twin = self.store.load_twin_record(&current)?;
        self.note_lifecycle(&current, &twin, NotificationOp::DeleteDeviceIdentity, now);
        self.batch.delete(cf::SESSIONS, id.as_bytes().to_vec());
        self.batch.delete(cf::TWINS, keys::twin(id, None));
        self.store.stage_queue_deletion(&mut self.batch, id)?;
        for mid in self.module_ids(id)? {
            if let Some(module) = self.module(id, &mid)? {
                let twin = self.store.load_twin_record(&module)?;
                self.note_lifecycle(&module, &twin, NotificationOp::DeleteDeviceIdentity, now);
            }
            self.batch
                .delete(cf::SESSIONS, format!("{id}/{mid}").into_bytes());
            self.batch.delete(cf::TWINS, keys::twin(id, Some(&mid)));
            self.batch.delete(cf::MODULES, keys::module(id, &mid));
            self.modules.insert((id.to_string(), mid), None);
        }
        self.counters = sub(self.counters, counters_for(current.status));
        self.batch.delete(cf::DEVICES, keys::device(id));
        self.devices.insert(id.to_string(), None);
        Ok(())
    }

    fn create_module(
        &mut self,
        device_id: &str,
        module_id: &str,
        spec: &IdentitySpec,
        now: UnixMillis,
    ) -> Result<Identity, RegistryError> {
        validate_id("moduleId", module_id)?;
        spec.validate()?;
        let device = self
            .device(device_id)?
            .ok_or_else(|| RegistryError::DeviceNotFound(device_id.to_string()))?;
        if self.module(device_id, module_id)?.is_some() {
            return Err(RegistryError::ModuleAlreadyExists {
                device_id: device_id.into(),
                module_id: module_id.into(),
            });
        }
        if self.module_ids(device_id)?.len() >= MAX_MODULES_PER_DEVICE {
            return Err(RegistryError::TooManyModules {
                device_id: device_id.into(),
                max: MAX_MODULES_PER_DEVICE,
            });
        }
        let module = Identity {
            device_id: device.device_id.clone(),
            module_id: Some(module_id.to_string()),
            generation_id: new_generation_id(),
            etag: next_etag(None),
            status: Status::Enabled,
            status_reason: None,
            status_updated_time: now,
            connection_state: ConnectionState::Disconnected,
            connection_state_updated_time: None,
            last_activity_time: None,
            cloud_to_device_message_count: 0,
            authentication: spec.authentication(None),
            iot_edge: false,
            device_scope: None,
            parent_scopes: Vec::new(),
            managed_by: spec.managed_by.clone(),
            model_id: None,
        };
        self.put_module(module.clone());
        let twin = self.new_twin(&module)?;
        self.note_lifecycle(&module, &twin, NotificationOp::CreateDeviceIdentity, now);
        Ok(module)
    }

    fn update_module(
        &mut self,
        device_id: &str,
        module_id: &str,
        spec: &IdentitySpec,
        if_match: &IfMatch,
    ) -> Result<Identity, RegistryError> {
        spec.validate()?;
        let current =
            self.module(device_id, module_id)?
                .ok_or_else(|| RegistryError::ModuleNotFound {
                    device_id: device_id.into(),
                    module_id: module_id.into(),
                })?;
        if_match.check(&current.etag)?;
        let mut next = current.clone();
        next.authentication = spec.authentication(Some(&current.authentication));
        next.managed_by = spec.managed_by.clone();
        next.etag = next_etag(Some(&current.etag));
        self.put_module(next.clone());
        Ok(next)
    }

    fn delete_module(
        &mut self,
        device_id: &str,
        module_id: &str,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<(), RegistryError> {
        let current =
            self.module(device_id, module_id)?
                .ok_or_else(|| RegistryError::ModuleNotFound {
                    device_id: device_id.into(),
                    module_id: module_id.into(),
                })?;
        if_match.check(&current.etag)?;
        let twin = self.store.load_twin_record(&current)?;
        self.note_lifecycle(&current, &twin, NotificationOp::DeleteDeviceIdentity, now);
        self.batch.delete(
            cf::SESSIONS,
            format!("{device_id}/{module_id}").into_bytes(),
        );
        self.batch
            .delete(cf::TWINS, keys::twin(device_id, Some(module_id)));
        self.batch
            .delete(cf::MODULES, keys::module(device_id, module_id));
        self.modules
            .insert((device_id.to_string(), module_id.to_string()), None);
        Ok(())
    }

    fn commit(mut self) -> Result<(), StorageError> {
        self.batch
            .merge_counters(DEVICE_COUNTERS_KEY, self.counters);
        self.store.commit_with_notifications(self.batch, self.notes)
    }

    /// Queues the batch without waiting; `done` runs once it is durable (at once if there is
    /// nothing to write).
    fn submit_pipelined(
        mut self,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<(), StorageError> {
        self.batch
            .merge_counters(DEVICE_COUNTERS_KEY, self.counters);
        if self.batch.is_empty() && self.notes.is_empty() {
            done(Ok(()));
            return Ok(());
        }
        self.store
            .submit_with_notifications_then(self.batch, self.notes, done)
    }

    /// Records a lifecycle notification whose body is the identity's twin.
    fn note_lifecycle(
        &mut self,
        identity: &Identity,
        twin: &TwinRecord,
        op: NotificationOp,
        now: UnixMillis,
    ) {
        self.notes.push(PendingNotification {
            device_id: identity.device_id.clone(),
            module_id: identity.module_id.clone(),
            op,
            time: now,
            body: crate::twin::changes::whole_twin(identity, twin, false),
        });
    }

    /// The twin a new identity starts with.
    fn new_twin(&self, identity: &Identity) -> Result<TwinRecord, StorageError> {
        self.store.load_twin_record(identity)
    }
}

impl Store {
    fn in_txn<T>(
        &self,
        device_id: &str,
        f: impl FnOnce(&mut Txn<'_>) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        let _guard = self.stripes.lock(device_id);
        let mut txn = Txn::new(self);
        let out = f(&mut txn)?;
        txn.commit()?;
        Ok(out)
    }

    /// Registers a new device; keys are generated when not supplied.
    ///
    /// # Errors
    /// [`RegistryError::Invalid`], [`RegistryError::DeviceAlreadyExists`] or storage errors.
    pub fn create_device(
        &self,
        device_id: &str,
        spec: &IdentitySpec,
        now: UnixMillis,
    ) -> Result<Identity, RegistryError> {
        self.in_txn(device_id, |t| t.create_device(device_id, spec, now))
    }

    /// Replaces the settable properties of a device, if `if_match` holds.
    ///
    /// # Errors
    /// [`RegistryError::DeviceNotFound`], [`RegistryError::EtagMismatch`], validation or storage.
    pub fn update_device(
        &self,
        device_id: &str,
        spec: &IdentitySpec,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<Identity, RegistryError> {
        self.in_txn(device_id, |t| {
            t.update_device(device_id, spec, if_match, now)
        })
    }

    /// Deletes a device and its modules, if `if_match` holds.
    ///
    /// # Errors
    /// [`RegistryError::DeviceNotFound`], [`RegistryError::EtagMismatch`] or storage errors.
    pub fn delete_device(
        &self,
        device_id: &str,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<(), RegistryError> {
        self.in_txn(device_id, |t| t.delete_device(device_id, if_match, now))
    }

    /// # Errors
    /// [`RegistryError::DeviceNotFound`] or storage errors (corruption included).
    pub fn get_device(&self, device_id: &str) -> Result<Identity, RegistryError> {
        self.find_identity(device_id, None)?
            .ok_or_else(|| RegistryError::DeviceNotFound(device_id.to_string()))
    }

    /// A device (`module_id` `None`) or module as [`Store::get_device`] and
    /// [`Store::get_module`] return it, or `None` when it is not registered: for callers that
    /// report "not found" in their own error type.
    pub(crate) fn find_identity(
        &self,
        device_id: &str,
        module_id: Option<&str>,
    ) -> Result<Option<Identity>, StorageError> {
        match module_id {
            None => self
                .raw
                .get_for_update(cf::DEVICES, &keys::device(device_id))?
                .map(|device| self.with_queue_depth(device))
                .transpose(),
            Some(m) => self
                .raw
                .get_for_update(cf::MODULES, &keys::module(device_id, m)),
        }
    }

    /// `cloudToDeviceMessageCount` is the device's C2D queue depth now; it is read with the
    /// identity, never stored in it.
    fn with_queue_depth(&self, mut device: Identity) -> Result<Identity, StorageError> {
        if device.module_id.is_none() {
            device.cloud_to_device_message_count = self.c2d_depth(&device.device_id)?;
        }
        Ok(device)
    }

    /// Up to `limit` devices in id order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_devices(&self, limit: usize) -> Result<Vec<Identity>, RegistryError> {
        let mut out = Vec::new();
        self.raw
            .scan_records::<Identity>(cf::DEVICES, &[], None, |_, d| {
                out.push(d);
                out.len() < limit
            })?;
        out.into_iter()
            .map(|d| self.with_queue_depth(d).map_err(RegistryError::from))
            .collect()
    }

    /// Counts of devices by status, read from the counters kept with every write.
    ///
    /// # Errors
    /// Storage errors.
    pub fn registry_statistics(&self) -> Result<RegistryStatistics, RegistryError> {
        let c: DeviceCounters = self
            .raw
            .get_record(cf::COUNTERS, DEVICE_COUNTERS_KEY)?
            .unwrap_or_default();
        let n = |v: i64| v.max(0) as u64;
        Ok(RegistryStatistics {
            total_device_count: n(c.total),
            enabled_device_count: n(c.enabled),
            disabled_device_count: n(c.disabled),
        })
    }

    /// Adds a module to an existing device.
    ///
    /// # Errors
    /// [`RegistryError::DeviceNotFound`], [`RegistryError::ModuleAlreadyExists`],
    /// [`RegistryError::TooManyModules`], validation or storage errors.
    pub fn create_module(
        &self,
        device_id: &str,
        module_id: &str,
        spec: &IdentitySpec,
        now: UnixMillis,
    ) -> Result<Identity, RegistryError> {
        self.in_txn(device_id, |t| {
            t.create_module(device_id, module_id, spec, now)
        })
    }

    /// # Errors
    /// [`RegistryError::ModuleNotFound`], [`RegistryError::EtagMismatch`], validation or storage.
    pub fn update_module(
        &self,
        device_id: &str,
        module_id: &str,
        spec: &IdentitySpec,
        if_match: &IfMatch,
    ) -> Result<Identity, RegistryError> {
        self.in_txn(device_id, |t| {
            t.update_module(device_id, module_id, spec, if_match)
        })
    }

    /// # Errors
    /// [`RegistryError::ModuleNotFound`], [`RegistryError::EtagMismatch`] or storage errors.
    pub fn delete_module(
        &self,
        device_id: &str,
        module_id: &str,
        if_match: &IfMatch,
        now: UnixMillis,
    ) -> Result<(), RegistryError> {
        self.in_txn(device_id, |t| {
            t.delete_module(device_id, module_id, if_match, now)
        })
    }

    /// # Errors
    /// [`RegistryError::ModuleNotFound`] or storage errors.
    pub fn get_module(&self, device_id: &str, module_id: &str) -> Result<Identity, RegistryError> {
        self.find_identity(device_id, Some(module_id))?
            .ok_or_else(|| RegistryError::ModuleNotFound {
                device_id: device_id.into(),
                module_id: module_id.into(),
            })
    }

    /// The modules of a device in id order.
    ///
    /// # Errors
    /// [`RegistryError::DeviceNotFound`] or storage errors.
    pub fn list_modules(&self, device_id: &str) -> Result<Vec<Identity>, RegistryError> {
        self.get_device(device_id)?;
        let prefix = keys::modules_of(device_id);
        let mut out = Vec::new();
        self.raw.scan_records::<Identity>(
            cf::MODULES,
            &prefix,
            keys::prefix_end(&prefix),
            |_, m| {
                out.push(m);
                true
            },
        )?;
        Ok(out)
    }

    /// Records that a device or module connected or disconnected (MQT-13): connection state,
    /// its time, and the last activity time. The etag does not change. Returns the identity as
    /// stored, or `None` if it no longer exists.
    ///
    /// # Errors
    /// Storage errors.
    pub fn record_connection(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        connected: bool,
        now: UnixMillis,
    ) -> Result<Option<Identity>, RegistryError> {
        self.in_txn(device_id, |t| {
            t.record_connection(device_id, module_id, connected, now)
        })
    }

    /// [`Store::record_connection`] without waiting for the sync: the change is queued, seen at
    /// once by identity reads and later writers of the device, and `done` runs on the commit
    /// thread once it is written. A connection state need not be durable before CONNACK: it
    /// describes a live connection, which a crash ends anyway, and IoT Hub documents it as a
    /// debugging aid that may lag by minutes (seed 002, `connectionState`). So its write may
    /// lag too: it is synced with the next synced write, or within [`crate::LAG_SYNC_WITHIN`].
    ///
    /// # Errors
    /// Storage errors before anything is queued; `done` is then dropped unrun.
    pub fn record_connection_then(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        connected: bool,
        now: UnixMillis,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<Option<Identity>, RegistryError> {
        self.record_connection_if(device_id, module_id, connected, now, || true, done)
    }

    /// [`Store::record_connection_then`] for a connection that ended, recorded only if
    /// `current()` still holds once the device's stripe is held: a newer connection of the
    /// same identity that registered first then records its "connected" after this, or has
    /// already made this one stale. Returns `None` (and runs `done` at once) when skipped.
    ///
    /// # Errors
    /// As [`Store::record_connection_then`].
    pub fn record_disconnection_then(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        now: UnixMillis,
        current: impl FnOnce() -> bool,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<Option<Identity>, RegistryError> {
        self.record_connection_if(device_id, module_id, false, now, current, done)
    }

    fn record_connection_if(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        connected: bool,
        now: UnixMillis,
        current: impl FnOnce() -> bool,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<Option<Identity>, RegistryError> {
        let _guard = self.stripes.lock_unless_waiting(device_id)?;
        if !current() {
            done(Ok(()));
            return Ok(None);
        }
        let mut txn = Txn::new(self);
        let out = txn.record_connection(device_id, module_id, connected, now)?;
        // Nobody is told a connection state is durable, and seed 002 lets it lag; syncing
        // each one cost a connect storm about 0.6 syncs per connect (issue 19).
        txn.batch.may_lag();
        txn.submit_pipelined(done)?;
        Ok(out)
    }
}

impl Txn<'_> {
    fn record_connection(
        &mut self,
        device_id: &str,
        module_id: Option<&str>,
        connected: bool,
        now: UnixMillis,
    ) -> Result<Option<Identity>, RegistryError> {
        let t = self;
        let current = match module_id {
            Some(m) => t.module(device_id, m)?,
            None => t.device(device_id)?,
        };
        let Some(mut next) = current else {
            return Ok(None);
        };
        next.connection_state = if connected {
            ConnectionState::Connected
        } else {
            ConnectionState::Disconnected
        };
        next.connection_state_updated_time = Some(now);
        next.last_activity_time = Some(now);
        match module_id {
            Some(_) => t.put_module(next.clone()),
            None => {
                let previous = next.clone();
                t.put_device(Some(&previous), next.clone());
            }
        }
        t.notes.push(PendingNotification {
            device_id: device_id.to_string(),
            module_id: module_id.map(str::to_string),
            op: if connected {
                NotificationOp::DeviceConnected
            } else {
                NotificationOp::DeviceDisconnected
            },
            time: now,
            body: serde_json::Map::new(),
        });
        Ok(Some(next))
    }
}
