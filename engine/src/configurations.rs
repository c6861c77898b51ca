//! Automatic device configuration records (ADM, issue 15 part 4): a target condition, a
//! priority, desired-property content, labels and metric queries, under an etag. What they do
//! to twins is decided by the server's reconciler and written with
//! [`Store::apply_configured_twin`](crate::Store::apply_configured_twin).
//!
//! Records live in `meta` under `cfg/{id}`.
//!
//! # Invariants
//! - Changes are serialised by one lock and conditional on the etag when one is given; every
//!   change gives a new etag.
//! - Content is immutable once created (IoT Hub lets only the target condition, priority,
//!   labels and metrics change).

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::keys;
use crate::model::{next_etag, IfMatch, UnixMillis};
use crate::raw::Batch;
use crate::Store;

const PREFIX: &[u8] = b"cfg/";

/// One configuration. JSON parts are kept as the service sent them (text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Configuration {
    pub id: String,
    pub schema_version: String,
    /// `{name: value}` as JSON text.
    pub labels: String,
    /// `{"deviceContent": {...}, "moduleContent": {...}}` as JSON text.
    pub content: String,
    pub target_condition: String,
    pub priority: i64,
    pub created: UnixMillis,
    pub last_updated: UnixMillis,
    /// Custom metric queries `{name: query}` as JSON text.
    pub metrics: String,
    pub etag: String,
}

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ConfigurationError {
    #[error("a configuration with id {0} already exists")]
    AlreadyExists(String),
    #[error("configuration {0} not found")]
    NotFound(String),
    #[error("precondition failed: etag {given} does not match the current etag {current}")]
    EtagMismatch { given: String, current: String },
    #[error("the content of configuration {0} cannot change; create another configuration")]
    ContentChanged(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<crate::error::EtagMismatch> for ConfigurationError {
    fn from(e: crate::error::EtagMismatch) -> Self {
        ConfigurationError::EtagMismatch {
            given: e.given,
            current: e.current,
        }
    }
}

/// Serialises configuration changes.
#[derive(Default)]
pub(crate) struct ConfigurationLock(Mutex<()>);

fn key(id: &str) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

impl Store {
    /// Creates (`if_match` `None`) or updates a configuration; returns it as stored, with its
    /// new etag (and, on update, its original creation time).
    ///
    /// # Errors
    /// [`ConfigurationError::AlreadyExists`] (create), `NotFound`, `EtagMismatch` or
    /// `ContentChanged` (update), or storage errors.
    pub fn put_configuration(
        &self,
        mut config: Configuration,
        if_match: Option<&IfMatch>,
        now: UnixMillis,
    ) -> Result<Configuration, ConfigurationError> {
        let _guard = self.configuration_lock.0.lock();
        let current = self
            .raw
            .get_record::<Configuration>(cf::META, &key(&config.id))?;
        match (current, if_match) {
            (Some(_), None) => return Err(ConfigurationError::AlreadyExists(config.id)),
            (None, Some(_)) => return Err(ConfigurationError::NotFound(config.id)),
            (None, None) => {
                config.created = now;
                config.etag = next_etag(None);
            }
            (Some(old), Some(m)) => {
                m.check(&old.etag)?;
                if old.content != config.content {
                    return Err(ConfigurationError::ContentChanged(config.id));
                }
                config.created = old.created;
                config.etag = next_etag(Some(&old.etag));
            }
        }
        config.last_updated = now;
        let mut batch = Batch::default();
        batch.put_record(cf::META, key(&config.id), &config);
        self.raw.commit(batch)?;
        Ok(config)
    }

    /// # Errors
    /// [`ConfigurationError::NotFound`] or storage errors.
    pub fn get_configuration(&self, id: &str) -> Result<Configuration, ConfigurationError> {
        self.raw
            .get_record(cf::META, &key(id))?
            .ok_or_else(|| ConfigurationError::NotFound(id.to_string()))
    }

    /// Every configuration, in id order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_configurations(&self) -> Result<Vec<Configuration>, StorageError> {
        let mut out = Vec::new();
        self.raw.scan_records::<Configuration>(
            cf::META,
            PREFIX,
            keys::prefix_end(PREFIX),
            |_, c| {
                out.push(c);
                true
            },
        )?;
        Ok(out)
    }

    /// Deletes a configuration (unconditionally for [`IfMatch::Any`]).
    ///
    /// # Errors
    /// [`ConfigurationError::NotFound`], `EtagMismatch` or storage errors.
    pub fn delete_configuration(
        &self,
        id: &str,
        if_match: &IfMatch,
    ) -> Result<(), ConfigurationError> {
        let _guard = self.configuration_lock.0.lock();
        let current = self.get_configuration(id)?;
        if_match.check(&current.etag)?;
        let mut batch = Batch::default();
        batch.delete(cf::META, key(id));
        self.raw.commit(batch)?;
        Ok(())
    }
}
