//! A send that locks its message for a waiting receiver (`send_c2d_locked`, issue 19): one
//! commit instead of a send and a receive, and only when the queue was empty, so the message
//! never overtakes an older one. What it locks behaves exactly as a received message: its
//! token settles it, its lock expires back into the queue, its delivery is counted, and the
//! lock survives a reopen.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use ferrohub_engine::c2d::{Ack, C2dError, C2dMessage, Delivered, QueueSettings, Sent, Settle};
use ferrohub_engine::StorageError;

use common::{at, store_with_device};

fn msg(id: &str) -> C2dMessage {
    common::c2d_message(id, Ack::None)
}

fn settings() -> QueueSettings {
    QueueSettings {
        max_depth: 3,
        default_ttl_ms: 600_000,
        max_delivery_count: 2,
        lock_timeout_ms: 1_000,
        feedback_ttl_ms: 60_000,
        feedback_max_delivery_count: 2,
        feedback_batch: 100,
    }
}

#[test]
fn a_send_to_an_empty_queue_comes_back_locked_and_a_receive_finds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    let store = store_with_device(dir.path());
    let (sent, delivered) = store.send_c2d_locked("d", msg("m0"), at(0), &s).unwrap();
    let d = delivered.expect("an empty queue: locked on send");
    assert_eq!((sent.sequence, sent.depth), (0, 1));
    assert_eq!((d.sequence, d.delivery_count), (0, 1));
    assert_eq!(d.message.body, b"m0");
    assert_eq!(d.expiry, sent.expiry);
    assert!(store.receive_c2d("d", 5, at(1), &s).unwrap().is_empty());
    assert_eq!(store.c2d_depth("d").unwrap(), 1);
    store
        .settle_c2d("d", &d.lock_token, Settle::Complete, at(2), &s)
        .unwrap();
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
    // Empty again: the next one is locked on send too.
    let (_, again) = store.send_c2d_locked("d", msg("m1"), at(3), &s).unwrap();
    assert_eq!(again.expect("empty again").message.body, b"m1");
}

#[test]
fn a_send_behind_queued_messages_stays_unlocked_and_order_holds() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    let store = store_with_device(dir.path());
    store.send_c2d("d", msg("m0"), at(0), &s).unwrap();
    let (sent, delivered) = store.send_c2d_locked("d", msg("m1"), at(1), &s).unwrap();
    assert!(delivered.is_none(), "m0 waits: m1 must not overtake it");
    assert_eq!(sent.depth, 2);
    let got = store.receive_c2d("d", 5, at(2), &s).unwrap();
    let bodies: Vec<_> = got.iter().map(|d| d.message.body.clone()).collect();
    assert_eq!(bodies, [b"m0".to_vec(), b"m1".to_vec()]);
    // A message locked (in flight) still counts: a send behind it is not locked either.
    let (_, behind_locked) = store.send_c2d_locked("d", msg("m2"), at(3), &s).unwrap();
    assert!(behind_locked.is_none());
    // The queue's limit applies as to any send, and nothing changes.
    assert!(matches!(
        store.send_c2d_locked("d", msg("m3"), at(4), &s),
        Err(C2dError::QueueFull { .. })
    ));
    assert!(matches!(
        store.send_c2d_locked("nobody", msg("x"), at(4), &s),
        Err(C2dError::DeviceNotFound(_))
    ));
    assert_eq!(store.c2d_depth("d").unwrap(), 3);
}

#[test]
fn a_message_already_expired_when_sent_is_not_locked() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    let store = store_with_device(dir.path());
    let mut m = msg("old");
    m.expiry = Some(at(-1));
    let (_, delivered) = store.send_c2d_locked("d", m, at(0), &s).unwrap();
    assert!(delivered.is_none());
}

#[test]
fn its_lock_expires_back_into_the_queue_and_counts_its_delivery_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    let token = {
        let store = store_with_device(dir.path());
        let (_, d) = store.send_c2d_locked("d", msg("m0"), at(0), &s).unwrap();
        d.expect("locked").lock_token
    };
    let store = common::open(dir.path());
    // Still locked after the reopen: the lock was stored with the message.
    assert!(store.receive_c2d("d", 5, at(999), &s).unwrap().is_empty());
    assert!(store
        .expire_c2d_locks(at(999), &s, 100)
        .unwrap()
        .requeued_devices
        .is_empty());
    assert_eq!(
        store
            .expire_c2d_locks(at(1_000), &s, 100)
            .unwrap()
            .requeued_devices,
        ["d"]
    );
    // The expired token settles nothing.
    assert!(matches!(
        store.settle_c2d("d", &token, Settle::Complete, at(1_001), &s),
        Err(C2dError::LockLost(_))
    ));
    let again = store.receive_c2d("d", 5, at(1_002), &s).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        again[0].delivery_count, 2,
        "the locked send counted the first delivery"
    );
    // Its last allowed delivery abandoned: dead, as for any received message.
    store
        .settle_c2d("d", &again[0].lock_token, Settle::Abandon, at(1_003), &s)
        .unwrap();
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
}

#[test]
fn the_queued_form_answers_the_same_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    {
        let store = store_with_device(dir.path());
        let (tx, rx) = mpsc::channel::<Result<(Sent, Option<Delivered>), StorageError>>();
        store
            .send_c2d_locked_then("d", msg("m0"), at(0), &s, move |r| tx.send(r).unwrap())
            .unwrap();
        let (sent, d) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("answered")
            .unwrap();
        assert_eq!(sent.sequence, 0);
        assert_eq!(d.expect("locked").delivery_count, 1);
    }
    let store = common::open(dir.path());
    assert_eq!(store.c2d_depth("d").unwrap(), 1);
    assert!(store.receive_c2d("d", 5, at(1), &s).unwrap().is_empty());
}
