//! AMQP messages a device sends on its own links, as the hub reads them: the bytes are one
//! delivery's payload, checked whole as the frame guard checks a finished delivery
//! (`value_check::check_sections`), decoded as `fe2o3-amqp` decodes a transfer's message, then
//! read by the device links' own functions: telemetry (`device::messages::telemetry`, and
//! `device::telemetry::batch` for a batch transfer, whose data sections are each a message)
//! stamped into a stored event (`telemetry::to_event`), a twin request
//! (`device::twin::twin_request`, the reply's correlation), and a method answer
//! (`device::methods::read_answer`).
//!
//! The hub reads nothing from a device link's attach properties (`com.microsoft:api-version`,
//! `com.microsoft:client-version`, `com.microsoft:channel-correlation-id`, a model id): it reads
//! the attach's address, which `amqp_frames` drives.
//!
//! # Invariants
//! - A stored event carries the hub's stamps, whatever the device sent: exactly one
//!   `iothub-connection-device-id`, auth generation, auth method and message source, the
//!   module id for a module only, the identity's model as `dt-dataschema` when it has one,
//!   and no application property under a name the hub stamps; its body is the message's.
//! - Every other application property the device set is kept, as text, under its own name.
//! - A batch is one device message per data section.
//! - A twin request is classified as the twin link's module documentation says, and a reply
//!   echoes its correlation id.
//! - A method answer's call id is its correlation id; the hub's own method call, echoed as
//!   the SDKs echo it, reads back as that call.

use fe2o3_amqp::types::messaging::message::DecodeIntoMessage;
use fe2o3_amqp::types::messaging::{Body, Message};
use fe2o3_amqp::types::primitives::Value;
use ferrohub_engine::d2c::SystemProperty;
use ferrohub_engine::model::{AuthType, Authentication, ConnectionState, Identity, Status};
use ferrohub_engine::UnixMillis;
use serde_amqp::read::SliceReader;

use crate::amqp::device::messages;
use crate::amqp::device::methods::read_answer;
use crate::amqp::device::telemetry::batch;
use crate::amqp::device::twin::{twin_request, TwinRequest};
use crate::amqp::message::{body_bytes, id_text, simple_text};
use crate::amqp::value_check::check_sections;
use crate::telemetry::{to_event, AuthMethod, DeviceMessage, MessageError, MAX_MESSAGE_BYTES};

/// The model the device identity announced.
const MODEL: &str = "dtmi:com:example:Thermostat;1";

/// Names only the hub sets on a stored event.
const STAMPED: [&str; 6] = [
    "iothub-connection-device-id",
    "iothub-connection-module-id",
    "iothub-connection-auth-generation-id",
    "iothub-connection-auth-method",
    "iothub-message-source",
    "iothub-enqueuedtime",
];

/// Application properties the telemetry link reads as system properties.
const RENAMED: [&str; 3] = ["dt-subject", "dt-dataschema", "iothub-outputname"];

fn identity(module_id: Option<&str>, model_id: Option<&str>, kind: AuthType) -> Identity {
    Identity {
        device_id: "dev-1".into(),
        module_id: module_id.map(str::to_string),
        generation_id: "638412345678901234".into(),
        etag: "MQ==".into(),
        status: Status::Enabled,
        status_reason: None,
        status_updated_time: UnixMillis(1),
        connection_state: ConnectionState::Connected,
        connection_state_updated_time: None,
        last_activity_time: None,
        cloud_to_device_message_count: 0,
        authentication: Authentication {
            kind,
            symmetric_keys: None,
            thumbprints: None,
        },
        iot_edge: false,
        device_scope: None,
        parent_scopes: Vec::new(),
        managed_by: None,
        model_id: model_id.map(str::to_string),
    }
}

/// Who sends: a Plug and Play device with a SAS token, a module with a CA-signed certificate.
fn senders() -> [(Identity, AuthMethod); 2] {
    [
        (
            identity(None, Some(MODEL), AuthType::Sas),
            AuthMethod::Sas { hub_policy: false },
        ),
        (
            identity(Some("mod-1"), None, AuthType::CertificateAuthority),
            AuthMethod::X509Ca,
        ),
    ]
}

/// One delivery on a device link: telemetry (single and batch), a twin request, a method
/// answer.
pub fn amqp_device_link(data: &[u8]) {
    if check_sections(data).is_err() {
        return;
    }
    let Ok(message) =
        <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(SliceReader::new(data))
    else {
        return;
    };
    for (sender, auth) in senders() {
        if let Ok(sent) = messages::telemetry(&message) {
            check_event(&sender, auth, sent, Some(&message));
        }
        if let Ok(sent) = batch(&message) {
            let Body::Data(sections) = &message.body else {
                panic!("a batch whose body is not data sections");
            };
            assert_eq!(
                sent.len(),
                sections.iter().count(),
                "one message per section"
            );
            for one in sent {
                check_event(&sender, auth, one, None);
            }
        }
    }
    twin(&message);
    method_answer(&message);
}

/// The values of the system properties named `name`.
fn values<'a>(properties: &'a [SystemProperty], name: &str) -> Vec<&'a str> {
    properties
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| &**v)
        .collect()
}

/// A device message stored as `sender`'s event; `message` is the AMQP message it came from
/// (none for one of a batch).
fn check_event(
    sender: &Identity,
    auth: AuthMethod,
    sent: DeviceMessage,
    message: Option<&Message<Body<Value>>>,
) {
    let body = sent.body.clone();
    let event = match to_event(sender, auth, sent) {
        Ok(event) => event,
        Err(MessageError::TooLarge(size)) => {
            assert!(
                size > MAX_MESSAGE_BYTES,
                "refused {size} bytes as too large"
            );
            return;
        }
    };
    assert_eq!(event.device_id, sender.device_id);
    assert_eq!(event.body, body, "the stored body");
    let system = &event.system_properties;
    assert_eq!(
        values(system, "iothub-connection-device-id"),
        [sender.device_id.as_str()]
    );
    assert_eq!(
        values(system, "iothub-connection-module-id"),
        sender
            .module_id
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        values(system, "iothub-connection-auth-generation-id"),
        [sender.generation_id.as_str()]
    );
    assert_eq!(
        values(system, "iothub-connection-auth-method"),
        [auth.json()]
    );
    assert_eq!(values(system, "iothub-message-source"), ["Telemetry"]);
    if let Some(model) = &sender.model_id {
        assert_eq!(values(system, "dt-dataschema"), [model.as_str()]);
    }
    for (name, _) in &event.application_properties {
        assert!(
            !STAMPED.contains(&name.as_str()),
            "the device set the stamped {name:?}"
        );
    }
    let Some(application) = message.and_then(|m| m.application_properties.as_ref()) else {
        return;
    };
    for (name, value) in application.0.iter() {
        if name.starts_with("$.")
            || RENAMED.contains(&name.as_str())
            || STAMPED.contains(&name.as_str())
        {
            continue;
        }
        let text = simple_text(value);
        assert!(
            event
                .application_properties
                .iter()
                .any(|(k, v)| k == name && *v == text),
            "application property {name:?} = {text:?} was not kept"
        );
    }
}

/// A twin request: what it asks, its body when a reported patch, and the reply's correlation.
fn twin(request: &Message<Body<Value>>) {
    let operation = messages::annotation_text(request, "operation").unwrap_or_default();
    let resource = messages::annotation_text(request, "resource")
        .unwrap_or_default()
        .trim_end_matches('/');
    match twin_request(request) {
        TwinRequest::Get => assert_eq!(operation, "GET"),
        TwinRequest::PatchReported => {
            assert_eq!((operation, resource), ("PATCH", "/properties/reported"));
            if let Ok(payload) = body_bytes(&request.body) {
                let _ = serde_json::from_slice::<serde_json::Value>(&payload);
            }
        }
        TwinRequest::DesiredPushes(on) => assert_eq!(
            (operation, resource),
            (
                if on { "PUT" } else { "DELETE" },
                "/notifications/twin/properties/desired"
            )
        ),
        TwinRequest::Unknown {
            operation: asked,
            resource: on,
        } => {
            assert_eq!((asked, on), (operation, resource));
            assert_ne!(asked, "GET", "a GET not read as one");
        }
    }
    let correlation = messages::correlation(request);
    let reply = messages::twin_reply(correlation.clone(), 204, Some(u64::MAX), Vec::new());
    let echoed = reply
        .properties
        .as_ref()
        .and_then(|p| p.correlation_id.as_ref())
        .map(id_text);
    assert_eq!(
        echoed,
        correlation.as_ref().map(id_text),
        "the reply's correlation"
    );
}

/// A method answer: the call it answers, its status and payload.
fn method_answer(answer: &Message<Body<Value>>) {
    let (rid, status, payload) = read_answer(answer);
    assert_eq!(rid, messages::correlation(answer).as_ref().map(id_text));
    if status.is_some() {
        assert!(
            answer
                .application_properties
                .as_ref()
                .is_some_and(|a| a.0.get("IoThub-status").is_some()),
            "a status without IoThub-status"
        );
    }
    if let Some(rid) = rid {
        let call = messages::method_request(&rid, "fuzz", payload.clone());
        assert_eq!(
            read_answer(&call),
            (Some(rid), None, payload),
            "the hub's own call read back"
        );
    }
}
