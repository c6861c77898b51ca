//! Pipelined writes (issue 19, parts 3 and 4). Reported patches: a device's patches are
//! queued without waiting for each other's sync, each builds on the one before it, readers see
//! only durable twins, the query index stays equal to a rebuild, and a failed write loses
//! exactly the queued patches and leaves nothing of them to build on. Connection state: queued
//! without a sync to wait for, shown at once, built on by the next writer of the device; a
//! clean-session connect without a stored session writes nothing.

mod common;

use std::sync::mpsc;

use ferrohub_engine::model::{IdentitySpec, IfMatch};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::twin_index::Probe;
use ferrohub_engine::{StorageError, Store};
use serde_json::{json, Map, Value};

const REPORTED: &str = "properties.reported.temp";

fn object(v: Value) -> Map<String, Value> {
    v.as_object().cloned().expect("an object")
}

type Answers = mpsc::Receiver<(usize, Result<u64, StorageError>)>;

/// Queues patch `i` of `d`; its answer arrives on the channel.
fn queue(
    store: &Store,
    i: usize,
    patch: Value,
    answers: &mpsc::Sender<(usize, Result<u64, StorageError>)>,
) {
    let tx = answers.clone();
    store
        .patch_reported_then("d", None, &object(patch), common::T0, move |r| {
            tx.send((i, r)).unwrap()
        })
        .expect("queued");
}

fn collect(rx: &Answers, n: usize) -> Vec<(usize, Result<u64, StorageError>)> {
    (0..n)
        .map(|_| {
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .expect("answered")
        })
        .collect()
}

fn reported(store: &Store) -> Map<String, Value> {
    store
        .get_twin("d", None)
        .unwrap()
        .record
        .reported
        .body
        .clone()
}

#[test]
fn queued_patches_build_on_each_other_share_syncs_and_are_read_only_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    assert!(store.define_twin_index(vec![REPORTED.into()]).unwrap());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let before = store.twin_index_keys().unwrap();
    let version_before = store.get_twin("d", None).unwrap().record.version;
    let (tx, rx) = mpsc::channel();

    let hold = store.hold_commits().expect("a writable store");
    let writes_before = store.commit_stats().writes;
    for i in 1..=5 {
        queue(&store, i, json!({"temp": i, format!("k{i}"): i}), &tx);
    }
    // Nothing is durable yet: readers and the index still see the twin before the patches.
    assert!(reported(&store).is_empty());
    assert_eq!(store.twin_index_keys().unwrap(), before);
    assert!(rx.try_recv().is_err(), "answered before its sync");
    drop(hold);

    let answers = collect(&rx, 5);
    let order: Vec<usize> = answers.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        order,
        vec![1, 2, 3, 4, 5],
        "answers keep the order of the patches"
    );
    let versions: Vec<u64> = answers.iter().map(|(_, r)| *r.as_ref().unwrap()).collect();
    assert_eq!(
        versions,
        vec![2, 3, 4, 5, 6],
        "each patch builds on the one queued before it"
    );
    assert!(
        store.commit_stats().writes - writes_before < 5,
        "five patches of one twin took five syncs"
    );

    let body = reported(&store);
    assert_eq!(body.get("temp"), Some(&json!(5)));
    for i in 1..=5 {
        assert_eq!(
            body.get(&format!("k{i}")),
            Some(&json!(i)),
            "patch {i} lost"
        );
    }
    assert_eq!(
        store.get_twin("d", None).unwrap().record.version,
        version_before + 5
    );
    // The index followed the chain of queued states: only the last value is indexed.
    let found = |v: i64| {
        store
            .twin_index_page(false, REPORTED, &Probe::Eq(vec![json!(v)]), None, 10)
            .unwrap()
            .unwrap()
            .len()
    };
    assert_eq!((found(1), found(4), found(5)), (0, 0, 1));
    let kept = store.twin_index_keys().unwrap();
    assert!(store.define_twin_index(Vec::new()).unwrap());
    assert!(store.define_twin_index(vec![REPORTED.into()]).unwrap());
    assert_eq!(
        store.twin_index_keys().unwrap(),
        kept,
        "index differs from a rebuild"
    );
}

#[test]
fn a_waiting_writer_of_the_same_twin_builds_on_a_queued_patch() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(common::open(dir.path()));
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let hold = store.hold_commits().unwrap();
    queue(&store, 1, json!({"a": 1}), &tx);
    // A service-side write waits for its own sync (here: until the hold ends), and must not
    // write back the twin from before the queued patch.
    let writer = {
        let store = std::sync::Arc::clone(&store);
        std::thread::spawn(move || {
            let write = TwinWrite {
                tags: Some(object(json!({"site": "Recife"}))),
                desired: None,
            };
            store
                .update_twin("d", None, &write, &IfMatch::Any, common::T0)
                .unwrap()
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(hold);
    let outcome = writer.join().unwrap();
    assert!(collect(&rx, 1)[0].1.is_ok());
    let twin = store.get_twin("d", None).unwrap();
    assert_eq!(
        twin.record.reported.body.get("a"),
        Some(&json!(1)),
        "the queued patch was lost"
    );
    assert_eq!(twin.record.tags.get("site"), Some(&json!("Recife")));
    assert_eq!(outcome.twin.record.version, twin.record.version);
}

#[test]
fn a_failed_write_answers_every_queued_patch_with_an_error_and_leaves_nothing_to_build_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    queue_and_wait(&store);
    let (tx, rx) = mpsc::channel();
    let hold = store.hold_commits().unwrap();
    for i in 1..=3 {
        queue(&store, i, json!({"lost": i}), &tx);
    }
    store.fail_next_write();
    drop(hold);
    for (i, r) in collect(&rx, 3) {
        assert!(r.is_err(), "patch {i} acknowledged after a failed write");
    }
    // Readers never saw the lost patches, and nothing is left to build on: a later write is
    // refused at once (the store is poisoned), and a reopen finds the durable twin.
    assert_eq!(reported(&store).get("lost"), None);
    assert!(store
        .patch_reported_then("d", None, &object(json!({"x": 1})), common::T0, |_| {
            panic!("queued on a poisoned store")
        })
        .is_err());
    drop(store);
    let reopened = common::open(dir.path());
    let body = reopened
        .get_twin("d", None)
        .unwrap()
        .record
        .reported
        .body
        .clone();
    assert_eq!(body.get("kept"), Some(&json!(true)));
    assert_eq!(body.get("lost"), None);
}

#[test]
fn connection_state_is_queued_shown_at_once_built_on_and_indexed_like_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(common::open(dir.path()));
    assert!(store
        .define_twin_index(vec!["connectionState".into()])
        .unwrap());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let hold = store.hold_commits().unwrap();
    for connected in [true, false, true] {
        let tx = tx.clone();
        let stored = store
            .record_connection_then("d", None, connected, common::T0, move |r| {
                tx.send(r).unwrap()
            })
            .expect("queued while the disk is held");
        assert!(stored.is_some());
    }
    // Shown before it is durable (a debugging aid that may lag, seed 002), not answered yet.
    let shown = store.get_device("d").unwrap();
    assert_eq!(format!("{:?}", shown.connection_state), "Connected");
    assert!(rx.try_recv().is_err());
    // A service write waits for its sync and keeps the queued state.
    let writer = {
        let store = std::sync::Arc::clone(&store);
        std::thread::spawn(move || {
            store
                .update_device(
                    "d",
                    &common::disabled("maintenance"),
                    &IfMatch::Any,
                    common::T0,
                )
                .unwrap()
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    drop(hold);
    writer.join().unwrap();
    for _ in 0..3 {
        assert!(rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .is_ok());
    }
    drop(store);
    let store = common::open(dir.path());
    let device = store.get_device("d").unwrap();
    assert_eq!(format!("{:?}", device.connection_state), "Connected");
    assert_eq!(format!("{:?}", device.status), "Disabled");
    let kept = store.twin_index_keys().unwrap();
    assert!(store.define_twin_index(Vec::new()).unwrap());
    assert!(store
        .define_twin_index(vec!["connectionState".into()])
        .unwrap());
    assert_eq!(
        store.twin_index_keys().unwrap(),
        kept,
        "index differs from a rebuild"
    );
}

#[test]
fn an_index_entry_follows_the_connection_state_queued_before_it() {
    // Each state's index entries are computed from the state the queued write before it left,
    // not from the durable one: a connect and a disconnect queued behind one sync must leave
    // the disconnected device indexed as disconnected.
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let hold = store.hold_commits().unwrap();
    for connected in [true, false] {
        let tx = tx.clone();
        store
            .record_connection_then("d", None, connected, common::T0, move |r| {
                tx.send(r).unwrap()
            })
            .unwrap();
    }
    drop(hold);
    for _ in 0..2 {
        assert!(rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .is_ok());
    }
    let disconnected = store
        .twin_index_page(
            false,
            "connectionState",
            &Probe::Eq(vec![json!("Disconnected")]),
            None,
            10,
        )
        .unwrap()
        .expect("indexed");
    assert_eq!(
        disconnected.len(),
        1,
        "the disconnected device is not indexed as such"
    );
    let kept = store.twin_index_keys().unwrap();
    assert!(store
        .define_twin_index(vec!["properties.reported.x".into()])
        .unwrap());
    assert!(store.define_twin_index(Vec::new()).unwrap());
    assert_eq!(
        store.twin_index_keys().unwrap(),
        kept,
        "index differs from a rebuild"
    );
}

#[test]
fn a_disconnection_is_recorded_only_while_its_connection_is_current() {
    // The check runs under the device's lock: a newer connection that registered first makes
    // the ended one's "disconnected" stale, and it must not land after the newer "connected".
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    store
        .record_connection_then("d", None, true, common::T0, move |r| tx2.send(r).unwrap())
        .unwrap();
    rx.recv().unwrap().unwrap();
    let checked = std::cell::Cell::new(false);
    let tx2 = tx.clone();
    let skipped = store
        .record_disconnection_then(
            "d",
            None,
            common::T0,
            || {
                checked.set(true);
                false
            },
            move |r| tx2.send(r).unwrap(),
        )
        .unwrap();
    assert!(checked.get() && skipped.is_none());
    rx.recv().unwrap().unwrap();
    assert_eq!(
        format!("{:?}", store.get_device("d").unwrap().connection_state),
        "Connected"
    );
    let recorded = store
        .record_disconnection_then("d", None, common::T0, || true, move |r| tx.send(r).unwrap())
        .unwrap();
    assert!(recorded.is_some());
    rx.recv().unwrap().unwrap();
    assert_eq!(
        format!("{:?}", store.get_device("d").unwrap().connection_state),
        "Disconnected"
    );
}

#[test]
fn a_clean_session_without_a_stored_session_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let writes = store.commit_stats().writes;
    store.delete_session("nobody").unwrap();
    assert_eq!(store.commit_stats().writes, writes);
    store.save_session("someone", &Default::default()).unwrap();
    store.delete_session("someone").unwrap();
    assert_eq!(store.commit_stats().writes, writes + 2);
    assert!(store.load_session("someone").unwrap().is_none());
}

/// One acknowledged patch, waited for.
fn queue_and_wait(store: &Store) {
    let (tx, rx) = mpsc::channel();
    queue(store, 0, json!({"kept": true}), &tx);
    assert!(collect(&rx, 1)[0].1.is_ok());
}

/// A device's traffic moves its last activity time forward only, without touching its etag,
/// connection state or module; a missing identity writes nothing.
#[test]
fn activity_moves_the_last_activity_time_forward_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .create_module("d", "m", &IdentitySpec::default(), common::T0)
        .unwrap();
    let before = store.get_device("d").unwrap();
    let (tx, rx) = mpsc::channel();
    let later = ferrohub_engine::UnixMillis(common::T0.0 + 60_000);
    for (module, at, expected) in [
        (None, later, true),
        (None, common::T0, false),
        (None, later, false),
        (Some("m"), later, true),
    ] {
        let tx = tx.clone();
        let queued = store
            .record_activity_then("d", module, at, move |r| tx.send(r).unwrap())
            .unwrap();
        assert_eq!(queued, expected, "{module:?} at {at:?}");
        assert!(rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .is_ok());
    }
    let after = store.get_device("d").unwrap();
    assert_eq!(after.last_activity_time, Some(later));
    assert_eq!(after.etag, before.etag);
    assert_eq!(
        format!("{:?}", after.connection_state),
        format!("{:?}", before.connection_state)
    );
    assert_eq!(
        store.get_module("d", "m").unwrap().last_activity_time,
        Some(later)
    );
    let tx = tx.clone();
    assert!(!store
        .record_activity_then("gone", None, later, move |r| tx.send(r).unwrap())
        .unwrap());
}
