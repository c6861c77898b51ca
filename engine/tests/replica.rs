//! Cluster mode's commit log seen from the engine: a writer's groups become log entries, a
//! replica fed those entries holds the same hub, and a refused append stops the writer.
//! The log here is an in-memory vector; tests/python/test_cluster.py drives the JetStream one.

mod common;

use std::sync::Arc;

use ferrohub_engine::model::{IdentitySpec, IfMatch};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::{AppendOutcome, CommitLog, LogError, Replica, Store, StoreConfig};
use parking_lot::Mutex;
use serde_json::json;

/// Entries in append order; sequence = index + 1. Refuses appends once `fenced`.
#[derive(Default)]
struct VecLog {
    entries: Mutex<Vec<Vec<u8>>>,
    fenced: std::sync::atomic::AtomicBool,
}

impl CommitLog for VecLog {
    fn start_append(&self, entry: Vec<u8>, outcome: AppendOutcome) {
        outcome.send(self.append(entry));
    }
}

impl VecLog {
    fn append(&self, entry: Vec<u8>) -> Result<u64, LogError> {
        let mut entries = self.entries.lock();
        if self.fenced.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(LogError::Fenced {
                expected: entries.len() as u64,
            });
        }
        entries.push(entry);
        Ok(entries.len() as u64)
    }
}

fn desired(v: serde_json::Value) -> TwinWrite {
    TwinWrite {
        tags: None,
        desired: v.as_object().cloned(),
    }
}

#[test]
fn a_replica_fed_the_log_holds_the_writers_hub() {
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = Arc::new(VecLog::default());
    let writer = Store::open_replicated(w.path(), StoreConfig::default(), log.clone()).unwrap();
    writer
        .create_device("a", &IdentitySpec::default(), common::T0)
        .unwrap();
    writer
        .create_device("b", &IdentitySpec::default(), common::T0)
        .unwrap();
    writer
        .update_twin(
            "a",
            None,
            &desired(json!({"fw": "2"})),
            &IfMatch::Any,
            common::T0,
        )
        .unwrap();
    writer
        .delete_device("b", &IfMatch::Any, common::T0)
        .unwrap();
    let appended = log.entries.lock().len() as u64;
    assert!(
        appended >= 4,
        "every write went through the log: {appended}"
    );
    assert_eq!(writer.applied_log_sequence().unwrap(), appended);
    drop(writer);

    let replica = Replica::open(r.path()).unwrap();
    assert_eq!(replica.applied_sequence().unwrap(), 0);
    for (i, entry) in log.entries.lock().iter().enumerate() {
        assert!(replica.apply(i as u64 + 1, entry).unwrap().is_some());
    }
    // Applying again changes nothing; a gap is refused.
    assert!(replica.apply(1, &log.entries.lock()[0]).unwrap().is_none());
    assert!(replica.apply(appended + 2, &log.entries.lock()[0]).is_err());
    assert_eq!(replica.applied_sequence().unwrap(), appended);
    drop(replica);

    // The replica, opened as the next writer, is the same hub.
    let next = Store::open_replicated(r.path(), StoreConfig::default(), log.clone()).unwrap();
    assert_eq!(next.applied_log_sequence().unwrap(), appended);
    assert!(next.get_device("a").is_ok());
    assert!(next.get_device("b").is_err());
    let twin = next.get_twin("a", None).unwrap();
    assert_eq!(twin.record.desired.body.get("fw"), Some(&json!("2")));
    assert_eq!(next.registry_statistics().unwrap().total_device_count, 1);
    next.create_device("c", &IdentitySpec::default(), common::T0)
        .unwrap();
    assert_eq!(next.applied_log_sequence().unwrap(), appended + 1);
}

#[test]
fn a_refused_append_writes_nothing_and_stops_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(VecLog::default());
    let writer = Store::open_replicated(dir.path(), StoreConfig::default(), log.clone()).unwrap();
    writer
        .create_device("kept", &IdentitySpec::default(), common::T0)
        .unwrap();
    log.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(writer
        .create_device("lost", &IdentitySpec::default(), common::T0)
        .is_err());
    assert!(writer.is_poisoned());
    assert!(writer
        .create_device("later", &IdentitySpec::default(), common::T0)
        .is_err());
    let applied = writer.applied_log_sequence().unwrap();
    drop(writer);
    let reopened = Replica::open(dir.path()).unwrap();
    assert_eq!(reopened.applied_sequence().unwrap(), applied);
    drop(reopened);
    let store = Store::open_read_only(dir.path()).unwrap();
    assert!(store.get_device("kept").is_ok());
    assert!(store.get_device("lost").is_err());
}

#[test]
fn a_single_nodes_hub_seeds_an_empty_log_that_rebuilds_it_elsewhere() {
    let (single, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    {
        let store = common::open(single.path());
        store
            .initialise_hub(ferrohub_engine::hub::HubSettings {
                hub_name: "seeded".into(),
                host_name: "localhost".into(),
                other_host_names: Vec::new(),
                policies: ferrohub_engine::hub::HubSettings::default_policies(),
                created: common::T0,
                provisioning: None,
            })
            .unwrap();
        for i in 0..300 {
            store
                .create_device(&format!("d{i}"), &IdentitySpec::default(), common::T0)
                .unwrap();
        }
        // About 5 MB of twins: more than one entry's worth.
        for i in 0..200 {
            store
                .update_twin(
                    &format!("d{i}"),
                    None,
                    &desired(json!({
                        "a": "x".repeat(4_000), "b": "x".repeat(4_000), "c": "x".repeat(4_000),
                        "d": "x".repeat(4_000), "e": "x".repeat(4_000), "f": "x".repeat(4_000),
                    })),
                    &IfMatch::Any,
                    common::T0,
                )
                .unwrap();
        }
        store
            .delete_device("d8", &IfMatch::Any, common::T0)
            .unwrap();
    }
    let seeded = Replica::open(single.path()).unwrap();
    assert!(seeded.holds_a_hub_outside_the_log().unwrap());
    let log = VecLog::default();
    seeded
        .seed_entries(|entry| {
            log.append(entry)
                .map(drop)
                .map_err(|e| ferrohub_engine::StorageError::Backend(e.to_string()))
        })
        .unwrap();
    let appended = log.entries.lock().len() as u64;
    assert!(appended >= 2, "{appended} entries");
    seeded.mark_seeded(appended).unwrap();
    assert!(!seeded.holds_a_hub_outside_the_log().unwrap());
    assert_eq!(seeded.applied_sequence().unwrap(), appended);
    drop(seeded);

    let replica = Replica::open(other.path()).unwrap();
    for (i, entry) in log.entries.lock().iter().enumerate() {
        assert!(replica.apply(i as u64 + 1, entry).unwrap().is_some());
    }
    drop(replica);
    let log = Arc::new(log);
    for dir in [single.path(), other.path()] {
        let store = Store::open_replicated(dir, StoreConfig::default(), log.clone()).unwrap();
        assert_eq!(store.applied_log_sequence().unwrap(), appended);
        assert_eq!(store.registry_statistics().unwrap().total_device_count, 299);
        assert!(store.get_device("d8").is_err());
        let twin = store.get_twin("d7", None).unwrap();
        assert_eq!(
            twin.record.desired.body["f"].as_str().map(str::len),
            Some(4_000)
        );
        assert!(store.get_twin("d299", None).is_ok());
        assert_eq!(store.hub_settings().unwrap().unwrap().hub_name, "seeded");
    }
}

fn event(device: &str, body: &str) -> ferrohub_engine::d2c::NewEvent {
    ferrohub_engine::d2c::NewEvent {
        device_id: device.into(),
        body: body.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// Feeds `follower` every entry of `log` it has not applied yet; returns the partitions the
/// entries advanced.
fn catch_up(follower: &Replica, log: &VecLog) -> Vec<(u16, u64)> {
    let from = follower.applied_sequence().unwrap() as usize;
    let mut advanced = Vec::new();
    for (i, entry) in log.entries.lock().iter().enumerate().skip(from) {
        advanced.extend(follower.apply(i as u64 + 1, entry).unwrap().unwrap());
    }
    advanced
}

#[test]
fn a_followers_store_reads_what_the_log_wrote_and_refuses_writes() {
    use ferrohub_engine::d2c::ReadPosition;
    let (w, f) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = Arc::new(VecLog::default());
    let writer = Store::open_replicated(w.path(), StoreConfig::default(), log.clone()).unwrap();
    let follower = Replica::open(f.path()).unwrap();
    let store = follower.store();
    assert_eq!(
        store.partition_count(),
        0,
        "an empty follower knows no hub yet"
    );
    catch_up(&follower, &log);
    assert_eq!(store.partition_count(), writer.partition_count());

    writer
        .create_device("dev", &IdentitySpec::default(), common::T0)
        .unwrap();
    let appended = writer
        .append_events(vec![event("dev", "one"), event("dev", "two")], common::T0)
        .unwrap();
    let p = appended[0].partition;
    assert_eq!(
        writer.last_logged_sequence(),
        log.entries.lock().len() as u64
    );
    let advanced = catch_up(&follower, &log);
    assert_eq!(advanced, vec![(p, appended[1].sequence_number)]);
    let read = store.read_events(p, ReadPosition::Start, 10).unwrap();
    assert_eq!(
        read.iter().map(|e| e.body.clone()).collect::<Vec<_>>(),
        vec![b"one".to_vec(), b"two".to_vec()]
    );
    assert_eq!(
        store.partition_info(p).unwrap(),
        writer.partition_info(p).unwrap()
    );
    assert_eq!(store.next_sequence_number(p).unwrap(), 2);
    assert!(store.get_device("dev").is_ok());

    // A custom endpoint's partitions appear, and its events are read.
    writer.create_endpoint("cold", 2, common::T0).unwrap();
    catch_up(&follower, &log);
    let slot = store
        .endpoint_slot("cold")
        .expect("the endpoint is followed");
    assert_eq!(Some(slot), writer.endpoint_slot("cold"));
    // A delivery target set later reaches the replica with the endpoint's record.
    let target = ferrohub_engine::delivery::DeliveryTarget::Webhook(
        ferrohub_engine::delivery::WebhookTarget {
            url: "https://receiver/".into(),
            signing_key: "c2l4dGVlbiBieXRlcyBrZXk=".into(),
            ca_certificate: None,
            timeout_ms: 5_000,
            dead_letter_after_ms: 60_000,
        },
    );
    writer
        .set_endpoint_delivery("cold", Some(target.clone()))
        .unwrap();
    catch_up(&follower, &log);
    let followed = store
        .list_endpoints()
        .into_iter()
        .find(|e| e.name == "cold");
    assert_eq!(followed.and_then(|e| e.delivery), Some(target));
    let routed = ferrohub_engine::d2c::NewEvent {
        endpoints: Some(vec![slot]),
        ..event("dev", "three")
    };
    let at = writer.append_events(vec![routed], common::T0).unwrap()[0];
    catch_up(&follower, &log);
    let read = store
        .read_events(at.partition, ReadPosition::Start, 10)
        .unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].body, b"three");

    // The twin index definition follows the writer's.
    writer
        .define_twin_index(vec!["properties.reported.fw".into()])
        .unwrap();
    catch_up(&follower, &log);
    assert_eq!(
        store.twin_index_definition(),
        writer.twin_index_definition()
    );
    assert!(store
        .twin_index_definition()
        .unwrap()
        .covers("properties.reported.fw"));

    // Writes are the writer's.
    assert!(matches!(
        store.create_device("mine", &IdentitySpec::default(), common::T0),
        Err(ferrohub_engine::RegistryError::Storage(
            ferrohub_engine::StorageError::NotWriter
        ))
    ));
    assert!(store.get_device("mine").is_err());
}

#[test]
fn a_replica_records_its_last_entry_and_refuses_a_single_nodes_open() {
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let log = Arc::new(VecLog::default());
    let writer = Store::open_replicated(w.path(), StoreConfig::default(), log.clone()).unwrap();
    writer
        .create_device("a", &IdentitySpec::default(), common::T0)
        .unwrap();
    writer
        .create_device("b", &IdentitySpec::default(), common::T0)
        .unwrap();
    drop(writer);
    let entries = log.entries.lock().clone();
    let last = entries.len() as u64;

    let replica = Replica::open(r.path()).unwrap();
    assert_eq!(replica.log_tip().unwrap(), None);
    assert_eq!(replica.log_identity().unwrap(), None);
    for (i, entry) in entries.iter().enumerate() {
        replica.apply(i as u64 + 1, entry).unwrap();
    }
    let tip = replica.log_tip().unwrap().expect("a tip after applying");
    assert_eq!(
        tip,
        ferrohub_engine::LogTip::of(last, &entries[last as usize - 1])
    );
    assert_ne!(tip, ferrohub_engine::LogTip::of(last, b"another entry"));
    replica
        .record_log_identity("FERROHUB_LOG created at 1 ns")
        .unwrap();
    assert_eq!(
        replica.log_identity().unwrap().as_deref(),
        Some("FERROHUB_LOG created at 1 ns")
    );
    drop(replica);

    // The writer's own store records the same tip for what it wrote.
    let writer = Store::open_replicated(w.path(), StoreConfig::default(), log.clone()).unwrap();
    drop(writer);
    let writer_dir = Replica::open(w.path()).unwrap();
    assert_eq!(writer_dir.log_tip().unwrap(), Some(tip));
    drop(writer_dir);

    // A single node's open (serve without [cluster], ca add, restore) is refused; copying it
    // out and reading it are not.
    match Store::open(r.path(), StoreConfig::default()) {
        Err(ferrohub_engine::OpenError::ClusterReplica { applied, .. }) => {
            assert_eq!(applied, last)
        }
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("a cluster replica opened as a single node"),
    }
    let copy = Store::open_to_copy(r.path(), StoreConfig::default()).unwrap();
    assert!(copy.get_device("a").is_ok());
    drop(copy);
    let read = Store::open_read_only(r.path()).unwrap();
    assert!(read.get_device("b").is_ok());
    drop(read);
    let replica = Replica::open(r.path()).unwrap();
    assert_eq!(
        replica.applied_sequence().unwrap(),
        last,
        "nothing was written"
    );
}
