//! Index keys: `collection ‖ path length:u16be ‖ path ‖ value ‖ twin key`, where the value
//! encoding sorts as the query language compares: by type (null, false, true, numbers,
//! strings), numbers by value, strings by code point (UTF-8 byte order).
//!
//! # Invariants
//! - An encoded value is self-delimiting (numbers are 8 bytes, strings end with `00 01` and
//!   escape `00` as `00 FF`), so the twin key is the rest of the key, and every key of one
//!   (path, value) is a contiguous range ordered by twin key.
//! - Numbers compare by their f64 value: integers beyond 2^53 may share a key. The query
//!   re-checks every candidate row, so that costs a read, never a wrong answer.

use serde_json::Value;

const NULL: u8 = 0x01;
const FALSE: u8 = 0x02;
const TRUE: u8 = 0x03;
const NUMBER: u8 = 0x04;
const STRING: u8 = 0x05;
/// The first byte after every string type byte sequence.
const AFTER_STRINGS: u8 = 0x06;

/// The device-twin and module-twin halves of the index.
pub(crate) fn collection_byte(module: bool) -> u8 {
    if module {
        b'm'
    } else {
        b'd'
    }
}

/// `collection ‖ len ‖ path`: the prefix of every entry of one path.
pub(crate) fn path_prefix(module: bool, path: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(3 + path.len());
    k.push(collection_byte(module));
    k.extend_from_slice(&(path.len().min(u16::MAX as usize) as u16).to_be_bytes());
    k.extend_from_slice(path.as_bytes());
    k
}

fn number_bytes(f: f64) -> [u8; 8] {
    let bits = f.to_bits();
    // Order-preserving: flip every bit of negatives, only the sign bit of the rest.
    let ordered = if bits >> 63 == 1 {
        !bits
    } else {
        bits | (1 << 63)
    };
    ordered.to_be_bytes()
}

/// Appends the encoding of a scalar; `None` for values the index does not hold (objects,
/// arrays, numbers that are not finite).
pub(crate) fn push_value(k: &mut Vec<u8>, v: &Value) -> Option<()> {
    match v {
        Value::Null => k.push(NULL),
        Value::Bool(false) => k.push(FALSE),
        Value::Bool(true) => k.push(TRUE),
        Value::Number(n) => {
            let f = n.as_f64().filter(|f| f.is_finite())?;
            k.push(NUMBER);
            k.extend_from_slice(&number_bytes(f));
        }
        Value::String(s) => {
            push_string_body(k, s);
            k.extend_from_slice(&[0x00, 0x01]);
        }
        Value::Array(_) | Value::Object(_) => return None,
    }
    Some(())
}

/// `STRING ‖ escaped bytes` without the terminator: the prefix of every string starting
/// with `s`.
pub(crate) fn push_string_body(k: &mut Vec<u8>, s: &str) {
    k.push(STRING);
    for b in s.bytes() {
        if b == 0 {
            k.extend_from_slice(&[0x00, 0xFF]);
        } else {
            k.push(b);
        }
    }
}

/// The first byte of the encodings of values of the type of `v` (for open-ended ranges), and
/// the first byte after them.
pub(crate) fn type_range(v: &Value) -> Option<(u8, u8)> {
    match v {
        Value::Null => Some((NULL, NULL + 1)),
        Value::Bool(_) => Some((FALSE, TRUE + 1)),
        Value::Number(_) => Some((NUMBER, NUMBER + 1)),
        Value::String(_) => Some((STRING, AFTER_STRINGS)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn enc(v: Value) -> Vec<u8> {
        let mut k = Vec::new();
        push_value(&mut k, &v).unwrap();
        k
    }

    #[test]
    fn encodings_sort_as_values_compare() {
        let ordered = [
            json!(null),
            json!(false),
            json!(true),
            json!(-1e300),
            json!(-2),
            json!(-0.5),
            json!(0),
            json!(0.25),
            json!(3),
            json!(1e300),
            json!(""),
            json!("a"),
            json!("a\u{0}"),
            json!("ab"),
            json!("b"),
            json!("é"),
        ];
        for pair in ordered.windows(2) {
            assert!(enc(pair[0].clone()) < enc(pair[1].clone()), "{pair:?}");
        }
        assert_eq!(enc(json!(3)), enc(json!(3.0)));
        assert!(push_value(&mut Vec::new(), &json!([1])).is_none());
        // A string's body is a prefix of every longer string's encoding.
        let mut prefix = Vec::new();
        push_string_body(&mut prefix, "ab");
        assert!(enc(json!("abc")).starts_with(&prefix) && !enc(json!("b")).starts_with(&prefix));
    }
}
