//! A digital twin JSON Patch (`PATCH /digitaltwins/{id}`) as the one desired-properties patch it
//! means, so the device gets an ordinary desired-properties notification.
//!
//! - `add` / `replace` of `/prop` sets the desired value of a root property (a deeper path sets
//!   a field of a complex property); `remove` clears it (`null` in the merge patch).
//! - `/component/prop` does the same for a property of a component (the component's desired
//!   object gains `"__t": "c"`). A path names a component when the twin has one of that name.
//! - `add` / `replace` of `/component` with an object holding a `$metadata` member sets every
//!   desired property given and clears the component's other desired properties; `remove` of
//!   `/component` clears them all.
//!
//! # Invariants
//! - A patch is checked whole before anything is derived from it: not an array, an empty one,
//!   an unknown `op`, a path that is not a JSON Pointer or that names `$`-members (`$dtId`,
//!   `$metadata`, ...), or `add`/`replace` without a value, is refused and nothing is written.

use serde_json::{Map, Value};

use super::{component_names, COMPONENT_MARKER};
use crate::error::ValidationError;
use crate::twin::record::TwinRecord;

const FIELD: &str = "digital twin patch";

fn invalid(reason: impl Into<String>) -> ValidationError {
    ValidationError::new(FIELD, reason)
}

/// One checked operation.
struct Operation<'a> {
    remove: bool,
    segments: Vec<String>,
    value: Option<&'a Value>,
}

/// The desired-properties merge patch that `patch` (a JSON Patch array) means for `record`.
///
/// # Errors
/// [`ValidationError`] naming the first operation that is not acceptable.
pub fn desired_patch(patch: &Value, record: &TwinRecord) -> Result<Map<String, Value>, ValidationError> {
    let operations = check(patch)?;
    let components = component_names(record);
    let mut out = Map::new();
    for op in operations {
        let first = &op.segments[0];
        let value = if op.remove {
            Value::Null
        } else {
            op.value.cloned().unwrap_or(Value::Null)
        };
        let whole_component = op.segments.len() == 1
            && (components.contains(first)
                || value.get("$metadata").is_some_and(Value::is_object));
        if whole_component {
            out.insert(first.clone(), component_value(first, value, record)?);
        } else if op.segments.len() > 1 && components.contains(first) {
            let component = out
                .entry(first.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if !component.is_object() {
                *component = Value::Object(Map::new());
            }
            if let Value::Object(c) = component {
                c.insert(COMPONENT_MARKER.into(), Value::String("c".into()));
                set_path(c, &op.segments[1..], value);
            }
        } else {
            set_path(&mut out, &op.segments, value);
        }
    }
    Ok(out)
}

/// The desired object of a component set whole: the given properties, and `null` for the
/// component's other desired properties. `null` (a removal) clears the component.
fn component_value(name: &str, value: Value, record: &TwinRecord) -> Result<Value, ValidationError> {
    let mut given = match value {
        Value::Null => return Ok(Value::Null),
        Value::Object(given) => given,
        _ => {
            return Err(invalid(format!(
                "the value of component {name:?} must be an object with a \"$metadata\" member"
            )))
        }
    };
    match given.remove("$metadata") {
        Some(Value::Object(_)) => {}
        _ => {
            return Err(invalid(format!(
                "the value of component {name:?} must be an object with a \"$metadata\" member"
            )))
        }
    }
    if let Some(bad) = given.keys().find(|k| k.starts_with('$')) {
        return Err(invalid(format!("{bad:?} in component {name:?} is not a property")));
    }
    if let Some(Value::Object(current)) = record.desired.body.get(name) {
        for key in current.keys().filter(|k| k.as_str() != COMPONENT_MARKER) {
            given.entry(key.clone()).or_insert(Value::Null);
        }
    }
    given.insert(COMPONENT_MARKER.into(), Value::String("c".into()));
    Ok(Value::Object(given))
}

/// Sets `value` at `segments` below `target`, making objects of whatever is in the way.
fn set_path(target: &mut Map<String, Value>, segments: &[String], value: Value) {
    let (last, parents) = segments.split_last().expect("paths have a segment");
    let mut at = target;
    for segment in parents {
        let slot = at
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        at = slot.as_object_mut().expect("made an object above");
    }
    at.insert(last.clone(), value);
}

fn check(patch: &Value) -> Result<Vec<Operation<'_>>, ValidationError> {
    let Value::Array(items) = patch else {
        return Err(invalid("the body must be a JSON Patch array of operations"));
    };
    if items.is_empty() {
        return Err(invalid("the patch has no operations"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(op) = item else {
                return Err(invalid(format!("operation {i} is not an object")));
            };
            let name = op.get("op").and_then(Value::as_str).unwrap_or_default();
            let remove = match name {
                "add" | "replace" => false,
                "remove" => true,
                other => {
                    return Err(invalid(format!(
                        "operation {i}: op {other:?} is not add, replace or remove"
                    )))
                }
            };
            let path = op
                .get("path")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("operation {i} has no path")))?;
            let segments = parse_pointer(path)
                .ok_or_else(|| invalid(format!("operation {i}: path {path:?} is not a JSON Pointer to a property")))?;
            if let Some(bad) = segments.iter().find(|s| s.starts_with('$') || s.as_str() == COMPONENT_MARKER) {
                return Err(invalid(format!(
                    "operation {i}: path {path:?} names {bad:?}, which is not a property"
                )));
            }
            let value = op.get("value");
            if !remove && value.is_none() {
                return Err(invalid(format!("operation {i} ({name}) has no value")));
            }
            if value.is_some_and(Value::is_null) && !remove {
                return Err(invalid(format!(
                    "operation {i}: a null value is not a property value (use remove)"
                )));
            }
            Ok(Operation {
                remove,
                segments,
                value,
            })
        })
        .collect()
}

/// The unescaped segments of a JSON Pointer with at least one non-empty segment.
fn parse_pointer(path: &str) -> Option<Vec<String>> {
    let rest = path.strip_prefix('/')?;
    let segments: Vec<String> = rest
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect();
    segments.iter().all(|s| !s.is_empty()).then_some(segments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UnixMillis;
    use serde_json::json;

    fn twin() -> TwinRecord {
        let mut r = TwinRecord::empty(UnixMillis(1));
        r.desired.patch(
            json!({"thermostat1": {"__t": "c", "targetTemperature": 20, "mode": "eco"}})
                .as_object()
                .unwrap(),
            UnixMillis(2),
        );
        r.reported.patch(
            json!({"thermostat2": {"__t": "c", "maxTemp": 30}}).as_object().unwrap(),
            UnixMillis(3),
        );
        r
    }

    #[test]
    fn operations_become_one_desired_patch() {
        let p = desired_patch(
            &json!([
                {"op": "add", "path": "/fanSpeed", "value": 2.0},
                {"op": "replace", "path": "/thermostat1/targetTemperature", "value": 21.4},
                {"op": "add", "path": "/thermostat2/targetTemperature", "value": 19},
                {"op": "remove", "path": "/old"},
                {"op": "add", "path": "/complex/field", "value": 1},
            ]),
            &twin(),
        )
        .unwrap();
        assert_eq!(
            Value::Object(p),
            json!({
                "fanSpeed": 2.0,
                "thermostat1": {"__t": "c", "targetTemperature": 21.4},
                "thermostat2": {"__t": "c", "targetTemperature": 19},
                "old": null,
                "complex": {"field": 1},
            })
        );
    }

    #[test]
    fn a_whole_component_clears_what_it_does_not_set() {
        let p = desired_patch(
            &json!([{"op": "add", "path": "/thermostat1", "value": {"targetTemperature": 22, "$metadata": {}}},
                    {"op": "add", "path": "/thermostat3", "value": {"x": 1, "$metadata": {}}}]),
            &twin(),
        )
        .unwrap();
        assert_eq!(
            Value::Object(p),
            json!({"thermostat1": {"__t": "c", "targetTemperature": 22, "mode": null},
                   "thermostat3": {"__t": "c", "x": 1}})
        );
        let removed = desired_patch(&json!([{"op": "remove", "path": "/thermostat1"}]), &twin()).unwrap();
        assert_eq!(Value::Object(removed), json!({"thermostat1": null}));
    }

    #[test]
    fn bad_patches_are_refused() {
        for bad in [
            json!({"op": "add", "path": "/a", "value": 1}),
            json!([]),
            json!([1]),
            json!([{"op": "move", "path": "/a", "from": "/b"}]),
            json!([{"op": "test", "path": "/a", "value": 1}]),
            json!([{"op": "add", "value": 1}]),
            json!([{"op": "add", "path": "a", "value": 1}]),
            json!([{"op": "add", "path": "/", "value": 1}]),
            json!([{"op": "add", "path": "/a//b", "value": 1}]),
            json!([{"op": "add", "path": "/$metadata/a", "value": 1}]),
            json!([{"op": "add", "path": "/$dtId", "value": "x"}]),
            json!([{"op": "add", "path": "/thermostat1/__t", "value": "x"}]),
            json!([{"op": "add", "path": "/a"}]),
            json!([{"op": "add", "path": "/a", "value": null}]),
            json!([{"op": "add", "path": "/thermostat1", "value": 5}]),
            json!([{"op": "add", "path": "/thermostat1", "value": {"x": 1, "$metadata": {}, "$bad": 1}}]),
        ] {
            assert!(desired_patch(&bad, &twin()).is_err(), "{bad}");
        }
    }
}
