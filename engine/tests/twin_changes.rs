//! TWN-9, EVT-2, EVT-3 groundwork: every twin change, identity creation or deletion and
//! connection state change leaves a notification in the same commit, numbered without gaps,
//! surviving restarts.

mod common;

use std::sync::Arc;

use ferrohub_engine::model::{IdentitySpec, IfMatch};
use ferrohub_engine::notifications::{EventSource, Notification, NotificationOp as TwinOp};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::UnixMillis;
use serde_json::{json, Map, Value};

fn twin_changes(all: Vec<Notification>) -> Vec<Notification> {
    all.into_iter()
        .filter(|n| n.op.source() == EventSource::TwinChangeEvents)
        .collect()
}

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

#[test]
fn each_change_is_recorded_with_its_parts_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path());
        store
            .create_device("d", &IdentitySpec::default(), common::T0)
            .unwrap();
        let write = TwinWrite {
            tags: Some(obj(json!({"site": "lab"}))),
            desired: Some(obj(json!({"fw": "2", "gone": null}))),
        };
        store
            .update_twin("d", None, &write, &IfMatch::Any, common::T0)
            .unwrap();
        store
            .patch_reported("d", None, &obj(json!({"fw": "1"})), common::T0)
            .unwrap();
        let replace = TwinWrite {
            tags: Some(obj(json!({"t": 1}))),
            desired: Some(obj(json!({"x": 1}))),
        };
        store
            .replace_twin("d", None, &replace, &IfMatch::Any, common::T0)
            .unwrap();
        let changes = twin_changes(store.read_notifications(0, 10).unwrap());
        assert_eq!(
            changes.iter().map(|c| c.sequence).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "0 is the device's creation"
        );
        let ops: Vec<TwinOp> = changes.iter().map(|c| c.op).collect();
        assert_eq!(
            ops,
            vec![TwinOp::UpdateTwin, TwinOp::UpdateTwin, TwinOp::ReplaceTwin]
        );

        let first = &changes[0].body;
        assert_eq!(first["version"], 2);
        assert_eq!(first["tags"], json!({"site": "lab"}));
        let desired = &first["properties"]["desired"];
        assert_eq!(
            (
                desired["fw"].clone(),
                desired["gone"].clone(),
                desired["$version"].clone()
            ),
            (json!("2"), Value::Null, json!(2))
        );
        assert_eq!(desired["$metadata"]["fw"]["$lastUpdatedVersion"], 2);
        assert_eq!(
            desired["$metadata"]["fw"]["$lastUpdated"],
            common::T0.0.to_string()
        );

        let reported = &changes[1].body["properties"]["reported"];
        assert_eq!(reported["fw"], "1");
        assert!(reported["$metadata"]["fw"]
            .get("$lastUpdatedVersion")
            .is_none());
        assert!(changes[1].body.get("tags").is_none());

        let whole = &changes[2].body;
        assert_eq!(whole["tags"], json!({"t": 1}));
        assert_eq!(whole["properties"]["desired"]["x"], 1);
        assert_eq!(whole["properties"]["reported"]["fw"], "1");
        store.close().unwrap();
    }
    let store = common::open(dir.path());
    store
        .patch_reported("d", None, &obj(json!({"after": "restart"})), common::T0)
        .unwrap();
    assert_eq!(
        store.read_notifications(4, 10).unwrap()[0].sequence,
        4,
        "numbering continues after a restart"
    );
}

#[test]
fn a_refused_change_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    assert!(store
        .patch_reported("d", None, &obj(json!({"a.b": 1})), common::T0)
        .is_err());
    let stale = IfMatch::Etag("stale".into());
    assert!(store
        .update_twin(
            "d",
            None,
            &TwinWrite {
                tags: Some(Map::new()),
                desired: None
            },
            &stale,
            common::T0
        )
        .is_err());
    let all = store.read_notifications(0, 10).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].op, TwinOp::CreateDeviceIdentity);
}

#[test]
fn concurrent_changes_are_numbered_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(common::open(dir.path()));
    for i in 0..8 {
        store
            .create_device(&format!("d{i}"), &IdentitySpec::default(), common::T0)
            .unwrap();
    }
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let s = Arc::clone(&store);
            std::thread::spawn(move || {
                for n in 0..25 {
                    s.patch_reported(&format!("d{i}"), None, &obj(json!({ "n": n })), common::T0)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let all = store.read_notifications(0, 1000).unwrap();
    assert_eq!(
        all.iter().map(|c| c.sequence).collect::<Vec<_>>(),
        (0..208).collect::<Vec<u64>>()
    );
    assert_eq!(twin_changes(all).len(), 200);
}

#[test]
fn lifecycle_and_connection_notifications_carry_the_twin() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let t = |ms| UnixMillis(ms);
    store
        .create_device("d", &IdentitySpec::default(), t(1000))
        .unwrap();
    store
        .create_module("d", "m", &IdentitySpec::default(), t(2000))
        .unwrap();
    store
        .update_twin(
            "d",
            Some("m"),
            &TwinWrite {
                tags: Some(obj(json!({"site": "x"}))),
                desired: None,
            },
            &IfMatch::Any,
            t(2500),
        )
        .unwrap();
    store.record_connection("d", None, true, t(3000)).unwrap();
    store
        .record_connection("d", Some("m"), false, t(3500))
        .unwrap();
    store.delete_device("d", &IfMatch::Any, t(4000)).unwrap();
    let all = store.read_notifications(0, 100).unwrap();
    let ops: Vec<_> = all
        .iter()
        .map(|n| (n.op, n.module_id.clone(), n.time.0))
        .collect();
    assert_eq!(
        ops,
        vec![
            (TwinOp::CreateDeviceIdentity, None, 1000),
            (TwinOp::CreateDeviceIdentity, Some("m".to_string()), 2000),
            (TwinOp::UpdateTwin, Some("m".to_string()), 2500),
            (TwinOp::DeviceConnected, None, 3000),
            (TwinOp::DeviceDisconnected, Some("m".to_string()), 3500),
            (TwinOp::DeleteDeviceIdentity, None, 4000),
            (TwinOp::DeleteDeviceIdentity, Some("m".to_string()), 4000),
        ]
    );
    let created = &all[1].body;
    assert_eq!(created["deviceId"], "d");
    assert_eq!(created["moduleId"], "m");
    assert_eq!(created["version"], 1);
    assert!(created["etag"].is_string());
    assert_eq!(created["properties"]["desired"]["$version"], 1);
    assert_eq!(
        created["properties"]["reported"]["$metadata"]["$lastUpdated"],
        "2000"
    );
    assert!(created.get("tags").is_none(), "no tags yet");
    let deleted_module = &all[6].body;
    assert_eq!(deleted_module["tags"], json!({"site": "x"}));
    assert_eq!(deleted_module["version"], 2);
    assert!(
        all[3].body.is_empty(),
        "connection events have no body of their own"
    );
}

/// A reported patch reads the identity only when the twin has no record yet: a deleted device
/// or module (whose twin record went with it) is not found, and one registered again under
/// the same id starts from the empty twin of its new generation, with no notification for a
/// patch that failed.
#[test]
fn a_reported_patch_finds_its_identity_through_the_twin_record() {
    use ferrohub_engine::TwinError;
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let not_found = |r: Result<u64, TwinError>| matches!(r, Err(TwinError::NotFound { .. }));
    assert!(not_found(store.patch_reported(
        "d",
        None,
        &obj(json!({"a": 1})),
        common::T0
    )));
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .create_module("d", "m", &IdentitySpec::default(), common::T0)
        .unwrap();
    let first_etag = store.get_twin("d", None).unwrap().record.etag;
    assert_eq!(
        store
            .patch_reported("d", None, &obj(json!({"a": 1})), common::T0)
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .patch_reported("d", None, &obj(json!({"a": 2})), common::T0)
            .unwrap(),
        3
    );
    assert_eq!(
        store
            .patch_reported("d", Some("m"), &obj(json!({"b": 1})), common::T0)
            .unwrap(),
        2
    );
    store
        .delete_module("d", "m", &IfMatch::Any, common::T0)
        .unwrap();
    assert!(not_found(store.patch_reported(
        "d",
        Some("m"),
        &obj(json!({"b": 2})),
        common::T0
    )));
    assert_eq!(
        store
            .get_twin("d", None)
            .unwrap()
            .record
            .reported
            .body
            .get("a"),
        Some(&json!(2))
    );
    store.delete_device("d", &IfMatch::Any, common::T0).unwrap();
    let before = twin_changes(store.read_notifications(0, 1000).unwrap()).len();
    assert!(not_found(store.patch_reported(
        "d",
        None,
        &obj(json!({"a": 3})),
        common::T0
    )));
    assert_eq!(
        twin_changes(store.read_notifications(0, 1000).unwrap()).len(),
        before
    );

    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let renewed = store.get_twin("d", None).unwrap().record;
    assert_ne!(
        renewed.etag, first_etag,
        "a new generation has its own initial etag"
    );
    assert_eq!(
        store
            .patch_reported("d", None, &obj(json!({"c": 1})), common::T0)
            .unwrap(),
        2
    );
    let twin = store.get_twin("d", None).unwrap().record;
    assert_eq!(twin.reported.body.get("a"), None);
    assert_eq!(twin.version, 2);
}
