//! Blob storage for import/export jobs, offline export/restore and file upload (JOB-4, FUP-1).
//!
//! Two backends behind one [`BlobContainer`], both from `object_store`:
//! - `file:///dir`: a local directory (offline use, tests); created when missing.
//! - Azure Blob Storage container SAS URIs: `https://{account}.blob.core.windows.net/{container}?sv=...`
//!   and the emulator's path-style `http(s)://{host}:{port}/{account}/{container}?sv=...`.
//!
//! # Invariants
//! - Reads and writes stream: a blob is read through a bounded buffer line by line and written
//!   in parts, so a job over a million identities never holds them all in memory.
//! - A blob being written is not visible under its name until the writer is finished (local:
//!   temporary file renamed; Azure: block list committed), so a failed job never leaves a
//!   half-written `devices.txt` in place of a good one.
//! - Container URIs are logged only through [`redact`], never with their signature.

mod account;
mod container;
mod sas;

pub use account::{encode_blob_path, StorageAccount, UploadGrant};
pub use container::{BlobContainer, BlobLines, BlobWriter};

/// Why a blob operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("invalid blob container URI: {0}")]
    InvalidUri(String),
    #[error("invalid storage connection string: {0}")]
    InvalidConnectionString(String),
    #[error("blob {0} not found")]
    NotFound(String),
    #[error("blob storage refused access: {0}")]
    Denied(String),
    #[error("blob storage error: {0}")]
    Store(String),
    #[error("blob {name}: {reason}")]
    Io { name: String, reason: String },
}

impl From<object_store::Error> for BlobError {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { path, .. } => BlobError::NotFound(path),
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => {
                BlobError::Denied(source.to_string())
            }
            other => BlobError::Store(other.to_string()),
        }
    }
}

/// A container URI without its SAS signature (for logs and job records shown to users).
pub fn redact(uri: &str) -> String {
    match uri.split_once('?') {
        Some((base, query)) => {
            let kept: Vec<&str> = query
                .split('&')
                .map(|pair| {
                    if pair.starts_with("sig=") {
                        "sig=REDACTED"
                    } else {
                        pair
                    }
                })
                .collect();
            format!("{base}?{}", kept.join("&"))
        }
        None => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_only_the_signature() {
        assert_eq!(
            redact("https://a.blob.core.windows.net/c?sv=1&sig=abc%2F&sp=rw"),
            "https://a.blob.core.windows.net/c?sv=1&sig=REDACTED&sp=rw"
        );
        assert_eq!(redact("file:///tmp/x"), "file:///tmp/x");
    }
}
