//! Packed D2C events (schema version 9): one append's events of a partition share a record of
//! the log, and every reader still finds each event by sequence number, offset and time, also
//! after a reopen, with a corrupt frame inside a pack reported rather than skipped.

mod common;

use std::path::Path;

use ferrohub_engine::d2c::D2cError;
use ferrohub_engine::d2c::{partition_of, Appended, NewEvent, ReadPosition};
use ferrohub_engine::error::StorageError;
use ferrohub_engine::model::UnixMillis;

fn ev(device: &str, body: Vec<u8>) -> NewEvent {
    NewEvent {
        device_id: device.into(),
        body,
        ..NewEvent::default()
    }
}

/// The keys and values of the log, read past the engine.
fn log_records(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let db = common::raw_db(dir);
    let cf = db.cf_handle("d2c_log").unwrap();
    db.iterator_cf(cf, rocksdb::IteratorMode::Start)
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// Reads from every position of every appended event, and one past each.
fn check_every_position(store: &ferrohub_engine::Store, p: u16, appended: &[Appended]) {
    for (i, a) in appended.iter().enumerate() {
        let next = appended.get(i + 1).map(|n| n.sequence_number);
        let by_seq = store
            .read_events(p, ReadPosition::Sequence(a.sequence_number), 2)
            .unwrap();
        assert_eq!(by_seq[0].sequence_number, a.sequence_number);
        assert_eq!(by_seq[0].offset, a.offset);
        assert_eq!(by_seq.get(1).map(|e| e.sequence_number), next);
        let by_offset = store
            .read_events(p, ReadPosition::Offset(a.offset), 1)
            .unwrap();
        assert_eq!(by_offset[0].sequence_number, a.sequence_number);
        let past_offset = store
            .read_events(p, ReadPosition::Offset(a.offset + 1), 1)
            .unwrap();
        assert_eq!(past_offset.first().map(|e| e.sequence_number), next);
        let by_time = store
            .read_events(p, ReadPosition::EnqueuedTime(a.enqueued_time), 1)
            .unwrap();
        assert!(by_time[0].sequence_number <= a.sequence_number);
        assert_eq!(by_time[0].enqueued_time, a.enqueued_time);
    }
}

#[test]
fn one_append_of_one_partition_is_one_record_read_from_every_position() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition_of("dev-a", 4);
    let (first, second) = {
        let store = common::open(dir.path());
        let first = store
            .append_events(
                (0..40u8).map(|i| ev("dev-a", vec![i; 100])).collect(),
                UnixMillis(1000),
            )
            .unwrap();
        let second = store
            .append_events(
                (0..3u8).map(|i| ev("dev-a", vec![i; 7])).collect(),
                UnixMillis(2000),
            )
            .unwrap();
        (first, second)
    };
    let records = log_records(dir.path());
    assert_eq!(records.len(), 2, "two appends, two records");
    // Offsets count stored bytes as when every event had a record of its own: the pack is
    // its events' frames back to back.
    assert_eq!(
        records[0].1.len() as u64,
        second[0].offset - first[0].offset
    );
    assert_eq!(
        records[1].1.len() as u64,
        3 * (second[1].offset - second[0].offset)
    );

    let store = common::open(dir.path());
    let all: Vec<Appended> = first.iter().chain(&second).copied().collect();
    check_every_position(&store, p, &all);
    let everything = store.read_events(p, ReadPosition::Start, 100).unwrap();
    assert_eq!(everything.len(), 43);
    assert_eq!(everything[17].body, vec![17u8; 100]);
    assert_eq!(everything[41].body, vec![1u8; 7]);
    // The head came back from the last event of the last pack.
    let info = store.partition_info(p).unwrap();
    assert_eq!(info.last_enqueued_sequence_number, Some(42));
    assert_eq!(info.last_enqueued_offset, Some(second[2].offset));
    let next = store
        .append_events(vec![ev("dev-a", vec![9; 7])], UnixMillis(3000))
        .unwrap();
    assert_eq!(next[0].sequence_number, 43);
    assert_eq!(
        next[0].offset,
        second[2].offset + (second[1].offset - second[0].offset)
    );
}

#[test]
fn a_pack_closes_at_its_size_and_partitions_get_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = ("dev-a", "dev-b");
    assert_ne!(partition_of(a, 4), partition_of(b, 4));
    let appended = {
        let store = common::open(dir.path());
        // Ten 5 KiB events of one device interleaved with small ones of another: packs close
        // at 16 KiB, so the first device's events take three records (4, 4, 2), the other's one.
        let events = (0..10u8)
            .flat_map(|i| [ev(a, vec![i; 5 << 10]), ev(b, vec![i; 10])])
            .collect();
        store.append_events(events, UnixMillis(1000)).unwrap()
    };
    assert_eq!(log_records(dir.path()).len(), 4);
    let store = common::open(dir.path());
    for device in [a, b] {
        let p = partition_of(device, 4);
        let mine: Vec<Appended> = appended
            .iter()
            .filter(|x| x.partition == p)
            .copied()
            .collect();
        assert_eq!(
            mine.iter().map(|x| x.sequence_number).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        check_every_position(&store, p, &mine);
        let events = store.read_events(p, ReadPosition::Sequence(5), 3).unwrap();
        assert_eq!(
            events.iter().map(|e| e.body[0]).collect::<Vec<_>>(),
            vec![5, 6, 7]
        );
    }
}

#[test]
fn a_corrupt_frame_inside_a_pack_is_reported_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition_of("dev-a", 4);
    {
        let store = common::open(dir.path());
        store
            .append_events(
                (0..3u8).map(|i| ev("dev-a", vec![i; 50])).collect(),
                UnixMillis(1000),
            )
            .unwrap();
        store
            .append_events(vec![ev("dev-a", vec![3; 50])], UnixMillis(2000))
            .unwrap();
    }
    {
        let mut records = log_records(dir.path());
        let (key, mut value) = records.remove(0);
        // A byte of the last frame's body.
        let at = value.len() - 10;
        value[at] ^= 0x40;
        let db = common::raw_db(dir.path());
        let cf = db.cf_handle("d2c_log").unwrap();
        db.put_cf(cf, key, value).unwrap();
    }
    let store = common::open(dir.path());
    let before = store.read_events(p, ReadPosition::Start, 2).unwrap();
    assert_eq!(before.len(), 2, "the frames before the damage still read");
    for from in [ReadPosition::Start, ReadPosition::Sequence(2)] {
        match store.read_events(p, from, 10) {
            Err(D2cError::Storage(StorageError::Corruption { cf, .. })) => {
                assert_eq!(cf, "d2c_log")
            }
            other => panic!("expected corruption, got {other:?}"),
        }
    }
    // Past the damaged pack, reads go on.
    let after = store.read_events(p, ReadPosition::Sequence(3), 10).unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].body, vec![3u8; 50]);
}
