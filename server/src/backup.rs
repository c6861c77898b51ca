//! Backups: a data directory copied whole, as one point in time, into a new directory that
//! `ferrohub serve` runs as it is. Made offline by `ferrohub backup` (the hub stopped), or
//! online by the running hub ([`OnlineBackups`]): through its control socket (`ferrohub
//! backup` against a running hub) or `POST /backups` (REST).
//!
//! # Invariants
//! - The database part is a RocksDB checkpoint: consistent across column families at one
//!   moment, so every write acknowledged before the backup began is in it.
//! - A backup goes into a directory that does not exist yet; it never overwrites.
//! - `tls/` is copied unless excluded, so a hub restored from the backup keeps the trust of
//!   the devices that trusted the original; `ca.pem` is copied last (it marks the material
//!   complete).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use ferrohub_engine::Store;

use crate::layout::db_path;

/// Whether a backup or an export carries the hub's TLS identity (its CA and server key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsIdentity {
    Include,
    Exclude,
}

/// What a devices' operator must be told when a hub comes back without its TLS identity.
pub const NEW_CA_WARNING: &str = "the hub gets a NEW certificate authority at its first start: \
devices and services that trusted the previous hub's CA will fail TLS until they trust the new \
DIR/tls/ca.pem (or restore from an export or backup that carries the TLS identity)";

/// Refuses a backup target that exists: a backup goes into a new directory.
///
/// # Errors
/// `to` exists.
pub fn check_target(to: &Path) -> anyhow::Result<()> {
    if to.exists() {
        bail!(
            "{} exists; a backup goes into a new directory",
            to.display()
        );
    }
    Ok(())
}

/// Copies `store` (open on `data_dir`, served or not) into `to` as a data directory: the
/// database as one point in time, then `tls/` unless excluded. Blocking.
///
/// # Errors
/// An existing `to`, storage or file errors.
pub fn copy_into(
    store: &Store,
    data_dir: &Path,
    to: &Path,
    tls: TlsIdentity,
) -> anyhow::Result<()> {
    check_target(to)?;
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    store.checkpoint(&db_path(to))?;
    let tls_dir = data_dir.join("tls");
    if tls == TlsIdentity::Include && tls_dir.is_dir() {
        let target = to.join("tls");
        std::fs::create_dir_all(&target)?;
        for name in crate::tls::MATERIAL_FILES {
            let from = tls_dir.join(name);
            if from.exists() {
                std::fs::copy(&from, target.join(name))
                    .with_context(|| format!("copying {}", from.display()))?;
            }
        }
    }
    Ok(())
}

/// Bytes of every file under `dir` (0 when it cannot be read).
pub fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size_of(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .sum()
}

/// A running single node's online backups: where its data directory is, and where backups
/// requested by name (REST) go.
#[derive(Debug, Clone)]
pub struct OnlineBackups {
    pub data_dir: PathBuf,
    pub directory: PathBuf,
}

/// A name for a backup requested through the REST API: letters, digits, `.`, `-`, `_`, not
/// starting with `.` (so it stays a plain entry of the backups directory).
pub fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}
