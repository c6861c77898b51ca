//! CONNECT authentication (SEC-3, SEC-4, MQT-2): client id, username and credential must agree.
//!
//! - client id: `deviceId` or `deviceId/moduleId`
//! - username: `{host}/{deviceId}/?{query}` or `{host}/{deviceId}/{moduleId}/?{query}`
//! - credential: a SAS token in the password (identity key, or a policy with DeviceConnect scoped
//!   to the identity), or, with no password, the TLS client certificate (X.509 self-signed by
//!   thumbprint, or CA-signed by a CA registered with the hub).

use ferrohub_engine::model::{AuthType, Identity as Record, Status};
use ferrohub_engine::RegistryError;
use mqtt::control::ConnectReturnCode;
use rustls::pki_types::CertificateDer;

use super::topics::Identity;
use crate::auth::{self, sas::SasToken, Scope};
use crate::hub::HubContext;
use crate::telemetry::AuthMethod;
use crate::x509;

/// Why a CONNECT was refused, with the CONNACK code it gets.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("malformed credentials: {0}")]
    BadCredentials(String),
    #[error("not authorised: {0}")]
    NotAuthorized(String),
    #[error("hub unavailable: {0}")]
    Unavailable(String),
}

impl Refusal {
    pub fn code(&self) -> ConnectReturnCode {
        match self {
            Refusal::BadCredentials(_) => ConnectReturnCode::BadUserNameOrPassword,
            Refusal::NotAuthorized(_) => ConnectReturnCode::NotAuthorized,
            // Transient: the device SDK retries on 3, and stops for good on 4 or 5.
            Refusal::Unavailable(_) => ConnectReturnCode::ServiceUnavailable,
        }
    }
}

/// An authenticated device or module.
#[derive(Debug, Clone)]
pub struct Authenticated {
    pub who: Identity,
    pub record: Record,
    pub method: AuthMethod,
}

/// Splits a client id into device and optional module.
pub fn parse_client_id(client_id: &str) -> Result<Identity, Refusal> {
    let mut parts = client_id.splitn(2, '/');
    let device_id = parts.next().unwrap_or_default().to_string();
    let module_id = parts.next().map(str::to_string);
    if device_id.is_empty() || module_id.as_deref() == Some("") {
        return Err(Refusal::BadCredentials(format!(
            "client id {client_id:?} is not deviceId or deviceId/moduleId"
        )));
    }
    Ok(Identity {
        device_id,
        module_id,
    })
}

/// Checks `{host}/{deviceId}[/{moduleId}]/?...` against the hub and the client id.
pub fn check_username(username: Option<&str>, host: &str, who: &Identity) -> Result<(), Refusal> {
    let username = username.ok_or_else(|| Refusal::BadCredentials("no username".into()))?;
    let path = username
        .split('?')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/');
    let parts: Vec<&str> = path.split('/').collect();
    let (h, d, m) = match parts.as_slice() {
        [h, d] => (*h, *d, None),
        [h, d, m] => (*h, *d, Some(*m)),
        _ => {
            return Err(Refusal::BadCredentials(format!(
                "username {username:?} is not host/deviceId[/moduleId]/?..."
            )))
        }
    };
    if !h.eq_ignore_ascii_case(host) || d != who.device_id || m != who.module_id.as_deref() {
        return Err(Refusal::BadCredentials(format!(
            "username {username:?} does not match client id {:?} on {host}",
            who.client_id()
        )));
    }
    Ok(())
}

fn now_secs() -> u64 {
    chrono::Utc::now().timestamp().max(0) as u64
}

/// Authenticates a CONNECT.
pub async fn authenticate(
    ctx: &HubContext,
    client_id: &str,
    username: Option<&str>,
    password: Option<&str>,
    client_cert: Option<&CertificateDer<'static>>,
) -> Result<Authenticated, Refusal> {
    let who = parse_client_id(client_id)?;
    check_username(username, &ctx.settings.host_name, &who)?;
    let (d, m) = (who.device_id.clone(), who.module_id.clone());
    let record = ctx
        .store
        .run(move |s| match &m {
            Some(m) => s.get_module(&d, m),
            None => s.get_device(&d),
        })
        .await
        .map_err(|e| match e {
            RegistryError::Storage(e) => Refusal::Unavailable(e.to_string()),
            other => Refusal::NotAuthorized(other.to_string()),
        })?;
    // A module has no status of its own: its device's status governs it.
    let device_status = if who.module_id.is_some() {
        let d = who.device_id.clone();
        ctx.store
            .run(move |s| s.get_device(&d))
            .await
            .map(|r| r.status)
            .map_err(|e| Refusal::NotAuthorized(e.to_string()))?
    } else {
        record.status
    };
    if device_status == Status::Disabled {
        return Err(Refusal::NotAuthorized(format!(
            "{} is disabled",
            who.client_id()
        )));
    }
    let method = match password {
        Some(token) => authenticate_token(ctx, token, &who, &record)?,
        None => authenticate_certificate(ctx, &who, &record, client_cert).await?,
    };
    Ok(Authenticated {
        who,
        record,
        method,
    })
}

fn authenticate_token(
    ctx: &HubContext,
    token: &str,
    who: &Identity,
    record: &Record,
) -> Result<AuthMethod, Refusal> {
    let refuse = |e: &dyn std::fmt::Display| Refusal::NotAuthorized(e.to_string());
    let token = SasToken::parse(token).map_err(|e| refuse(&e))?;
    let scope =
        auth::parse_scope(&token.resource, &ctx.settings.host_name).map_err(|e| refuse(&e))?;
    let expected = Scope::Device {
        device_id: who.device_id.clone(),
        module_id: who.module_id.clone(),
    };
    if scope != expected {
        return Err(Refusal::NotAuthorized(format!(
            "token resource {:?} is not {}",
            token.resource,
            who.client_id()
        )));
    }
    if token.key_name.is_some() {
        let principal =
            auth::authenticate_policy(&token, &ctx.settings, now_secs()).map_err(|e| refuse(&e))?;
        let principal = principal.ok_or_else(|| Refusal::NotAuthorized("no policy".into()))?;
        principal
            .require(auth::Permission::DeviceConnect)
            .map_err(|e| refuse(&e))?;
        return Ok(AuthMethod::Sas { hub_policy: true });
    }
    auth::authenticate_identity(&token, record, now_secs()).map_err(|e| refuse(&e))?;
    Ok(AuthMethod::Sas { hub_policy: false })
}

async fn authenticate_certificate(
    ctx: &HubContext,
    who: &Identity,
    record: &Record,
    cert: Option<&CertificateDer<'static>>,
) -> Result<AuthMethod, Refusal> {
    let cert =
        cert.ok_or_else(|| Refusal::NotAuthorized("no password and no client certificate".into()))?;
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
                Err(Refusal::NotAuthorized(format!(
                    "client certificate thumbprint does not match {}",
                    who.client_id()
                )))
            }
        }
        AuthType::CertificateAuthority => {
            let cert = cert.clone();
            let subject = who.client_id();
            let cas = ctx
                .store
                .run(|s| s.list_certificate_authorities())
                .await
                .map_err(|e| Refusal::Unavailable(e.to_string()))?;
            x509::verify_ca_signed(&cert, &cas, &subject, chrono::Utc::now().timestamp())
                .map_err(|e| Refusal::NotAuthorized(e.to_string()))?;
            Ok(AuthMethod::X509Ca)
        }
        AuthType::Sas | AuthType::None => Err(Refusal::NotAuthorized(format!(
            "{} does not use X.509 authentication",
            who.client_id()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_and_usernames() {
        let dev = parse_client_id("dev1").unwrap();
        let module = parse_client_id("dev1/m1").unwrap();
        assert_eq!(module.module_id.as_deref(), Some("m1"));
        assert!(parse_client_id("").is_err() && parse_client_id("dev1/").is_err());
        let sdk = "localhost/dev1/?api-version=2019-10-01&DeviceClientType=azure-iot-device-iothub-py%2F2.14.0";
        assert!(check_username(Some(sdk), "localhost", &dev).is_ok());
        assert!(check_username(Some("LOCALHOST/dev1/?api-version=1"), "localhost", &dev).is_ok());
        assert!(check_username(
            Some("localhost/dev1/m1/?api-version=1"),
            "localhost",
            &module
        )
        .is_ok());
        assert!(check_username(Some("localhost/dev2/?api-version=1"), "localhost", &dev).is_err());
        assert!(check_username(Some("other/dev1/?api-version=1"), "localhost", &dev).is_err());
        assert!(check_username(Some("localhost/dev1/?x"), "localhost", &module).is_err());
        assert!(check_username(None, "localhost", &dev).is_err());
    }
}
