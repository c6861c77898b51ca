//! TLS material: the hub's own CA and server certificate, created once per data directory
//! (P-2), and the rustls configuration offering TLS 1.2 and 1.3 (SEC-5).
//!
//! Files under `DIR/tls/`: `ca.pem` (give this to clients), `ca-key.pem`, `server.pem` (server
//! certificate followed by the CA), `server-key.pem`. Keys are written with mode 0600.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
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

/// Creates the CA and server certificate unless they exist. Returns true if it created them.
pub fn ensure_material(
    paths: &TlsPaths,
    hub_name: &str,
    host_name: &str,
) -> Result<bool, TlsError> {
    ensure_material_for(paths, hub_name, host_name, &[])
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

/// As [`ensure_material`], the server certificate also covering `extra_names` (names or IP
/// addresses).
pub fn ensure_material_for(
    paths: &TlsPaths,
    hub_name: &str,
    host_name: &str,
    extra_names: &[String],
) -> Result<bool, TlsError> {
    if paths.server().exists() && paths.server_key().exists() && paths.ca().exists() {
        return Ok(false);
    }
    fs::create_dir_all(&paths.dir).map_err(|e| file_err(&paths.dir, e))?;

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("ferrohub CA for {hub_name}"));
    dn.push(DnType::OrganizationName, "ferrohub");
    ca_params.distinguished_name = dn;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    ca_params.not_after = rcgen::date_time_ymd(2049, 1, 1);
    let ca_cert = ca_params.self_signed(&ca_key)?;

    let server_key = KeyPair::generate()?;
    let mut names: Vec<String> = vec![host_name.to_string()];
    for n in ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .chain(extra_names.iter().map(String::as_str))
    {
        if !names.iter().any(|x| x.eq_ignore_ascii_case(n)) {
            names.push(n.to_string());
        }
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, host_name);
    params.distinguished_name = dn;
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n.clone().try_into().map(SanType::DnsName),
        })
        .collect::<Result<_, _>>()?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2049, 1, 1);
    let server_cert = params.signed_by(&server_key, &ca_cert, &ca_key)?;

    write_file(&paths.ca_key(), &ca_key.serialize_pem(), true)?;
    write_file(&paths.server_key(), &server_key.serialize_pem(), true)?;
    write_file(
        &paths.server(),
        &format!("{}{}", server_cert.pem(), ca_cert.pem()),
        false,
    )?;
    // ca.pem last: its presence marks the material complete.
    write_file(&paths.ca(), &ca_cert.pem(), false)?;
    Ok(true)
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

/// The HTTPS configuration: TLS 1.2 and 1.3, ring provider, an optional client certificate
/// (X.509 provisioning over HTTPS, MQTT over WebSocket).
pub fn server_config(paths: &TlsPaths) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(crate::x509::OptionalClientCert::new(provider))
        .with_single_cert(load_certs(&paths.server())?, load_key(&paths.server_key())?)?;
    Ok(Arc::new(config))
}

/// The MQTT configuration: as HTTPS, but asking for an optional client certificate (X.509
/// device authentication).
/// MQTT over QUIC: TLS 1.3 only (QUIC requires it), ALPN `mqtt`, the same optional client
/// certificate as over TCP. No 0-RTT data: a replayed CONNECT or PUBLISH would be accepted
/// twice, so resumption is 1-RTT (session tickets from rustls' default cache).
pub fn mqtt_quic_server_config(paths: &TlsPaths) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(crate::x509::OptionalClientCert::new(provider))
        .with_single_cert(load_certs(&paths.server())?, load_key(&paths.server_key())?)?;
    config.alpn_protocols = vec![b"mqtt".to_vec()];
    config.max_early_data_size = 0;
    Ok(config)
}

pub fn mqtt_server_config(paths: &TlsPaths) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(crate::x509::OptionalClientCert::new(provider))
        .with_single_cert(load_certs(&paths.server())?, load_key(&paths.server_key())?)?;
    Ok(Arc::new(config))
}
