//! C2D-1..C2D-6 at the engine level: queue limits, locks, delivery counts, TTL, dead letters,
//! feedback, and durability of all of it across a reopen.

mod common;

use ferrohub_engine::c2d::{
    Ack, C2dError, C2dMessage, FeedbackStatus, QueueSettings, Settle, Settled, TimerKind,
};
use ferrohub_engine::model::{IdentitySpec, IfMatch, UnixMillis};
use ferrohub_engine::Store;

fn msg(id: &str, ack: Ack) -> C2dMessage {
    C2dMessage {
        message_id: Some(id.into()),
        ack,
        properties: vec![("k".into(), "v".into())],
        body: id.as_bytes().to_vec(),
        ..C2dMessage::default()
    }
}

fn settings() -> QueueSettings {
    QueueSettings {
        max_depth: 50,
        default_ttl_ms: 60_000,
        max_delivery_count: 3,
        lock_timeout_ms: 1_000,
        feedback_ttl_ms: 60_000,
        feedback_max_delivery_count: 2,
        feedback_batch: 100,
    }
}

fn with_device(store: &Store, id: &str) {
    store
        .create_device(id, &IdentitySpec::default(), UnixMillis(0))
        .unwrap();
}

fn t(ms: i64) -> UnixMillis {
    UnixMillis(ms)
}

#[test]
fn queue_holds_max_depth_and_refuses_one_more_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    let s = settings();
    for i in 0..50 {
        let sent = store
            .send_c2d("d", msg(&format!("m{i}"), Ack::None), t(1000), &s)
            .unwrap();
        assert_eq!(sent.sequence, i);
        assert_eq!(sent.depth, i as u32 + 1);
    }
    let err = store
        .send_c2d("d", msg("m50", Ack::None), t(1000), &s)
        .unwrap_err();
    assert!(
        matches!(err, C2dError::QueueFull { max: 50, .. }),
        "{err:?}"
    );
    let got = store.receive_c2d("d", 100, t(1001), &s).unwrap();
    assert_eq!(got.len(), 50);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.message.body, format!("m{i}").into_bytes());
        assert_eq!(
            d.message.properties,
            vec![("k".to_string(), "v".to_string())]
        );
        assert_eq!(d.delivery_count, 1);
        assert_eq!(d.expiry, t(61_000));
    }
    assert!(matches!(
        store.send_c2d("nobody", msg("x", Ack::None), t(1), &s),
        Err(C2dError::DeviceNotFound(_))
    ));
}

#[test]
fn locked_messages_are_invisible_and_complete_removes_with_positive_feedback() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    let s = settings();
    store
        .send_c2d("d", msg("a", Ack::Positive), t(0), &s)
        .unwrap();
    store
        .send_c2d("d", msg("b", Ack::Negative), t(0), &s)
        .unwrap();
    let first = store.receive_c2d("d", 1, t(10), &s).unwrap();
    assert_eq!(first[0].message.message_id.as_deref(), Some("a"));
    let second = store.receive_c2d("d", 5, t(10), &s).unwrap();
    assert_eq!(second.len(), 1, "a is locked, only b is visible");
    assert_eq!(second[0].message.message_id.as_deref(), Some("b"));
    assert!(store.receive_c2d("d", 5, t(10), &s).unwrap().is_empty());

    assert_eq!(
        store
            .settle_c2d("d", &first[0].lock_token, Settle::Complete, t(20), &s)
            .unwrap(),
        Settled::Removed
    );
    // The same token again: the lock is gone.
    assert!(matches!(
        store.settle_c2d("d", &first[0].lock_token, Settle::Complete, t(21), &s),
        Err(C2dError::LockLost(_))
    ));
    assert!(matches!(
        store.settle_c2d("d", "garbage", Settle::Complete, t(21), &s),
        Err(C2dError::BadLockToken(_))
    ));
    // b has ack negative: completing it produces nothing.
    store
        .settle_c2d("d", &second[0].lock_token, Settle::Complete, t(30), &s)
        .unwrap();
    assert_eq!(store.c2d_depth("d").unwrap(), 0);

    let fb = store
        .receive_feedback(t(40), &s)
        .unwrap()
        .expect("feedback for a");
    assert_eq!(fb.records.len(), 1);
    let r = &fb.records[0];
    assert_eq!(r.original_message_id.as_deref(), Some("a"));
    assert_eq!(r.status, FeedbackStatus::Success);
    assert_eq!(r.status.code(), 0);
    assert_eq!(r.enqueued_time, t(20));
    assert_eq!(r.device_id, "d");
    assert_eq!(
        r.device_generation_id,
        store.get_device("d").unwrap().generation_id
    );
    store
        .settle_feedback(&fb.lock_token, Settle::Complete, t(41), &s)
        .unwrap();
    assert!(store.receive_feedback(t(42), &s).unwrap().is_none());
}

#[test]
fn abandon_and_lock_expiry_requeue_until_max_delivery_count_then_dead() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    let s = settings();
    store.send_c2d("d", msg("m", Ack::Full), t(0), &s).unwrap();

    let d1 = store.receive_c2d("d", 1, t(0), &s).unwrap().remove(0);
    assert_eq!(d1.delivery_count, 1);
    assert_eq!(
        store
            .settle_c2d("d", &d1.lock_token, Settle::Abandon, t(5), &s)
            .unwrap(),
        Settled::Requeued
    );
    let d2 = store.receive_c2d("d", 1, t(10), &s).unwrap().remove(0);
    assert_eq!(d2.delivery_count, 2);
    assert_ne!(d2.lock_token, d1.lock_token);

    // The lock expires at 1010: not yet at 1009.
    assert_eq!(
        store.next_c2d_deadline(TimerKind::Lock, &s).unwrap(),
        Some(t(1010))
    );
    let none = store.expire_c2d_locks(t(1009), &s, 100).unwrap();
    assert!(none.requeued_devices.is_empty());
    let r = store.expire_c2d_locks(t(1010), &s, 100).unwrap();
    assert_eq!(r.requeued_devices, vec!["d".to_string()]);
    assert!(matches!(
        store.settle_c2d("d", &d2.lock_token, Settle::Complete, t(1011), &s),
        Err(C2dError::LockLost(_))
    ));
    let d3 = store.receive_c2d("d", 1, t(1020), &s).unwrap().remove(0);
    assert_eq!(d3.delivery_count, 3);
    assert_eq!(
        store
            .settle_c2d("d", &d3.lock_token, Settle::Abandon, t(1030), &s)
            .unwrap(),
        Settled::Dead
    );
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
    let fb = store.receive_feedback(t(1040), &s).unwrap().unwrap();
    assert_eq!(fb.records[0].status, FeedbackStatus::DeliveryCountExceeded);
    assert_eq!(fb.records[0].status.code(), 2);
}

#[test]
fn lock_expiry_after_last_delivery_is_dead_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    let s = QueueSettings {
        max_delivery_count: 1,
        ..settings()
    };
    store
        .send_c2d("d", msg("m", Ack::Negative), t(0), &s)
        .unwrap();
    store.receive_c2d("d", 1, t(0), &s).unwrap();
    let r = store.expire_c2d_locks(t(5000), &s, 100).unwrap();
    assert_eq!(r.dead, 1);
    assert!(r.requeued_devices.is_empty());
    assert_eq!(r.dead_devices, vec!["d".to_string()]);
    let fb = store.receive_feedback(t(5001), &s).unwrap().unwrap();
    assert_eq!(fb.records[0].status, FeedbackStatus::DeliveryCountExceeded);
}

#[test]
fn ttl_expiry_and_reject_are_dead_with_feedback_batched_in_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    with_device(&store, "e");
    let s = settings();
    let mut short = msg("short", Ack::Negative);
    short.expiry = Some(t(500));
    store.send_c2d("d", short, t(0), &s).unwrap();
    store
        .send_c2d("e", msg("rej", Ack::Full), t(0), &s)
        .unwrap();
    store
        .send_c2d("e", msg("quiet", Ack::None), t(0), &s)
        .unwrap();

    let got = store.receive_c2d("e", 2, t(1), &s).unwrap();
    store
        .settle_c2d("e", &got[0].lock_token, Settle::Reject, t(2), &s)
        .unwrap();
    store
        .settle_c2d("e", &got[1].lock_token, Settle::Reject, t(2), &s)
        .unwrap();

    assert_eq!(
        store.next_c2d_deadline(TimerKind::Expiry, &s).unwrap(),
        Some(t(500))
    );
    // A locked-then-expired message is dead as well; lock d's message first.
    let locked = store.receive_c2d("d", 1, t(3), &s).unwrap();
    assert_eq!(locked.len(), 1);
    let r = store.expire_c2d_messages(t(600), &s, 100).unwrap();
    assert_eq!(r.dead, 1);
    assert!(matches!(
        store.settle_c2d("d", &locked[0].lock_token, Settle::Complete, t(601), &s),
        Err(C2dError::LockLost(_))
    ));
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
    // The expired message's lock timer is gone with it.
    assert_eq!(
        store.next_c2d_deadline(TimerKind::Lock, &s).unwrap(),
        None,
        "no lock timers remain"
    );

    let fb = store.receive_feedback(t(700), &s).unwrap().unwrap();
    let mut statuses: Vec<_> = fb
        .records
        .iter()
        .map(|r| (r.original_message_id.clone().unwrap(), r.status.code()))
        .collect();
    statuses.sort();
    assert_eq!(
        statuses,
        vec![("rej".to_string(), 3), ("short".to_string(), 1)]
    );
}

#[test]
fn feedback_message_lock_abandon_and_max_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    let s = settings();
    store
        .send_c2d("d", msg("a", Ack::Positive), t(0), &s)
        .unwrap();
    let d = store.receive_c2d("d", 1, t(0), &s).unwrap();
    store
        .settle_c2d("d", &d[0].lock_token, Settle::Complete, t(1), &s)
        .unwrap();

    let f1 = store.receive_feedback(t(10), &s).unwrap().unwrap();
    assert!(
        store.receive_feedback(t(11), &s).unwrap().is_none(),
        "locked"
    );
    assert_eq!(
        store
            .settle_feedback(&f1.lock_token, Settle::Abandon, t(12), &s)
            .unwrap(),
        Settled::Requeued
    );
    let f2 = store.receive_feedback(t(13), &s).unwrap().unwrap();
    assert_eq!(f2.sequence, f1.sequence);
    assert_eq!(f2.delivery_count, 2);
    assert_eq!(f2.records, f1.records);
    assert_eq!(
        store
            .settle_feedback(&f2.lock_token, Settle::Abandon, t(14), &s)
            .unwrap(),
        Settled::Dead
    );
    assert!(store.receive_feedback(t(15), &s).unwrap().is_none());
}

#[test]
fn feedback_records_past_their_ttl_are_never_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    let s = settings();
    store
        .send_c2d("d", msg("a", Ack::Positive), t(0), &s)
        .unwrap();
    let d = store.receive_c2d("d", 1, t(0), &s).unwrap();
    store
        .settle_c2d("d", &d[0].lock_token, Settle::Complete, t(1), &s)
        .unwrap();
    assert_eq!(store.pending_feedback_records().unwrap(), 1);
    assert_eq!(
        store.next_c2d_deadline(TimerKind::Expiry, &s).unwrap(),
        Some(t(60_001))
    );
    let r = store.expire_c2d_messages(t(60_001), &s, 100).unwrap();
    assert_eq!(r.dead, 1);
    assert_eq!(store.pending_feedback_records().unwrap(), 0);
    assert!(store.receive_feedback(t(60_002), &s).unwrap().is_none());
}

#[test]
fn locks_deadlines_and_feedback_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings();
    let token;
    {
        let store = common::open(dir.path());
        with_device(&store, "d");
        store
            .send_c2d("d", msg("locked", Ack::Full), t(0), &s)
            .unwrap();
        let mut ttl = msg("ttl", Ack::Negative);
        ttl.expiry = Some(t(2_000));
        store.send_c2d("d", ttl, t(0), &s).unwrap();
        let got = store.receive_c2d("d", 1, t(0), &s).unwrap();
        token = got[0].lock_token.clone();
        store.close().unwrap();
    }
    let store = common::open(dir.path());
    // Both deadlines passed while "down".
    let r = store.expire_c2d_locks(t(10_000), &s, 100).unwrap();
    assert_eq!(r.requeued_devices, vec!["d".to_string()]);
    let r = store.expire_c2d_messages(t(10_000), &s, 100).unwrap();
    assert_eq!(r.dead, 1);
    assert!(matches!(
        store.settle_c2d("d", &token, Settle::Complete, t(10_001), &s),
        Err(C2dError::LockLost(_))
    ));
    let again = store.receive_c2d("d", 5, t(10_002), &s).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].message.message_id.as_deref(), Some("locked"));
    assert_eq!(again[0].delivery_count, 2);
    let fb = store.receive_feedback(t(10_003), &s).unwrap().unwrap();
    assert_eq!(fb.records.len(), 1);
    assert_eq!(fb.records[0].status, FeedbackStatus::Expired);
}

#[test]
fn deleting_a_device_drops_its_queue_and_sequence_numbers_keep_growing() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    with_device(&store, "d");
    let s = settings();
    store.send_c2d("d", msg("a", Ack::Full), t(0), &s).unwrap();
    store.send_c2d("d", msg("b", Ack::Full), t(0), &s).unwrap();
    store.receive_c2d("d", 1, t(0), &s).unwrap();
    store.delete_device("d", &IfMatch::Any, t(0)).unwrap();
    with_device(&store, "d");
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
    assert!(store.receive_c2d("d", 5, t(1), &s).unwrap().is_empty());
    let sent = store.send_c2d("d", msg("c", Ack::None), t(2), &s).unwrap();
    assert_eq!(sent.sequence, 2);
    // The old messages' timers are stale: sweeping them touches nothing.
    let r = store.expire_c2d_locks(t(100_000), &s, 100).unwrap();
    assert!(r.requeued_devices.is_empty());
    let r = store.expire_c2d_messages(t(59_999), &s, 100).unwrap();
    assert_eq!(r.dead, 0);
    assert_eq!(store.c2d_depth("d").unwrap(), 1);
    assert_eq!(store.purge_c2d("d").unwrap(), 1);
    assert_eq!(store.c2d_depth("d").unwrap(), 0);
    assert!(
        store.receive_feedback(t(3), &s).unwrap().is_none(),
        "no feedback from deletion or purge"
    );
}
