//! The one place credentials become a principal (SEC-1..SEC-4).
//!
//! Protocol adapters only adapt: REST hands over the `Authorization` header, MQTT the CONNECT
//! identity, password and TLS client certificate, AMQP (later) the CBS put-token. Each maps the
//! [`AuthFailure`] it gets back to its own refusal (a 401 body, a CONNACK code, an AMQP error).
//!
//! # Invariants
//! - A service token (no identity in the request) is a policy token, or a device token whose
//!   identity exists, uses SAS and is enabled.
//! - A device connection is allowed only for an existing, enabled identity (a module follows
//!   its device's status) with a token scoped to exactly that identity (its own key, or a
//!   policy with DeviceConnect), or with a certificate the identity's X.509 settings accept.
//! - Time comes from the hub's [`Clock`]; storage failures are reported as such, never as a
//!   refusal, so a client can tell "try again" from "go away".

use std::sync::Arc;

use ferrohub_engine::model::{AuthType, Identity as Record, Status};
use ferrohub_engine::{HubError, RegistryError, StorageError};
use rustls::pki_types::CertificateDer;

use super::policies::LivePolicies;
use super::store_handle::StoreHandle;
use crate::auth::sas::SasToken;
use crate::auth::{self, AuthError, Permission, Principal, Scope};
use crate::clock::Clock;
use crate::ids::Identity;
use crate::telemetry::AuthMethod;
use crate::x509;

/// Why credentials were not accepted.
#[derive(Debug, thiserror::Error)]
pub enum AuthFailure {
    /// The credentials are wrong, expired, or not allowed: final for these credentials.
    #[error(transparent)]
    Refused(#[from] AuthError),
    /// The registry could not be read: the client may try again.
    #[error("the registry is unavailable: {0}")]
    Unavailable(StorageError),
}

/// A principal proved by a token, valid until the token's expiry.
#[derive(Debug, Clone)]
pub struct ServiceClaim {
    pub principal: Principal,
    /// The token's `se`, seconds since the epoch.
    pub expires_secs: u64,
}

/// A device or module allowed to connect, and how it proved it.
#[derive(Debug, Clone)]
pub struct DeviceAuth {
    pub who: Identity,
    /// The identity's registry record as read at authentication.
    pub record: Record,
    pub method: AuthMethod,
}

/// Checks credentials against the hub's policies and registry.
#[derive(Clone)]
pub struct Authenticator {
    store: StoreHandle,
    /// The policies as they stand now: a token is checked against the current ones.
    policies: Arc<LivePolicies>,
    clock: Clock,
}

impl Authenticator {
    pub fn new(store: StoreHandle, policies: Arc<LivePolicies>, clock: Clock) -> Self {
        Authenticator {
            store,
            policies,
            clock,
        }
    }

    /// A SAS token presented to a service endpoint: a policy token, or a device or module
    /// token checked against that identity's keys.
    ///
    /// # Errors
    /// [`AuthFailure::Refused`] with the reason; [`AuthFailure::Unavailable`] when the
    /// identity could not be read.
    pub async fn service_token(&self, token: &str) -> Result<Principal, AuthFailure> {
        self.service_claim(token).await.map(|c| c.principal)
    }

    /// [`Authenticator::service_token`], with the token's expiry: for protocols where one
    /// token authorises a connection until it expires or is replaced (AMQP CBS).
    ///
    /// # Errors
    /// As [`Authenticator::service_token`].
    pub async fn service_claim(&self, token: &str) -> Result<ServiceClaim, AuthFailure> {
        let token = SasToken::parse(token).map_err(AuthError::from)?;
        let now = self.clock.now_secs();
        let claim = |principal| ServiceClaim {
            principal,
            expires_secs: token.expiry,
        };
        if let Some(p) = auth::authenticate_policy(&token, &self.policies.current(), now)? {
            return Ok(claim(p));
        }
        let Scope::Device {
            device_id,
            module_id,
        } = auth::parse_scope(&token.resource, &*self.policies.current())?
        else {
            return Err(AuthError::UnknownIdentity("(hub)".into()).into());
        };
        let who = match module_id {
            Some(m) => Identity::for_module(device_id, m),
            None => Identity::for_device(device_id),
        };
        let record = self.record(&who).await?;
        Ok(claim(auth::authenticate_identity(&token, &record, now)?))
    }

    /// A shared access policy's token, checked at once and without storage (policies live in
    /// the hub's settings): for SASL PLAIN, whose answer cannot wait.
    ///
    /// # Errors
    /// [`AuthError`] when it is not a valid, current token of a policy of this hub.
    pub fn policy_claim(&self, token: &str) -> Result<ServiceClaim, AuthError> {
        let token = SasToken::parse(token)?;
        let principal =
            auth::authenticate_policy(&token, &self.policies.current(), self.clock.now_secs())?
                .ok_or(AuthError::UnknownPolicy(String::new()))?;
        Ok(ServiceClaim {
            principal,
            expires_secs: token.expiry,
        })
    }

    /// A policy's own key, as SASL PLAIN may carry it (user `{policy}@sas.root.{hub}`): valid
    /// as long as the key is.
    ///
    /// # Errors
    /// [`AuthError::UnknownPolicy`] for an unknown policy or a key that is not one of its two.
    pub fn policy_key_claim(&self, policy: &str, key: &str) -> Result<ServiceClaim, AuthError> {
        let refused = || AuthError::UnknownPolicy(policy.to_string());
        let settings = self.policies.current();
        let p = settings.policy(policy).ok_or_else(refused)?;
        if !same_secret(key, &p.primary_key) && !same_secret(key, &p.secondary_key) {
            return Err(refused());
        }
        Ok(ServiceClaim {
            principal: Principal {
                signer: auth::Signer::Policy(p.name.clone()),
                scope: Scope::Hub,
                permissions: p.permissions,
            },
            expires_secs: u64::MAX,
        })
    }

    /// Seconds since the epoch by the hub's clock, to compare with a claim's expiry.
    pub fn now_secs(&self) -> u64 {
        self.clock.now_secs()
    }

    /// A device or module connecting with a SAS token (`Some`) or, without one, the TLS client
    /// certificate it presented.
    ///
    /// # Errors
    /// [`AuthFailure::Refused`] with the reason; [`AuthFailure::Unavailable`] when the
    /// registry could not be read.
    pub async fn device(
        &self,
        who: &Identity,
        token: Option<&str>,
        client_cert: Option<&CertificateDer<'static>>,
    ) -> Result<DeviceAuth, AuthFailure> {
        let record = self.record(who).await?;
        // A module has no status of its own: its device's status governs it.
        let device_status = if who.module_id.is_some() {
            self.record(&Identity::for_device(who.device_id.as_str()))
                .await?
                .status
        } else {
            record.status
        };
        if device_status == Status::Disabled {
            return Err(AuthError::Disabled(who.to_string()).into());
        }
        let method = match token {
            Some(token) => self.device_token(token, who, &record)?,
            None => self.certificate(who, &record, client_cert).await?,
        };
        Ok(DeviceAuth {
            who: who.clone(),
            record,
            method,
        })
    }

    async fn record(&self, who: &Identity) -> Result<Record, AuthFailure> {
        let (d, m) = (who.device_id.clone(), who.module_id.clone());
        let name = who.to_string();
        self.store
            .run_quick(move |s| match &m {
                Some(m) => s.get_module(&d, m),
                None => s.get_device(&d),
            })
            .await
            .map_err(|e| match e {
                RegistryError::Storage(s) => AuthFailure::Unavailable(s),
                _ => AuthFailure::Refused(AuthError::UnknownIdentity(name)),
            })
    }

    fn device_token(
        &self,
        token: &str,
        who: &Identity,
        record: &Record,
    ) -> Result<AuthMethod, AuthFailure> {
        let token = SasToken::parse(token).map_err(AuthError::from)?;
        let scope = auth::parse_scope(&token.resource, &*self.policies.current())?;
        let expected = Scope::Device {
            device_id: who.device_id.to_string(),
            module_id: who.module_id.as_ref().map(|m| m.to_string()),
        };
        if scope != expected {
            return Err(AuthError::OtherIdentity {
                resource: token.resource.clone(),
                identity: who.to_string(),
            }
            .into());
        }
        let now = self.clock.now_secs();
        if token.key_name.is_some() {
            let principal = auth::authenticate_policy(&token, &self.policies.current(), now)?
                .ok_or_else(|| AuthError::UnknownPolicy(String::new()))?;
            principal.require(Permission::DeviceConnect)?;
            return Ok(AuthMethod::Sas { hub_policy: true });
        }
        auth::authenticate_identity(&token, record, now)?;
        Ok(AuthMethod::Sas { hub_policy: false })
    }

    async fn certificate(
        &self,
        who: &Identity,
        record: &Record,
        cert: Option<&CertificateDer<'static>>,
    ) -> Result<AuthMethod, AuthFailure> {
        let cert = cert.ok_or(AuthError::Missing)?;
        let refuse = |reason: String| AuthFailure::Refused(AuthError::Certificate(reason));
        match record.authentication.kind {
            AuthType::SelfSigned => {
                let prints = record
                    .authentication
                    .thumbprints
                    .clone()
                    .unwrap_or_default();
                if x509::thumbprint_matches(
                    cert,
                    [prints.primary.as_deref(), prints.secondary.as_deref()],
                ) {
                    Ok(AuthMethod::X509SelfSigned)
                } else {
                    Err(refuse(format!(
                        "client certificate thumbprint does not match {who}"
                    )))
                }
            }
            AuthType::CertificateAuthority => {
                let cas = self
                    .store
                    .run_quick(|s| s.list_certificate_authorities())
                    .await
                    .map_err(|e| match e {
                        HubError::Storage(s) => AuthFailure::Unavailable(s),
                        other => AuthFailure::Unavailable(StorageError::Backend(other.to_string())),
                    })?;
                x509::verify_ca_signed(cert, &cas, &who.to_string(), self.clock.now_secs() as i64)
                    .map_err(|e| refuse(e.to_string()))?;
                Ok(AuthMethod::X509Ca)
            }
            AuthType::Sas | AuthType::None => {
                Err(refuse(format!("{who} does not use X.509 authentication")))
            }
        }
    }
}
/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}
