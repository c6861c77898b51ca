//! TLS for the brokers a delivery publishes to: the machine's roots, and the target's own CA
//! when it has one (a broker with its own PKI).

use std::sync::Arc;

use rustls::pki_types::CertificateDer;

/// The certificates of a PEM bundle; at least one, or why not.
///
/// # Errors
/// The bundle does not parse or holds no certificate.
pub fn ca_certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("caCertificate: {e}"))?;
    if certs.is_empty() {
        return Err("caCertificate: no PEM certificate in it".into());
    }
    Ok(certs)
}

/// A client configuration trusting the machine's roots and `ca` (PEM).
///
/// # Errors
/// The CA does not parse, or no root at all could be loaded.
pub fn client_config(ca: Option<&str>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    // The machine's roots, when it has any: a broker with a public certificate needs no CA.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(pem) = ca {
        for cert in ca_certificates(pem)? {
            roots.add(cert).map_err(|e| format!("caCertificate: {e}"))?;
        }
    }
    if roots.is_empty() {
        return Err("no CA certificate given and none on this machine".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
