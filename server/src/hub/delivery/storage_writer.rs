//! Where a storage container endpoint's partition writes its batches, and the rules that cut
//! and name them (what [`super::storage`]'s loop reads).

use ferrohub_engine::delivery::{StorageEncoding, StorageTarget};

use crate::blob::{BlobContainer, StorageAccount};

/// Where one partition's batches go, and how they are cut and named.
pub struct StorageWriter {
    pub container: BlobContainer,
    pub encoding: StorageEncoding,
    pub file_name_format: String,
    pub window_ms: i64,
    pub max_chunk: u64,
    pub hub_name: String,
    /// The partition's index within its endpoint (IoT Hub's `{partition}`).
    pub index: u16,
}

impl StorageWriter {
    /// # Errors
    /// The connection string does not load.
    pub fn new(
        target: &StorageTarget,
        hub_name: &str,
        index: u16,
    ) -> Result<StorageWriter, String> {
        let container = StorageAccount::from_connection_string(
            &target.connection_string,
            &target.container_name,
        )
        .map_err(|e| format!("storageContainer.connectionString: {e}"))?
        .into_container();
        Ok(StorageWriter {
            container,
            encoding: target.encoding,
            file_name_format: target.file_name_format.clone(),
            window_ms: i64::from(target.batch_frequency_secs) * 1000,
            max_chunk: target.max_chunk_size_bytes,
            hub_name: hub_name.to_string(),
            index,
        })
    }
}
