//! ENG-2: concurrent writers share synced writes, and every acknowledged write is readable.

mod common;

use std::sync::Arc;

use ferrohub_engine::model::IdentitySpec;

#[test]
fn concurrent_writers_share_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::open(dir.path()));
    let before = store.commit_stats();
    let threads: Vec<_> = (0..64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..20 {
                    store
                        .create_device(&format!("d{t}-{i}"), &IdentitySpec::default(), common::T0)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let after = store.commit_stats();
    let commits = after.commits - before.commits;
    let writes = after.writes - before.writes;
    assert_eq!(commits, 64 * 20);
    // With 64 writers blocked on syncs, groups must form: far fewer writes than commits.
    assert!(
        writes * 2 < commits,
        "{writes} synced writes for {commits} commits: no grouping"
    );
    assert_eq!(
        store.registry_statistics().unwrap().total_device_count,
        64 * 20
    );
    assert_eq!(store.list_devices(2000).unwrap().len(), 64 * 20);
}

#[test]
fn acknowledged_writes_survive_reopen_without_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let etag = {
        let store = common::open(dir.path());
        let d = store
            .create_device("kept", &IdentitySpec::default(), common::T0)
            .unwrap();
        // Dropped without close(): only the synced WAL holds the write.
        std::mem::forget(store);
        d.etag
    };
    // A forgotten store still holds the RocksDB lock in this process, so copy the files as a
    // crash would leave them and open the copy.
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
    }
    let store = common::open(copy.path());
    assert_eq!(store.get_device("kept").unwrap().etag, etag);
}

/// Connection states and a router cursor that routed nothing may lag: they are written at
/// once (and readable) but share no sync of their own; the committer syncs them within
/// `LAG_SYNC_WITHIN`, and a synced write in between makes them durable with it.
#[test]
fn lagging_writes_are_written_at_once_and_synced_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store_with_device(dir.path());
    let before = store.commit_stats();
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..40 {
        let tx = tx.clone();
        store
            .record_connection_then("d", None, i % 2 == 0, common::at(i), move |r| {
                tx.send(r).unwrap()
            })
            .unwrap();
        rx.recv().unwrap().unwrap();
    }
    // Routed nowhere: the cursor moves past the 40 notifications without a sync.
    let notes = store.read_notifications(0, 100).unwrap();
    assert_eq!(
        notes.len(),
        41,
        "the device's creation and 40 connection states"
    );
    let sequences: Vec<u64> = notes.iter().map(|n| n.sequence).collect();
    store
        .append_routed_notifications(Vec::new(), common::at(50), &sequences)
        .unwrap();
    assert!(store.read_notifications(0, 100).unwrap().is_empty());
    let written = store.commit_stats();
    assert!(
        written.writes - before.writes >= 21,
        "each waited for its own write"
    );
    // Every write above waited for the one before, so unsynced they take milliseconds; one
    // sync is allowed for a machine that stalls past the bound in between.
    assert!(
        written.syncs - before.syncs <= 1,
        "{} syncs for {} lagging writes",
        written.syncs - before.syncs,
        written.writes - before.writes
    );
    let stored = store.get_device("d").unwrap();
    assert_eq!(format!("{:?}", stored.connection_state), "Disconnected");

    // The committer syncs them by itself within the bound.
    let deadline = std::time::Instant::now() + ferrohub_engine::LAG_SYNC_WITHIN * 10;
    while store.commit_stats().syncs == written.syncs {
        assert!(
            std::time::Instant::now() < deadline,
            "lagging writes never synced"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // A synced write syncs everything before it, so no lagging sync is left owed after it.
    let tx2 = tx.clone();
    store
        .record_connection_then("d", None, true, common::at(60), move |r| {
            tx2.send(r).unwrap()
        })
        .unwrap();
    rx.recv().unwrap().unwrap();
    store
        .create_device("e", &IdentitySpec::default(), common::at(61))
        .unwrap();
    let synced = store.commit_stats();
    std::thread::sleep(ferrohub_engine::LAG_SYNC_WITHIN + std::time::Duration::from_millis(500));
    assert_eq!(
        store.commit_stats().syncs,
        synced.syncs,
        "a sync owed after a synced write"
    );
}

/// A batch that may lag does not wake the committer by itself: lagging batches queued while
/// it naps after a lagging write share its next write, where a thread woken for each one wrote
/// them one by one. A synced write queued in between is still written (and answered).
#[test]
fn lagging_batches_queued_close_together_share_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store_with_device(dir.path());
    let before = store.commit_stats();
    let (tx, rx) = std::sync::mpsc::channel();
    let batches = 200;
    let queued_from = std::time::Instant::now();
    for i in 0..batches {
        let tx = tx.clone();
        store
            .record_connection_then("d", None, i % 2 == 0, common::at(i), move |r| {
                tx.send(r).unwrap()
            })
            .unwrap();
        if i == batches / 2 {
            store
                .create_device("e", &IdentitySpec::default(), common::at(i))
                .unwrap();
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    // A loaded machine sleeps longer than 50 us: the naps (1 ms each) then number more, but
    // without them every batch would be its own write.
    let queued_ms = queued_from.elapsed().as_millis() as u64;
    let bound = (batches as u64 / 5)
        .max(queued_ms * 3 / 2)
        .min(batches as u64 / 2);
    for _ in 0..batches {
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .unwrap()
            .unwrap();
    }
    let writes = store.commit_stats().writes - before.writes;
    assert!(
        writes <= bound,
        "{writes} writes for {batches} lagging batches queued 50 us apart in {queued_ms} ms"
    );
    assert!(store.get_device("e").is_ok());
}
