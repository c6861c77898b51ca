//! Provisioning credentials (DPS-2, DPS-4): the service API's policy tokens, and a device's
//! registration token checked against an enrollment's keys.
//!
//! - A service token is signed with a provisioning policy's key: `skn` names the policy and
//!   `sr` is the host name (by segment: `{host}[/...]`).
//! - A registration token's `sr` is `{idScope}/registrations/{registrationId}` (Python encodes
//!   it, Node does not: the signature covers `sr` as sent, see [`super::sas`]); `skn` is
//!   `registration` or absent. A group member signs with its derived key
//!   ([`derive_device_key`]).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ferrohub_engine::provisioning::{ProvisioningRights, ProvisioningSettings};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::sas::SasToken;
use super::{AuthError, HostNames};

/// Checks a service token against the provisioning policies; returns the policy's rights.
///
/// # Errors
/// [`AuthError`] for a missing `skn`, an unknown policy, another host, a bad signature or an
/// expired token.
pub fn service_rights(
    token: &SasToken,
    settings: &ProvisioningSettings,
    hosts: impl HostNames,
    now_secs: u64,
) -> Result<ProvisioningRights, AuthError> {
    let name = token
        .key_name
        .as_deref()
        .ok_or_else(|| AuthError::UnknownPolicy("(none: the token has no skn)".into()))?;
    let resource = token
        .resource
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default();
    let host = match resource.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => resource,
    };
    if !hosts.includes(host) {
        return Err(AuthError::WrongHub(token.resource.clone()));
    }
    let policy = settings
        .policy(name)
        .ok_or_else(|| AuthError::UnknownPolicy(name.to_string()))?;
    token.verify(
        now_secs,
        [policy.primary_key.as_str(), policy.secondary_key.as_str()],
    )?;
    Ok(policy.rights)
}

/// Whether a registration token names exactly this registration.
pub fn names_registration(token: &SasToken, id_scope: &str, registration_id: &str) -> bool {
    token
        .resource
        .eq_ignore_ascii_case(&format!("{id_scope}/registrations/{registration_id}"))
}

/// The device key of a symmetric-key enrollment group's member:
/// base64(HMAC-SHA256(base64decode(group key), registration id)); `None` for a group key that
/// is not base64.
pub fn derive_device_key(group_key: &str, registration_id: &str) -> Option<String> {
    let key = B64.decode(group_key).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(registration_id.as_bytes());
    Some(B64.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::sas::sign;

    #[test]
    fn group_keys_derive_as_the_documented_formula() {
        // az iot dps enrollment-group compute-device-key --key <below> --registration-id sn-007
        let key = B64.encode([7u8; 32]);
        let derived = derive_device_key(&key, "sn-007").unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(&[7u8; 32]).unwrap();
        mac.update(b"sn-007");
        assert_eq!(derived, B64.encode(mac.finalize().into_bytes()));
        assert!(derive_device_key("not base64!", "x").is_none());
    }

    #[test]
    fn service_tokens_need_a_provisioning_policy_of_this_host() {
        let settings = ProvisioningSettings::generate();
        let owner = &settings.policies[0];
        let now = 1_000;
        let token = |sr: &str, key: &str, skn: Option<&str>| {
            SasToken::parse(&sign(sr, key, now + 60, skn).unwrap()).unwrap()
        };
        let good = token("localhost", &owner.primary_key, Some(&owner.name));
        assert_eq!(
            service_rights(&good, &settings, "localhost", now).unwrap(),
            ProvisioningRights::ALL
        );
        let other_host = token("elsewhere", &owner.primary_key, Some(&owner.name));
        assert!(service_rights(&other_host, &settings, "localhost", now).is_err());
        let no_policy = token("localhost", &owner.primary_key, None);
        assert!(service_rights(&no_policy, &settings, "localhost", now).is_err());
        let wrong_key = token(
            "localhost",
            &settings.policies[1].primary_key,
            Some(&owner.name),
        );
        assert!(service_rights(&wrong_key, &settings, "localhost", now).is_err());
        let hub_policy = token("localhost", &owner.primary_key, Some("iothubowner"));
        assert!(service_rights(&hub_policy, &settings, "localhost", now).is_err());
    }

    #[test]
    fn registration_tokens_name_their_registration_either_encoding() {
        let key = B64.encode([1u8; 32]);
        let python =
            SasToken::parse(&sign("0ne0000AB12/registrations/d-1", &key, 99, None).unwrap())
                .unwrap();
        assert!(names_registration(&python, "0ne0000AB12", "d-1"));
        assert!(!names_registration(&python, "0ne0000AB12", "d-2"));
        python.verify(10, [key.as_str()]).unwrap();
    }
}
