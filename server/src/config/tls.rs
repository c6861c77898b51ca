//! The `[tls]` section: a server certificate from the operator's own PKI instead of the one
//! the hub issues from its generated CA (docs/operations.md, "Your own certificate").

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

/// How often the certificate files are looked at for a change, by default.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// PEM file: the server certificate first, then the intermediates of its chain.
    pub certificate: Option<PathBuf>,
    /// PEM file: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// How often the files are checked for a change (a renewal); SIGHUP reloads at once.
    #[serde(with = "humantime_serde")]
    pub check_interval: Duration,
}

impl Default for TlsSection {
    fn default() -> Self {
        TlsSection {
            certificate: None,
            key: None,
            check_interval: DEFAULT_CHECK_INTERVAL,
        }
    }
}

impl TlsSection {
    /// The configured certificate and key files, when the operator brings their own.
    pub fn own(&self) -> Option<(PathBuf, PathBuf)> {
        Some((self.certificate.clone()?, self.key.clone()?))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.certificate.is_some() != self.key.is_some() {
            return Err(ConfigError::Invalid {
                key: "tls",
                reason: "certificate and key are set together".into(),
            });
        }
        if self.check_interval < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                key: "tls.check_interval",
                reason: "at least 1s".into(),
            });
        }
        Ok(())
    }
}
