//! Adapter that lets `ferrohub-migrations` steps act on the RocksDB database at open time.

use ferrohub_migrations::{cf, record, MigrationError, SchemaTarget, Visitor, VERSION_KEY};
use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions, DB};

use super::column_families::cf_options;
use crate::error::StorageError;

/// Reads the schema version; 0 for a database that has never been initialised.
pub(super) fn read_version(db: &DB) -> Result<u32, StorageError> {
    let Some(meta) = db.cf_handle(cf::META) else {
        return Ok(0);
    };
    match db
        .get_cf(meta, VERSION_KEY)
        .map_err(|e| StorageError::Backend(e.into_string()))?
    {
        None => Ok(0),
        Some(bytes) => record::decode::<u32>(&bytes).map_err(|e| StorageError::Corruption {
            cf: cf::META.into(),
            key: crate::error::KeyDisplay(VERSION_KEY.to_vec()),
            reason: e.to_string(),
        }),
    }
}

pub(super) struct Target<'a> {
    db: &'a mut DB,
    staged: Vec<(String, Vec<u8>, Vec<u8>)>,
}

impl<'a> Target<'a> {
    pub(super) fn new(db: &'a mut DB) -> Self {
        Target {
            db,
            staged: Vec::new(),
        }
    }
}

fn storage(e: rocksdb::Error) -> MigrationError {
    MigrationError::Storage(e.into_string())
}

impl SchemaTarget for Target<'_> {
    fn ensure_column_family(&mut self, name: &str) -> Result<(), MigrationError> {
        if self.db.cf_handle(name).is_none() {
            self.db
                .create_cf(name, &cf_options(name))
                .map_err(storage)?;
        }
        Ok(())
    }

    fn scan(&self, cf: &str, visit: &mut Visitor<'_, ()>) -> Result<(), MigrationError> {
        let Some(handle) = self.db.cf_handle(cf) else {
            return Ok(());
        };
        for item in self.db.iterator_cf(handle, IteratorMode::Start) {
            let (k, v) = item.map_err(storage)?;
            visit(&k, &v)?;
        }
        Ok(())
    }

    fn scan_from(
        &self,
        cf: &str,
        from: &[u8],
        visit: &mut Visitor<'_, bool>,
    ) -> Result<(), MigrationError> {
        let Some(handle) = self.db.cf_handle(cf) else {
            return Ok(());
        };
        for item in self
            .db
            .iterator_cf(handle, IteratorMode::From(from, Direction::Forward))
        {
            let (k, v) = item.map_err(storage)?;
            if !visit(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    fn stage_put(&mut self, cf: &str, key: &[u8], value: Vec<u8>) {
        self.staged.push((cf.to_string(), key.to_vec(), value));
    }

    fn checkpoint(&mut self) -> Result<(), MigrationError> {
        let batch = self.staged_batch()?;
        self.write_synced(batch)
    }

    fn drop_column_family(&mut self, name: &str) -> Result<(), MigrationError> {
        if self.db.cf_handle(name).is_some() {
            self.db.drop_cf(name).map_err(storage)?;
        }
        Ok(())
    }

    fn commit(&mut self, version: u32) -> Result<(), MigrationError> {
        let mut batch = self.staged_batch()?;
        let meta = self
            .db
            .cf_handle(cf::META)
            .ok_or_else(|| MigrationError::Storage("column family meta missing".into()))?;
        batch.put_cf(meta, VERSION_KEY, record::encode(&version));
        self.write_synced(batch)
    }
}

impl Target<'_> {
    /// The staged writes as one batch (the staging list is emptied).
    fn staged_batch(&mut self) -> Result<WriteBatch, MigrationError> {
        let mut batch = WriteBatch::default();
        for (cf, key, value) in self.staged.drain(..) {
            let handle = self
                .db
                .cf_handle(&cf)
                .ok_or_else(|| MigrationError::Storage(format!("column family {cf} missing")))?;
            batch.put_cf(handle, key, value);
        }
        Ok(batch)
    }

    fn write_synced(&self, batch: WriteBatch) -> Result<(), MigrationError> {
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo).map_err(storage)
    }
}
