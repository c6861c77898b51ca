//! Partition heads recovered at open (schema version 8): appends store only their events, and a
//! reopened store continues each partition exactly where its last durable append left it, also
//! after retention removed every event and after appends that followed such a trim.

mod common;

use std::path::Path;

use ferrohub_engine::d2c::{Appended, NewEvent};
use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::Store;

const DEVICES: [&str; 4] = ["dev-a", "dev-b", "dev-c", "dev-d"];

fn open(dir: &Path) -> Store {
    let store = common::open(dir);
    // Small segments: the appends below span several, so recovery must find the newest one.
    store.set_d2c_segment_bytes(400);
    store
}

/// Round `r`'s batch: a few events of varied sizes from several devices.
fn batch(r: usize) -> Vec<NewEvent> {
    (0..1 + r % 3)
        .map(|i| NewEvent {
            device_id: DEVICES[(r + i) % DEVICES.len()].to_string(),
            application_properties: vec![("round".into(), r.to_string())],
            body: vec![b'x'; 10 + (r * 7 + i * 13) % 90],
            ..NewEvent::default()
        })
        .collect()
}

fn append(store: &Store, r: usize, now: i64) -> Vec<Appended> {
    store
        .append_events(batch(r), UnixMillis(common::T0.0 + now))
        .unwrap()
}

#[test]
fn a_reopened_store_assigns_what_a_store_kept_open_assigns() {
    let kept = tempfile::tempdir().unwrap();
    let reopened = tempfile::tempdir().unwrap();
    let a = open(kept.path());
    let mut b = open(reopened.path());
    for r in 0..40 {
        // The clock steps back after round 20: enqueued times must not go back after a reopen.
        let now = if r < 20 { r as i64 * 10 } else { 150 };
        let from_a = append(&a, r, now);
        let from_b = append(&b, r, now);
        assert_eq!(from_a, from_b, "round {r}");
        if r % 6 == 5 {
            drop(b);
            b = open(reopened.path());
        }
    }
    for p in 0..a.partition_count() {
        assert_eq!(a.partition_info(p).unwrap(), b.partition_info(p).unwrap());
        assert_eq!(
            a.next_sequence_number(p).unwrap(),
            b.next_sequence_number(p).unwrap()
        );
    }
}

#[test]
fn sequence_numbers_continue_after_retention_removed_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut next = vec![0u64; store.partition_count() as usize];
    let check = |appended: Vec<Appended>, next: &mut Vec<u64>| {
        for a in appended {
            assert_eq!(a.sequence_number, next[a.partition as usize]);
            next[a.partition as usize] += 1;
        }
    };
    for r in 0..30 {
        check(append(&store, r, 0), &mut next);
    }
    // Every event gone: only the heads the trim stored know where the partitions stood.
    assert!(
        store
            .trim_events_before(UnixMillis(common::T0.0 + 1))
            .unwrap()
            > 0
    );
    for p in 0..store.partition_count() {
        assert!(store.partition_info(p).unwrap().is_empty);
    }
    drop(store);
    store = open(dir.path());
    for r in 30..45 {
        check(append(&store, r, 5), &mut next);
    }
    // Now the stored heads are older than the log: the log must win.
    drop(store);
    store = open(dir.path());
    for r in 45..50 {
        check(append(&store, r, 10), &mut next);
    }
    for (p, n) in next.iter().enumerate() {
        assert_eq!(store.next_sequence_number(p as u16).unwrap(), *n);
    }
}
