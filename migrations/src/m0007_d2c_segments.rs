//! Version 7: D2C events are keyed segment first, so RocksDB stops rewriting them.
//!
//! Until version 6 an event's key was `partition ‖ sequence`. Every memtable flush then held
//! the newest events of all partitions, and its key range spanned every older table file's:
//! leveled compaction rewrote all retained events again and again (a quarter of the hub's CPU
//! under a telemetry flood). From version 7 the key is `segment ‖ partition ‖ sequence`, where
//! the segment is a hub-wide counter that the engine advances together with a memtable switch.
//! A flush then covers one segment, above every older file, and compaction only moves files.
//!
//! A reader finds a partition's events through the segment index in [`cf::D2C_STATE`]: one
//! entry per partition and segment it wrote in, keyed by the first sequence number it wrote
//! there. This step copies the old events into segment 0 in chunks (idempotent: a crash re-runs
//! the copy, which overwrites), indexes them, and drops the old column family.

use crate::{cf, record, Migration, MigrationError, SchemaTarget};

pub(crate) const MIGRATION: Migration = Migration {
    version: 7,
    name: "segmented D2C events",
    apply,
};

/// Events copied per durable chunk: bounds the memory the step needs.
const CHUNK: usize = 4096;

/// Key of an event in [`cf::D2C_LOG`]: `segment:u32be ‖ partition:u16be ‖ sequence:u64be`.
pub fn event_key(segment: u32, partition: u16, sequence: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(14);
    k.extend_from_slice(&segment.to_be_bytes());
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(&sequence.to_be_bytes());
    k
}

/// Prefix of every segment index entry in [`cf::D2C_STATE`].
pub const SEGMENT_INDEX_PREFIX: &[u8] = b"segment/";

/// Key of a segment index entry: `"segment/" ‖ partition:u16be ‖ first_sequence:u64be`; the
/// value is the framed `u32` segment.
pub fn segment_index_key(partition: u16, first_sequence: u64) -> Vec<u8> {
    let mut k = SEGMENT_INDEX_PREFIX.to_vec();
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(&first_sequence.to_be_bytes());
    k
}

/// Parses a segment index key back into `(partition, first_sequence)`.
pub fn parse_segment_index_key(key: &[u8]) -> Option<(u16, u64)> {
    let rest = key.strip_prefix(SEGMENT_INDEX_PREFIX)?;
    let p = u16::from_be_bytes(rest.get(..2)?.try_into().ok()?);
    let s = u64::from_be_bytes(rest.get(2..10)?.try_into().ok()?);
    (rest.len() == 10).then_some((p, s))
}

/// Key in [`cf::D2C_STATE`] of the segment new events go to (a framed `u32`).
pub const CURRENT_SEGMENT_KEY: &[u8] = b"current_segment";

/// The segment that holds the events of versions 3 to 6.
pub const MIGRATED_SEGMENT: u32 = 0;

fn apply(db: &mut dyn SchemaTarget) -> Result<(), MigrationError> {
    db.ensure_column_family(cf::D2C_LOG)?;
    let mut from = Vec::new();
    let mut last_partition: Option<u16> = None;
    loop {
        let mut chunk: Vec<(u16, u64, Vec<u8>)> = Vec::with_capacity(CHUNK);
        db.scan_from(cf::D2C_EVENTS, &from, &mut |key, value| {
            let (p, s) = old_event_key(key).ok_or_else(|| MigrationError::Step {
                version: 7,
                name: MIGRATION.name,
                reason: format!("unexpected key of {} bytes in d2c_events", key.len()),
            })?;
            chunk.push((p, s, value.to_vec()));
            Ok(chunk.len() < CHUNK)
        })?;
        let Some(&(p, s, _)) = chunk.last() else {
            break;
        };
        // Resume after the last key copied (keys are ordered by partition, then sequence).
        from = match s.checked_add(1) {
            Some(next) => [p.to_be_bytes().as_slice(), &next.to_be_bytes()].concat(),
            None => (u32::from(p) + 1).to_be_bytes()[2..].to_vec(),
        };
        let full = chunk.len() == CHUNK;
        for (p, s, value) in chunk {
            if last_partition != Some(p) {
                // The first event seen of a partition is its oldest.
                last_partition = Some(p);
                db.stage_put(
                    cf::D2C_STATE,
                    &segment_index_key(p, s),
                    record::encode(&MIGRATED_SEGMENT),
                );
            }
            db.stage_put(cf::D2C_LOG, &event_key(MIGRATED_SEGMENT, p, s), value);
        }
        db.checkpoint()?;
        if !full {
            break;
        }
    }
    db.drop_column_family(cf::D2C_EVENTS)
}

/// `(partition, sequence)` of a version 3 to 6 event key.
fn old_event_key(key: &[u8]) -> Option<(u16, u64)> {
    if key.len() != 10 {
        return None;
    }
    let p = u16::from_be_bytes([key[0], key[1]]);
    let s = u64::from_be_bytes(key[2..10].try_into().ok()?);
    Some((p, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_by_segment_then_partition_then_sequence() {
        assert!(event_key(1, 0, 0) > event_key(0, 255, u64::MAX));
        assert!(event_key(1, 2, 0) > event_key(1, 1, u64::MAX));
        assert!(event_key(1, 2, 7) > event_key(1, 2, 6));
        let k = segment_index_key(3, 42);
        assert_eq!(parse_segment_index_key(&k), Some((3, 42)));
        assert_eq!(parse_segment_index_key(b"segment/x"), None);
        assert_eq!(old_event_key(&[0, 3, 0, 0, 0, 0, 0, 0, 0, 9]), Some((3, 9)));
        assert_eq!(old_event_key(&[0, 3]), None);
    }
}
