//! The on-disk record frame shared by every column family.
//!
//! A record is `crc32(payload) as u32 big-endian ‖ payload`, where the payload is the value
//! encoded with rmp-serde *with field names* (`to_vec_named`), so a later version can add
//! optional fields without a migration and a migration can read old records generically.
//!
//! Invariant: [`decode`] never returns a value whose checksum did not match; a mismatch is a
//! [`RecordError::Checksum`], which the engine reports as corruption together with the key.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Bytes in front of the payload.
pub const HEADER_LEN: usize = 4;

/// Why a stored record could not be turned back into a value.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("record shorter than its {HEADER_LEN}-byte header ({0} bytes)")]
    Truncated(usize),
    #[error("record checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("record payload does not decode: {0}")]
    Payload(String),
}

/// Frames a value: checksum, then the named MessagePack encoding.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    encode_sized(value, 64)
}

/// [`encode`] into a buffer sized for `payload_hint` bytes of payload, so a record whose size
/// the caller can estimate (a D2C event: its body and properties) is encoded without growing.
pub fn encode_sized<T: Serialize + ?Sized>(value: &T, payload_hint: usize) -> Vec<u8> {
    encode_sized_with(payload_hint, |out| {
        // Encoding our own plain data types into a Vec cannot fail: no I/O, no maps with
        // non-string keys, no unsupported types. A failure here is a programming error.
        rmp_serde::encode::write_named(out, value).expect("record types always encode");
    })
}

/// Frames the MessagePack payload that `write` appends to the buffer it is given: for a hot
/// record type with an encoder of its own, which must write what [`encode`] would.
pub fn encode_sized_with(payload_hint: usize, write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload_hint);
    append_framed(&mut out, write);
    out
}

/// Appends to `out` the frame of the payload `write` appends, as [`encode_sized_with`] would
/// write it alone; returns the frame's length. For records that hold several frames in a row
/// (see [`decode_first`]).
pub fn append_framed(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    write(out);
    let crc = crc32fast::hash(&out[start + HEADER_LEN..]);
    out[start..start + HEADER_LEN].copy_from_slice(&crc.to_be_bytes());
    out.len() - start
}

/// Decodes the frame at the start of `bytes`, which may go on with further frames, and
/// returns the value with the frame's length. The payload's end is where its MessagePack
/// value ends; the checksum is checked over exactly those bytes before the value is returned.
pub fn decode_first<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), RecordError> {
    if bytes.len() < HEADER_LEN {
        return Err(RecordError::Truncated(bytes.len()));
    }
    let (head, rest) = bytes.split_at(HEADER_LEN);
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(rest));
    // A corrupt length may make the value look longer or shorter than it was: either the
    // decode fails or the checksum below does not match.
    let value = T::deserialize(&mut de).map_err(|e| RecordError::Payload(e.to_string()));
    let used = usize::try_from(de.position())
        .unwrap_or(usize::MAX)
        .min(rest.len());
    let stored = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let computed = crc32fast::hash(&rest[..used]);
    if stored != computed {
        return Err(RecordError::Checksum { stored, computed });
    }
    Ok((value?, HEADER_LEN + used))
}

/// Checks the frame and returns the payload bytes.
pub fn payload(bytes: &[u8]) -> Result<&[u8], RecordError> {
    if bytes.len() < HEADER_LEN {
        return Err(RecordError::Truncated(bytes.len()));
    }
    let (head, payload) = bytes.split_at(HEADER_LEN);
    let stored = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    let computed = crc32fast::hash(payload);
    if stored != computed {
        return Err(RecordError::Checksum { stored, computed });
    }
    Ok(payload)
}

/// Checks the frame and decodes the value.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, RecordError> {
    rmp_serde::from_slice(payload(bytes)?).map_err(|e| RecordError::Payload(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Sample {
        name: String,
        n: u64,
    }

    #[test]
    fn round_trip() {
        let v = Sample {
            name: "dev1".into(),
            n: 7,
        };
        let bytes = encode(&v);
        assert_eq!(decode::<Sample>(&bytes).unwrap(), v);
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let bytes = encode(&Sample {
            name: "dev1".into(),
            n: 7,
        });
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(
                decode::<Sample>(&bad).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn frames_in_a_row_decode_one_by_one() {
        let a = Sample {
            name: "first".into(),
            n: 1,
        };
        let b = Sample {
            name: "é".repeat(40),
            n: u64::MAX,
        };
        let mut row = Vec::new();
        let la = append_framed(&mut row, |out| {
            rmp_serde::encode::write_named(out, &a).unwrap()
        });
        assert_eq!(row, encode(&a));
        let lb = append_framed(&mut row, |out| {
            rmp_serde::encode::write_named(out, &b).unwrap()
        });
        let (first, used) = decode_first::<Sample>(&row).unwrap();
        assert_eq!((first, used), (a, la));
        let (second, used) = decode_first::<Sample>(&row[la..]).unwrap();
        assert_eq!((second, used), (b, lb));
        for i in 0..row.len() {
            let mut bad = row.clone();
            bad[i] ^= 0x01;
            let first = decode_first::<Sample>(&bad);
            let second = first
                .as_ref()
                .ok()
                .map(|(_, used)| decode_first::<Sample>(&bad[*used..]));
            assert!(
                first.is_err() || second.is_some_and(|s| s.is_err()),
                "flip at byte {i} went unnoticed"
            );
        }
    }

    #[test]
    fn truncated_is_an_error() {
        assert!(matches!(payload(&[1, 2]), Err(RecordError::Truncated(2))));
    }

    #[test]
    fn named_fields_decode_generically() {
        let bytes = encode(&Sample {
            name: "x".into(),
            n: 1,
        });
        let v: serde_json::Value = decode(&bytes).unwrap();
        assert_eq!(v["name"], "x");
    }
}
