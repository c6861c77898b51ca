//! Online backups of the running hub (see [`crate::backup`]): the copy is made on the blocking
//! pool through the store handle, while the hub keeps serving.

use std::path::PathBuf;

use anyhow::anyhow;

use super::HubContext;
use crate::backup::{self, OnlineBackups, TlsIdentity};

/// Makes an online backup of the running hub into `to`.
///
/// # Errors
/// An existing `to`, storage or file errors.
pub async fn online_backup(
    ctx: &HubContext,
    backups: &OnlineBackups,
    to: PathBuf,
    tls: TlsIdentity,
) -> anyhow::Result<PathBuf> {
    let data_dir = backups.data_dir.clone();
    let target = to.clone();
    let started = std::time::Instant::now();
    ctx.store
        .run(move |s| backup::copy_into(s, &data_dir, &target, tls).map_err(BackupFailed::from))
        .await
        .map_err(|e| anyhow!("{e}"))?;
    tracing::info!(
        to = %to.display(),
        tls = (tls == TlsIdentity::Include),
        seconds = started.elapsed().as_secs_f64(),
        "online backup made"
    );
    Ok(to)
}

/// A failed backup, carried through the store handle (which wants storage errors convertible).
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
struct BackupFailed(anyhow::Error);

impl From<anyhow::Error> for BackupFailed {
    fn from(e: anyhow::Error) -> Self {
        BackupFailed(e)
    }
}

impl From<ferrohub_engine::StorageError> for BackupFailed {
    fn from(e: ferrohub_engine::StorageError) -> Self {
        BackupFailed(e.into())
    }
}
