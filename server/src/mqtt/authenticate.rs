//! CONNECT credentials (SEC-3, SEC-4, MQT-2), adapted for the hub's authenticator: client id,
//! username and credential must agree.
//!
//! - client id: `deviceId` or `deviceId/moduleId`
//! - username: `{host}/{deviceId}/?{query}` or `{host}/{deviceId}/{moduleId}/?{query}`
//! - credential: a SAS token in the password, or, with no password, the TLS client certificate.
//!   Which of those is accepted is the [`Authenticator`](crate::hub::Authenticator)'s decision;
//!   this module only turns its answer into a CONNACK code.

use mqtt::control::ConnectReturnCode;
use rustls::pki_types::CertificateDer;

use super::topics::Identity;
use crate::auth::HostNames;
use crate::hub::{AuthFailure, DeviceAuth, HubContext};

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
pub type Authenticated = DeviceAuth;

/// Splits a client id into device and optional module.
pub fn parse_client_id(client_id: &str) -> Result<Identity, Refusal> {
    let mut parts = client_id.splitn(2, '/');
    let device_id = parts.next().unwrap_or_default();
    let module_id = parts.next();
    if device_id.is_empty() || module_id == Some("") {
        return Err(Refusal::BadCredentials(format!(
            "client id {client_id:?} is not deviceId or deviceId/moduleId"
        )));
    }
    Ok(match module_id {
        Some(m) => Identity::for_module(device_id, m),
        None => Identity::for_device(device_id),
    })
}

/// Checks `{host}/{deviceId}[/{moduleId}]/?...` against the hub and the client id.
pub fn check_username(
    username: Option<&str>,
    hosts: impl HostNames,
    who: &Identity,
) -> Result<(), Refusal> {
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
    if !hosts.includes(h) || d != who.device_id.as_str() || m != who.module() {
        return Err(Refusal::BadCredentials(format!(
            "username {username:?} does not match client id {:?} on {}",
            who.client_id(),
            hosts.shown()
        )));
    }
    Ok(())
}

/// The Plug and Play model id in a user name's query (`model-id=...`, percent-decoded: the
/// Python SDK encodes it, Node's does not), `None` when there is none (PNP-1).
///
/// # Errors
/// [`Refusal::BadCredentials`] for a model id that is not a DTMI: nothing is stored for it.
pub fn model_id_of(username: Option<&str>) -> Result<Option<String>, Refusal> {
    let Some((_, query)) = username.and_then(|u| u.split_once('?')) else {
        return Ok(None);
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let Some(raw) = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| decode(k) == "model-id")
        .map(|(_, v)| decode(v))
    else {
        return Ok(None);
    };
    if ferrohub_engine::twin::pnp::is_valid_dtmi(&raw) {
        Ok(Some(raw))
    } else {
        Err(Refusal::BadCredentials(format!(
            "model-id {raw:?} is not a DTMI (dtmi:<segment>[:<segment>...];<version>)"
        )))
    }
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
    check_username(username, &*ctx.settings, &who)?;
    ctx.auth
        .device(&who, password, client_cert)
        .await
        .map_err(|e| match e {
            AuthFailure::Refused(reason) => Refusal::NotAuthorized(reason.to_string()),
            AuthFailure::Unavailable(e) => Refusal::Unavailable(e.to_string()),
        })
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

    #[test]
    fn model_ids_from_either_sdk_and_malformed_ones() {
        let python =
            "h/d/?api-version=2020-09-30&DeviceClientType=x&model-id=dtmi%3Acom%3Aexample%3AT%3B1";
        let node = "h/d/?api-version=2021-04-12&model-id=dtmi:com:example:T;1&DeviceClientType=y";
        for u in [python, node] {
            assert_eq!(
                model_id_of(Some(u)).unwrap().as_deref(),
                Some("dtmi:com:example:T;1")
            );
        }
        assert_eq!(
            model_id_of(Some("h/d/?api-version=2019-10-01")).unwrap(),
            None
        );
        assert_eq!(model_id_of(Some("h/d/")).unwrap(), None);
        assert_eq!(model_id_of(None).unwrap(), None);
        for bad in [
            "dtmi%3Acom%3AT",
            "com:example:T;1",
            "dtmi:com:example:T;0",
            "",
        ] {
            let u = format!("h/d/?api-version=2020-09-30&model-id={bad}");
            assert!(
                matches!(model_id_of(Some(&u)), Err(Refusal::BadCredentials(_))),
                "{bad}"
            );
        }
    }
}
