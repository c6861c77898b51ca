//! Calls made without waiting (`Store::without_waiting`, issue 19): what an async runtime's
//! worker may run in place. Reads answer from memory and are refused when the value is only on
//! disk; the connection state is queued when the device's stripe is free and the commit queue
//! has room, and refused otherwise; a write that would wait for its sync is refused. A refused
//! call changes nothing, and the same call made where it may wait then succeeds.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use ferrohub_engine::c2d::Ack;
use ferrohub_engine::model::{ConnectionState, IdentitySpec};
use ferrohub_engine::{Store, StoreConfig};

fn connect_without_waiting(store: &Store, device: &str, connected: bool) -> Option<bool> {
    store.without_waiting(|s| {
        s.record_connection_then(device, None, connected, common::T0, |_| {})
            .is_ok()
    })
}

fn state(store: &Store, device: &str) -> ConnectionState {
    store.get_device(device).unwrap().connection_state
}

/// A store whose commit queue holds one batch, with commits held and a connect of "d" and "e"
/// queued: the committer waits on the hold with one, the other fills the queue. Dropping the
/// hold lets both through; the receiver then yields their results.
fn queue_full_of_connects(
    dir: &std::path::Path,
    devices: &[&str],
) -> (
    Store,
    ferrohub_engine::CommitHold,
    mpsc::Receiver<Result<(), ferrohub_engine::StorageError>>,
) {
    let store = Store::open(
        dir,
        StoreConfig {
            commit_queue_depth: 1,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    for d in devices {
        store
            .create_device(d, &IdentitySpec::default(), common::T0)
            .unwrap();
    }
    let hold = store.hold_commits().unwrap();
    let (tx, rx) = mpsc::channel();
    for d in ["d", "e"] {
        let tx = tx.clone();
        store
            .record_connection_then(d, None, true, common::T0, move |r| tx.send(r).unwrap())
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    (store, hold, rx)
}

#[test]
fn a_read_from_memory_is_answered_and_one_from_disk_is_refused_until_it_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::store_with_device(dir.path());
        store.save_session("d", &Default::default()).unwrap();
        // In the memtable: answered in place.
        assert!(store
            .without_waiting(|s| s.get_device("d"))
            .expect("answered from memory")
            .is_ok());
        store.close().unwrap();
    }
    // Reopened after a flush, the records are in table files the block cache has not read.
    let store = common::open(dir.path());
    assert!(
        store.without_waiting(|s| s.get_device("d")).is_none(),
        "a read that needs the disk must be refused"
    );
    assert!(store.without_waiting(|s| s.load_session("d")).is_none());
    // Made where it may wait, the read loads the blocks, and the next one is answered in place.
    store.get_device("d").unwrap();
    store.load_session("d").unwrap();
    assert!(store
        .without_waiting(|s| s.get_device("d"))
        .expect("answered from the block cache")
        .is_ok());
    assert!(store
        .without_waiting(|s| s.load_session("d"))
        .expect("answered from the block cache")
        .unwrap()
        .is_some());
}

#[test]
fn a_connection_state_is_queued_in_place_unless_the_device_stripe_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store_with_device(dir.path());
    store
        .create_device("e", &IdentitySpec::default(), common::T0)
        .unwrap();
    assert_eq!(connect_without_waiting(&store, "e", true), Some(true));
    assert_eq!(state(&store, "e"), ConnectionState::Connected);

    // A C2D send holds the device's stripe until its write is durable; the disk is held.
    let hold = store.hold_commits().unwrap();
    let (tx, rx) = mpsc::channel();
    store
        .send_c2d_then(
            "d",
            common::c2d_message("m1", Ack::None),
            common::T0,
            &common::queue_settings(10),
            move |r| tx.send(r.map(|_| ())).unwrap(),
        )
        .unwrap();
    assert_eq!(connect_without_waiting(&store, "d", true), None);
    assert_eq!(
        state(&store, "d"),
        ConnectionState::Disconnected,
        "a refused call must change nothing"
    );
    drop(hold);
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(
        state(&store, "d"),
        ConnectionState::Disconnected,
        "only the send was queued"
    );
    // Once the stripe is free, the same call goes through in place.
    assert_eq!(connect_without_waiting(&store, "d", true), Some(true));
    assert_eq!(state(&store, "d"), ConnectionState::Connected);
}

#[test]
fn a_full_commit_queue_refuses_the_connection_state_and_nothing_of_it_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let (store, hold, rx) = queue_full_of_connects(dir.path(), &["d", "e", "f"]);
    assert_eq!(connect_without_waiting(&store, "f", true), None);
    assert_eq!(
        state(&store, "f"),
        ConnectionState::Disconnected,
        "the refused state must not be visible in flight"
    );
    drop(hold);
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    }
    assert_eq!(connect_without_waiting(&store, "f", true), Some(true));
    assert_eq!(state(&store, "f"), ConnectionState::Connected);
}

#[test]
fn a_write_that_waits_for_its_sync_is_refused_and_not_made() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store_with_device(dir.path());
    store.save_session("d", &Default::default()).unwrap();
    let writes = store.commit_stats().writes;
    // Deleting a stored session is a synced write: refused in place.
    assert!(store.without_waiting(|s| s.delete_session("d")).is_none());
    assert!(store.load_session("d").unwrap().is_some());
    assert_eq!(store.commit_stats().writes, writes);
    // A clean-session connect without a stored session writes nothing, so it needs no wait.
    assert!(matches!(
        store.without_waiting(|s| s.delete_session("nobody")),
        Some(Ok(()))
    ));
    // Even where the caller swallows the error, the refusal is reported and the write not made.
    let swallowed = store.without_waiting(|s| {
        let _ = s.save_session("x", &Default::default());
    });
    assert!(swallowed.is_none());
    assert!(store.load_session("x").unwrap().is_none());
    assert_eq!(store.commit_stats().writes, writes);
    store.delete_session("d").unwrap();
    assert!(store.load_session("d").unwrap().is_none());
}

#[test]
fn a_refused_state_leaves_the_queued_state_before_it_visible_and_indexed() {
    // A connect queued and not yet written, then the disconnect refused for a full queue after
    // it was staged: the device must still read as connected (the queued state, not the
    // durable one), and once both calls are made the index must match the device.
    let dir = tempfile::tempdir().unwrap();
    let (store, hold, rx) = queue_full_of_connects(dir.path(), &["d", "e"]);
    assert_eq!(connect_without_waiting(&store, "d", false), None);
    assert_eq!(
        state(&store, "d"),
        ConnectionState::Connected,
        "the refused disconnect hid the queued connect"
    );
    drop(hold);
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    }
    // Made again where it may wait, as the server does.
    let (tx, rx) = mpsc::channel();
    store
        .record_connection_then("d", None, false, common::T0, move |r| tx.send(r).unwrap())
        .unwrap();
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(state(&store, "d"), ConnectionState::Disconnected);
    let disconnected = store
        .twin_index_page(
            false,
            "connectionState",
            &ferrohub_engine::twin_index::Probe::Eq(vec![serde_json::json!("Disconnected")]),
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
}

#[test]
fn a_reported_patch_is_queued_in_place_unless_the_device_stripe_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store_with_device(dir.path());
    let patch = |v: i64| {
        let mut m = serde_json::Map::new();
        m.insert("x".into(), serde_json::json!(v));
        m
    };
    let reported_without_waiting = |v: i64| {
        let (tx, rx) = mpsc::channel();
        let queued = store.without_waiting(|s| {
            s.patch_reported_then("d", None, &patch(v), common::T0, move |r| {
                tx.send(r).unwrap()
            })
            .is_ok()
        });
        (queued, rx)
    };
    let (queued, rx) = reported_without_waiting(1);
    assert_eq!(queued, Some(true));
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap(),
        2
    );

    // A C2D send holds the device's stripe until its write is durable; the disk is held.
    let hold = store.hold_commits().unwrap();
    let (tx, sent) = mpsc::channel();
    store
        .send_c2d_then(
            "d",
            common::c2d_message("m1", Ack::None),
            common::T0,
            &common::queue_settings(10),
            move |r| tx.send(r.map(|_| ())).unwrap(),
        )
        .unwrap();
    let (queued, rx) = reported_without_waiting(2);
    assert_eq!(queued, None, "a held stripe must refuse the patch");
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "nothing was queued"
    );
    drop(hold);
    sent.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    let twin = store.get_twin("d", None).unwrap();
    assert_eq!(
        twin.record.reported.version, 2,
        "the refused patch changed nothing"
    );
    let (queued, rx) = reported_without_waiting(3);
    assert_eq!(queued, Some(true));
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap(),
        3
    );
}
