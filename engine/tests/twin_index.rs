//! The twin query index (issue 15, part 2): kept exact by every writer (it equals an index
//! rebuilt from scratch after writes of every kind), and probes that find exactly the twins
//! whose indexed value matches.

mod common;

use ferrohub_engine::model::{IdentitySpec, IfMatch, UnixMillis};
use ferrohub_engine::scheduled_jobs::{
    JobTarget, ScheduledJob, ScheduledJobKind, ScheduledJobStatus,
};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::twin_index::Probe;
use ferrohub_engine::Store;
use serde_json::{json, Value};

const REPORTED: &str = "properties.reported.temp";

fn tags(store: &Store, id: &str, module: Option<&str>, t: Value) {
    let write = TwinWrite {
        tags: t.as_object().cloned(),
        desired: None,
    };
    store
        .update_twin(id, module, &write, &IfMatch::Any, common::T0)
        .unwrap();
}

fn ids(store: &Store, module: bool, path: &str, probe: Probe) -> Vec<String> {
    let page = store
        .twin_index_page(module, path, &probe, None, 1000)
        .unwrap()
        .expect("indexed");
    let mut out: Vec<String> = page
        .into_iter()
        .map(|(_, t)| match t.identity.module_id {
            Some(m) => format!("{}/{m}", t.identity.device_id),
            None => t.identity.device_id,
        })
        .collect();
    out.sort();
    out
}

#[test]
fn writers_keep_the_index_equal_to_a_rebuild_and_probes_find_their_twins() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    assert!(store.define_twin_index(vec![REPORTED.into()]).unwrap());
    assert!(!store.define_twin_index(vec![REPORTED.into()]).unwrap());
    for i in 0..20 {
        let id = format!("dev{i:02}");
        store
            .create_device(&id, &IdentitySpec::default(), common::T0)
            .unwrap();
        let plant = ["Lyon", "Recife"][i % 2];
        tags(
            &store,
            &id,
            None,
            json!({"plant": plant, "n": i, "meta": {"on": i % 3 == 0}}),
        );
    }
    store
        .create_module("dev00", "m1", &IdentitySpec::default(), common::T0)
        .unwrap();
    tags(&store, "dev00", Some("m1"), json!({"plant": "Lyon"}));
    // Every other kind of writer.
    tags(&store, "dev01", None, json!({"plant": "Lyon", "n": null}));
    store
        .patch_reported(
            "dev02",
            None,
            json!({"temp": 21.5}).as_object().unwrap(),
            common::T0,
        )
        .unwrap();
    store
        .record_connection("dev03", None, true, common::T0)
        .unwrap();
    store
        .update_device("dev04", &common::disabled("x"), &IfMatch::Any, common::T0)
        .unwrap();
    store
        .delete_device("dev05", &IfMatch::Any, common::T0)
        .unwrap();
    store
        .create_scheduled_job(&ScheduledJob {
            id: "j".into(),
            kind: ScheduledJobKind::UpdateTwin,
            status: ScheduledJobStatus::Running,
            query_condition: "*".into(),
            created: common::T0,
            start: common::T0,
            max_execution_secs: 60,
            ended: None,
            spec: "{}".into(),
            failure_reason: None,
            cursor: None,
            statistics: Default::default(),
            cancel_requested: false,
        })
        .unwrap();
    let job_write = TwinWrite {
        tags: json!({"job": "done"}).as_object().cloned(),
        desired: None,
    };
    let target = |d: &str| JobTarget {
        device_id: d.into(),
        module_id: None,
    };
    store
        .apply_twin_job_batch(
            "j",
            &[target("dev06"), target("dev07")],
            &job_write,
            UnixMillis(common::T0.0 + 1),
        )
        .unwrap();

    assert_eq!(
        ids(&store, false, "tags.plant", Probe::Eq(vec![json!("Lyon")])).len(),
        11
    );
    assert_eq!(
        ids(&store, true, "tags.plant", Probe::Eq(vec![json!("Lyon")])),
        ["dev00/m1"]
    );
    assert_eq!(
        ids(
            &store,
            false,
            "tags.n",
            Probe::Range {
                lo: Some((json!(15), false)),
                hi: None
            }
        ),
        ["dev16", "dev17", "dev18", "dev19"]
    );
    assert_eq!(
        ids(
            &store,
            false,
            "tags.n",
            Probe::Range {
                lo: Some((json!(2), true)),
                hi: Some((json!(4), true))
            }
        ),
        ["dev02", "dev03", "dev04"]
    );
    // A null in a patch removes the tag, and its entry with it.
    assert!(ids(&store, false, "tags.n", Probe::Eq(vec![json!(null)])).is_empty());
    assert!(!ids(
        &store,
        false,
        "tags.n",
        Probe::Range {
            lo: Some((json!(0), true)),
            hi: None
        }
    )
    .contains(&"dev01".to_string()));
    assert_eq!(
        ids(&store, false, "tags.meta.on", Probe::Eq(vec![json!(true)])).len(),
        7
    );
    assert_eq!(
        ids(
            &store,
            false,
            "connectionState",
            Probe::Eq(vec![json!("Connected")])
        ),
        ["dev03"]
    );
    assert_eq!(
        ids(&store, false, "status", Probe::Eq(vec![json!("disabled")])),
        ["dev04"]
    );
    assert_eq!(
        ids(&store, false, REPORTED, Probe::Eq(vec![json!(21.5)])),
        ["dev02"]
    );
    assert_eq!(
        ids(&store, false, "tags.job", Probe::Prefix("do".into())),
        ["dev06", "dev07"]
    );
    assert!(
        ids(&store, false, "tags.plant", Probe::Eq(vec![json!("Lyon")]))
            .iter()
            .all(|d| d != "dev05")
    );
    assert!(store
        .twin_index_page(
            false,
            "properties.reported.other",
            &Probe::Eq(vec![json!(1)]),
            None,
            10
        )
        .unwrap()
        .is_none());

    // Paging: after the last key of a page, the next page goes on.
    let first = store
        .twin_index_page(false, "status", &Probe::Eq(vec![json!("enabled")]), None, 5)
        .unwrap()
        .unwrap();
    let next = store
        .twin_index_page(
            false,
            "status",
            &Probe::Eq(vec![json!("enabled")]),
            Some(&first[4].0),
            100,
        )
        .unwrap()
        .unwrap();
    assert_eq!(first.len() + next.len(), 18);

    // What the writers kept equals a rebuild from scratch.
    let kept = store.twin_index_keys().unwrap();
    assert!(store.define_twin_index(Vec::new()).unwrap());
    assert!(store.define_twin_index(vec![REPORTED.into()]).unwrap());
    assert_eq!(store.twin_index_keys().unwrap(), kept);
    drop(store);
    // The definition in force survives a reopen, so nothing is rebuilt.
    let reopened = common::open(dir.path());
    assert!(!reopened.define_twin_index(vec![REPORTED.into()]).unwrap());
    assert_eq!(reopened.twin_index_keys().unwrap(), kept);
}

/// Without indexed reported paths a device's reported patch leaves the index alone (the hook
/// reads nothing for it); with one declared later, the rebuild finds what the patches wrote.
#[test]
fn reported_patches_keep_an_index_without_reported_paths_equal_to_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    // A new store indexes the fixed paths only.
    assert!(!store.define_twin_index(Vec::new()).unwrap());
    for i in 0..6 {
        let id = format!("dev{i}");
        store
            .create_device(&id, &IdentitySpec::default(), common::T0)
            .unwrap();
        if i % 2 == 0 {
            tags(&store, &id, None, json!({"plant": "Lyon", "n": i}));
        }
    }
    store
        .create_module("dev0", "m1", &IdentitySpec::default(), common::T0)
        .unwrap();
    // The first write of a twin that has no record yet, then a second patch over it, on
    // both the waiting and the pipelined paths, and a connection state between them.
    for (i, id) in ["dev1", "dev2", "dev3"].iter().enumerate() {
        store
            .patch_reported(
                id,
                None,
                json!({"temp": i}).as_object().unwrap(),
                common::T0,
            )
            .unwrap();
    }
    store
        .record_connection("dev2", None, true, common::T0)
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for id in ["dev2", "dev4", "dev5"] {
        let tx = tx.clone();
        store
            .patch_reported_then(
                id,
                None,
                json!({"temp": 30}).as_object().unwrap(),
                common::T0,
                move |r| tx.send(r.map(|_| ())).unwrap(),
            )
            .unwrap();
    }
    store
        .patch_reported(
            "dev0",
            Some("m1"),
            json!({"temp": 1}).as_object().unwrap(),
            common::T0,
        )
        .unwrap();
    for _ in 0..3 {
        rx.recv().unwrap().unwrap();
    }
    tags(&store, "dev2", None, json!({"plant": "Recife"}));
    assert_eq!(
        ids(&store, false, "tags.plant", Probe::Eq(vec![json!("Lyon")])),
        ["dev0", "dev4"]
    );
    assert_eq!(
        ids(
            &store,
            false,
            "tags.plant",
            Probe::Eq(vec![json!("Recife")])
        ),
        ["dev2"]
    );
    assert_eq!(
        ids(
            &store,
            false,
            "connectionState",
            Probe::Eq(vec![json!("Connected")])
        ),
        ["dev2"]
    );
    assert_eq!(
        ids(&store, false, "status", Probe::Eq(vec![json!("enabled")])).len(),
        6
    );
    assert_eq!(
        ids(&store, true, "status", Probe::Eq(vec![json!("enabled")])),
        ["dev0/m1"]
    );

    let kept = store.twin_index_keys().unwrap();
    // A definition with a reported path indexes what the skipped patches wrote.
    assert!(store.define_twin_index(vec![REPORTED.into()]).unwrap());
    assert_eq!(
        ids(&store, false, REPORTED, Probe::Eq(vec![json!(30)])),
        ["dev2", "dev4", "dev5"]
    );
    assert_eq!(
        ids(&store, true, REPORTED, Probe::Eq(vec![json!(1)])),
        ["dev0/m1"]
    );
    // What the writers kept equals a rebuild from scratch under the same definition.
    assert!(store.define_twin_index(Vec::new()).unwrap());
    assert_eq!(store.twin_index_keys().unwrap(), kept);
}
