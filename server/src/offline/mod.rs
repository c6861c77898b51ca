//! Offline export, restore and backup (JOB-5, OPS-2): the hub stopped, the data directory
//! opened by this process alone (a running hub holds RocksDB's lock and is refused).
//!
//! An export is a container holding:
//! - `hub.json`: the hub's settings (name, host name, shared access policies with keys),
//!   registered CAs, consumer groups, custom endpoints (names, partition counts, and delivery
//!   targets with their signing keys), routes, the fallback route and enrichments, and the
//!   built-in partition count.
//! - `devices.txt`: every device and module, one line each (see `rest::jobs::line`), with keys
//!   or thumbprints, twin tags, desired and reported properties, versions, etags and metadata.
//!
//! - the hub's TLS identity in `hub.json` (its CA with the CA's key, and the server certificate
//!   with its key), unless the export was told to leave it out: a hub restored with it keeps
//!   the trust of every device that trusted the original.
//!
//! It does not hold queued C2D messages, feedback, D2C events, checkpoints or MQTT sessions:
//! [`backup`] (a RocksDB checkpoint, with `tls/`) does.
//!
//! # Invariants
//! - [`restore`] writes only into a data directory that holds no hub and no devices, and
//!   writes the hub's settings last. A restore that failed part-way is refused if repeated
//!   over the same directory (it holds devices): clear the directory and restore again.

pub mod host_name;
pub mod info;
mod progress;

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use ferrohub_engine::archive::DeviceRecords;
use ferrohub_engine::hub::{CertificateAuthority, HubSettings};
use ferrohub_engine::routing::RoutingConfig;
use ferrohub_engine::{OpenError, Store, StoreConfig};
use serde::{Deserialize, Serialize};

use crate::blob::BlobContainer;
use crate::node::db_path;
use crate::rest::jobs::line::{export_line, restore_records};
use crate::rest::jobs::DEVICES_BLOB;
use crate::tls::TlsPaths;
use progress::Progress;

/// The hub-wide part of an export.
pub const HUB_BLOB: &str = "hub.json";
const FORMAT: &str = "ferrohub-export";
const FORMAT_VERSION: u32 = 1;
/// Devices read, or restored, per engine call.
const PAGE: usize = 1000;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct HubExport {
    format: String,
    version: u32,
    settings: HubSettings,
    certificate_authorities: Vec<CertificateAuthority>,
    consumer_groups: Vec<String>,
    endpoints: Vec<EndpointExport>,
    routing: RoutingConfig,
    partition_count: u16,
    device_count: u64,
    /// Enrollments, groups and registration states (DPS-5); absent in exports made before
    /// provisioning existed.
    #[serde(default)]
    provisioning: ProvisioningExport,
    /// The files of `tls/` (name, PEM text); absent when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tls_identity: Option<Vec<(String, String)>>,
}

pub use crate::backup::{TlsIdentity, NEW_CA_WARNING};

/// A container named on the command line: a URI (`file:///dir`, an Azure container SAS URI),
/// or a plain directory path (created when missing), as `backup --to` takes.
///
/// # Errors
/// A URI that is not a container, a path that cannot be made absolute.
pub fn cli_container(location: &str) -> anyhow::Result<BlobContainer> {
    let has_scheme = location.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    if has_scheme {
        return Ok(BlobContainer::parse(location)?);
    }
    let path = Path::new(location);
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    let absolute = std::fs::canonicalize(path)?;
    let uri = url::Url::from_directory_path(&absolute)
        .map_err(|()| anyhow!("{} is not a directory path", absolute.display()))?;
    Ok(BlobContainer::parse(uri.as_str())?)
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct ProvisioningExport {
    enrollments: Vec<ferrohub_engine::provisioning::Enrollment>,
    registrations: Vec<ferrohub_engine::provisioning::RegistrationRecord>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EndpointExport {
    name: String,
    partitions: u16,
    /// Where its events are delivered outside the hub (with the signing key: a restored hub
    /// signs as the original did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delivery: Option<ferrohub_engine::delivery::DeliveryTarget>,
}

/// Opens the data directory to write (a restore); a cluster node's replica is refused.
pub(crate) fn open_exclusive(data_dir: &Path, partitions: u16) -> anyhow::Result<Store> {
    open_with(data_dir, partitions, Store::open)
}

/// Opens the data directory to copy it out (a backup, an export), a cluster node's replica
/// too: nothing is written.
pub(crate) fn open_to_copy(data_dir: &Path) -> anyhow::Result<Store> {
    open_with(
        data_dir,
        ferrohub_engine::DEFAULT_D2C_PARTITIONS,
        Store::open_to_copy,
    )
}

fn open_with(
    data_dir: &Path,
    partitions: u16,
    open: fn(&Path, StoreConfig) -> Result<Store, OpenError>,
) -> anyhow::Result<Store> {
    open(
        &db_path(data_dir),
        StoreConfig {
            d2c_partitions: partitions,
            ..StoreConfig::default()
        },
    )
    .map_err(|e| match e {
        OpenError::InUse { .. } => anyhow!(
            "data directory {} is in use by a running hub; stop it first ({e})",
            data_dir.display()
        ),
        other => anyhow!(other),
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Writes `hub.json` and `devices.txt` for the hub in `data_dir` into the container `to`.
///
/// # Errors
/// A data directory in use or without a hub, blob errors, storage errors.
pub fn export(
    data_dir: &Path,
    to: &str,
    exclude_keys: bool,
    tls: TlsIdentity,
) -> anyhow::Result<u64> {
    if !db_path(data_dir).exists() {
        bail!("{} holds no hub (no db/ directory)", data_dir.display());
    }
    let store = open_to_copy(data_dir)?;
    let settings = store
        .hub_settings()?
        .ok_or_else(|| anyhow!("{} holds no initialised hub", data_dir.display()))?;
    let device_count = store.registry_statistics()?.total_device_count;
    let hub = HubExport {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        settings,
        certificate_authorities: store.list_certificate_authorities()?,
        consumer_groups: store.list_consumer_groups()?,
        endpoints: store
            .list_endpoints()
            .into_iter()
            .map(|e| EndpointExport {
                name: e.name,
                partitions: e.slot.partitions,
                delivery: e.delivery,
            })
            .collect(),
        routing: store.routing_config()?,
        partition_count: store.partition_count(),
        device_count,
        provisioning: {
            let (enrollments, registrations) = store.export_provisioning()?;
            ProvisioningExport {
                enrollments,
                registrations,
            }
        },
        tls_identity: match tls {
            TlsIdentity::Include => {
                let files = crate::tls::read_material(&TlsPaths::new(data_dir));
                if files.is_none() {
                    eprintln!(
                        "WARNING: {} holds no TLS material (the hub never started): the export \
                         has no TLS identity, and {NEW_CA_WARNING}",
                        data_dir.display()
                    );
                }
                files
            }
            TlsIdentity::Exclude => None,
        },
    };
    let container = cli_container(to)?;
    let rt = runtime()?;
    let mut progress = Progress::new("export", device_count);
    let written = rt.block_on(async {
        let mut writer = container.writer(DEVICES_BLOB)?;
        let mut after: Option<String> = None;
        let mut written = 0u64;
        loop {
            let page = store.archive_page(after.as_deref(), PAGE)?;
            let Some(last) = page.last() else { break };
            after = Some(last.device.identity.device_id.clone());
            let mut out = Vec::with_capacity(page.len() * 1024);
            for d in &page {
                for r in std::iter::once(&d.device).chain(&d.modules) {
                    serde_json::to_writer(&mut out, &export_line(r, exclude_keys))?;
                    out.push(b'\n');
                }
            }
            writer.write(&out).await?;
            written += page.len() as u64;
            progress.advance(page.len() as u64);
        }
        writer.finish().await?;
        container
            .put(HUB_BLOB, serde_json::to_vec_pretty(&hub)?)
            .await?;
        anyhow::Ok(written)
    })?;
    progress.finish();
    store.close()?;
    Ok(written)
}

/// Fills `data_dir` (which must hold no hub) from an export in the container `from`.
///
/// # Errors
/// A directory that holds a hub or is in use, an export that is not one, bad lines, blob
/// or storage errors.
pub fn restore(data_dir: &Path, from: &str) -> anyhow::Result<Restored> {
    let container = cli_container(from)?;
    let rt = runtime()?;
    let hub: HubExport = {
        let bytes = rt
            .block_on(container.get(HUB_BLOB))
            .with_context(|| format!("reading {HUB_BLOB} from {}", container.shown()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("{HUB_BLOB} is not an export"))?
    };
    if hub.format != FORMAT || hub.version > FORMAT_VERSION {
        bail!(
            "{HUB_BLOB} is format {} version {}; this build reads {FORMAT} up to version {FORMAT_VERSION}",
            hub.format,
            hub.version
        );
    }
    let db = db_path(data_dir);
    if db.exists() {
        let store = open_exclusive(data_dir, hub.partition_count)?;
        let initialised = store.hub_settings()?.is_some();
        let devices = store.registry_statistics()?.total_device_count;
        store.close()?;
        if initialised || devices > 0 {
            bail!(
                "{} already holds a hub; restore into an empty data directory",
                data_dir.display()
            );
        }
    }
    let store = open_exclusive(data_dir, hub.partition_count)?;
    if store.partition_count() != hub.partition_count {
        bail!(
            "{} was created with {} partitions; the export has {}",
            data_dir.display(),
            store.partition_count(),
            hub.partition_count
        );
    }
    let now = ferrohub_engine::UnixMillis(chrono::Utc::now().timestamp_millis());
    for ca in &hub.certificate_authorities {
        store.put_certificate_authority(ca)?;
    }
    let existing = store.list_consumer_groups()?;
    for group in hub.consumer_groups.iter().filter(|g| !existing.contains(g)) {
        store.create_consumer_group(group, now)?;
    }
    for e in &hub.endpoints {
        store.create_endpoint_delivering(&e.name, e.partitions, e.delivery.clone(), now)?;
    }
    let routing = hub.routing.clone();
    store.update_routing_config::<ferrohub_engine::StorageError>(move |r| {
        *r = routing;
        Ok(())
    })?;
    store.restore_provisioning(
        &hub.provisioning.enrollments,
        &hub.provisioning.registrations,
    )?;
    let mut progress = Progress::new("restore", hub.device_count);
    let devices = rt.block_on(restore_devices(&store, &container, &mut progress))?;
    progress.finish();
    // The TLS identity before the settings: a hub is complete once its settings are written.
    let paths = TlsPaths::new(data_dir);
    let tls_identity = match &hub.tls_identity {
        Some(files) => {
            crate::tls::write_material(&paths, files)?;
            true
        }
        None => false,
    };
    store.initialise_hub(hub.settings)?;
    store.close()?;
    Ok(Restored {
        devices,
        tls_identity,
    })
}

/// What [`restore`] brought back.
pub struct Restored {
    pub devices: u64,
    /// Whether the export carried the hub's TLS identity (else a new CA is made at start).
    pub tls_identity: bool,
}

async fn restore_devices(
    store: &Store,
    container: &BlobContainer,
    progress: &mut Progress,
) -> anyhow::Result<u64> {
    let (mut lines, _) = container
        .lines(DEVICES_BLOB)
        .await
        .with_context(|| format!("reading {DEVICES_BLOB} from {}", container.shown()))?;
    let mut page: Vec<DeviceRecords> = Vec::with_capacity(PAGE);
    let mut restored = 0u64;
    let mut line_number = 0u64;
    while let Some(text) = lines.next_line().await? {
        line_number += 1;
        if text.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{DEVICES_BLOB} line {line_number} is not JSON"))?;
        let records = restore_records(&value).map_err(|e| {
            anyhow!(
                "{DEVICES_BLOB} line {line_number} ({}): {}",
                e.device_id.unwrap_or_default(),
                e.message
            )
        })?;
        if records.identity.module_id.is_some() {
            // A module line belongs to the device line before it (the export writes them so).
            let device = page
                .last_mut()
                .filter(|d| d.device.identity.device_id == records.identity.device_id)
                .ok_or_else(|| {
                    anyhow!(
                        "{DEVICES_BLOB} line {line_number}: module of {} does not follow its device",
                        records.identity.device_id
                    )
                })?;
            device.modules.push(records);
            continue;
        }
        if page.len() >= PAGE {
            restored += flush(store, &mut page, progress)?;
        }
        page.push(DeviceRecords {
            device: records,
            modules: Vec::new(),
        });
    }
    restored += flush(store, &mut page, progress)?;
    Ok(restored)
}

fn flush(
    store: &Store,
    page: &mut Vec<DeviceRecords>,
    progress: &mut Progress,
) -> anyhow::Result<u64> {
    let n = page.len() as u64;
    if n > 0 {
        store.restore_devices(page)?;
        progress.advance(n);
        page.clear();
    }
    Ok(n)
}

/// A complete copy of the data directory in `to` (which must not exist): a RocksDB
/// checkpoint of the database (queues, partitions, checkpoints and sessions included) and,
/// unless excluded, the TLS material. `ferrohub serve --data-dir {to}` runs it as it is.
///
/// # Errors
/// A directory in use, an existing `to`, storage or file errors.
pub fn backup(data_dir: &Path, to: &Path, tls: TlsIdentity) -> anyhow::Result<PathBuf> {
    if !db_path(data_dir).exists() {
        bail!("{} holds no hub (no db/ directory)", data_dir.display());
    }
    crate::backup::check_target(to)?;
    let store = open_to_copy(data_dir)?;
    eprintln!("backup: checkpointing the database");
    let copied = crate::backup::copy_into(&store, data_dir, to, tls);
    store.close()?;
    copied?;
    if tls == TlsIdentity::Exclude {
        eprintln!("backup: without the TLS identity: {NEW_CA_WARNING}");
    }
    eprintln!("backup: complete in {}", to.display());
    Ok(to.to_path_buf())
}
