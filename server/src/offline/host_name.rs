//! `ferrohub host-name`: a hub's host names changed after it was initialised.
//!
//! # Invariants
//! - The settings change and the certificate re-issue happen with the hub stopped (the data
//!   directory opened by this process alone); policies, device keys and the CA stay as they
//!   are, so a device needs only the new name in its connection string.
//! - A cluster node's replica is refused: the cluster's settings change on its writer.

use std::fmt;
use std::path::Path;

use anyhow::{anyhow, Context as _};
use ferrohub_engine::Store;

use crate::node::db_path;
use crate::tls::{self, TlsPaths};

/// What `set` changed, shown to the operator.
pub struct Change {
    before: Vec<String>,
    after: Vec<String>,
    reissued: bool,
    ca: std::path::PathBuf,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "host names: {} -> {}",
            self.before.join(","),
            self.after.join(",")
        )?;
        if self.reissued {
            writeln!(
                f,
                "server certificate re-issued for them from the hub's CA; {} is unchanged, so devices that trust it keep doing so",
                self.ca.display()
            )?;
        } else {
            writeln!(
                f,
                "the server certificate is made for them at the next start"
            )?;
        }
        write!(
            f,
            "connection strings now carry HostName={}: give devices and services the new ones (`ferrohub connection-string --data-dir DIR [--device ID]`); their keys are unchanged",
            self.after[0]
        )
    }
}

/// Makes `name` the hub's host name and `also` its other names, and re-issues the generated
/// server certificate for them.
///
/// # Errors
/// A running hub, a directory without a hub, a cluster replica, names that are not DNS names
/// or IP addresses (or repeat), a CA that cannot sign.
pub fn set(data_dir: &Path, name: &str, also: &[String]) -> anyhow::Result<Change> {
    let store = super::open_exclusive(data_dir, ferrohub_engine::DEFAULT_D2C_PARTITIONS)?;
    let result = set_in(&store, data_dir, name, also);
    store.close()?;
    result
}

fn set_in(store: &Store, data_dir: &Path, name: &str, also: &[String]) -> anyhow::Result<Change> {
    let settings = store
        .hub_settings()?
        .ok_or_else(|| anyhow!("{} holds no initialised hub", data_dir.display()))?;
    let before: Vec<String> = settings.host_names().map(String::from).collect();
    let changed = ferrohub_engine::hub::HubSettings {
        host_name: name.to_string(),
        other_host_names: also.to_vec(),
        ..settings
    };
    let after: Vec<String> = changed.host_names().map(String::from).collect();
    store
        .replace_hub_settings(changed)
        .context("the new host names")?;
    let paths = TlsPaths::new(data_dir);
    let reissued = paths.ca().exists();
    if reissued {
        let names: Vec<&str> = after.iter().map(String::as_str).collect();
        tls::reissue_server(&paths, &names).context("re-issuing the server certificate")?;
    }
    Ok(Change {
        before,
        after,
        reissued,
        ca: paths.ca(),
    })
}

/// The hub's host name, then its other names (read-only: works while the hub runs).
///
/// # Errors
/// A directory without a hub, storage errors.
pub fn show(data_dir: &Path) -> anyhow::Result<Vec<String>> {
    let store = Store::open_read_only(&db_path(data_dir))?;
    let settings = store
        .hub_settings()?
        .ok_or_else(|| anyhow!("{} holds no initialised hub", data_dir.display()))?;
    Ok(settings.host_names().map(String::from).collect())
}
