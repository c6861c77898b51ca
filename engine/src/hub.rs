//! Hub-wide settings: name, host names and the shared access policies.
//!
//! # Invariants
//! - Settings are written once by [`Store::initialise_hub`] and then only replaced whole
//!   (policies one change at a time: [`crate::policies`]).
//! - There are between 1 and [`MAX_POLICIES`] policies with distinct names.
//! - The host name and every other host name are distinct (ignoring ASCII case), each a DNS
//!   name or an IP address; there are at most [`MAX_HOST_NAMES`] in all.

use serde::{Deserialize, Serialize};

use crate::error::{HubError, ValidationError};
use crate::keys;
use crate::model::{generate_key, UnixMillis};
use crate::raw::Batch;
use crate::Store;
use ferrohub_migrations::cf;

/// Most shared access policies a hub may have.
pub const MAX_POLICIES: usize = 16;

/// Most host names (the main one and the others) a hub answers to.
pub const MAX_HOST_NAMES: usize = 16;

/// Rights a policy grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Permissions {
    pub registry_read: bool,
    pub registry_write: bool,
    pub service_connect: bool,
    pub device_connect: bool,
}

impl Permissions {
    pub const ALL: Permissions = Permissions {
        registry_read: true,
        registry_write: true,
        service_connect: true,
        device_connect: true,
    };
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedAccessPolicy {
    pub name: String,
    pub primary_key: String,
    pub secondary_key: String,
    pub permissions: Permissions,
}

impl SharedAccessPolicy {
    /// A policy with freshly generated 256-bit keys.
    pub fn generate(name: &str, permissions: Permissions) -> Self {
        SharedAccessPolicy {
            name: name.to_string(),
            primary_key: generate_key(),
            secondary_key: generate_key(),
            permissions,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubSettings {
    pub hub_name: String,
    /// The name in connection strings and redirects.
    pub host_name: String,
    /// Further names the hub answers to (a DNS alias, an IP address): SAS audiences and MQTT
    /// user names may use any of them, and the server certificate covers them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_host_names: Vec<String>,
    pub policies: Vec<SharedAccessPolicy>,
    pub created: UnixMillis,
    /// The provisioning service's ID scope and policies (DPS-5). `None` only in hubs
    /// initialised before provisioning existed, until their next start adds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<crate::provisioning::ProvisioningSettings>,
}

impl HubSettings {
    /// The five policies a new IoT hub has.
    pub fn default_policies() -> Vec<SharedAccessPolicy> {
        let p = |r, w, s, d| Permissions {
            registry_read: r,
            registry_write: w,
            service_connect: s,
            device_connect: d,
        };
        vec![
            SharedAccessPolicy::generate("iothubowner", Permissions::ALL),
            SharedAccessPolicy::generate("service", p(false, false, true, false)),
            SharedAccessPolicy::generate("device", p(false, false, false, true)),
            SharedAccessPolicy::generate("registryRead", p(true, false, false, false)),
            SharedAccessPolicy::generate("registryReadWrite", p(true, true, false, false)),
        ]
    }

    pub fn policy(&self, name: &str) -> Option<&SharedAccessPolicy> {
        self.policies.iter().find(|p| p.name == name)
    }

    /// The host name first, then the others.
    pub fn host_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.host_name.as_str())
            .chain(self.other_host_names.iter().map(String::as_str))
    }

    /// Whether `name` is one of the hub's host names (ASCII case ignored, as DNS does).
    pub fn answers_to(&self, name: &str) -> bool {
        self.host_names().any(|h| h.eq_ignore_ascii_case(name))
    }

    pub(crate) fn validate(&self) -> Result<(), ValidationError> {
        let names: Vec<&str> = self.host_names().collect();
        if names.len() > MAX_HOST_NAMES {
            return Err(ValidationError::new(
                "hostName",
                format!("a hub has at most {MAX_HOST_NAMES} host names"),
            ));
        }
        for (i, name) in names.iter().enumerate() {
            if !is_host_name(name) {
                return Err(ValidationError::new(
                    "hostName",
                    format!("{name:?} is neither a DNS name nor an IP address"),
                ));
            }
            if names[..i].iter().any(|n| n.eq_ignore_ascii_case(name)) {
                return Err(ValidationError::new(
                    "hostName",
                    format!("{name:?} is given twice"),
                ));
            }
        }
        if self.policies.is_empty() || self.policies.len() > MAX_POLICIES {
            return Err(ValidationError::new(
                "policies",
                format!("a hub has 1 to {MAX_POLICIES} policies"),
            ));
        }
        let mut names: Vec<&str> = self.policies.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(ValidationError::new(
                "policies",
                "policy names must be distinct",
            ));
        }
        Ok(())
    }
}

/// A DNS name (labels of letters, digits and hyphens, 1-63 characters, not starting or ending
/// with a hyphen; 253 characters at most) or an IP address.
pub fn is_host_name(name: &str) -> bool {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

impl Store {
    /// The hub's settings, or `None` before initialisation.
    ///
    /// # Errors
    /// [`HubError::Storage`] on a read failure or corruption.
    pub fn hub_settings(&self) -> Result<Option<HubSettings>, HubError> {
        Ok(self.raw.get_record(cf::META, keys::meta::HUB_SETTINGS)?)
    }

    /// Stores the settings of a new hub; returns the settings in force (the existing ones if
    /// the hub was already initialised, so initialisation is idempotent).
    ///
    /// # Errors
    /// [`HubError::Invalid`] for bad policies, [`HubError::Storage`] on failure.
    pub fn initialise_hub(&self, settings: HubSettings) -> Result<HubSettings, HubError> {
        let _guard = self.hub_lock.lock();
        if let Some(existing) = self.hub_settings()? {
            return Ok(existing);
        }
        settings.validate()?;
        let mut batch = Batch::default();
        batch.put_record(cf::META, keys::meta::HUB_SETTINGS.to_vec(), &settings);
        self.raw.commit(batch)?;
        Ok(settings)
    }

    /// Replaces the settings of an initialised hub (for example its policies).
    ///
    /// # Errors
    /// [`HubError::NotInitialised`], [`HubError::Invalid`] or [`HubError::Storage`].
    pub fn replace_hub_settings(&self, settings: HubSettings) -> Result<(), HubError> {
        let _guard = self.hub_lock.lock();
        if self.hub_settings()?.is_none() {
            return Err(HubError::NotInitialised);
        }
        self.write_hub_settings(&settings)
    }

    /// Checks and writes the settings whole; the caller holds the hub lock.
    pub(crate) fn write_hub_settings(&self, settings: &HubSettings) -> Result<(), HubError> {
        settings.validate()?;
        let mut batch = Batch::default();
        batch.put_record(cf::META, keys::meta::HUB_SETTINGS.to_vec(), settings);
        Ok(self.raw.commit(batch)?)
    }
}

/// A certificate authority registered for X.509 CA-signed device authentication.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateAuthority {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub der: Vec<u8>,
    pub created: UnixMillis,
}

fn ca_key(name: &str) -> Vec<u8> {
    let mut k = keys::meta::CA_PREFIX.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

impl Store {
    /// Registers (or replaces) a CA certificate (DER, already checked by the caller).
    ///
    /// # Errors
    /// [`HubError::Invalid`] for a bad name, [`HubError::Storage`] on failure.
    pub fn put_certificate_authority(&self, ca: &CertificateAuthority) -> Result<(), HubError> {
        let ok = !ca.name.is_empty()
            && ca.name.len() <= 64
            && ca
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
        if !ok {
            return Err(ValidationError::new(
                "name",
                "must be 1 to 64 letters, digits, '-', '.' or '_'",
            )
            .into());
        }
        let mut batch = Batch::default();
        batch.put_record(cf::META, ca_key(&ca.name), ca);
        Ok(self.raw.commit(batch)?)
    }

    /// Registered CAs, by name.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_certificate_authorities(&self) -> Result<Vec<CertificateAuthority>, HubError> {
        let mut out = Vec::new();
        let prefix = keys::meta::CA_PREFIX;
        self.raw.scan_records::<CertificateAuthority>(
            cf::META,
            prefix,
            keys::prefix_end(prefix),
            |_, ca| {
                out.push(ca);
                true
            },
        )?;
        Ok(out)
    }

    /// Removes a CA; returns whether it existed.
    ///
    /// # Errors
    /// Storage errors.
    pub fn delete_certificate_authority(&self, name: &str) -> Result<bool, HubError> {
        let existed = self
            .raw
            .get_record::<CertificateAuthority>(cf::META, &ca_key(name))?
            .is_some();
        let mut batch = Batch::default();
        batch.delete(cf::META, ca_key(name));
        self.raw.commit(batch)?;
        Ok(existed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_dns_names_or_ip_addresses() {
        for good in [
            "localhost",
            "hub.example.com",
            "a-1.b",
            "10.0.0.5",
            "::1",
            "fd00::7",
        ] {
            assert!(is_host_name(good), "{good}");
        }
        for bad in [
            "",
            "hub..example",
            "-hub.example",
            "hub-.example",
            "hub_1.example",
            "a b",
            "hub:8883",
        ] {
            assert!(!is_host_name(bad), "{bad}");
        }
        assert!(!is_host_name(&"a".repeat(64)));
    }

    #[test]
    fn other_host_names_must_be_distinct_from_the_host_name() {
        let mut settings = HubSettings {
            hub_name: "h".into(),
            host_name: "Hub.Example".into(),
            other_host_names: vec!["10.0.0.5".into()],
            policies: HubSettings::default_policies(),
            created: UnixMillis(0),
            provisioning: None,
        };
        assert!(settings.validate().is_ok());
        assert!(settings.answers_to("hub.example") && settings.answers_to("10.0.0.5"));
        assert!(!settings.answers_to("other.example"));
        settings.other_host_names.push("hub.example".into());
        assert!(settings.validate().is_err());
    }
}
