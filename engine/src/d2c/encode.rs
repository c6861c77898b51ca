//! The stored form of a D2C event, written without serde's generic machinery.
//!
//! Every device message is encoded once per endpoint on the append path, where the generic
//! serializer cost several percent of the hub's CPU under a telemetry flood (a call chain per
//! field and per property string). This writes the same MessagePack directly.
//!
//! # Invariant
//! [`D2cEventRef::encode_into`] appends exactly the bytes `record::encode_sized` produces
//! for the same value through its `Serialize` derive (a map of the seven fields by name, in
//! declaration order, each in MessagePack's most compact form), so stored events read back
//! as [`super::D2cEvent`] whichever way they were written. The tests compare the two.

use ferrohub_migrations::record;
use rmp::encode;

use super::D2cEventRef;

/// Writes into a `Vec`, which cannot fail.
const INFALLIBLE: &str = "writing MessagePack into a Vec cannot fail";

impl D2cEventRef<'_> {
    /// The framed record, as `record::encode_sized(self, payload_hint)` would write it.
    #[cfg(test)]
    pub(super) fn encode_framed(&self, payload_hint: usize) -> Vec<u8> {
        record::encode_sized_with(payload_hint, |out| self.write(out))
    }

    /// Appends the framed record to `out` (a pack, see `pack`); returns its length.
    pub(super) fn encode_into(&self, out: &mut Vec<u8>) -> usize {
        record::append_framed(out, |out| self.write(out))
    }

    fn write(&self, out: &mut Vec<u8>) {
        encode::write_map_len(out, 7).expect(INFALLIBLE);
        field(out, "partition");
        encode::write_uint(out, u64::from(self.partition)).expect(INFALLIBLE);
        field(out, "sequence_number");
        encode::write_uint(out, self.sequence_number).expect(INFALLIBLE);
        field(out, "offset");
        encode::write_uint(out, self.offset).expect(INFALLIBLE);
        field(out, "enqueued_time");
        encode::write_sint(out, self.enqueued_time.0).expect(INFALLIBLE);
        field(out, "system_properties");
        pairs(out, self.system_properties);
        field(out, "application_properties");
        pairs(out, self.application_properties);
        field(out, "body");
        encode::write_bin(out, self.body).expect(INFALLIBLE);
    }
}

fn field(out: &mut Vec<u8>, name: &str) {
    encode::write_str(out, name).expect(INFALLIBLE);
}

/// A list of string pairs: an array of two-element arrays.
fn pairs<K: AsRef<str>, V: AsRef<str>>(out: &mut Vec<u8>, list: &[(K, V)]) {
    encode::write_array_len(out, len32(list.len())).expect(INFALLIBLE);
    for (k, v) in list {
        encode::write_array_len(out, 2).expect(INFALLIBLE);
        encode::write_str(out, k.as_ref()).expect(INFALLIBLE);
        encode::write_str(out, v.as_ref()).expect(INFALLIBLE);
    }
}

/// MessagePack lengths are 32-bit; the hub's message size limits keep every list far below.
fn len32(n: usize) -> u32 {
    u32::try_from(n).expect("a list longer than MessagePack can frame")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{D2cEvent, D2cEventRef, SystemProperty};
    use crate::model::UnixMillis;
    use ferrohub_migrations::record;

    fn text() -> impl Strategy<Value = String> {
        // Lengths across MessagePack's str forms: fixstr (<32), str8, str16.
        prop_oneof![
            "[a-z\\-]{0,31}",
            "\\PC{0,40}",
            "[a-z]{32,300}",
            Just("é".repeat(33_000)),
        ]
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            Just(vec![7u8; 70_000]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn writes_what_serde_writes(
            partition in any::<u16>(),
            sequence_number in any::<u64>(),
            offset in prop_oneof![0..200u64, any::<u64>()],
            enqueued in prop_oneof![-200..200i64, any::<i64>()],
            system in proptest::collection::vec((text(), text()), 0..12),
            application in proptest::collection::vec((text(), text()), 0..5),
            body in body(),
            hint in 0..400usize,
        ) {
            let system: Vec<SystemProperty> =
                system.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
            let event = D2cEventRef {
                partition,
                sequence_number,
                offset,
                enqueued_time: UnixMillis(enqueued),
                system_properties: &system,
                application_properties: &application,
                body: &body,
            };
            let bytes = event.encode_framed(hint);
            prop_assert_eq!(&bytes, &record::encode_sized(&event, hint));
            let mut appended = vec![9u8; hint % 3];
            let len = event.encode_into(&mut appended);
            prop_assert_eq!(&appended[hint % 3..], &bytes[..]);
            prop_assert_eq!(len, bytes.len());
            let back: D2cEvent = record::decode(&bytes).unwrap();
            prop_assert_eq!(back.sequence_number, sequence_number);
            prop_assert_eq!(back.body, body);
        }
    }
}
