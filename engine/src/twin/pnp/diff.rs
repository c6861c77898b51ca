//! The JSON Patch (RFC 6902) that turns one digital twin view into another: the body of a
//! digital twin change event.
//!
//! # Invariants
//! - Applying the result to `before` gives `after`: members only in `before` are removed,
//!   members only in `after` are added, objects and arrays on both sides are compared part by
//!   part, and any other difference replaces the value.
//! - Paths are JSON Pointers (RFC 6901): `~` is written `~0` and `/` is written `~1`.
//! - The diff itself is the `json-patch` crate's; this module fixes its input and output shape.

use serde_json::{Map, Value};

/// The operations from `before` to `after` (json-patch's diff: objects compared member by
/// member, arrays element by element, anything else replaced), as JSON values.
pub fn diff(before: Map<String, Value>, after: Map<String, Value>) -> Vec<Value> {
    let patch = json_patch::diff(&Value::Object(before), &Value::Object(after));
    match serde_json::to_value(patch) {
        Ok(Value::Array(ops)) => ops,
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(doc: &mut Value, ops: &[Value]) {
        for op in ops {
            let path = op["path"].as_str().unwrap();
            let (parent, last) = path.rsplit_once('/').unwrap();
            let last = last.replace("~1", "/").replace("~0", "~");
            let target = doc.pointer_mut(parent).unwrap().as_object_mut().unwrap();
            match op["op"].as_str().unwrap() {
                "remove" => {
                    target.remove(&last).unwrap();
                }
                "add" => {
                    assert!(target.insert(last, op["value"].clone()).is_none(), "{op}");
                }
                "replace" => {
                    assert!(target.insert(last, op["value"].clone()).is_some(), "{op}");
                }
                other => panic!("{other}"),
            }
        }
    }

    #[test]
    fn applying_the_diff_to_before_gives_after() {
        let before = json!({
            "$dtId": "d", "a": 1, "gone": true, "odd/~name": 1,
            "c": {"x": 1, "$metadata": {"x": {"lastUpdateTime": "1"}}},
            "$metadata": {"$model": "dtmi:a;1", "a": {"lastUpdateTime": "1"}},
        });
        let after = json!({
            "$dtId": "d", "a": 2, "odd/~name": 2, "new": {"deep": [1]},
            "c": {"x": 1, "y": 2, "$metadata": {"x": {"lastUpdateTime": "1"}, "y": {"lastUpdateTime": "5"}}},
            "$metadata": {"$model": "dtmi:a;1", "a": {"lastUpdateTime": "5"}},
        });
        let ops = diff(
            before.as_object().unwrap().clone(),
            after.as_object().unwrap().clone(),
        );
        let mut doc = before.clone();
        apply(&mut doc, &ops);
        assert_eq!(doc, after);
        assert!(ops.contains(&json!({"op": "replace", "path": "/odd~1~0name", "value": 2})));
        assert!(ops.contains(&json!({"op": "remove", "path": "/gone"})));
        assert!(ops.contains(&json!({"op": "add", "path": "/c/y", "value": 2})));
        let same = after.as_object().unwrap().clone();
        assert!(diff(same.clone(), same).is_empty());
    }
}
