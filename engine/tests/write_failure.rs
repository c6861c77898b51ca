//! A failed durable write (issue 18, part 3; ENG-3), injected in the group committer: every
//! writer waiting in the failed group gets an error, every later write is refused, nothing is
//! acknowledged after the failure, and reopening the store recovers exactly the acknowledged
//! writes. (A real one, ENOSPC on a full file system, is tests/python/test_disk_full.py.)

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier, Mutex};

use ferrohub_engine::d2c::{NewEvent, ReadPosition};
use ferrohub_engine::model::{IdentitySpec, UnixMillis};
use ferrohub_engine::{RegistryError, StorageError};

#[test]
fn a_failed_group_write_fails_every_waiter_poisons_the_store_and_a_reopen_keeps_the_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::open(dir.path()));
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let start = Arc::new(Barrier::new(33));
    let threads: Vec<_> = (0..32)
        .map(|t| {
            let (store, acked, failed, start) = (
                Arc::clone(&store),
                Arc::clone(&acked),
                Arc::clone(&failed),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                start.wait();
                for i in 0..100_000 {
                    let id = format!("d{t}-{i}");
                    match store.create_device(&id, &IdentitySpec::default(), common::T0) {
                        Ok(_) => {
                            acked.lock().unwrap().insert(id);
                        }
                        Err(RegistryError::Storage(e)) => {
                            failed.lock().unwrap().push(e);
                            return;
                        }
                        Err(e) => panic!("{id}: {e}"),
                    }
                }
                panic!("writer {t} never saw the injected failure");
            })
        })
        .collect();
    start.wait();
    std::thread::sleep(std::time::Duration::from_millis(50));
    // Writes held back queue up; the write that takes them when released fails.
    let hold = store.hold_commits().expect("a writable store");
    std::thread::sleep(std::time::Duration::from_millis(50));
    store.fail_next_write();
    drop(hold);
    for t in threads {
        t.join().unwrap();
    }
    let failed = failed.lock().unwrap().clone();
    assert_eq!(failed.len(), 32, "every writer ends with an error");
    let write_failed = failed
        .iter()
        .filter(|e| matches!(e, StorageError::WriteFailed(_)))
        .count();
    assert!(
        write_failed > 1,
        "the failed group held {write_failed} writers: {failed:?}"
    );
    assert!(failed
        .iter()
        .all(|e| matches!(e, StorageError::WriteFailed(_) | StorageError::Poisoned)));
    assert!(store.is_poisoned());
    // Every kind of write is refused now; reads go on.
    assert!(store
        .append_events(
            vec![NewEvent {
                device_id: "d0-0".into(),
                body: b"x".to_vec(),
                ..NewEvent::default()
            }],
            UnixMillis(1)
        )
        .is_err());
    let acked = acked.lock().unwrap().clone();
    let some = acked
        .iter()
        .next()
        .expect("writes were acknowledged before the failure");
    assert!(store.get_device(some).is_ok());
    assert!(store.read_events(0, ReadPosition::Start, 10).is_ok());

    // Reopened: exactly the acknowledged devices, and writes are taken again.
    drop(Arc::try_unwrap(store).ok().expect("the only reference"));
    let store = common::open(dir.path());
    let mut present = BTreeSet::new();
    for t in 0..32 {
        for i in 0.. {
            let id = format!("d{t}-{i}");
            if store.get_device(&id).is_err() {
                break;
            }
            present.insert(id);
        }
    }
    assert_eq!(
        present, acked,
        "the acknowledged devices, no more and no fewer"
    );
    assert!(!store.is_poisoned());
    store
        .create_device("after", &IdentitySpec::default(), common::T0)
        .unwrap();
}
