//! The segmented D2C log (schema version 7): reads across segments, retention that drops whole
//! table files, compaction that moves files instead of rewriting events, and the migration of
//! version 6's partition-major events.

mod common;

use std::path::Path;

use ferrohub_engine::d2c::{partition_of, NewEvent, ReadPosition};
use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::Store;
use ferrohub_migrations::{record, VERSION_KEY};
use serde::Serialize;

fn ev(device: &str, body: Vec<u8>) -> NewEvent {
    NewEvent {
        device_id: device.into(),
        body,
        ..NewEvent::default()
    }
}

fn open_with_segments(dir: &Path, bytes: u64) -> Store {
    let store = common::open(dir);
    store.set_d2c_segment_bytes(bytes);
    store
}

/// `(segment of the first key, segment of the last key, level)` of each d2c_log table file.
fn log_files(dir: &Path) -> Vec<(u32, u32, i32)> {
    let db = common::raw_db(dir);
    let seg =
        |k: &Option<Vec<u8>>| u32::from_be_bytes(k.as_ref().unwrap()[..4].try_into().unwrap());
    db.live_files()
        .unwrap()
        .into_iter()
        .filter(|f| f.column_family_name == "d2c_log")
        .map(|f| (seg(&f.start_key), seg(&f.end_key), f.level))
        .collect()
}

#[test]
fn reads_cross_segments_in_order_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition_of("dev-a", 4);
    {
        // About three events per segment.
        let store = open_with_segments(dir.path(), 600);
        for i in 0..200u64 {
            let a = store
                .append_events(
                    vec![ev("dev-a", vec![i as u8; 150]), ev("dev-b", vec![1; 10])],
                    UnixMillis(1000 + i as i64),
                )
                .unwrap();
            assert_eq!(a[0].sequence_number, i);
        }
        let all = store.read_events(p, ReadPosition::Start, 1000).unwrap();
        assert_eq!(
            all.iter().map(|e| e.sequence_number).collect::<Vec<_>>(),
            (0..200).collect::<Vec<_>>()
        );
        let middle = store.read_events(p, ReadPosition::Sequence(97), 7).unwrap();
        assert_eq!(middle.first().unwrap().sequence_number, 97);
        assert_eq!(middle.len(), 7);
        assert_eq!(middle[3].body, vec![100u8; 150]);
    }
    let files = log_files(dir.path());
    let segments: std::collections::BTreeSet<u32> = files.iter().map(|f| f.0).collect();
    assert!(segments.len() > 20, "the log was not segmented: {files:?}");
    let store = common::open(dir.path());
    let got = store
        .read_events(p, ReadPosition::Sequence(150), 1000)
        .unwrap();
    assert_eq!(got.len(), 50);
    let a = store
        .append_events(vec![ev("dev-a", b"after".to_vec())], UnixMillis(5000))
        .unwrap();
    assert_eq!(a[0].sequence_number, 200);
    let tail = store
        .read_events(p, ReadPosition::Sequence(199), 10)
        .unwrap();
    assert_eq!(
        tail.iter().map(|e| e.sequence_number).collect::<Vec<_>>(),
        vec![199, 200]
    );
}

#[test]
fn compaction_moves_segment_files_instead_of_merging_them() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open_with_segments(dir.path(), 256 << 10);
        // 24 segments of 256 KiB over four partitions: far past the level-0 trigger.
        for i in 0..6_000u64 {
            let batch = (0..4)
                .map(|d| ev(&format!("dev-{d}"), vec![(i % 251) as u8; 250]))
                .collect();
            store.append_events(batch, UnixMillis(i as i64)).unwrap();
        }
        // Let background compaction catch up before the store closes (bounded: a slow machine
        // gets more time, never an endless wait).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        std::thread::sleep(std::time::Duration::from_millis(500));
        while store.storage_stats().pending_compaction_bytes > 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    let files = log_files(dir.path());
    assert!(
        files.iter().any(|f| f.2 > 0),
        "nothing left level 0, so the test shows nothing: {files:?}"
    );
    for (first, last, level) in &files {
        assert_eq!(
            first, last,
            "a table file at level {level} spans segments {first}..={last}: compaction merged flushes ({files:?})"
        );
    }
    let store = common::open(dir.path());
    let mut total = 0;
    for p in 0..4 {
        let got = store.read_events(p, ReadPosition::Start, 100_000).unwrap();
        assert!(got
            .windows(2)
            .all(|w| w[1].sequence_number == w[0].sequence_number + 1));
        total += got.len();
    }
    assert_eq!(total, 24_000);
}

#[test]
fn retention_drops_whole_segment_files_and_keeps_the_rest_readable() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition_of("dev-a", 4);
    let store = open_with_segments(dir.path(), 64 << 10);
    for i in 0..2_000i64 {
        store
            .append_events(vec![ev("dev-a", vec![7; 200])], UnixMillis(i))
            .unwrap();
    }
    drop(store);
    let before = log_files(dir.path());
    let store = open_with_segments(dir.path(), 64 << 10);
    let removed = store.trim_events_before(UnixMillis(1_500)).unwrap();
    assert_eq!(removed, 1_500);
    let info = store.partition_info(p).unwrap();
    assert_eq!(info.begin_sequence_number, 1_500);
    let got = store.read_events(p, ReadPosition::Start, 10_000).unwrap();
    assert_eq!(got.len(), 500);
    assert_eq!(got[0].sequence_number, 1_500);
    // Offsets and times still resolve within what is left.
    let at = store
        .read_events(p, ReadPosition::EnqueuedTime(UnixMillis(10)), 1)
        .unwrap();
    assert_eq!(at[0].sequence_number, 1_500);
    drop(store);
    let after = log_files(dir.path());
    assert!(
        after.len() < before.len(),
        "no table file was dropped: {} before, {} after",
        before.len(),
        after.len()
    );
    let store = common::open(dir.path());
    assert_eq!(
        store.partition_info(p).unwrap().begin_sequence_number,
        1_500
    );
    assert_eq!(
        store
            .read_events(p, ReadPosition::Start, 10_000)
            .unwrap()
            .len(),
        500
    );
}

/// Version 6's partition head, as it was stored.
#[derive(Serialize)]
struct HeadV6 {
    next_sequence: u64,
    next_offset: u64,
    last_enqueued: UnixMillis,
    last_sequence: Option<u64>,
    last_offset: Option<u64>,
}

#[test]
fn version_6_events_migrate_into_the_segmented_log() {
    let dir = tempfile::tempdir().unwrap();
    let p = partition_of("dev-a", 4);
    // A current store writes the events, then they are rewritten in version 6's layout.
    let events = {
        let store = common::open(dir.path());
        for i in 0..5_000i64 {
            store
                .append_events(vec![ev("dev-a", i.to_be_bytes().to_vec())], UnixMillis(i))
                .unwrap();
        }
        store.read_events(p, ReadPosition::Start, 10_000).unwrap()
    };
    assert_eq!(events.len(), 5_000);
    {
        let mut db = common::raw_db(dir.path());
        db.drop_cf("d2c_log").unwrap();
        db.create_cf("d2c_log", &rocksdb::Options::default())
            .unwrap();
        db.create_cf("d2c_events", &rocksdb::Options::default())
            .unwrap();
        let state = db.cf_handle("d2c_state").unwrap();
        let stale: Vec<Vec<u8>> = db
            .prefix_iterator_cf(state, b"segment/")
            .map(|kv| kv.unwrap().0.to_vec())
            .take_while(|k| k.starts_with(b"segment/"))
            .collect();
        for k in stale {
            db.delete_cf(state, k).unwrap();
        }
        db.delete_cf(state, b"current_segment").unwrap();
        let last = events.last().unwrap();
        let mut head_key = b"head/".to_vec();
        head_key.extend_from_slice(&p.to_be_bytes());
        let head = HeadV6 {
            next_sequence: 5_000,
            next_offset: last.offset + record::encode(last).len() as u64,
            last_enqueued: last.enqueued_time,
            last_sequence: Some(last.sequence_number),
            last_offset: Some(last.offset),
        };
        db.put_cf(state, head_key, record::encode(&head)).unwrap();
        let old = db.cf_handle("d2c_events").unwrap();
        for e in &events {
            let mut k = p.to_be_bytes().to_vec();
            k.extend_from_slice(&e.sequence_number.to_be_bytes());
            db.put_cf(old, k, record::encode(e)).unwrap();
        }
        let meta = db.cf_handle("meta").unwrap();
        db.put_cf(meta, VERSION_KEY, record::encode(&6u32)).unwrap();
    }
    let store = common::open(dir.path());
    let got = store.read_events(p, ReadPosition::Start, 10_000).unwrap();
    assert_eq!(got, events);
    let a = store
        .append_events(vec![ev("dev-a", b"next".to_vec())], UnixMillis(9_000))
        .unwrap();
    assert_eq!(a[0].sequence_number, 5_000);
    let tail = store
        .read_events(p, ReadPosition::Sequence(4_999), 10)
        .unwrap();
    assert_eq!(tail.len(), 2);
    assert_eq!(tail[1].body, b"next".to_vec());
    drop(store);
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir.path()).unwrap();
    assert!(!cfs.iter().any(|c| c == "d2c_events"), "{cfs:?}");
}

/// The WAL files in a store's directory.
fn wal_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".log"))
        })
        .count()
}

#[test]
fn segment_switches_leave_old_wal_files_free_to_recycle() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with_segments(dir.path(), 4 << 10);
    // A consumer group: a write to d2c_state outside the segment index, as connects leave
    // writes in other column families.
    store
        .create_consumer_group("readers", UnixMillis(0))
        .unwrap();
    // About 30 segments. Each switch starts a WAL file, and every segment also writes its
    // index entries to d2c_state: unless d2c_state is flushed too, each file stays live.
    for i in 0..600u64 {
        let batch = vec![ev("dev-0", vec![(i % 251) as u8; 200])];
        store.append_events(batch, UnixMillis(i as i64)).unwrap();
    }
    // Flushes run in the background: wait for them (bounded; a slow machine gets more time).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while wal_files(dir.path()) > 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The live one, one whose flush may still run, and RocksDB's two recycled ones.
    let live = wal_files(dir.path());
    assert!(live <= 5, "{live} WAL files after 30 segment switches");
    let got = store.read_events(0, ReadPosition::Start, 1_000).unwrap();
    assert_eq!(got.len(), 600);
}

/// A `d2c_log` table file holds blocks of about 64 KiB of events (RocksDB's default is 4 KiB):
/// fewer blocks make each memtable flush cheaper.
#[test]
fn event_tables_are_written_in_large_blocks() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path());
        // Bodies that barely compress, so block sizes are what the table properties say.
        let mut x = 0x9e37_79b9_u32;
        for chunk in 0..40 {
            let events = (0..100)
                .map(|_| {
                    let body = (0..600)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 17;
                            x ^= x << 5;
                            x as u8
                        })
                        .collect();
                    ev("dev-a", body)
                })
                .collect();
            store.append_events(events, UnixMillis(chunk)).unwrap();
        }
        // A clean close flushes the memtables into table files (opened raw, the WAL would be
        // replayed into a table written with RocksDB's default options).
        store.close().unwrap();
    }
    let db = common::raw_db(dir.path());
    let cf = db.cf_handle("d2c_log").unwrap();
    let props = db
        .property_value_cf(cf, "rocksdb.aggregated-table-properties")
        .unwrap()
        .unwrap();
    let field = |name: &str| -> u64 {
        let at = props
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} in {props}"));
        let rest = &props[at + name.len() + 1..];
        rest[..rest.find(';').unwrap_or(rest.len())]
            .trim()
            .parse()
            .unwrap()
    };
    let (blocks, raw) = (
        field("# data blocks"),
        field("raw key size") + field("raw value size"),
    );
    assert!(raw > 2_000_000, "{props}");
    assert!(
        raw / blocks >= 48 << 10,
        "{blocks} blocks for {raw} bytes of events: {props}"
    );
}
