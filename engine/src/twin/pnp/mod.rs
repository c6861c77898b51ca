//! IoT Plug and Play (PNP-1..PNP-5): the digital twin, a view of a device's or module's twin
//! under the Plug and Play conventions, and the model id a device announces.
//!
//! - [`is_valid_dtmi`]: the Digital Twin Model Identifier syntax a model id must follow.
//! - [`view`]: the digital twin of a twin record: `$dtId`, `$metadata.$model`, root properties
//!   and components (twin objects marked `"__t": "c"`) with per-property `$metadata`.
//! - [`patch`]: a digital twin JSON Patch turned into the one desired-properties patch it means.
//! - [`diff`]: the JSON Patch between two views, the body of a digital twin change event.
//!
//! # Invariants
//! - The view is a pure function of the twin record, the id and the model id: two nodes (or a
//!   restore) render the same twin the same way, and a change event is exactly the patch from
//!   the view before a write to the view after it.
//! - Times in a view are whatever the caller's formatter makes of them; stored change events
//!   carry Unix milliseconds as strings, formatted when the event is shaped.

pub mod diff;
pub mod patch;

use serde_json::{Map, Value};

use super::document::MetaNode;
use super::record::TwinRecord;
use crate::UnixMillis;

/// The member that marks a twin object as a component (`"__t": "c"`).
pub const COMPONENT_MARKER: &str = "__t";

/// The longest model id accepted (DTDL's limit for an identifier).
pub const MAX_DTMI_LEN: usize = 2048;

/// Whether `text` is a DTMI: `dtmi:` then `:`-separated segments (a letter, or underscores and
/// a letter or digit for a system segment; then letters, digits and underscores, not ending in
/// an underscore), then `;` and a version (an integer of 1 to 9 digits without a leading zero,
/// optionally `.` and a minor version of up to 6).
pub fn is_valid_dtmi(text: &str) -> bool {
    if text.len() > MAX_DTMI_LEN {
        return false;
    }
    let Some(rest) = text.strip_prefix("dtmi:") else {
        return false;
    };
    let Some((path, version)) = rest.rsplit_once(';') else {
        return false;
    };
    // A segment starts with a letter, or (a system segment) with underscores and then a letter
    // or digit; then letters, digits and underscores, not ending in an underscore.
    let segment_ok = |s: &str| {
        let body = s.trim_start_matches('_');
        let system = body.len() < s.len();
        body.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || (system && c.is_ascii_digit()))
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.ends_with('_')
    };
    let number_ok = |n: &str, max: usize| {
        !n.is_empty()
            && n.len() <= max
            && n.chars().all(|c| c.is_ascii_digit())
            && !n.starts_with('0')
    };
    let version_ok = match version.split_once('.') {
        Some((major, minor)) => number_ok(major, 9) && number_ok(minor, 6),
        None => number_ok(version, 9),
    };
    path.split(':').all(segment_ok) && version_ok
}

/// Whether a twin value is a component (an object marked `"__t": "c"`).
pub fn is_component(value: &Value) -> bool {
    value
        .get(COMPONENT_MARKER)
        .and_then(Value::as_str)
        .is_some_and(|m| m == "c")
}

/// The names of the components of a twin: marked in its desired or its reported section.
pub fn component_names(record: &TwinRecord) -> Vec<String> {
    let mut names: Vec<String> = record
        .desired
        .body
        .iter()
        .chain(record.reported.body.iter())
        .filter(|(_, v)| is_component(v))
        .map(|(k, _)| k.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The digital twin of `record`, for the device (or module) `dt_id` whose model is `model`
/// (`$metadata.$model`, left out for a twin without one).
pub fn view(
    dt_id: &str,
    model: Option<&str>,
    record: &TwinRecord,
    fmt_time: &dyn Fn(UnixMillis) -> String,
) -> Map<String, Value> {
    let desired_version = record.desired.version;
    let mut out = Map::new();
    out.insert("$dtId".into(), Value::String(dt_id.to_string()));
    let components = component_names(record);
    let mut root_meta = Map::new();
    if let Some(model) = model {
        root_meta.insert("$model".into(), Value::String(model.to_string()));
    }
    let root = Level {
        desired: Some(&record.desired.body),
        reported: Some(&record.reported.body),
        reported_meta: Some(&record.reported.metadata),
    };
    root.render(
        &components,
        desired_version,
        fmt_time,
        &mut out,
        &mut root_meta,
    );
    for name in &components {
        let level = Level {
            desired: record.desired.body.get(name).and_then(Value::as_object),
            reported: record.reported.body.get(name).and_then(Value::as_object),
            reported_meta: record.reported.metadata.children.get(name),
        };
        let mut component = Map::new();
        let mut meta = Map::new();
        level.render(&[], desired_version, fmt_time, &mut component, &mut meta);
        component.insert("$metadata".into(), Value::Object(meta));
        out.insert(name.clone(), Value::Object(component));
    }
    out.insert("$metadata".into(), Value::Object(root_meta));
    out
}

/// One level of the digital twin: the root, or one component.
struct Level<'a> {
    desired: Option<&'a Map<String, Value>>,
    reported: Option<&'a Map<String, Value>>,
    reported_meta: Option<&'a MetaNode>,
}

impl Level<'_> {
    /// Writes the level's property values into `values` and their metadata into `meta`,
    /// skipping the names in `skip` (the components, rendered apart).
    fn render(
        &self,
        skip: &[String],
        desired_version: u64,
        fmt_time: &dyn Fn(UnixMillis) -> String,
        values: &mut Map<String, Value>,
        meta: &mut Map<String, Value>,
    ) {
        let property = |name: &String| name != COMPONENT_MARKER && !skip.contains(name);
        if let Some(reported) = self.reported {
            for (name, value) in reported.iter().filter(|(n, _)| property(*n)) {
                let mut m = Map::new();
                match acknowledgement(value) {
                    Some(ack) => {
                        values.insert(name.clone(), ack.value.clone());
                        if let Some(v) = ack.version {
                            m.insert("ackVersion".into(), v.clone());
                        }
                        if let Some(c) = ack.code {
                            m.insert("ackCode".into(), c.clone());
                        }
                        if let Some(d) = ack.description {
                            m.insert("ackDescription".into(), d.clone());
                        }
                    }
                    None => {
                        values.insert(name.clone(), value.clone());
                    }
                }
                if let Some(node) = self.reported_meta.and_then(|n| n.children.get(name)) {
                    m.insert(
                        "lastUpdateTime".into(),
                        Value::String(fmt_time(node.last_updated)),
                    );
                }
                meta.insert(name.clone(), Value::Object(m));
            }
        }
        if let Some(desired) = self.desired {
            for (name, value) in desired.iter().filter(|(n, _)| property(*n)) {
                let entry = meta
                    .entry(name.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = entry {
                    m.insert("desiredValue".into(), value.clone());
                    m.insert("desiredVersion".into(), Value::from(desired_version));
                }
            }
        }
    }
}

/// A writable property's acknowledgement in reported properties: `{"value", "ac", "av", "ad"}`.
struct Acknowledgement<'a> {
    value: &'a Value,
    code: Option<&'a Value>,
    version: Option<&'a Value>,
    description: Option<&'a Value>,
}

fn acknowledgement(value: &Value) -> Option<Acknowledgement<'_>> {
    let object = value.as_object()?;
    let inner = object.get("value")?;
    let code = Some(object.get("ac")?);
    let known = |k: &String| matches!(k.as_str(), "value" | "ac" | "av" | "ad");
    object.keys().all(known).then_some(Acknowledgement {
        value: inner,
        code,
        version: object.get("av"),
        description: object.get("ad"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ms(t: UnixMillis) -> String {
        t.0.to_string()
    }

    #[test]
    fn dtmi_syntax() {
        for good in [
            "dtmi:com:example:Thermostat;1",
            "dtmi:a;1",
            "dtmi:com:example:x_1;123456789",
            "dtmi:com:example:T;2.1",
            "dtmi:_system:_1x:T;1",
        ] {
            assert!(is_valid_dtmi(good), "{good}");
        }
        for bad in [
            "",
            "dtmi:",
            "com:example:T;1",
            "dtmi:com:example:T",
            "dtmi:com:example:T;0",
            "dtmi:com:example:T;01",
            "dtmi:com:1example:T;1",
            "dtmi:com:example_:T;1",
            "dtmi:com:_:T;1",
            "dtmi:com::T;1",
            "dtmi:com:ex-ample:T;1",
            "dtmi:com:example:T;1234567890",
            "dtmi:com:example:T;1.",
            "DTMI:com:example:T;1",
        ] {
            assert!(!is_valid_dtmi(bad), "{bad}");
        }
        assert!(!is_valid_dtmi(&format!(
            "dtmi:{};1",
            "a".repeat(MAX_DTMI_LEN)
        )));
    }

    fn record(desired: Value, reported: Value) -> TwinRecord {
        let mut r = TwinRecord::empty(UnixMillis(1));
        r.desired
            .patch(desired.as_object().unwrap(), UnixMillis(10));
        r.reported
            .patch(reported.as_object().unwrap(), UnixMillis(20));
        r
    }

    #[test]
    fn a_view_has_root_properties_components_and_their_metadata() {
        let r = record(
            json!({"fanSpeed": 2.0, "thermostat1": {"__t": "c", "targetTemperature": 21.8}}),
            json!({
                "serialNumber": "abc",
                "fanSpeed": {"value": 3.0, "ac": 200, "av": 1, "ad": "done"},
                "thermostat1": {"__t": "c", "maxTemp": 25.3,
                                "targetTemperature": {"value": 21.8, "ac": 200, "av": 2}},
            }),
        );
        let v = Value::Object(view("dev1", Some("dtmi:com:example:T;1"), &r, &ms));
        assert_eq!(
            v,
            json!({
                "$dtId": "dev1",
                "serialNumber": "abc",
                "fanSpeed": 3.0,
                "thermostat1": {
                    "maxTemp": 25.3,
                    "targetTemperature": 21.8,
                    "$metadata": {
                        "maxTemp": {"lastUpdateTime": "20"},
                        "targetTemperature": {"ackCode": 200, "ackVersion": 2, "lastUpdateTime": "20",
                                              "desiredValue": 21.8, "desiredVersion": 2},
                    },
                },
                "$metadata": {
                    "$model": "dtmi:com:example:T;1",
                    "serialNumber": {"lastUpdateTime": "20"},
                    "fanSpeed": {"ackCode": 200, "ackVersion": 1, "ackDescription": "done",
                                 "lastUpdateTime": "20", "desiredValue": 2.0, "desiredVersion": 2},
                },
            })
        );
    }

    #[test]
    fn a_component_only_desired_has_its_metadata_and_no_values() {
        let r = record(
            json!({"thermostat2": {"__t": "c", "targetTemperature": 19}}),
            json!({}),
        );
        let v = Value::Object(view("d", Some("dtmi:a;1"), &r, &ms));
        assert_eq!(
            v["thermostat2"],
            json!({"$metadata": {"targetTemperature": {"desiredValue": 19, "desiredVersion": 2}}})
        );
        assert_eq!(component_names(&r), vec!["thermostat2".to_string()]);
    }
}
