//! Completing a message and locking the next ones in one batch (`complete_and_receive_c2d`,
//! issue 19): the same outcome as a settle followed by a receive, in one commit; a lost lock
//! changes nothing.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use ferrohub_engine::c2d::{Ack, C2dError, C2dMessage, Delivered, QueueSettings, Settle};
use ferrohub_engine::StorageError;

use common::{at, store_with_device};

fn msg(id: &str) -> C2dMessage {
    common::c2d_message(id, Ack::Positive)
}

fn settings() -> QueueSettings {
    QueueSettings {
        max_depth: 10,
        lock_timeout_ms: 1_000,
        ..QueueSettings::default()
    }
}

fn bodies(got: &[Delivered]) -> Vec<String> {
    got.iter()
        .map(|d| String::from_utf8(d.message.body.clone()).unwrap())
        .collect()
}

#[test]
fn completing_locks_the_oldest_deliverable_messages_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    let store = store_with_device(dir.path());
    for i in 0..5 {
        store
            .send_c2d("d", msg(&format!("m{i}")), at(i), &s)
            .unwrap();
    }
    let first = store.receive_c2d("d", 2, at(10), &s).unwrap();
    assert_eq!(bodies(&first), ["m0", "m1"]);
    let next = store
        .complete_and_receive_c2d("d", &first[0].lock_token, 2, at(11), &s)
        .unwrap();
    assert_eq!(bodies(&next), ["m2", "m3"]);
    assert!(next.iter().all(|d| d.delivery_count == 1));
    assert_eq!(store.c2d_depth("d").unwrap(), 4, "m0 completed");
    // m1 is still locked: completing it locks only what is left.
    let last = store
        .complete_and_receive_c2d("d", &first[1].lock_token, 5, at(12), &s)
        .unwrap();
    assert_eq!(bodies(&last), ["m4"]);
    for d in next.iter().chain(&last) {
        store
            .settle_c2d("d", &d.lock_token, Settle::Complete, at(13), &s)
            .unwrap();
    }
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
    assert!(store.receive_c2d("d", 5, at(14), &s).unwrap().is_empty());
    // Each completion asked for positive feedback: five records, as five settles make.
    assert_eq!(store.pending_feedback_records().unwrap(), 5);
}

#[test]
fn a_lost_lock_changes_nothing_and_no_room_locks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    let store = store_with_device(dir.path());
    for i in 0..3 {
        store
            .send_c2d("d", msg(&format!("m{i}")), at(i), &s)
            .unwrap();
    }
    let got = store.receive_c2d("d", 1, at(10), &s).unwrap();
    // The lock has expired (not yet swept): refused, and m1 is not locked either.
    assert!(matches!(
        store.complete_and_receive_c2d("d", &got[0].lock_token, 2, at(1_010), &s),
        Err(C2dError::LockLost(_))
    ));
    assert!(matches!(
        store.complete_and_receive_c2d("d", "not a token", 2, at(1_010), &s),
        Err(C2dError::BadLockToken(_))
    ));
    assert_eq!(store.c2d_depth("d").unwrap(), 3);
    let again = store.receive_c2d("d", 1, at(1_011), &s).unwrap();
    assert_eq!(
        bodies(&again),
        ["m1"],
        "m0's lock is still there until swept"
    );
    let none = store
        .complete_and_receive_c2d("d", &again[0].lock_token, 0, at(1_012), &s)
        .unwrap();
    assert!(none.is_empty());
    assert_eq!(store.c2d_depth("d").unwrap(), 2);
}

#[test]
fn the_queued_form_answers_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    {
        let store = store_with_device(dir.path());
        for i in 0..3 {
            store
                .send_c2d("d", msg(&format!("m{i}")), at(i), &s)
                .unwrap();
        }
        let got = store.receive_c2d("d", 1, at(10), &s).unwrap();
        let (tx, rx) = mpsc::channel::<Result<Vec<Delivered>, StorageError>>();
        store
            .complete_and_receive_c2d_then("d", &got[0].lock_token, 1, at(11), &s, move |r| {
                tx.send(r).unwrap()
            })
            .unwrap();
        let next = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        assert_eq!(bodies(&next), ["m1"]);
    }
    let store = common::open(dir.path());
    assert_eq!(store.c2d_depth("d").unwrap(), 2);
    let rest = store.receive_c2d("d", 5, at(12), &s).unwrap();
    assert_eq!(bodies(&rest), ["m2"], "m1 stays locked across the reopen");
}
