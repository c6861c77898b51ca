//! File uploads (FUP-1): SAS grants for `{deviceId}/{blobName}` in the configured account,
//! the uploads a device may still report on, and notifications for the service.
//!
//! # Invariants
//! - A correlation id is issued with each grant and accepted once, by the device it was
//!   issued to, until the grant's SAS expires; then it is forgotten.
//! - A notification is queued only after the blob was found in storage (its size and time
//!   are read from there, not taken from the device).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::c2d::file_notifications::{FileNotification, FileNotificationSettings};
use ferrohub_engine::UnixMillis;
use parking_lot::Mutex;

use crate::blob::{BlobError, StorageAccount, UploadGrant};
use crate::config::FileUploadSection;

/// An upload a device was granted and has not reported on yet.
#[derive(Debug, Clone)]
struct Pending {
    device_id: String,
    blob_name: String,
    expires: UnixMillis,
}

/// The configured upload account and the grants in flight.
pub struct FileUploads {
    account: StorageAccount,
    sas_ttl: Duration,
    pub notifications: bool,
    pub notification_settings: FileNotificationSettings,
    pending: Mutex<HashMap<String, Pending>>,
}

/// Why an upload report was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("correlation id {0} was not issued to this device or has expired")]
    UnknownCorrelation(String),
    #[error("{0}")]
    Blob(#[from] BlobError),
}

impl FileUploads {
    /// # Errors
    /// An unusable connection string.
    pub fn new(section: &FileUploadSection) -> Result<Arc<FileUploads>, BlobError> {
        Ok(Arc::new(FileUploads {
            account: StorageAccount::from_connection_string(
                &section.connection_string,
                &section.container,
            )?,
            sas_ttl: section.sas_ttl,
            notifications: section.notifications,
            notification_settings: FileNotificationSettings {
                ttl_ms: section.notification_ttl.as_millis() as i64,
                lock_timeout_ms: 60_000,
                max_delivery_count: section.notification_max_delivery_count,
            },
            pending: Mutex::new(HashMap::new()),
        }))
    }

    /// A grant for `{device_id}/{blob_name}` and its correlation id.
    ///
    /// # Errors
    /// A blob name storage cannot address, or signing errors.
    pub async fn grant(
        &self,
        device_id: &str,
        blob_name: &str,
        now: UnixMillis,
    ) -> Result<(String, UploadGrant), BlobError> {
        let full = format!("{device_id}/{blob_name}");
        let signed_at = chrono::DateTime::from_timestamp_millis(now.0).unwrap_or_default();
        let grant = self.account.grant_upload(&full, signed_at, self.sas_ttl)?;
        let correlation: [u8; 24] = rand::random();
        let correlation =
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, correlation);
        let mut pending = self.pending.lock();
        pending.retain(|_, p| p.expires > now);
        pending.insert(
            correlation.clone(),
            Pending {
                device_id: device_id.to_string(),
                blob_name: full,
                expires: UnixMillis(now.0 + self.sas_ttl.as_millis() as i64),
            },
        );
        Ok((correlation, grant))
    }

    /// Takes the upload a device reports on; for a success, reads the blob and returns the
    /// notification to queue (when notifications are on).
    ///
    /// # Errors
    /// [`UploadError::UnknownCorrelation`]; the blob missing or unreadable.
    pub async fn complete(
        &self,
        device_id: &str,
        correlation_id: &str,
        success: bool,
        now: UnixMillis,
    ) -> Result<Option<FileNotification>, UploadError> {
        let pending = {
            let mut map = self.pending.lock();
            match map.get(correlation_id) {
                Some(p) if p.device_id == device_id && p.expires > now => {
                    map.remove(correlation_id)
                }
                _ => None,
            }
        }
        .ok_or_else(|| UploadError::UnknownCorrelation(correlation_id.to_string()))?;
        if !success || !self.notifications {
            return Ok(None);
        }
        let (size, modified) = self.account.blob_info(&pending.blob_name).await?;
        Ok(Some(FileNotification {
            device_id: pending.device_id,
            blob_uri: self.account.blob_uri(&pending.blob_name),
            blob_name: pending.blob_name,
            blob_size: size,
            last_updated: UnixMillis(modified),
        }))
    }
}
