//! The device credentials one AMQP connection holds (AMQ-5): SAS tokens by identity, from
//! SASL PLAIN (user `{deviceId}@sas.{hubName}` or `{deviceId}/modules/{moduleId}@sas.{hubName}`)
//! or from CBS put-tokens with a device audience (renewed on the same connection), and the TLS
//! client certificate. Several identities may share one connection (IoT Edge multiplexes);
//! each link is checked against the identity it names, when it attaches.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;

use crate::ids::Identity;

#[derive(Default)]
struct Held {
    tokens: HashMap<Identity, String>,
    chain: Vec<CertificateDer<'static>>,
}

#[derive(Clone, Default)]
pub struct DeviceCredentials(Arc<Mutex<Held>>);

impl DeviceCredentials {
    /// Keeps (or renews) an identity's token.
    pub fn put_token(&self, who: Identity, token: String) {
        self.0.lock().tokens.insert(who, token);
    }

    pub fn set_chain(&self, chain: Vec<CertificateDer<'static>>) {
        self.0.lock().chain = chain;
    }

    /// The identity's token, if the connection holds one.
    pub fn token(&self, who: &Identity) -> Option<String> {
        self.0.lock().tokens.get(who).cloned()
    }

    /// The TLS client certificate, if one was presented.
    pub fn leaf(&self) -> Option<CertificateDer<'static>> {
        self.0.lock().chain.first().cloned()
    }
}

/// The identity a SASL PLAIN user names: `{deviceId}@sas.{hubName}` or
/// `{deviceId}/modules/{moduleId}@sas.{hubName}` (`None` for anything else, a policy's
/// `{policy}@sas.root.{hubName}` included).
pub fn plain_user(user: &str, hub_name: &str) -> Option<Identity> {
    let (id, hub) = user.rsplit_once("@sas.")?;
    if hub.starts_with("root.") || !hub.eq_ignore_ascii_case(hub_name) || id.is_empty() {
        return None;
    }
    match id.split_once("/modules/") {
        Some((d, m)) if !d.is_empty() && !m.is_empty() => Some(Identity::for_module(d, m)),
        Some(_) => None,
        None => Some(Identity::for_device(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_users_name_devices_and_modules_of_this_hub() {
        assert_eq!(
            plain_user("d1@sas.ferrohub", "ferrohub"),
            Some(Identity::for_device("d1"))
        );
        assert_eq!(
            plain_user("d1/modules/m1@sas.ferrohub", "ferrohub"),
            Some(Identity::for_module("d1", "m1"))
        );
        assert_eq!(
            plain_user("iothubowner@sas.root.ferrohub", "ferrohub"),
            None
        );
        assert_eq!(plain_user("d1@sas.other", "ferrohub"), None);
        assert_eq!(plain_user("d1", "ferrohub"), None);
    }
}
