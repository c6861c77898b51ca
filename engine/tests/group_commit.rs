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
