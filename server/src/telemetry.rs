//! Turning a device's message into a stored event (MQT-6, MQT-7, MQT-8, SEC-6, HDV-1): system
//! properties under their IoT Hub names, application properties, and the anti-spoofing stamps
//! the hub adds (overwriting anything the device claimed).

use ferrohub_engine::d2c::NewEvent;
use ferrohub_engine::model::{AuthType, Identity};

/// Largest device-to-cloud message, body and properties together (IoT Hub: 256 KB).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// How the sender authenticated, for `iothub-connection-auth-method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMethod {
    /// Identity key (scope device) or a hub policy (scope hub).
    Sas {
        hub_policy: bool,
    },
    X509SelfSigned,
    X509Ca,
}

impl AuthMethod {
    pub fn json(self) -> &'static str {
        // Constants, not formatted per message: every stored event carries one.
        match self {
            AuthMethod::Sas { hub_policy: false } => {
                r#"{"scope":"device","type":"sas","issuer":"iothub","acceptingIpFilterRule":null}"#
            }
            AuthMethod::Sas { hub_policy: true } => {
                r#"{"scope":"hub","type":"sas","issuer":"iothub","acceptingIpFilterRule":null}"#
            }
            AuthMethod::X509SelfSigned => {
                r#"{"scope":"device","type":"x509Certificate","issuer":"iothub","acceptingIpFilterRule":null}"#
            }
            AuthMethod::X509Ca => {
                r#"{"scope":"device","type":"x509Ca","issuer":"iothub","acceptingIpFilterRule":null}"#
            }
        }
    }

    pub fn for_identity(identity: &Identity, hub_policy: bool) -> Self {
        match identity.authentication.kind {
            AuthType::SelfSigned => AuthMethod::X509SelfSigned,
            AuthType::CertificateAuthority => AuthMethod::X509Ca,
            AuthType::Sas | AuthType::None => AuthMethod::Sas { hub_policy },
        }
    }
}

/// System properties a device may set, by MQTT bag key, with their stored names.
const DEVICE_SYSTEM_PROPERTIES: &[(&str, &str)] = &[
    ("$.mid", "message-id"),
    ("$.cid", "correlation-id"),
    ("$.uid", "user-id"),
    ("$.ct", "content-type"),
    ("$.ce", "content-encoding"),
    ("$.exp", "absolute-expiry-time"),
    ("$.to", "to"),
    ("$.on", "iothub-outputname"),
    ("$.ifid", "iothub-interface-id"),
    ("$.ctime", "iothub-creation-time-utc"),
    ("$.sub", "dt-subject"),
    ("$.schema", "dt-dataschema"),
];

/// Names the hub stamps; a device can never set them, as system or application property.
const STAMPED: &[&str] = &[
    "iothub-connection-device-id",
    "iothub-connection-module-id",
    "iothub-connection-auth-generation-id",
    "iothub-connection-auth-method",
    "iothub-message-source",
    "iothub-enqueuedtime",
];

/// A message as a device sent it, before stamping.
#[derive(Debug, Default)]
pub struct DeviceMessage {
    /// `(name, value)` where name is a bag key (`$.mid`, or an application property name).
    pub properties: Vec<(String, Option<String>)>,
    pub body: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("message of {0} bytes exceeds the 256 KB limit")]
    TooLarge(usize),
}

/// Adds a property the hub sets for a transport flag (RETAIN, Will).
pub fn add_application_property(msg: &mut DeviceMessage, name: &str, value: &str) {
    msg.properties.retain(|(k, _)| k != name);
    msg.properties
        .push((name.to_string(), Some(value.to_string())));
}

/// Builds the stored event: device-settable system properties mapped, application properties
/// kept, stamps added.
pub fn to_event(
    identity: &Identity,
    auth: AuthMethod,
    msg: DeviceMessage,
) -> Result<NewEvent, MessageError> {
    let size = msg.body.len()
        + msg
            .properties
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, String::len))
            .sum::<usize>();
    if size > MAX_MESSAGE_BYTES {
        return Err(MessageError::TooLarge(size));
    }
    // Sized once: the stamped properties below, and what the device set.
    let mut system = Vec::with_capacity(msg.properties.len() + 5);
    let mut application = Vec::with_capacity(msg.properties.len());
    for (key, value) in msg.properties {
        let value = value.unwrap_or_default();
        if let Some((_, name)) = DEVICE_SYSTEM_PROPERTIES.iter().find(|(k, _)| *k == key) {
            system.push(((*name).into(), value.into()));
        } else if !STAMPED.contains(&key.as_str()) {
            application.push((key, value));
        }
    }
    system.push((
        "iothub-connection-device-id".into(),
        identity.device_id.clone().into(),
    ));
    if let Some(m) = &identity.module_id {
        system.push(("iothub-connection-module-id".into(), m.clone().into()));
    }
    system.push((
        "iothub-connection-auth-generation-id".into(),
        identity.generation_id.clone().into(),
    ));
    system.push(("iothub-connection-auth-method".into(), auth.json().into()));
    system.push(("iothub-message-source".into(), "Telemetry".into()));
    // A Plug and Play device's messages name its model (PNP-3); the hub states it, as IoT Hub
    // does, in place of anything the device put there.
    if let Some(model) = &identity.model_id {
        system.retain(|(k, _)| k != "dt-dataschema");
        system.push(("dt-dataschema".into(), model.clone().into()));
    }
    Ok(NewEvent {
        endpoints: None,
        device_id: identity.device_id.clone(),
        system_properties: system,
        application_properties: application,
        body: msg.body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_auth_method_is_iot_hubs_json_object() {
        for (method, scope, kind) in [
            (AuthMethod::Sas { hub_policy: false }, "device", "sas"),
            (AuthMethod::Sas { hub_policy: true }, "hub", "sas"),
            (AuthMethod::X509SelfSigned, "device", "x509Certificate"),
            (AuthMethod::X509Ca, "device", "x509Ca"),
        ] {
            let v: serde_json::Value = serde_json::from_str(method.json()).unwrap();
            assert_eq!(
                v,
                serde_json::json!({"scope": scope, "type": kind, "issuer": "iothub",
                    "acceptingIpFilterRule": null})
            );
        }
    }
}
