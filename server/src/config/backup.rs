//! The `[backup]` section: where online backups requested through the REST API go.

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackupSection {
    /// Directory that `POST /backups` makes named backups in (default `DATA_DIR/backups`).
    /// The REST API names a backup, never a path: it writes nowhere else.
    pub directory: Option<PathBuf>,
}

impl BackupSection {
    /// The backups directory of the hub in `data_dir`.
    pub fn directory_for(&self, data_dir: &Path) -> PathBuf {
        self.directory
            .clone()
            .unwrap_or_else(|| crate::layout::default_backups(data_dir))
    }
}
