//! TWN-9 groundwork: every twin change leaves a change record in the same commit, numbered
//! without gaps, surviving restarts.

mod common;

use std::sync::Arc;

use ferrohub_engine::model::{IdentitySpec, IfMatch};
use ferrohub_engine::twin::changes::TwinOp;
use ferrohub_engine::twin::store::TwinWrite;
use serde_json::{json, Map, Value};

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
        let changes = store.read_twin_changes(0, 10).unwrap();
        assert_eq!(
            changes.iter().map(|c| c.sequence).collect::<Vec<_>>(),
            vec![0, 1, 2]
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
        store.read_twin_changes(3, 10).unwrap()[0].sequence,
        3,
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
    assert!(store.read_twin_changes(0, 10).unwrap().is_empty());
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
    let changes = store.read_twin_changes(0, 1000).unwrap();
    assert_eq!(
        changes.iter().map(|c| c.sequence).collect::<Vec<_>>(),
        (0..200).collect::<Vec<u64>>()
    );
}
