//! Where things are in a data directory: `db/` (the RocksDB database), `tls/` (see
//! [`crate::tls`]), `control.sock` (the running hub's local control socket, see
//! [`crate::control`]) and, by default, `backups/` (online backups made through the REST API).

use std::path::{Path, PathBuf};

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("db")
}

pub fn control_socket(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

pub fn default_backups(data_dir: &Path) -> PathBuf {
    data_dir.join("backups")
}
