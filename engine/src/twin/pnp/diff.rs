//! The JSON Patch (RFC 6902) that turns one digital twin view into another: the body of a
//! digital twin change event.
//!
//! # Invariants
//! - Applying the result to `before` gives `after`: members only in `before` are removed,
//!   members only in `after` are added, objects on both sides are compared member by member,
//!   and any other difference replaces the value.
//! - Paths are JSON Pointers (RFC 6901): `~` is written `~0` and `/` is written `~1`.

use serde_json::{json, Map, Value};

/// The operations from `before` to `after`, in member order (removals of a level first).
pub fn diff(before: &Map<String, Value>, after: &Map<String, Value>) -> Vec<Value> {
    let mut ops = Vec::new();
    diff_level("", before, after, &mut ops);
    ops
}

fn diff_level(
    path: &str,
    before: &Map<String, Value>,
    after: &Map<String, Value>,
    ops: &mut Vec<Value>,
) {
    for key in before.keys().filter(|k| !after.contains_key(*k)) {
        ops.push(json!({"op": "remove", "path": pointer(path, key)}));
    }
    for (key, new) in after {
        let at = pointer(path, key);
        match (before.get(key), new) {
            (None, _) => ops.push(json!({"op": "add", "path": at, "value": new})),
            (Some(Value::Object(old)), Value::Object(new)) => diff_level(&at, old, new, ops),
            (Some(old), _) if old != new => {
                ops.push(json!({"op": "replace", "path": at, "value": new}));
            }
            _ => {}
        }
    }
}

/// `path` extended by one member name, escaped as JSON Pointer requires.
pub fn pointer(path: &str, key: &str) -> String {
    format!("{path}/{}", key.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let ops = diff(before.as_object().unwrap(), after.as_object().unwrap());
        let mut doc = before.clone();
        apply(&mut doc, &ops);
        assert_eq!(doc, after);
        assert!(ops.contains(&json!({"op": "replace", "path": "/odd~1~0name", "value": 2})));
        assert!(ops.contains(&json!({"op": "remove", "path": "/gone"})));
        assert!(ops.contains(&json!({"op": "add", "path": "/c/y", "value": 2})));
        assert!(diff(after.as_object().unwrap(), after.as_object().unwrap()).is_empty());
    }
}
