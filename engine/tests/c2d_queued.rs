//! C2D queue changes answered from the commit thread (`send_c2d_then`, `receive_c2d_then`,
//! `settle_c2d_then`; issue 19): each answers once durable, the device's stripe stays held
//! until then (the next change of the queue waits and reads what the queued one wrote), a
//! failed write answers with its error and releases the stripe, and refusals come back before
//! anything is queued.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use ferrohub_engine::c2d::{
    Ack, C2dError, C2dMessage, Delivered, QueueSettings, Sent, Settle, Settled,
};
use ferrohub_engine::StorageError;

use common::{at, store_with_device};

fn msg(id: &str) -> C2dMessage {
    common::c2d_message(id, Ack::Full)
}

fn settings() -> QueueSettings {
    common::queue_settings(2)
}

/// Runs a `*_then` call and returns the answer its callback got.
fn answered<T: Send + 'static>(
    call: impl FnOnce(Box<dyn FnOnce(Result<T, StorageError>) + Send>) -> Result<(), C2dError>,
) -> Result<T, StorageError> {
    let (tx, rx) = mpsc::channel();
    call(Box::new(move |r| tx.send(r).unwrap())).expect("queued");
    rx.recv_timeout(Duration::from_secs(10)).expect("answered")
}

#[test]
fn send_receive_and_settle_answer_once_durable_with_what_the_waiting_forms_return() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    {
        let store = store_with_device(dir.path());
        let sent: Sent =
            answered(|done| store.send_c2d_then("d", msg("m0"), at(0), &s, done)).unwrap();
        assert_eq!((sent.sequence, sent.depth), (0, 1));
        let got: Vec<Delivered> =
            answered(|done| store.receive_c2d_then("d", 5, at(1), &s, done)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message.body, b"m0");
        // Locked: nothing more to deliver.
        let none: Vec<Delivered> =
            answered(|done| store.receive_c2d_then("d", 5, at(2), &s, done)).unwrap();
        assert!(none.is_empty());
        let settled: Settled = answered(|done| {
            store.settle_c2d_then("d", &got[0].lock_token, Settle::Complete, at(3), &s, done)
        })
        .unwrap();
        assert_eq!(settled, Settled::Removed);
        assert_eq!(store.c2d_depth("d").unwrap(), 0);
        // Nothing to lock: answered at once, from an empty batch.
        let empty: Vec<Delivered> =
            answered(|done| store.receive_c2d_then("d", 5, at(4), &s, done)).unwrap();
        assert!(empty.is_empty());
    }
    // Durable: the completion and its feedback record survive a reopen.
    let store = common::open(dir.path());
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
    assert_eq!(store.pending_feedback_records().unwrap(), 1);
}

#[test]
fn refusals_come_back_before_anything_is_queued() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_device(dir.path());
    let s = settings();
    let never = |_: Result<Sent, StorageError>| panic!("a refused send must not be answered");
    assert!(matches!(
        store.send_c2d_then("nobody", msg("x"), at(0), &s, never),
        Err(C2dError::DeviceNotFound(_))
    ));
    for i in 0..2 {
        answered(|done| store.send_c2d_then("d", msg(&format!("m{i}")), at(0), &s, done)).unwrap();
    }
    assert!(matches!(
        store.send_c2d_then("d", msg("m2"), at(0), &s, never),
        Err(C2dError::QueueFull { .. })
    ));
    let never = |_: Result<Settled, StorageError>| panic!("a refused settle must not be answered");
    assert!(store
        .settle_c2d_then("d", "garbage", Settle::Complete, at(1), &s, never)
        .is_err());
    assert_eq!(store.c2d_depth("d").unwrap(), 2);
}

#[test]
fn the_next_change_of_the_queue_waits_for_the_queued_one_and_builds_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(store_with_device(dir.path()));
    let s = settings();
    let hold = store.hold_commits().expect("a writable store");
    let (sent_tx, sent_rx) = mpsc::channel();
    store
        .send_c2d_then("d", msg("m0"), at(0), &s, move |r| sent_tx.send(r).unwrap())
        .expect("queued");
    // The send is queued, not durable: it is not answered, and a receive of the same device
    // (the waiting form, on another thread) must wait for its stripe.
    let (got_tx, got_rx) = mpsc::channel();
    let receiver = {
        let store = std::sync::Arc::clone(&store);
        std::thread::spawn(move || {
            got_tx
                .send(store.receive_c2d("d", 5, at(1), &settings()))
                .unwrap()
        })
    };
    assert!(sent_rx.recv_timeout(Duration::from_millis(200)).is_err());
    assert!(got_rx.recv_timeout(Duration::from_millis(200)).is_err());
    drop(hold);
    let sent = sent_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    let got = got_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap()
        .unwrap();
    receiver.join().unwrap();
    assert_eq!(got.len(), 1, "the receive read the queued send");
    assert_eq!(got[0].sequence, sent.sequence);
}

#[test]
fn a_failed_write_answers_its_error_and_releases_the_stripe() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with_device(dir.path());
    let s = settings();
    let hold = store.hold_commits().unwrap();
    let (tx, rx) = mpsc::channel();
    store
        .send_c2d_then("d", msg("m0"), at(0), &s, move |r| tx.send(r).unwrap())
        .expect("queued");
    store.fail_next_write();
    drop(hold);
    let answer = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(answer.is_err(), "{answer:?}");
    // The stripe is free again: the next call on the device returns instead of waiting
    // forever, and the lost send left nothing to deliver.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        tx.send(store.receive_c2d("d", 1, at(1), &settings()))
            .unwrap()
    });
    let next = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("not blocked");
    assert!(next.map_or(true, |got| got.is_empty()));
}
