//! X.509 device authentication (SEC-3): thumbprints of self-signed certificates, chains to CAs
//! registered with the hub, and the TLS verifier that asks for (but does not require) a client
//! certificate. The handshake proves the client holds the certificate's key; which identity the
//! certificate stands for is decided at CONNECT, against the registry.

use std::sync::Arc;

use ferrohub_engine::hub::CertificateAuthority;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use sha1::Digest as _;

/// The TLS client certificate chain of an HTTPS connection (leaf first, empty when none), put
/// into each request's extensions by the HTTPS listener.
#[derive(Debug, Clone, Default)]
pub struct PeerChain(pub Arc<Vec<CertificateDer<'static>>>);

/// Upper-case hex SHA-1 and SHA-256 of a certificate's DER: the two thumbprint forms IoT Hub
/// accepts.
pub fn thumbprints(cert: &CertificateDer<'_>) -> (String, String) {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02X}")).collect::<String>();
    (
        hex(&sha1::Sha1::digest(cert.as_ref())),
        hex(&sha2::Sha256::digest(cert.as_ref())),
    )
}

/// Whether the certificate's thumbprint is one of `expected` (case-insensitive).
pub fn thumbprint_matches<'a>(
    cert: &CertificateDer<'_>,
    expected: impl IntoIterator<Item = Option<&'a str>>,
) -> bool {
    let (s1, s256) = thumbprints(cert);
    expected
        .into_iter()
        .flatten()
        .any(|t| t.eq_ignore_ascii_case(&s1) || t.eq_ignore_ascii_case(&s256))
}

#[derive(Debug, thiserror::Error)]
pub enum X509Error {
    #[error("no certificate authority is registered with the hub")]
    NoAuthorities,
    #[error("the client certificate does not chain to a registered CA: {0}")]
    Chain(String),
    #[error("the certificate's subject common name is {found:?}, not {expected:?}")]
    Subject { found: String, expected: String },
    #[error("the certificate cannot be parsed: {0}")]
    Parse(String),
}

/// The subject common name of a certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Result<String, X509Error> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| X509Error::Parse(e.to_string()))?;
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok(cn)
}

/// The certificate's subject and issuer names, DER as they stand in it (`None` when it cannot
/// be parsed): equal bytes name the same CA, which is how a chain finds its issuer.
pub fn subject_and_issuer(der: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(der).ok()?;
    Some((
        parsed.subject().as_raw().to_vec(),
        parsed.issuer().as_raw().to_vec(),
    ))
}

/// Checks that `cert` chains to one of `cas` (valid now, for client authentication) and that
/// its subject CN is the identity (`deviceId` or `deviceId/moduleId`), as IoT Hub requires.
pub fn verify_ca_signed(
    cert: &CertificateDer<'static>,
    cas: &[CertificateAuthority],
    subject: &str,
    now_secs: i64,
) -> Result<(), X509Error> {
    if cas.is_empty() {
        return Err(X509Error::NoAuthorities);
    }
    let anchors: Vec<(&str, &[u8])> = cas.iter().map(|c| (c.name.as_str(), &c.der[..])).collect();
    chains_to(cert, &[], &anchors, now_secs)?;
    let cn = common_name(cert)?;
    if cn != subject {
        return Err(X509Error::Subject {
            found: cn,
            expected: subject.to_string(),
        });
    }
    Ok(())
}

/// Checks that `cert`, with the `intermediates` the client sent, chains to one of `anchors`
/// (`(name, DER)`; a root or an intermediate CA alike) and is valid now for client
/// authentication.
///
/// # Errors
/// [`X509Error::Chain`] naming why.
pub fn chains_to(
    cert: &CertificateDer<'static>,
    intermediates: &[CertificateDer<'static>],
    anchors: &[(&str, &[u8])],
    now_secs: i64,
) -> Result<(), X509Error> {
    let mut roots = RootCertStore::empty();
    for (name, der) in anchors {
        roots
            .add(CertificateDer::from(der.to_vec()))
            .map_err(|e| X509Error::Chain(format!("certificate {name}: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| X509Error::Chain(e.to_string()))?;
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now_secs.max(0) as u64));
    verifier
        .verify_client_cert(cert, intermediates, now)
        .map_err(|e| X509Error::Chain(e.to_string()))?;
    Ok(())
}

/// A certificate from PEM (the first one) or base64 DER, as DPS enrollments carry them.
///
/// # Errors
/// [`X509Error::Parse`].
pub fn parse_certificate_text(text: &str) -> Result<Vec<u8>, X509Error> {
    use base64::Engine as _;
    let trimmed = text.trim();
    let der = if trimmed.starts_with("-----") {
        rustls_pemfile::certs(&mut trimmed.as_bytes())
            .next()
            .ok_or_else(|| X509Error::Parse("no certificate in the PEM".into()))?
            .map_err(|e| X509Error::Parse(e.to_string()))?
            .to_vec()
    } else {
        let compact: String = trimmed.split_whitespace().collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|_| X509Error::Parse("neither PEM nor base64 DER".into()))?
    };
    x509_parser::parse_x509_certificate(&der).map_err(|e| X509Error::Parse(e.to_string()))?;
    Ok(der)
}

/// Parses a PEM (or DER) certificate for registration as a CA.
pub fn parse_ca(bytes: &[u8]) -> Result<Vec<u8>, X509Error> {
    let der = if bytes.starts_with(b"-----") {
        rustls_pemfile::certs(&mut &bytes[..])
            .next()
            .ok_or_else(|| X509Error::Parse("no certificate in the PEM".into()))?
            .map_err(|e| X509Error::Parse(e.to_string()))?
            .to_vec()
    } else {
        bytes.to_vec()
    };
    let (_, parsed) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| X509Error::Parse(e.to_string()))?;
    if !parsed.is_ca() {
        return Err(X509Error::Parse(
            "the certificate is not a CA (basicConstraints CA:TRUE missing)".into(),
        ));
    }
    Ok(der)
}

/// Asks every TLS client for a certificate, accepts any (after checking the handshake
/// signature with it), and leaves the identity decision to CONNECT.
#[derive(Debug)]
pub struct OptionalClientCert {
    provider: Arc<CryptoProvider>,
}

impl OptionalClientCert {
    pub fn new(provider: Arc<CryptoProvider>) -> Arc<Self> {
        Arc::new(OptionalClientCert { provider })
    }
}

impl ClientCertVerifier for OptionalClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
