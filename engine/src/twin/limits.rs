//! TWN-7: what a twin section may contain, and how its size is counted (seeds 000 and 003).
//!
//! - Keys: UTF-8, at most 1 KB, no C0/C1 control characters, no `.`, `$` or space.
//! - Values: boolean, number, string, object, array; integers within ±2^52 (−4503599627370496
//!   to 4503599627370495); strings at most 4 KB.
//! - Depth: at most 10 nested objects below the section (`tags`, `desired`, `reported`).
//! - Size: tags ≤ 8 KB, desired and reported ≤ 32 KB each, counting keys and string values by
//!   characters excluding control characters, numbers as 8, booleans as 4, objects as the sum of
//!   their members; `$version`, `$metadata` and `$etag` are not counted.

use serde_json::{Map, Value};

use crate::error::ValidationError;

pub const MAX_KEY_BYTES: usize = 1024;
pub const MAX_STRING_BYTES: usize = 4 * 1024;
pub const MAX_DEPTH: usize = 10;
pub const MIN_INTEGER: i64 = -4_503_599_627_370_496;
pub const MAX_INTEGER: i64 = 4_503_599_627_370_495;
pub const MAX_TAGS_SIZE: usize = 8 * 1024;
pub const MAX_PROPERTIES_SIZE: usize = 32 * 1024;

/// The three parts of a twin a caller writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionKind {
    Tags,
    Desired,
    Reported,
}

impl SectionKind {
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Tags => "tags",
            SectionKind::Desired => "properties.desired",
            SectionKind::Reported => "properties.reported",
        }
    }

    pub fn max_size(self) -> usize {
        match self {
            SectionKind::Tags => MAX_TAGS_SIZE,
            SectionKind::Desired | SectionKind::Reported => MAX_PROPERTIES_SIZE,
        }
    }
}

fn is_control(c: char) -> bool {
    // C0 (U+0000..U+001F, U+007F) and C1 (U+0080..U+009F).
    c.is_control()
}

/// Characters counted for size: everything but control characters.
fn counted_chars(s: &str) -> usize {
    s.chars().filter(|c| !is_control(*c)).count()
}

fn check_key(path: &str, key: &str) -> Result<(), ValidationError> {
    let bad = |why: &str| {
        Err(ValidationError::new(
            "twin",
            format!("key {key:?} at {path}: {why}"),
        ))
    };
    if key.is_empty() {
        return bad("keys must not be empty");
    }
    if key.len() > MAX_KEY_BYTES {
        return bad("keys are at most 1 KB");
    }
    if let Some(c) = key
        .chars()
        .find(|c| is_control(*c) || matches!(c, '.' | '$' | ' '))
    {
        return bad(&format!("{c:?} is not allowed in keys"));
    }
    Ok(())
}

fn check_value(
    path: &str,
    value: &Value,
    depth: usize,
    allow_null: bool,
) -> Result<(), ValidationError> {
    let bad = |why: String| Err(ValidationError::new("twin", format!("{path}: {why}")));
    match value {
        Value::Null if allow_null => Ok(()),
        Value::Null => bad("null is only allowed in a patch, to remove a property".into()),
        Value::Bool(_) => Ok(()),
        Value::Number(n) => {
            if n.is_f64() {
                return Ok(());
            }
            match n.as_i64() {
                Some(i) if (MIN_INTEGER..=MAX_INTEGER).contains(&i) => Ok(()),
                _ => bad(format!(
                    "integer {n} is outside {MIN_INTEGER}..{MAX_INTEGER}"
                )),
            }
        }
        Value::String(s) if s.len() > MAX_STRING_BYTES => {
            bad(format!("string of {} bytes; at most 4 KB", s.len()))
        }
        Value::String(_) => Ok(()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                // Arrays hold values, not removals: null inside an array is a plain value.
                check_value(&format!("{path}[{i}]"), item, depth, true)?;
            }
            Ok(())
        }
        Value::Object(map) => {
            if depth > MAX_DEPTH {
                return bad(format!("objects nest at most {MAX_DEPTH} deep"));
            }
            check_object(path, map, depth, allow_null)
        }
    }
}

fn check_object(
    path: &str,
    map: &Map<String, Value>,
    depth: usize,
    allow_null: bool,
) -> Result<(), ValidationError> {
    for (k, v) in map {
        check_key(path, k)?;
        check_value(&format!("{path}.{k}"), v, depth + 1, allow_null)?;
    }
    Ok(())
}

/// Checks keys, values and depth of a section body or a patch (`nulls_remove`: a patch, where
/// `null` means "remove").
///
/// # Errors
/// [`ValidationError`] naming the first offending path.
pub fn check_section(
    kind: SectionKind,
    body: &Map<String, Value>,
    nulls_remove: bool,
) -> Result<(), ValidationError> {
    check_object(kind.name(), body, 0, nulls_remove)
}

/// The size of a value by the seed's rule.
pub fn size_of(value: &Value) -> usize {
    match value {
        Value::Null => 0,
        Value::Bool(_) => 4,
        Value::Number(_) => 8,
        Value::String(s) => counted_chars(s),
        Value::Array(items) => items.iter().map(size_of).sum(),
        Value::Object(map) => map.iter().map(|(k, v)| counted_chars(k) + size_of(v)).sum(),
    }
}

/// Checks a whole section against its size limit.
///
/// # Errors
/// [`ValidationError`] with the size and the limit.
pub fn check_size(kind: SectionKind, section: &Map<String, Value>) -> Result<(), ValidationError> {
    let size: usize = section
        .iter()
        .map(|(k, v)| counted_chars(k) + size_of(v))
        .sum();
    if size > kind.max_size() {
        return Err(ValidationError::new(
            "twin",
            format!(
                "{} would be {size} bytes; at most {} are allowed",
                kind.name(),
                kind.max_size()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn keys() {
        assert!(check_section(SectionKind::Tags, &obj(json!({"ok_key-1": 1})), false).is_ok());
        for bad in ["a.b", "$a", "a b", "a\u{7}b", "a\u{85}b"] {
            let mut m = Map::new();
            m.insert(bad.to_string(), json!(1));
            assert!(
                check_section(SectionKind::Desired, &m, false).is_err(),
                "{bad:?}"
            );
        }
        let mut m = Map::new();
        m.insert("k".repeat(1024), json!(1));
        assert!(check_section(SectionKind::Tags, &m, false).is_ok());
        m.insert("k".repeat(1025), json!(1));
        assert!(check_section(SectionKind::Tags, &m, false).is_err());
    }

    #[test]
    fn values() {
        assert!(check_section(
            SectionKind::Reported,
            &obj(json!({"i": 4503599627370495i64, "f": 1.5e300, "a": [1, "x", null, {"b": true}]})),
            false
        )
        .is_ok());
        assert!(check_section(
            SectionKind::Reported,
            &obj(json!({"i": 4503599627370496i64})),
            false
        )
        .is_err());
        assert!(check_section(
            SectionKind::Reported,
            &obj(json!({"i": -4503599627370497i64})),
            false
        )
        .is_err());
        assert!(check_section(
            SectionKind::Reported,
            &obj(json!({"s": "x".repeat(4096)})),
            false
        )
        .is_ok());
        assert!(check_section(
            SectionKind::Reported,
            &obj(json!({"s": "x".repeat(4097)})),
            false
        )
        .is_err());
        assert!(check_section(SectionKind::Reported, &obj(json!({"gone": null})), false).is_err());
        assert!(check_section(SectionKind::Reported, &obj(json!({"gone": null})), true).is_ok());
    }

    #[test]
    fn depth_matches_the_seed_example() {
        let mut v = json!({"property": "value"});
        for level in [
            "ten", "nine", "eight", "seven", "six", "five", "four", "three", "two", "one",
        ] {
            v = json!({ level: v });
        }
        assert!(
            check_section(SectionKind::Tags, &obj(v.clone()), false).is_ok(),
            "the seed's valid example"
        );
        let deeper = json!({"zero": v});
        assert!(
            check_section(SectionKind::Tags, &obj(deeper), false).is_err(),
            "depth 11"
        );
    }

    #[test]
    fn sizes_follow_the_seed_rule() {
        assert_eq!(
            size_of(&json!({"ab": "cde", "n": 1, "b": true, "o": {"x": "yy"}})),
            2 + 3 + 1 + 8 + 1 + 4 + 1 + 1 + 2
        );
        assert_eq!(
            size_of(&json!("a\u{1}b")),
            2,
            "control characters are not counted"
        );
        let big = obj(json!({"k": "x".repeat(4000), "l": "x".repeat(4000), "m": "x".repeat(200)}));
        assert!(check_size(SectionKind::Tags, &big).is_err());
        assert!(check_size(SectionKind::Desired, &big).is_ok());
    }
}
