//! A writer's commit thread with several appends in flight: groups reach the log in commit
//! order, are written and acknowledged only once the log stored them, and a refused append
//! fails every group behind it. The log here answers from its own thread after a pause, as
//! JetStream answers from the network; tests/python/test_cluster*.py drive the real one.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::model::IdentitySpec;
use ferrohub_engine::{AppendOutcome, CommitLog, LogError, Replica, Store, StoreConfig};
use parking_lot::Mutex;

const IN_FLIGHT: usize = 8;

/// Stores entries in the order they are started and answers each from a thread of its own
/// after `pause`; refuses every entry once `refuse_from` entries were stored.
struct SlowLog {
    entries: Arc<Mutex<Vec<Vec<u8>>>>,
    started: Mutex<Option<Sender<(Vec<u8>, AppendOutcome)>>>,
    /// The most appends seen unanswered at once.
    most_in_flight: Arc<AtomicUsize>,
    unanswered: Arc<AtomicUsize>,
    refusing: Arc<AtomicBool>,
}

impl SlowLog {
    fn new(pause: Duration, refuse_from: usize) -> Arc<SlowLog> {
        let (tx, rx) = channel::<(Vec<u8>, AppendOutcome)>();
        let log = Arc::new(SlowLog {
            entries: Arc::default(),
            started: Mutex::new(Some(tx)),
            most_in_flight: Arc::default(),
            unanswered: Arc::default(),
            refusing: Arc::default(),
        });
        let (entries, unanswered, refusing) = (
            Arc::clone(&log.entries),
            Arc::clone(&log.unanswered),
            Arc::clone(&log.refusing),
        );
        std::thread::spawn(move || {
            for (entry, outcome) in rx {
                std::thread::sleep(pause);
                let mut held = entries.lock();
                let answer = if refusing.load(Ordering::SeqCst) || held.len() >= refuse_from {
                    refusing.store(true, Ordering::SeqCst);
                    Err(LogError::Fenced {
                        expected: held.len() as u64,
                    })
                } else {
                    held.push(entry);
                    Ok(held.len() as u64)
                };
                drop(held);
                unanswered.fetch_sub(1, Ordering::SeqCst);
                outcome.send(answer);
            }
        });
        log
    }
}

impl CommitLog for SlowLog {
    fn start_append(&self, entry: Vec<u8>, outcome: AppendOutcome) {
        let now = self.unanswered.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        if let Some(tx) = self.started.lock().as_ref() {
            tx.send((entry, outcome)).unwrap();
        }
    }

    fn max_in_flight(&self) -> usize {
        IN_FLIGHT
    }
}

/// Creates `per_thread` devices from each of `threads` threads at once; the ids each call
/// answered Ok and those it refused.
fn create_devices(
    store: &Arc<Store>,
    threads: usize,
    per_thread: usize,
) -> (Vec<String>, Vec<String>) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = Arc::clone(store);
            std::thread::spawn(move || {
                let (mut ok, mut refused) = (Vec::new(), Vec::new());
                for i in 0..per_thread {
                    let id = format!("d{t}-{i}");
                    match store.create_device(&id, &IdentitySpec::default(), common::T0) {
                        Ok(_) => ok.push(id),
                        Err(_) => refused.push(id),
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let (mut ok, mut refused) = (Vec::new(), Vec::new());
    for h in handles {
        let (o, r) = h.join().unwrap();
        ok.extend(o);
        refused.extend(r);
    }
    (ok, refused)
}

/// A replica of the log's entries, applied in order.
fn replica_of(log: &SlowLog, dir: &std::path::Path) -> Replica {
    let replica = Replica::open(dir).unwrap();
    for (i, entry) in log.entries.lock().iter().enumerate() {
        replica.apply(i as u64 + 1, entry).unwrap();
    }
    replica
}

#[test]
fn groups_in_flight_are_written_in_log_order_once_stored() {
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = SlowLog::new(Duration::from_millis(2), usize::MAX);
    let writer =
        Arc::new(Store::open_replicated(w.path(), StoreConfig::default(), log.clone()).unwrap());
    let (ok, refused) = create_devices(&writer, 8, 40);
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert!(
        log.most_in_flight.load(Ordering::SeqCst) > 1,
        "the commit thread never had two appends in flight"
    );
    assert!(log.most_in_flight.load(Ordering::SeqCst) <= IN_FLIGHT);
    let stored = log.entries.lock().len() as u64;
    assert_eq!(writer.last_logged_sequence(), stored);
    assert_eq!(writer.applied_log_sequence().unwrap(), stored);

    let replica = replica_of(&log, r.path());
    let store = replica.store();
    for id in &ok {
        assert!(
            writer.get_device(id).is_ok(),
            "{id} answered Ok but the writer lacks it"
        );
        assert!(
            store.get_device(id).is_ok(),
            "{id} answered Ok but the log lacks it"
        );
    }
    assert_eq!(
        writer.list_devices(10_000).unwrap().len(),
        store.list_devices(10_000).unwrap().len()
    );
}

#[test]
fn a_refused_append_fails_every_group_behind_it_unwritten() {
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The hub's own first entries go through; the log refuses from the 20th on.
    let log = SlowLog::new(Duration::from_millis(2), 20);
    let writer =
        Arc::new(Store::open_replicated(w.path(), StoreConfig::default(), log.clone()).unwrap());
    let (ok, refused) = create_devices(&writer, 8, 40);
    assert!(!refused.is_empty(), "the log never refused");
    assert!(writer.is_poisoned());
    let stored = log.entries.lock().len() as u64;
    assert_eq!(stored, 20);
    assert_eq!(writer.applied_log_sequence().unwrap(), stored);

    // The writer holds exactly what the log stored: what was answered Ok, nothing refused.
    let replica = replica_of(&log, r.path());
    let store = replica.store();
    for id in &ok {
        assert!(writer.get_device(id).is_ok(), "{id}");
        assert!(store.get_device(id).is_ok(), "{id}");
    }
    for id in &refused {
        assert!(
            writer.get_device(id).is_err(),
            "{id} was refused but written"
        );
        assert!(store.get_device(id).is_err(), "{id} was refused but stored");
    }
    assert!(writer
        .create_device("later", &IdentitySpec::default(), common::T0)
        .is_err());
}
