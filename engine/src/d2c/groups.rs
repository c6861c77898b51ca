//! Consumer groups and their checkpoints (D2C-3): named readers of the partitions, each
//! with a stored position per partition.
//!
//! # Invariants
//! - `$Default` always exists and is never stored; other groups are records in `d2c_state`,
//!   at most [`MAX_CONSUMER_GROUPS`] in all, created and deleted under the hub lock.
//! - A group's checkpoints go in the same batch as its deletion.

use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use super::{Checkpoint, D2cError, DEFAULT_CONSUMER_GROUP, MAX_CONSUMER_GROUPS};
use crate::error::ValidationError;
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConsumerGroupRecord {
    name: String,
    created: UnixMillis,
}

fn validate_group_name(name: &str) -> Result<(), ValidationError> {
    let ok = !name.is_empty()
        && name.len() <= 50
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._$".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "consumerGroup",
            "must be 1 to 50 letters, digits, '-', '.', '_' or '$'",
        ))
    }
}

impl Store {
    /// Creates a consumer group.
    ///
    /// # Errors
    /// [`D2cError::GroupExists`], [`D2cError::TooManyGroups`], [`D2cError::Invalid`] or storage.
    pub fn create_consumer_group(&self, name: &str, now: UnixMillis) -> Result<(), D2cError> {
        validate_group_name(name)?;
        let _guard = self.hub_lock.lock();
        let existing = self.list_consumer_groups()?;
        if existing.iter().any(|g| g == name) {
            return Err(D2cError::GroupExists(name.into()));
        }
        if existing.len() >= MAX_CONSUMER_GROUPS {
            return Err(D2cError::TooManyGroups(MAX_CONSUMER_GROUPS));
        }
        let mut batch = Batch::default();
        batch.put_record(
            cf::D2C_STATE,
            keys::d2c::group(name),
            &ConsumerGroupRecord {
                name: name.into(),
                created: now,
            },
        );
        Ok(self.raw.commit(batch)?)
    }

    /// Consumer group names, `$Default` first.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_consumer_groups(&self) -> Result<Vec<String>, D2cError> {
        let mut out = vec![DEFAULT_CONSUMER_GROUP.to_string()];
        let prefix = keys::d2c::GROUP_PREFIX;
        self.raw.scan_records::<ConsumerGroupRecord>(
            cf::D2C_STATE,
            prefix,
            keys::prefix_end(prefix),
            |_, g| {
                out.push(g.name);
                true
            },
        )?;
        Ok(out)
    }

    fn require_group(&self, name: &str) -> Result<(), D2cError> {
        if name == DEFAULT_CONSUMER_GROUP
            || self
                .raw
                .get_record::<ConsumerGroupRecord>(cf::D2C_STATE, &keys::d2c::group(name))?
                .is_some()
        {
            Ok(())
        } else {
            Err(D2cError::NoSuchGroup(name.into()))
        }
    }

    /// Deletes a consumer group and its checkpoints.
    ///
    /// # Errors
    /// [`D2cError::DefaultGroup`], [`D2cError::NoSuchGroup`] or storage errors.
    pub fn delete_consumer_group(&self, name: &str) -> Result<(), D2cError> {
        if name == DEFAULT_CONSUMER_GROUP {
            return Err(D2cError::DefaultGroup);
        }
        let _guard = self.hub_lock.lock();
        self.require_group(name)?;
        let mut batch = Batch::default();
        batch.delete(cf::D2C_STATE, keys::d2c::group(name));
        let prefix = keys::d2c::checkpoints_of(name);
        if let Some(end) = keys::prefix_end(&prefix) {
            batch.delete_range(cf::D2C_STATE, prefix, end);
        }
        Ok(self.raw.commit(batch)?)
    }

    /// Stores a checkpoint for a consumer group and partition.
    ///
    /// # Errors
    /// [`D2cError::NoSuchGroup`], [`D2cError::NoSuchPartition`] or storage errors.
    pub fn set_checkpoint(
        &self,
        group: &str,
        partition: u16,
        checkpoint: &Checkpoint,
    ) -> Result<(), D2cError> {
        self.check_partition(partition)?;
        self.require_group(group)?;
        let mut batch = Batch::default();
        batch.put_record(
            cf::D2C_STATE,
            keys::d2c::checkpoint(group, partition),
            checkpoint,
        );
        Ok(self.raw.commit(batch)?)
    }

    /// # Errors
    /// [`D2cError::NoSuchGroup`], [`D2cError::NoSuchPartition`] or storage errors.
    pub fn get_checkpoint(
        &self,
        group: &str,
        partition: u16,
    ) -> Result<Option<Checkpoint>, D2cError> {
        self.check_partition(partition)?;
        self.require_group(group)?;
        Ok(self
            .raw
            .get_record(cf::D2C_STATE, &keys::d2c::checkpoint(group, partition))?)
    }
}
