//! The SASL mechanisms of the service endpoint.
//!
//! - `MSSBCBS` (what the Python service SDK requires) and `ANONYMOUS`: the connection opens
//!   with no claim; the client puts a token on `$cbs` before it uses any other node.
//! - `PLAIN`: the user is `{policy}@sas.root.{hub}` (or anything, when the password is a SAS
//!   token) and the password a policy's SAS token or key; checked here, and the connection
//!   starts with that claim. Wrong credentials end SASL with outcome `auth`.
//!
//! - `PLAIN` with user `{deviceId}@sas.{hub}` (or a module's): a device; its token is kept
//!   for [`super::device`], which checks it when the identity's first link attaches.
//! - `PLAIN` with user `{idScope}/registrations/{registrationId}`: a provisioning registration;
//!   its token is kept for [`super::provisioning`], which checks it with each request.
//!
//! The check is synchronous because `fe2o3-amqp` asks for the outcome synchronously; policy
//! tokens and keys live in the hub's settings, so no storage is read.

use fe2o3_amqp::acceptor::sasl_acceptor::{SaslAcceptor, SaslServerFrame};
use fe2o3_amqp::types::primitives::{Array, Symbol};
use fe2o3_amqp::types::sasl::{SaslCode, SaslInit, SaslOutcome, SaslResponse};

use super::claims::Claims;
use super::device::credentials::plain_user;
use super::device::DeviceCredentials;
use super::provisioning::{is_registration_user, DeviceCredential};
use crate::hub::Authenticator;

const MSSBCBS: &str = "MSSBCBS";
const PLAIN: &str = "PLAIN";
const ANONYMOUS: &str = "ANONYMOUS";

/// One connection's SASL exchange; `fe2o3-amqp` clones it per connection, and the clone
/// shares the connection's [`Claims`].
#[derive(Clone)]
pub struct HubSasl {
    auth: Authenticator,
    claims: Claims,
    device: DeviceCredential,
    devices: DeviceCredentials,
    hub_name: String,
}

impl HubSasl {
    pub fn new(
        auth: Authenticator,
        claims: Claims,
        device: DeviceCredential,
        devices: DeviceCredentials,
        hub_name: String,
    ) -> Self {
        HubSasl {
            auth,
            claims,
            device,
            devices,
            hub_name,
        }
    }

    fn plain(&self, init: SaslInit) -> SaslCode {
        let Some(response) = init.initial_response else {
            return SaslCode::Auth;
        };
        let response = response.into_vec();
        let mut parts = response.split(|b| *b == 0);
        let (Some(_authzid), Some(user), Some(password)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return SaslCode::Auth;
        };
        let (Ok(user), Ok(password)) = (std::str::from_utf8(user), std::str::from_utf8(password))
        else {
            return SaslCode::Auth;
        };
        if is_registration_user(user) {
            // A provisioning registration: its token is checked with each request (DPS-1).
            self.device.set_token(password);
            return SaslCode::Ok;
        }
        if let Some(who) = plain_user(user, &self.hub_name) {
            // A device or module (AMQ-5): its token is checked against the registry when its
            // first link attaches, since this answer cannot wait for storage.
            self.devices.put_token(who, password.to_string());
            return SaslCode::Ok;
        }
        let claim = if password.starts_with("SharedAccessSignature ") {
            self.auth.policy_claim(password)
        } else {
            let policy = user.split_once("@sas.root.").map_or(user, |(p, _)| p);
            self.auth.policy_key_claim(policy, password)
        };
        match claim {
            Ok(claim) => {
                self.claims.set(claim);
                SaslCode::Ok
            }
            Err(e) => {
                tracing::debug!(error = %e, "AMQP SASL PLAIN refused");
                SaslCode::Auth
            }
        }
    }
}

impl SaslAcceptor for HubSasl {
    fn mechanisms(&self) -> Array<Symbol> {
        Array::from(vec![
            Symbol::from(MSSBCBS),
            Symbol::from(PLAIN),
            Symbol::from(ANONYMOUS),
        ])
    }

    fn on_init(&mut self, init: SaslInit) -> SaslServerFrame {
        let code = match init.mechanism.0.as_str() {
            MSSBCBS | ANONYMOUS => SaslCode::Ok,
            PLAIN => self.plain(init),
            _ => SaslCode::Auth,
        };
        SaslServerFrame::Outcome(SaslOutcome {
            code,
            additional_data: None,
        })
    }

    fn on_response(&mut self, _response: SaslResponse) -> SaslServerFrame {
        // None of the mechanisms sends a challenge, so a response is a protocol error.
        SaslServerFrame::Outcome(SaslOutcome {
            code: SaslCode::Sys,
            additional_data: None,
        })
    }
}
