//! The MQTT property bag (`compat` §A5/§A6): `k=v&k2=v2`, keys and values percent-encoded.
//!
//! Parsing is strict: a `%` not followed by two hex digits, or bytes that are not UTF-8 after
//! decoding, is an error (the connection is then closed; nothing is stored). `+` is a literal
//! plus, never a space.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BagError {
    #[error("bad percent-encoding in {0:?}")]
    BadEncoding(String),
    #[error("property name is empty")]
    EmptyKey,
}

/// One property: a key with no `=` has no value.
pub type Property = (String, Option<String>);

fn decode(part: &str) -> Result<String, BagError> {
    let bytes = part.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let ok = bytes.len() > i + 2
                && bytes[i + 1].is_ascii_hexdigit()
                && bytes[i + 2].is_ascii_hexdigit();
            if !ok {
                return Err(BagError::BadEncoding(part.to_string()));
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    percent_decode_str(part)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| BagError::BadEncoding(part.to_string()))
}

/// Parses a bag; an empty string is an empty bag.
pub fn parse(bag: &str) -> Result<Vec<Property>, BagError> {
    let mut out = Vec::new();
    for pair in bag.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (pair, None),
        };
        let key = decode(k)?;
        if key.is_empty() {
            return Err(BagError::EmptyKey);
        }
        out.push((key, v.map(decode).transpose()?));
    }
    Ok(out)
}

/// What stays unencoded: unreserved characters only. `/`, `&`, `=`, `+`, `$` and space are
/// encoded, as the device SDK's parser needs.
const ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Encodes a bag: `None` → `key`, `Some("")` → `key=`, else `key=value`.
pub fn encode(props: &[Property]) -> String {
    let mut out = String::new();
    for (k, v) in props {
        if !out.is_empty() {
            out.push('&');
        }
        out.extend(utf8_percent_encode(k, ENCODE));
        if let Some(v) = v {
            out.push('=');
            out.extend(utf8_percent_encode(v, ENCODE));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sdk_capture() {
        let bag = "%24.mid=m-1&%24.cid=c%2F1&%24.uid=u1&%24.ct=application%2Fjson&%24.ce=utf-8&%24.exp=2030-01-02T03%3A04%3A05%2B00%3A00&alpha=5&zeta=a%20b%26c%3Dd%2Fe";
        let p = parse(bag).unwrap();
        assert_eq!(p[0], ("$.mid".into(), Some("m-1".into())));
        assert_eq!(p[1], ("$.cid".into(), Some("c/1".into())));
        assert_eq!(
            p[5],
            ("$.exp".into(), Some("2030-01-02T03:04:05+00:00".into()))
        );
        assert_eq!(p[7], ("zeta".into(), Some("a b&c=d/e".into())));
    }

    #[test]
    fn plus_is_literal_and_flags_have_no_value() {
        assert_eq!(
            parse("a+b=c+d&flag&empty=").unwrap(),
            vec![
                ("a+b".into(), Some("c+d".into())),
                ("flag".into(), None),
                ("empty".into(), Some(String::new())),
            ]
        );
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn bad_encoding_is_refused() {
        for bad in ["a=%", "a=%4", "a=%zz", "%C3%28=x", "=v"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn encode_round_trips() {
        let props = vec![
            ("$.mid".to_string(), Some("msg 1".to_string())),
            (
                "custom key".to_string(),
                Some("custom/val=1&x+y".to_string()),
            ),
            ("flagonly".to_string(), None),
            ("empty".to_string(), Some(String::new())),
        ];
        let s = encode(&props);
        assert_eq!(
            s,
            "%24.mid=msg%201&custom%20key=custom%2Fval%3D1%26x%2By&flagonly&empty="
        );
        assert_eq!(parse(&s).unwrap(), props);
    }
}
