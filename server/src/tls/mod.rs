//! TLS material: the hub's own CA and server certificate, created once per data directory
//! ([`issue`]), the certificate the listeners serve and reload ([`serving`]), and the rustls
//! configurations offering TLS 1.2 and 1.3.
//!
//! Files under `DIR/tls/`: `ca.pem` (give this to clients), `ca-key.pem`, `server.pem` (server
//! certificate followed by the CA), `server-key.pem`. Keys are written with mode 0600. With a
//! `[tls]` certificate configured, the listeners serve that instead (the files stay, unused).

pub mod issue;
pub mod serving;

pub use issue::{ensure_material, ensure_material_for, reissue_server};
pub use serving::{CertificateFiles, ServerCertificate};

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration failed: {0}")]
    Config(#[from] rustls::Error),
}

pub struct TlsPaths {
    pub dir: PathBuf,
}

impl TlsPaths {
    pub fn new(data_dir: &Path) -> Self {
        TlsPaths {
            dir: data_dir.join("tls"),
        }
    }
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    fn ca_key(&self) -> PathBuf {
        self.dir.join("ca-key.pem")
    }
    fn server(&self) -> PathBuf {
        self.dir.join("server.pem")
    }
    fn server_key(&self) -> PathBuf {
        self.dir.join("server-key.pem")
    }

    /// The generated server certificate's files.
    pub fn generated(&self) -> CertificateFiles {
        CertificateFiles {
            chain: self.server(),
            key: self.server_key(),
            own: false,
        }
    }
}

fn file_err(path: &Path, e: impl ToString) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&tmp)
        .map_err(|e| file_err(&tmp, e))?;
    f.write_all(contents.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| file_err(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| file_err(path, e))
}

/// The files of the material, in the order they are written (`ca.pem`, which marks the
/// material complete, last).
pub const MATERIAL_FILES: [&str; 4] = ["ca-key.pem", "server-key.pem", "server.pem", "ca.pem"];

/// Reads the material's files as (name, contents), or `None` when it is incomplete.
pub fn read_material(paths: &TlsPaths) -> Option<Vec<(String, String)>> {
    MATERIAL_FILES
        .iter()
        .map(|name| {
            fs::read_to_string(paths.dir.join(name))
                .ok()
                .map(|c| (name.to_string(), c))
        })
        .collect()
}

/// Writes material read elsewhere by [`read_material`] (cluster nodes share one).
pub fn write_material(paths: &TlsPaths, files: &[(String, String)]) -> Result<(), TlsError> {
    fs::create_dir_all(&paths.dir).map_err(|e| file_err(&paths.dir, e))?;
    for name in MATERIAL_FILES {
        let contents = files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c)
            .ok_or_else(|| file_err(&paths.dir.join(name), "missing from the shared material"))?;
        write_file(&paths.dir.join(name), contents, name.ends_with("key.pem"))?;
    }
    Ok(())
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = fs::read(path).map_err(|e| file_err(path, e))?;
    rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, e))
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = fs::read(path).map_err(|e| file_err(path, e))?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| file_err(path, e))?
        .ok_or_else(|| file_err(path, "no private key found"))
}

/// A configuration for `versions`, asking for an optional client certificate (X.509 device
/// authentication, X.509 provisioning over HTTPS, MQTT over WebSocket), serving `cert`.
fn config_for(
    cert: &Arc<ServerCertificate>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)?
        .with_client_cert_verifier(crate::x509::OptionalClientCert::new(provider))
        .with_cert_resolver(Arc::clone(cert) as Arc<dyn rustls::server::ResolvesServerCert>))
}

/// HTTPS, AMQP and MQTT over TLS: TLS 1.2 and 1.3.
pub fn server_config(cert: &Arc<ServerCertificate>) -> Result<Arc<ServerConfig>, TlsError> {
    Ok(Arc::new(config_for(
        cert,
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    )?))
}

/// MQTT over QUIC: TLS 1.3 only (QUIC requires it), ALPN `mqtt`. No 0-RTT data: a replayed
/// CONNECT or PUBLISH would be accepted twice, so resumption is 1-RTT (session tickets from
/// rustls' default cache).
pub fn mqtt_quic_server_config(cert: &Arc<ServerCertificate>) -> Result<ServerConfig, TlsError> {
    let mut config = config_for(cert, &[&rustls::version::TLS13])?;
    config.alpn_protocols = vec![b"mqtt".to_vec()];
    config.max_early_data_size = 0;
    Ok(config)
}

/// The PEM file at `path` (the hub's public CA certificate) as an HTTP response
/// (`application/x-pem-file`), read now; `None` while there is none (a cluster node receives
/// its CA only once it joined). The ops listener and the console serve it.
pub async fn ca_pem_reply(path: &std::path::Path) -> Option<warp::reply::Response> {
    let pem = tokio::fs::read(path).await.ok()?;
    let mut response = warp::reply::Reply::into_response(pem);
    response.headers_mut().insert(
        "content-type",
        warp::http::HeaderValue::from_static("application/x-pem-file"),
    );
    Some(response)
}
