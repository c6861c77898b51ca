//! D2C-1..D2C-4 at the engine level: partitions, order, positions, retention, groups.

mod common;

use std::sync::Arc;

use ferrohub_engine::d2c::{
    partition_of, Checkpoint, D2cError, NewEvent, ReadPosition, DEFAULT_CONSUMER_GROUP,
};
use ferrohub_engine::model::UnixMillis;

fn ev(device: &str, body: &str) -> NewEvent {
    NewEvent {
        device_id: device.into(),
        body: body.as_bytes().to_vec(),
        ..NewEvent::default()
    }
}

#[test]
fn a_devices_events_stay_in_one_partition_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    assert_eq!(store.partition_count(), 4);
    let p = partition_of("dev-a", 4);
    for i in 0..50 {
        let a = store
            .append_events(vec![ev("dev-a", &format!("m{i}"))], UnixMillis(1000 + i))
            .unwrap();
        assert_eq!(a[0].partition, p);
        assert_eq!(a[0].sequence_number, i as u64);
    }
    let got = store.read_events(p, ReadPosition::Start, 1000).unwrap();
    assert_eq!(got.len(), 50);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.body, format!("m{i}").into_bytes());
        assert_eq!(e.sequence_number, i as u64);
        if i > 0 {
            assert!(e.offset > got[i - 1].offset);
            assert!(e.enqueued_time >= got[i - 1].enqueued_time);
        }
    }
    assert_eq!(got[0].enqueued_time, UnixMillis(1000));
}

#[test]
fn concurrent_appends_leave_no_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::open(dir.path()));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let s = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..50 {
                    s.append_events(
                        vec![ev(&format!("dev{t}"), &format!("{t}-{i}"))],
                        UnixMillis(5),
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut total = 0;
    for p in 0..store.partition_count() {
        let events = store.read_events(p, ReadPosition::Start, 10_000).unwrap();
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.sequence_number, i as u64, "partition {p} has a gap");
        }
        // Per device, bodies come in the order they were sent.
        for t in 0..16 {
            let mine: Vec<_> = events
                .iter()
                .filter(|e| e.body.starts_with(format!("{t}-").as_bytes()))
                .collect();
            for (i, e) in mine.iter().enumerate() {
                assert_eq!(e.body, format!("{t}-{i}").into_bytes());
            }
        }
        total += events.len();
    }
    assert_eq!(total, 16 * 50);
}

#[test]
fn read_positions() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let appended: Vec<_> = (0..20)
        .map(|i| {
            store
                .append_events(vec![ev("d", &i.to_string())], UnixMillis(100 * i))
                .unwrap()[0]
        })
        .collect();
    let p = appended[0].partition;
    assert_eq!(
        store
            .read_events(p, ReadPosition::Sequence(15), 100)
            .unwrap()
            .len(),
        5
    );
    assert_eq!(
        store
            .read_events(p, ReadPosition::Sequence(15), 2)
            .unwrap()
            .len(),
        2
    );
    let by_offset = store
        .read_events(p, ReadPosition::Offset(appended[7].offset), 1)
        .unwrap();
    assert_eq!(by_offset[0].sequence_number, 7);
    let by_offset_between = store
        .read_events(p, ReadPosition::Offset(appended[7].offset + 1), 1)
        .unwrap();
    assert_eq!(by_offset_between[0].sequence_number, 8);
    let by_time = store
        .read_events(p, ReadPosition::EnqueuedTime(UnixMillis(1250)), 1)
        .unwrap();
    assert_eq!(by_time[0].sequence_number, 13);
    assert!(store
        .read_events(p, ReadPosition::End, 10)
        .unwrap()
        .is_empty());
    assert!(store
        .read_events(p, ReadPosition::Sequence(20), 10)
        .unwrap()
        .is_empty());
    assert!(matches!(
        store.read_events(99, ReadPosition::Start, 1),
        Err(D2cError::NoSuchPartition(99))
    ));
    let info = store.partition_info(p).unwrap();
    assert_eq!(
        (
            info.begin_sequence_number,
            info.last_enqueued_sequence_number
        ),
        (0, Some(19))
    );
    assert_eq!(info.last_enqueued_offset, Some(appended[19].offset));
    assert_eq!(info.last_enqueued_time, Some(UnixMillis(1900)));
}

#[test]
fn retention_removes_prefixes_and_sequences_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let p;
    {
        let store = common::open(dir.path());
        p = store
            .append_events(vec![ev("d", "old")], UnixMillis(1_000))
            .unwrap()[0]
            .partition;
        for i in 0..9 {
            store
                .append_events(vec![ev("d", &format!("old{i}"))], UnixMillis(1_000 + i))
                .unwrap();
        }
        for i in 0..5 {
            store
                .append_events(vec![ev("d", &format!("new{i}"))], UnixMillis(50_000 + i))
                .unwrap();
        }
        assert_eq!(store.trim_events_before(UnixMillis(10_000)).unwrap(), 10);
        let left = store.read_events(p, ReadPosition::Start, 100).unwrap();
        assert_eq!(left.len(), 5);
        assert_eq!(left[0].sequence_number, 10);
        assert_eq!(store.partition_info(p).unwrap().begin_sequence_number, 10);
        // Everything expires: the partition is empty but keeps counting.
        assert_eq!(store.trim_events_before(UnixMillis(100_000)).unwrap(), 5);
        assert!(store.partition_info(p).unwrap().is_empty);
        store.close().unwrap();
    }
    let store = common::open(dir.path());
    let a = store
        .append_events(vec![ev("d", "after restart")], UnixMillis(200_000))
        .unwrap()[0];
    assert_eq!(a.sequence_number, 15, "sequence numbers are never reused");
    let info = store.partition_info(p).unwrap();
    assert_eq!(info.begin_sequence_number, 15);
}

#[test]
fn consumer_groups_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    assert_eq!(
        store.list_consumer_groups().unwrap(),
        vec![DEFAULT_CONSUMER_GROUP]
    );
    store
        .create_consumer_group("analytics", common::T0)
        .unwrap();
    assert!(matches!(
        store.create_consumer_group("analytics", common::T0),
        Err(D2cError::GroupExists(_))
    ));
    assert!(matches!(
        store.create_consumer_group("bad name", common::T0),
        Err(D2cError::Invalid(_))
    ));
    let cp = Checkpoint {
        sequence_number: 3,
        offset: 300,
        updated: common::T0,
    };
    store.set_checkpoint("analytics", 1, &cp).unwrap();
    store
        .set_checkpoint(DEFAULT_CONSUMER_GROUP, 1, &cp)
        .unwrap();
    assert_eq!(
        store.get_checkpoint("analytics", 1).unwrap(),
        Some(cp.clone())
    );
    assert_eq!(store.get_checkpoint("analytics", 2).unwrap(), None);
    assert!(matches!(
        store.set_checkpoint("nobody", 1, &cp),
        Err(D2cError::NoSuchGroup(_))
    ));
    assert!(matches!(
        store.delete_consumer_group(DEFAULT_CONSUMER_GROUP),
        Err(D2cError::DefaultGroup)
    ));
    store.delete_consumer_group("analytics").unwrap();
    store
        .create_consumer_group("analytics", common::T0)
        .unwrap();
    assert_eq!(
        store.get_checkpoint("analytics", 1).unwrap(),
        None,
        "checkpoints went with the group"
    );
    assert_eq!(
        store.get_checkpoint(DEFAULT_CONSUMER_GROUP, 1).unwrap(),
        Some(cp)
    );
}

/// A non-blocking append that finds the commit queue full changes nothing and gives its
/// events back; later appends continue the partition without a gap.
#[test]
fn a_try_append_that_would_wait_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let config = ferrohub_engine::StoreConfig {
        commit_queue_depth: 2,
        ..Default::default()
    };
    let store = ferrohub_engine::Store::open(dir.path(), config).unwrap();
    let p = partition_of("dev-a", 4);
    let (tx, rx) = std::sync::mpsc::channel();
    let hold = store.hold_commits().expect("a writable store");
    let mut queued = 0u64;
    let refused = loop {
        assert!(queued < 10, "the queue of depth 2 never filled");
        let tx = tx.clone();
        let body = format!("m{queued}");
        match store
            .try_append_events_then(vec![ev("dev-a", &body)], UnixMillis(1000), move |r| {
                tx.send(r.map(|a| a[0].sequence_number)).unwrap()
            })
            .unwrap()
        {
            Ok(()) => queued += 1,
            Err(would_wait) => break would_wait,
        }
    };
    assert!(
        queued >= 2,
        "only {queued} queued before the queue was full"
    );
    assert_eq!(refused.events.len(), 1);
    assert_eq!(refused.events[0].body, format!("m{queued}").into_bytes());
    // The refused callback was never run, and nothing of it is committed.
    drop(refused);
    drop(hold);
    let mut durable: Vec<u64> = (0..queued).map(|_| rx.recv().unwrap().unwrap()).collect();
    durable.sort_unstable();
    assert_eq!(durable, (0..queued).collect::<Vec<_>>());
    assert!(rx.try_recv().is_err());
    let next = store
        .append_events(vec![ev("dev-a", "after")], UnixMillis(1001))
        .unwrap();
    assert_eq!(
        next[0].sequence_number, queued,
        "no sequence number was skipped"
    );
    let got = store.read_events(p, ReadPosition::Start, 100).unwrap();
    assert_eq!(got.len() as u64, queued + 1);
    assert_eq!(got.last().unwrap().body, b"after".to_vec());
}
