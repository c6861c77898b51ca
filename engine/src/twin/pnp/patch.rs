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
use crate::twin::limits::MAX_DEPTH;
use crate::twin::record::TwinRecord;

const FIELD: &str = "digital twin patch";

fn invalid(reason: impl Into<String>) -> ValidationError {
    ValidationError::new(FIELD, reason)
}

/// Most segments a path may have: the twin's depth limit, below a component.
const MAX_SEGMENTS: usize = MAX_DEPTH + 1;
/// Most operations in one patch.
pub const MAX_OPERATIONS: usize = 1000;

/// One checked operation.
struct Operation<'a> {
    remove: bool,
    segments: Vec<String>,
    value: Option<&'a Value>,
}

/// The desired-properties merge patch that `patch` (a JSON Patch array) means for `record`.
///
/// An operation has the effect JSON Patch gives it on the stored desired properties: `add` or
/// `replace` of an object replaces the object (members it does not name become `null` in the
/// merge patch), `remove` of something that is not there changes nothing, and a path through
/// an array is refused (a merge patch cannot address an array element).
///
/// # Errors
/// [`ValidationError`] naming the first operation that is not acceptable.
pub fn desired_patch(
    patch: &Value,
    record: &TwinRecord,
) -> Result<Map<String, Value>, ValidationError> {
    let operations = check(patch)?;
    let components = component_names(record);
    let desired = &record.desired.body;
    let mut out = Map::new();
    for (i, op) in operations.into_iter().enumerate() {
        let first = &op.segments[0];
        let value = if op.remove {
            Value::Null
        } else {
            op.value.cloned().unwrap_or(Value::Null)
        };
        let whole_component = op.segments.len() == 1
            && (components.contains(first) || value.get("$metadata").is_some_and(Value::is_object));
        if whole_component {
            out.insert(first.clone(), component_value(first, value, record)?);
            continue;
        }
        let in_component = op.segments.len() > 1 && components.contains(first);
        let current = match current_at(desired, &op.segments) {
            Ok(current) => current,
            Err(()) => {
                return Err(invalid(format!(
                    "operation {i}: the path goes through an array, which a patch cannot address"
                )))
            }
        };
        let target = if in_component {
            let component = out
                .entry(first.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if !component.is_object() {
                *component = Value::Object(Map::new());
            }
            let c = component.as_object_mut().expect("made an object above");
            c.insert(COMPONENT_MARKER.into(), Value::String("c".into()));
            c
        } else {
            &mut out
        };
        let path = if in_component {
            &op.segments[1..]
        } else {
            &op.segments[..]
        };
        match (op.remove, current) {
            // Nothing stored there: only what this patch itself added is taken back.
            (true, None) => remove_path(target, path),
            (_, current) => set_path(target, path, replacement(value, current)),
        }
    }
    Ok(out)
}

/// The stored desired value at `path`, or `Err` when the path runs through an array.
fn current_at<'a>(
    desired: &'a Map<String, Value>,
    path: &[String],
) -> Result<Option<&'a Value>, ()> {
    let mut node = match desired.get(&path[0]) {
        Some(v) => v,
        None => return Ok(None),
    };
    for step in &path[1..] {
        match node {
            Value::Object(map) => match map.get(step) {
                Some(v) => node = v,
                None => return Ok(None),
            },
            Value::Array(_) => return Err(()),
            _ => return Ok(None),
        }
    }
    Ok(Some(node))
}

/// `value` as a merge patch that leaves exactly `value` where `current` was: members of a
/// stored object that `value` does not name become `null`, level by level.
fn replacement(value: Value, current: Option<&Value>) -> Value {
    match (value, current) {
        (Value::Object(mut given), Some(Value::Object(stored))) => {
            for (key, old) in stored {
                match given.remove(key) {
                    Some(new) => {
                        given.insert(key.clone(), replacement(new, Some(old)));
                    }
                    None => {
                        given.insert(key.clone(), Value::Null);
                    }
                }
            }
            Value::Object(given)
        }
        (value, _) => value,
    }
}

/// Takes back what an earlier operation of the same patch set at `segments`, if anything.
fn remove_path(target: &mut Map<String, Value>, segments: &[String]) {
    let (last, parents) = segments.split_last().expect("paths have a segment");
    let mut at = target;
    for segment in parents {
        match at.get_mut(segment) {
            Some(Value::Object(next)) => at = next,
            _ => return,
        }
    }
    at.remove(last);
}

/// The desired object of a component set whole: the given properties, and `null` for the
/// component's other desired properties. `null` (a removal) clears the component.
fn component_value(
    name: &str,
    value: Value,
    record: &TwinRecord,
) -> Result<Value, ValidationError> {
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
        return Err(invalid(format!(
            "{bad:?} in component {name:?} is not a property"
        )));
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
    if items.len() > MAX_OPERATIONS {
        return Err(invalid(format!(
            "the patch has {} operations; at most {MAX_OPERATIONS} are allowed",
            items.len()
        )));
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
            if path.matches('/').count() > MAX_SEGMENTS {
                return Err(invalid(format!(
                    "operation {i}: the path is deeper than properties nest ({MAX_DEPTH})"
                )));
            }
            let segments = parse_pointer(path)
                .ok_or_else(|| invalid(format!("operation {i}: path {path:?} is not a JSON Pointer to a property")))?;
            if segments.len() > MAX_SEGMENTS {
                return Err(invalid(format!(
                    "operation {i}: the path has {} steps; properties nest at most {MAX_DEPTH} deep",
                    segments.len()
                )));
            }
            if let Some(bad) = segments.iter().find(|s| s.starts_with('$') || s.as_str() == COMPONENT_MARKER || s.as_str() == "-") {
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
            json!({"thermostat2": {"__t": "c", "maxTemp": 30}})
                .as_object()
                .unwrap(),
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
        let removed =
            desired_patch(&json!([{"op": "remove", "path": "/thermostat1"}]), &twin()).unwrap();
        assert_eq!(Value::Object(removed), json!({"thermostat1": null}));
    }

    #[test]
    fn operations_mean_what_json_patch_says_of_the_stored_values() {
        let mut r = twin();
        r.desired.patch(
            json!({"obj": {"x": 1, "y": {"a": 1, "b": 2}}, "list": [1, 2], "gone": 1})
                .as_object()
                .unwrap(),
            UnixMillis(4),
        );
        let p = desired_patch(
            &json!([
                {"op": "replace", "path": "/obj", "value": {"x": 5, "y": {"a": 3}}},
                {"op": "remove", "path": "/absent/x"},
                {"op": "add", "path": "/added", "value": 1},
                {"op": "remove", "path": "/added"},
                {"op": "remove", "path": "/gone"},
                {"op": "replace", "path": "/thermostat1", "value": {"mode": "off", "$metadata": {}}},
            ]),
            &r,
        )
        .unwrap();
        assert_eq!(
            Value::Object(p),
            json!({
                "obj": {"x": 5, "y": {"a": 3, "b": null}},
                "gone": null,
                "thermostat1": {"__t": "c", "mode": "off", "targetTemperature": null},
            })
        );
        for through_array in ["/list/0", "/list/-"] {
            let op = json!([{"op": "replace", "path": through_array, "value": 5}]);
            assert!(desired_patch(&op, &r).is_err(), "{through_array}");
        }
    }

    #[test]
    fn long_paths_and_long_patches_are_refused_before_anything_is_built() {
        let deep = format!("/{}", vec!["a"; 500_000].join("/"));
        let op = json!([{"op": "add", "path": deep, "value": 1}]);
        assert!(desired_patch(&op, &twin()).is_err());
        let ok_depth = format!("/{}", vec!["a"; MAX_SEGMENTS].join("/"));
        assert!(desired_patch(
            &json!([{"op": "add", "path": ok_depth, "value": 1}]),
            &twin()
        )
        .is_ok());
        let many: Vec<Value> = (0..=MAX_OPERATIONS)
            .map(|i| json!({"op": "add", "path": format!("/p{i}"), "value": i}))
            .collect();
        assert!(desired_patch(&Value::Array(many), &twin()).is_err());
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
