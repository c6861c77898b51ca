//! The hub's own CA and the server certificates it issues.
//!
//! # Invariants
//! - The CA is made once per data directory and never replaced here: devices trust it.
//!   Re-issuing (new host names) signs a new server key with the same CA key.
//! - `ca.pem` is written last when the material is made, so its presence marks it complete.
//! - A server certificate always covers `localhost`, `127.0.0.1` and `::1` besides the hub's
//!   names, so tools on the hub's own machine can reach it.

use std::fs;
use std::net::IpAddr;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use super::{file_err, write_file, TlsError, TlsPaths};

/// Names every server certificate covers besides the hub's.
const LOCAL_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Creates the CA and server certificate unless they exist. Returns true if it created them.
pub fn ensure_material(
    paths: &TlsPaths,
    hub_name: &str,
    host_name: &str,
) -> Result<bool, TlsError> {
    ensure_material_for(paths, hub_name, host_name, &[])
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

    let names: Vec<&str> = std::iter::once(host_name)
        .chain(extra_names.iter().map(String::as_str))
        .collect();
    let (server_cert, server_key) = issue_server(&ca_cert, &ca_key, &names)?;
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

/// Signs a new server key for `names` (the first is the subject's common name) with the CA
/// in `paths`, replacing `server.pem` and `server-key.pem`; the CA stays as it is.
///
/// # Errors
/// [`TlsError::File`] when the CA or its key is missing or unreadable (a hub whose server
/// certificate comes from elsewhere has no CA key to sign with).
pub fn reissue_server(paths: &TlsPaths, names: &[&str]) -> Result<(), TlsError> {
    let ca_pem = fs::read_to_string(paths.ca()).map_err(|e| file_err(&paths.ca(), e))?;
    let ca_key_pem =
        fs::read_to_string(paths.ca_key()).map_err(|e| file_err(&paths.ca_key(), e))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| file_err(&paths.ca_key(), e))?;
    // The issuer as the CA certificate names it (subject and key identifier), so the new
    // certificate chains to the ca.pem devices already trust.
    let ca_cert = CertificateParams::from_ca_cert_pem(&ca_pem)
        .map_err(|e| file_err(&paths.ca(), e))?
        .self_signed(&ca_key)?;
    let (server_cert, server_key) = issue_server(&ca_cert, &ca_key, names)?;
    // The key first: a reload between the two writes fails on a mismatched pair and keeps
    // serving the old one, where the other order could pair the old key with the new chain.
    write_file(&paths.server_key(), &server_key.serialize_pem(), true)?;
    write_file(
        &paths.server(),
        &format!("{}{ca_pem}", server_cert.pem()),
        false,
    )?;
    Ok(())
}

fn issue_server(
    ca_cert: &Certificate,
    ca_key: &KeyPair,
    names: &[&str],
) -> Result<(Certificate, KeyPair), TlsError> {
    let server_key = KeyPair::generate()?;
    let mut all: Vec<&str> = Vec::new();
    for n in names.iter().copied().chain(LOCAL_NAMES) {
        if !all.iter().any(|x| x.eq_ignore_ascii_case(n)) {
            all.push(n);
        }
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, all[0]);
    params.distinguished_name = dn;
    params.subject_alt_names = all
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n.to_string().try_into().map(SanType::DnsName),
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
    let cert = params.signed_by(&server_key, ca_cert, ca_key)?;
    Ok((cert, server_key))
}
