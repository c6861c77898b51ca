//! The certificate the listeners present, reloaded while the hub runs.
//!
//! Every listener (HTTPS, MQTT over TLS and QUIC, AMQP) resolves its certificate through one
//! [`ServerCertificate`]; [`ServerCertificate::reload`] swaps what new handshakes get, so a
//! renewed certificate is served without a restart and without dropping connections.
//!
//! # Invariants
//! - What is served is always a certificate with its matching key: a pair that does not load
//!   or does not match leaves the previous one in place (and is logged).
//! - The files are looked at again on SIGHUP and every `check_interval`; a change is noticed
//!   by modification time and length.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::{file_err, load_certs, load_key, TlsError};

/// Where the served certificate comes from.
#[derive(Debug, Clone)]
pub struct CertificateFiles {
    /// PEM: the certificate, then its chain.
    pub chain: PathBuf,
    pub key: PathBuf,
    /// The operator's own (`[tls]`), not the hub's generated one.
    pub own: bool,
}

/// What a served certificate says, for the log and `ferrohub info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    pub subject: String,
    pub issuer: String,
    /// DNS names and IP addresses it is valid for.
    pub names: Vec<String>,
    pub not_after: String,
}

impl Description {
    /// Whether `host` is among the names (a `*.` wildcard covers one label).
    pub fn covers(&self, host: &str) -> bool {
        self.names.iter().any(|n| {
            n.eq_ignore_ascii_case(host)
                || n.strip_prefix("*.").is_some_and(|suffix| {
                    host.split_once('.').is_some_and(|(label, rest)| {
                        !label.is_empty() && rest.eq_ignore_ascii_case(suffix)
                    })
                })
        })
    }
}

/// Reads the subject, issuer, names and expiry of a DER certificate.
pub fn describe(der: &[u8]) -> Option<Description> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => names.push(d.to_string()),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(std::net::IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes)
                            .ok()
                            .map(std::net::IpAddr::from),
                        _ => None,
                    };
                    names.extend(ip.map(|ip| ip.to_string()));
                }
                _ => {}
            }
        }
    }
    Some(Description {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        names,
        not_after: cert
            .validity()
            .not_after
            .to_rfc2822()
            .unwrap_or_else(|_| cert.validity().not_after.to_string()),
    })
}

/// [`describe`] for the first certificate of a PEM file.
pub fn describe_file(path: &Path) -> Option<Description> {
    let pem = std::fs::read(path).ok()?;
    let first = rustls_pemfile::certs(&mut pem.as_slice()).next()?.ok()?;
    describe(&first)
}

/// Modification time and length of both files: what a change is noticed by.
type Stamp = Option<(SystemTime, u64, SystemTime, u64)>;

fn stamp(files: &CertificateFiles) -> Stamp {
    let a = std::fs::metadata(&files.chain).ok()?;
    let b = std::fs::metadata(&files.key).ok()?;
    Some((a.modified().ok()?, a.len(), b.modified().ok()?, b.len()))
}

/// The served certificate: a rustls resolver whose answer [`ServerCertificate::reload`]
/// replaces.
pub struct ServerCertificate {
    files: CertificateFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Arc<CertifiedKey>, Stamp)>,
}

impl std::fmt::Debug for ServerCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCertificate")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ServerCertificate {
    /// Loads the pair in `files`.
    ///
    /// # Errors
    /// [`TlsError::File`] when a file is missing or unreadable, holds no certificate or key,
    /// or the key is not the certificate's.
    pub fn load(files: CertificateFiles) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let stamp = stamp(&files);
        let key = load_pair(&files, &provider)?;
        Ok(Arc::new(ServerCertificate {
            files,
            provider,
            current: RwLock::new((key, stamp)),
        }))
    }

    pub fn files(&self) -> &CertificateFiles {
        &self.files
    }

    /// What is served now.
    pub fn description(&self) -> Option<Description> {
        let key = Arc::clone(&self.current.read().0);
        key.cert.first().and_then(|c| describe(c))
    }

    /// Loads the files again if they changed since they were last loaded (or always, when
    /// `force`). Returns whether a new certificate is served.
    ///
    /// # Errors
    /// As [`ServerCertificate::load`]; the previous certificate is still served then.
    pub fn reload(&self, force: bool) -> Result<bool, TlsError> {
        let now = stamp(&self.files);
        if !force && now == self.current.read().1 {
            return Ok(false);
        }
        let key = match load_pair(&self.files, &self.provider) {
            Ok(key) => key,
            Err(e) => {
                // Remember the stamp so a broken file is reported once, not every interval.
                self.current.write().1 = now;
                return Err(e);
            }
        };
        let changed = key.cert != self.current.read().0.cert;
        *self.current.write() = (key, now);
        Ok(changed)
    }

    /// Reloads on SIGHUP and whenever the files change (looked at every `interval`), until
    /// `shutdown`.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: CancellationToken) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "no SIGHUP handler: certificates reload on change only");
                None
            }
        };
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let forced = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => false,
                Some(()) = async {
                    match hangup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => true,
            };
            let this = Arc::clone(&self);
            let outcome = tokio::task::spawn_blocking(move || this.reload(forced)).await;
            match outcome {
                Ok(Ok(true)) => {
                    let d = self.description();
                    tracing::info!(
                        file = %self.files.chain.display(),
                        subject = d.as_ref().map(|d| d.subject.as_str()).unwrap_or("?"),
                        names = ?d.as_ref().map(|d| &d.names),
                        expires = d.as_ref().map(|d| d.not_after.as_str()).unwrap_or("?"),
                        "server certificate reloaded"
                    );
                }
                Ok(Ok(false)) if forced => {
                    tracing::info!(file = %self.files.chain.display(), "SIGHUP: server certificate unchanged");
                }
                Ok(Ok(false)) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "server certificate not reloaded; still serving the previous one");
                }
                Err(e) => tracing::error!(error = %e, "certificate reload task failed"),
            }
        }
    }
}

impl ResolvesServerCert for ServerCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read().0))
    }
}

fn load_pair(
    files: &CertificateFiles,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(&files.chain)?;
    if chain.is_empty() {
        return Err(file_err(&files.chain, "no certificate found"));
    }
    let key = load_key(&files.key)?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| file_err(&files.key, e))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        // A key whose public half the provider cannot derive is taken on trust.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => {
            return Err(file_err(
                &files.key,
                format!("not the key of {}: {e}", shown(&files.chain)),
            ))
        }
    }
    Ok(Arc::new(certified))
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}
