//! JSON and TOML from outside: twin patches and documents, identity bodies and import/restore
//! lines, DPS register bodies, and the configuration file.

use std::collections::BTreeMap;

use ferrohub_engine::twin::document::{MetaNode, Section};
use ferrohub_engine::twin::limits::{check_section, check_size, SectionKind};
use ferrohub_engine::UnixMillis;
use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::hub::daily_quota::DailyQuota;
use crate::hub::provisioning::{parse_register_body, DpsFailure};
use crate::hub::throttle::Throttles;
use crate::rest::identity_json::IdentityBody;
use crate::rest::jobs::line::{import_item, restore_records};

const KINDS: [SectionKind; 3] = [
    SectionKind::Tags,
    SectionKind::Desired,
    SectionKind::Reported,
];

/// Every member of `body` has its `$metadata` node, and no member is `null` (a patch's `null`
/// removes; a replacement drops it).
fn check_document(body: &Map<String, Value>, meta: &BTreeMap<String, MetaNode>, path: &str) {
    for (key, value) in body {
        let node = meta
            .get(key)
            .unwrap_or_else(|| panic!("{path}.{key} has no metadata"));
        match value {
            Value::Null => panic!("{path}.{key} is null in the stored document"),
            Value::Object(inner) => check_document(inner, &node.children, &format!("{path}.{key}")),
            _ => {}
        }
    }
}

/// The engine keeps a section's body as JSON text; reading it back must give the same values.
fn check_stored_text(body: &Map<String, Value>) {
    let text = serde_json::to_string(body).unwrap_or_else(|e| panic!("{body:?} as text: {e}"));
    let back: Map<String, Value> =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text} read back: {e}"));
    assert_eq!(&back, body, "stored as {text}");
}

/// A section the patch lands on: nested objects, a leaf and an array.
fn existing_section() -> Section {
    let mut section = Section::new(UnixMillis(1));
    let Value::Object(seed) = json!({"a": {"b": 1, "c": {"d": "x"}}, "e": [1, 2], "f": true})
    else {
        unreachable!("a literal object")
    };
    section.patch(&seed, UnixMillis(2));
    section
}

/// A twin patch or replacement body as the REST and MQTT paths take it: parsed, checked against
/// the limits of each section, and applied when accepted.
pub fn twin_patch(data: &[u8]) {
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let fmt = |t: UnixMillis| t.0.to_string();
    for kind in KINDS {
        if check_section(kind, &body, true).is_ok() {
            let mut section = existing_section();
            let before = section.version;
            assert_eq!(section.patch(&body, UnixMillis(3)), before + 1);
            check_document(&section.body, &section.metadata.children, kind.name());
            check_stored_text(&section.body);
            let _ = check_size(kind, &section.body);
            let _ = section.to_json(&fmt, true);
        }
        if check_section(kind, &body, false).is_ok() {
            let mut section = existing_section();
            let before = section.version;
            assert_eq!(section.replace(&body, UnixMillis(3)), before + 1);
            check_document(&section.body, &section.metadata.children, kind.name());
            for key in body.keys() {
                assert_eq!(
                    section.body.contains_key(key),
                    !body[key].is_null(),
                    "{key} after replacing"
                );
            }
            let _ = section.to_json(&fmt, false);
        }
    }
}

/// A device or module body of the registry API, an import job's line, and a restore line.
pub fn identity_json(data: &[u8]) {
    if let Ok(body) = serde_json::from_slice::<IdentityBody>(data) {
        if let Ok(spec) = body.to_spec() {
            let _ = spec.validate();
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(item) = import_item(text) {
        assert!(!item.device_id.is_empty(), "an import item without an id");
        let _ = item.spec.validate();
    }
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        let _ = restore_records(&value);
    }
}

/// The configuration file: parsed, validated, and (when valid) turned into what the node
/// builds from it at start.
pub fn config_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::from_toml(text) else {
        return;
    };
    if config.validate().is_ok() {
        let _ = config.c2d.queue_settings();
        let _ = Throttles::new(&config.throttling);
        let _ = DailyQuota::new(&config.throttling);
    }
}

/// A DPS register request: the registration id its topic, path or address names (the first
/// line), then the body (the rest), read as MQTT, HTTPS and AMQP read it. What is accepted
/// holds the module's rules: nothing or one JSON object, naming no other registration id and
/// no TPM, and its payload is the body's own.
pub fn dps_register(data: &[u8]) {
    let (rid, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(rid) = std::str::from_utf8(rid) else {
        return;
    };
    match parse_register_body(body, rid) {
        Ok(payload) => {
            if body.iter().all(u8::is_ascii_whitespace) {
                assert_eq!(payload, None, "an empty body has no payload");
                return;
            }
            let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
                panic!("accepted a body that is not a JSON object");
            };
            assert!(
                matches!(fields.get("registrationId"), None | Some(Value::Null))
                    || fields.get("registrationId") == Some(&Value::String(rid.to_string())),
                "accepted another registration id"
            );
            assert!(
                fields.get("tpm").is_none_or(Value::is_null),
                "accepted a TPM"
            );
            assert_eq!(payload, fields.get("payload").cloned());
        }
        Err(DpsFailure::BadRequest(text)) => assert!(!text.is_empty()),
        Err(other) => panic!("a register body refused as {other:?}"),
    }
}
