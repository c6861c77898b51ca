//! The IoT Plug and Play model id of a device or module (PNP-1): the DTMI it announced when it
//! last connected with one.
//!
//! # Invariants
//! - Only a valid DTMI is stored ([`crate::twin::pnp::is_valid_dtmi`]).
//! - The identity record and its twin record carry the same model id, written in one batch, so
//!   a twin write knows from the twin alone whether its digital twin changes. Neither record's
//!   etag or version changes: the model id is the device's statement, not a registry or twin
//!   update by anyone, and IoT Hub leaves both etags alone when a device announces one.
//! - The same model id again writes nothing.

use ferrohub_migrations::cf;

use super::Txn;
use crate::error::{RegistryError, ValidationError};
use crate::keys;
use crate::twin::pnp::is_valid_dtmi;
use crate::Store;

impl Store {
    /// Stores `model_id` as the model of the device (`module_id` `None`) or module; returns
    /// whether anything changed. Synced before it returns.
    ///
    /// # Errors
    /// [`RegistryError::Invalid`] for a model id that is not a DTMI,
    /// [`RegistryError::DeviceNotFound`] / [`RegistryError::ModuleNotFound`], or storage.
    pub fn set_model_id(
        &self,
        device_id: &str,
        module_id: Option<&str>,
        model_id: &str,
    ) -> Result<bool, RegistryError> {
        if !is_valid_dtmi(model_id) {
            return Err(ValidationError::new(
                "modelId",
                format!("{model_id:?} is not a DTMI (dtmi:<path>;<version>)"),
            )
            .into());
        }
        let _guard = self.stripes.lock(device_id);
        let mut txn = Txn::new(self);
        let current = match module_id {
            Some(m) => txn
                .module(device_id, m)?
                .ok_or_else(|| RegistryError::ModuleNotFound {
                    device_id: device_id.to_string(),
                    module_id: m.to_string(),
                })?,
            None => txn
                .device(device_id)?
                .ok_or_else(|| RegistryError::DeviceNotFound(device_id.to_string()))?,
        };
        if current.model_id.as_deref() == Some(model_id) {
            return Ok(false);
        }
        let mut twin = self.load_twin_record(&current)?;
        twin.model_id = Some(model_id.to_string());
        let mut next = current.clone();
        next.model_id = Some(model_id.to_string());
        let twin_key = keys::twin(device_id, module_id);
        txn.batch.put_record(cf::TWINS, twin_key.clone(), &twin);
        txn.batch.note_twin_write(&twin_key, false);
        match module_id {
            Some(_) => txn.put_module(next),
            None => txn.put_device(Some(&current), next),
        }
        txn.commit()?;
        Ok(true)
    }
}
