//! `ferrohub info`: what a data directory holds, read without disturbing a running hub.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::anyhow;
use ferrohub_engine::Store;
use rustls::pki_types::CertificateDer;

use crate::node::db_path;
use crate::tls::serving::{describe, describe_file, Description};
use crate::tls::TlsPaths;

/// The facts `info` prints, one `key: value` line each.
pub struct Info {
    version: &'static str,
    data_dir: PathBuf,
    hub_name: String,
    host_names: Vec<String>,
    id_scope: Option<String>,
    devices: u64,
    storage_bytes: u64,
    ca: PathBuf,
    ca_fingerprint: Option<String>,
    ca_subject: Option<String>,
    server: Option<Description>,
}

impl fmt::Display for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "version: {}", self.version)?;
        writeln!(f, "data directory: {}", self.data_dir.display())?;
        writeln!(f, "hub name: {}", self.hub_name)?;
        writeln!(f, "host name: {}", self.host_names[0])?;
        if self.host_names.len() > 1 {
            writeln!(f, "other host names: {}", self.host_names[1..].join(", "))?;
        }
        if let Some(scope) = &self.id_scope {
            writeln!(f, "ID scope: {scope}")?;
        }
        writeln!(f, "devices: {}", self.devices)?;
        writeln!(
            f,
            "storage size: {} bytes ({})",
            self.storage_bytes,
            human(self.storage_bytes)
        )?;
        writeln!(f, "CA certificate: {}", self.ca.display())?;
        if let Some(subject) = &self.ca_subject {
            writeln!(f, "CA subject: {subject}")?;
        }
        if let Some(fp) = &self.ca_fingerprint {
            writeln!(f, "CA SHA-256 fingerprint: {fp}")?;
        }
        match &self.server {
            Some(d) => {
                writeln!(f, "server certificate names: {}", d.names.join(", "))?;
                writeln!(f, "server certificate expires: {}", d.not_after)?;
                writeln!(
                    f,
                    "(a certificate configured under [tls] is served instead of this one)"
                )
            }
            None => writeln!(f, "server certificate: none yet (made at first start)"),
        }
    }
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Colon-separated upper-case hex, as `openssl x509 -fingerprint -sha256` prints it.
fn fingerprint(der: &[u8]) -> String {
    let (_, sha256) = crate::x509::thumbprints(&CertificateDer::from(der));
    sha256
        .as_bytes()
        .chunks(2)
        .map(|pair| std::str::from_utf8(pair).unwrap_or("??"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Reads the facts of the hub in `data_dir` (read-only: works while the hub runs).
///
/// # Errors
/// A directory without a hub, storage errors.
pub fn info(data_dir: &Path) -> anyhow::Result<Info> {
    let db = db_path(data_dir);
    if !db.exists() {
        return Err(anyhow!(
            "{} holds no hub (no db/ directory)",
            data_dir.display()
        ));
    }
    let store = Store::open_read_only(&db)?;
    let settings = store
        .hub_settings()?
        .ok_or_else(|| anyhow!("{} holds no initialised hub", data_dir.display()))?;
    let devices = store.registry_statistics()?.total_device_count;
    let paths = TlsPaths::new(data_dir);
    let ca_der = std::fs::read(paths.ca()).ok().and_then(|pem| {
        rustls_pemfile::certs(&mut pem.as_slice())
            .next()
            .and_then(Result::ok)
    });
    Ok(Info {
        version: env!("CARGO_PKG_VERSION"),
        data_dir: data_dir.to_path_buf(),
        hub_name: settings.hub_name.clone(),
        host_names: settings.host_names().map(String::from).collect(),
        id_scope: settings.provisioning.as_ref().map(|p| p.id_scope.clone()),
        devices,
        storage_bytes: crate::backup::size_of(&db),
        ca_fingerprint: ca_der.as_ref().map(|d| fingerprint(d)),
        ca_subject: ca_der.as_ref().and_then(|d| describe(d)).map(|d| d.subject),
        ca: paths.ca(),
        server: describe_file(&paths.generated().chain),
    })
}
