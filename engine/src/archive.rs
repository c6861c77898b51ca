//! Identities with their twins as whole records: read page by page for an export, written back
//! exactly for a restore (JOB-1, JOB-5).
//!
//! # Invariants
//! - A page holds whole devices: a device comes with all its modules and every twin, read
//!   under the device's stripe lock, so no page shows a device without its modules.
//! - A restore writes records as given (etags, generation ids, versions and metadata
//!   included) and refuses an id that exists, so it never overwrites what a hub already holds.
//!   The device counters move with every device it writes, in the same batch.

use ferrohub_migrations::cf;
use ferrohub_migrations::m0002_registry_counters::{DeviceCounters, DEVICE_COUNTERS_KEY};

use crate::error::{RegistryError, StorageError};
use crate::keys;
use crate::model::{validate_id, ConnectionState, Identity, Status};
use crate::raw::Batch;
use crate::twin::record::TwinRecord;
use crate::Store;

/// One identity and its twin, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentityRecords {
    pub identity: Identity,
    pub twin: TwinRecord,
}

/// A device with its modules.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRecords {
    pub device: IdentityRecords,
    pub modules: Vec<IdentityRecords>,
}

impl Store {
    /// Up to `limit` devices whose ids sort after `after` (all when `None`), in id order, with
    /// their modules and twins. Call again with the last id to read on; an empty page is the end.
    ///
    /// # Errors
    /// Storage errors (a corrupt record included).
    pub fn archive_page(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DeviceRecords>, StorageError> {
        let from = match after {
            // The smallest key after `after` is `after` with a zero byte appended.
            Some(id) => {
                let mut k = keys::device(id);
                k.push(0);
                k
            }
            None => Vec::new(),
        };
        self.page_from(&from, limit)
    }

    /// As [`Store::archive_page`], from the device `first` on (itself included if it exists):
    /// for readers that stopped inside a device's modules.
    ///
    /// # Errors
    /// Storage errors (a corrupt record included).
    pub fn archive_page_from(
        &self,
        first: &str,
        limit: usize,
    ) -> Result<Vec<DeviceRecords>, StorageError> {
        self.page_from(&keys::device(first), limit)
    }

    fn page_from(&self, from: &[u8], limit: usize) -> Result<Vec<DeviceRecords>, StorageError> {
        let mut ids = Vec::with_capacity(limit);
        self.raw
            .scan_records::<Identity>(cf::DEVICES, from, None, |_, d| {
                ids.push(d.device_id);
                ids.len() < limit
            })?;
        let mut page = Vec::with_capacity(ids.len());
        for id in ids {
            let _guard = self.stripes.lock(&id);
            // Deleted between the scan and the lock: it is simply not in this export.
            let Some(device) = self
                .raw
                .get_record::<Identity>(cf::DEVICES, &keys::device(&id))?
            else {
                continue;
            };
            let prefix = keys::modules_of(&id);
            let mut modules = Vec::new();
            self.raw.scan_records::<Identity>(
                cf::MODULES,
                &prefix,
                keys::prefix_end(&prefix),
                |_, m| {
                    modules.push(m);
                    true
                },
            )?;
            let modules = modules
                .into_iter()
                .map(|m| self.records_of(m))
                .collect::<Result<Vec<_>, _>>()?;
            page.push(DeviceRecords {
                device: self.records_of(device)?,
                modules,
            });
        }
        Ok(page)
    }

    fn records_of(&self, identity: Identity) -> Result<IdentityRecords, StorageError> {
        let twin = self.load_twin_record(&identity)?;
        Ok(IdentityRecords { identity, twin })
    }

    /// Writes devices, modules and twins exactly as given, in one atomic commit. Connection
    /// state is written as disconnected (nothing is connected to a hub being restored).
    ///
    /// # Errors
    /// [`RegistryError::DeviceAlreadyExists`] / [`RegistryError::ModuleAlreadyExists`] (nothing
    /// written), an invalid id, or storage errors.
    pub fn restore_devices(&self, devices: &[DeviceRecords]) -> Result<(), RegistryError> {
        let _guards = self
            .stripes
            .lock_many(devices.iter().map(|d| d.device.identity.device_id.as_str()));
        let mut batch = Batch::default();
        let mut counters = DeviceCounters::default();
        for d in devices {
            let device = &d.device.identity;
            validate_id("deviceId", &device.device_id)?;
            if self
                .raw
                .get_record::<Identity>(cf::DEVICES, &keys::device(&device.device_id))?
                .is_some()
            {
                return Err(RegistryError::DeviceAlreadyExists(device.device_id.clone()));
            }
            counters.total += 1;
            match device.status {
                Status::Enabled => counters.enabled += 1,
                Status::Disabled => counters.disabled += 1,
            }
            stage_identity(&mut batch, &d.device);
            for m in &d.modules {
                let module_id = m.identity.module_id.as_deref().unwrap_or_default();
                validate_id("moduleId", module_id)?;
                if m.identity.device_id != device.device_id {
                    return Err(RegistryError::Invalid(crate::ValidationError::new(
                        "deviceId",
                        format!(
                            "module {module_id} names device {} but is listed under {}",
                            m.identity.device_id, device.device_id
                        ),
                    )));
                }
                stage_identity(&mut batch, m);
            }
        }
        batch.merge_counters(DEVICE_COUNTERS_KEY, counters);
        self.raw.commit(batch)?;
        Ok(())
    }
}

fn stage_identity(batch: &mut Batch, records: &IdentityRecords) {
    let mut identity = records.identity.clone();
    identity.connection_state = ConnectionState::Disconnected;
    identity.cloud_to_device_message_count = 0;
    let module_id = identity.module_id.clone();
    match &module_id {
        None => batch.put_record(cf::DEVICES, keys::device(&identity.device_id), &identity),
        Some(m) => batch.put_record(cf::MODULES, keys::module(&identity.device_id, m), &identity),
    }
    batch.put_record(
        cf::TWINS,
        keys::twin(&identity.device_id, module_id.as_deref()),
        &records.twin,
    );
}
