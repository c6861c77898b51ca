//! Plug and Play digital twin patches (`PATCH /digitaltwins/{id}`, a JSON Patch array as the
//! `DigitalTwinClient`s send it): turned into the one desired-properties patch it means for a
//! twin with components (`twin::pnp::patch::desired_patch`), checked as the engine checks it
//! (`TwinWrite::check_patch`), applied to the desired section, and the digital twin rendered
//! before and after (`twin::pnp::view`, `twin::pnp::diff::diff`), as
//! `Store::patch_digital_twin` and the change event do.
//!
//! # Invariants
//! - A refused patch is a validation error with a reason, never a panic.
//! - An accepted patch changes only the properties and components its operations name first,
//!   and each of its operations is accepted alone.
//! - Each operation alone means what JSON Patch says of the stored desired properties: after
//!   `add` or `replace` its path holds the value given (objects without their `null` members,
//!   which a merge patch cannot store); after `remove` nothing is there; a component set whole
//!   (`$metadata`) has exactly the properties given that are not `null`, and is marked as a
//!   component; a property set inside a component leaves it marked.
//! - The digital twin renders after the patch, with its id and model, and its change event
//!   (the diff of the two views) is empty exactly when the view did not change.

use std::collections::BTreeSet;

use ferrohub_engine::twin::pnp::diff::diff;
use ferrohub_engine::twin::pnp::patch::desired_patch;
use ferrohub_engine::twin::pnp::{component_names, view, COMPONENT_MARKER};
use ferrohub_engine::twin::record::TwinRecord;
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::UnixMillis;
use serde_json::{json, Map, Value};

const DT_ID: &str = "pnp-dev-1";
const MODEL: &str = "dtmi:com:example:TemperatureController;2";

fn object(value: Value) -> Map<String, Value> {
    let Value::Object(members) = value else {
        unreachable!("a literal object")
    };
    members
}

/// The twin the patches land on: root properties (a leaf, nested objects, an array, a name
/// that needs escaping), a component with desired properties (one of them an object), and a
/// component that only reported properties name.
fn twin() -> TwinRecord {
    let mut record = TwinRecord::empty(UnixMillis(1));
    record.desired.patch(
        &object(json!({
            "fanSpeed": 2.0,
            "flag": true,
            "list": [1, 2, {"z": 1}],
            "obj": {"x": 1, "y": {"a": 1, "b": [1, 2]}},
            "odd/~name": 1,
            "thermostat1": {
                "__t": "c",
                "targetTemperature": 20,
                "mode": "eco",
                "schedule": {"on": "07:00", "off": "22:00"},
            },
        })),
        UnixMillis(2),
    );
    record.reported.patch(
        &object(json!({
            "serialNumber": "abc",
            "fanSpeed": {"value": 2.0, "ac": 200, "av": 2, "ad": "done"},
            "thermostat2": {"__t": "c", "maxTemp": 30},
        })),
        UnixMillis(3),
    );
    record
}

/// A digital twin JSON Patch body as the REST layer reads it, applied as the engine applies it.
pub fn pnp_patch(data: &[u8]) {
    let Ok(patch) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let twin = twin();
    let merge = match desired_patch(&patch, &twin) {
        Ok(merge) => merge,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "a refusal without a reason");
            return;
        }
    };
    let Value::Array(operations) = &patch else {
        panic!("accepted {patch}, which is not an array");
    };
    let paths: Vec<Vec<String>> = operations
        .iter()
        .map(|op| pointer(op).unwrap_or_else(|| panic!("accepted {op}, whose path is no pointer")))
        .collect();
    for key in merge.keys() {
        assert!(
            paths.iter().any(|p| &p[0] == key),
            "{patch} changes {key:?}, which none of its operations names"
        );
    }
    if let Some(after) = applied(&twin, merge) {
        check_views(&twin, &after);
    }
    for (op, path) in operations.iter().zip(&paths) {
        let alone = Value::Array(vec![op.clone()]);
        let merge = desired_patch(&alone, &twin)
            .unwrap_or_else(|e| panic!("{op} is accepted in {patch} but not alone: {e}"));
        if let Some(after) = applied(&twin, merge) {
            check_operation(op, path, &twin, &after);
        }
    }
}

/// An operation's path as JSON Pointer (RFC 6901) segments, unescaped.
fn pointer(op: &Value) -> Option<Vec<String>> {
    let path = op.get("path")?.as_str()?.strip_prefix('/')?;
    Some(
        path.split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

/// The twin after the desired patch `merge`, if the engine's checks of a desired patch pass.
fn applied(twin: &TwinRecord, merge: Map<String, Value>) -> Option<TwinRecord> {
    let write = TwinWrite {
        tags: None,
        desired: Some(merge),
    };
    write.check_patch().ok()?;
    let mut after = twin.clone();
    let version = after.desired.version;
    let merge = write.desired.as_ref()?;
    assert_eq!(after.desired.patch(merge, UnixMillis(10)), version + 1);
    Some(after)
}

/// What is stored at `path` below `desired`.
fn lookup<'a>(desired: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let mut node = desired.get(first)?;
    for step in rest {
        node = node.as_object()?.get(step)?;
    }
    Some(node)
}

/// `value` as a merge patch stores it: `null` members of objects dropped, level by level
/// (arrays are values: what they hold stays).
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// One accepted operation, applied alone to `twin`, did what JSON Patch says.
fn check_operation(op: &Value, path: &[String], twin: &TwinRecord, after: &TwinRecord) {
    let desired = &after.desired.body;
    let remove = op.get("op").and_then(Value::as_str) == Some("remove");
    let value = op.get("value").filter(|_| !remove);
    let first = &path[0];
    let components = component_names(twin);
    let whole_component = path.len() == 1
        && (components.contains(first)
            || value
                .and_then(|v| v.get("$metadata"))
                .is_some_and(Value::is_object));
    let found = lookup(desired, path);
    match (whole_component, value) {
        (_, None) => assert_eq!(found, None, "{op} left a value"),
        (true, Some(Value::Object(given))) => {
            let Some(Value::Object(component)) = found else {
                panic!("{op} left {found:?}, not a component");
            };
            assert_eq!(
                component.get(COMPONENT_MARKER),
                Some(&json!("c")),
                "{op} left no component marker"
            );
            let want: BTreeSet<&str> = given
                .iter()
                .filter(|(k, v)| !v.is_null() && k.as_str() != "$metadata")
                .map(|(k, _)| k.as_str())
                .chain([COMPONENT_MARKER])
                .collect();
            let have: BTreeSet<&str> = component.keys().map(String::as_str).collect();
            assert_eq!(have, want, "the properties of the component {op} set");
            for (key, member) in given {
                if !member.is_null() && !member.is_object() && key != COMPONENT_MARKER {
                    assert_eq!(component.get(key), Some(member), "{key} after {op}");
                }
            }
        }
        (true, Some(other)) => panic!("{op} set the component {first:?} to {other}"),
        (false, Some(given)) => {
            assert_eq!(found, Some(&without_nulls(given)), "{op}");
            if path.len() > 1 && components.contains(first) {
                assert_eq!(
                    desired.get(first).and_then(|c| c.get(COMPONENT_MARKER)),
                    Some(&json!("c")),
                    "{op} unmarked its component"
                );
            }
        }
    }
}

/// The digital twin before and after a patch, and the change event between them.
fn check_views(before: &TwinRecord, after: &TwinRecord) {
    let fmt = |t: UnixMillis| t.0.to_string();
    let old = view(DT_ID, Some(MODEL), before, &fmt);
    let new = view(DT_ID, Some(MODEL), after, &fmt);
    assert_eq!(new.get("$dtId"), Some(&json!(DT_ID)));
    assert_eq!(
        new.get("$metadata").and_then(|m| m.get("$model")),
        Some(&json!(MODEL))
    );
    let changes = diff(old.clone(), new.clone());
    assert_eq!(
        changes.is_empty(),
        old == new,
        "the change event {changes:?} between {old:?} and {new:?}"
    );
}
