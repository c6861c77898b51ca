//! PNP-1, PNP-3, PNP-5 in the engine: the model id on the identity and its twin, digital twin
//! patches as desired patches, and digital twin change records beside twin change records.

mod common;

use ferrohub_engine::model::{IdentitySpec, IfMatch};
use ferrohub_engine::notifications::{EventSource, Notification, NotificationOp};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::{RegistryError, TwinError, UnixMillis};
use serde_json::{json, Map, Value};

const MODEL: &str = "dtmi:com:example:TemperatureController;1";

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

fn digital(all: Vec<Notification>) -> Vec<Notification> {
    all.into_iter()
        .filter(|n| n.op.source() == EventSource::DigitalTwinChangeEvents)
        .collect()
}

fn ms(t: UnixMillis) -> String {
    t.0.to_string()
}

#[test]
fn a_model_id_is_stored_on_identity_and_twin_without_new_etags() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::store_with_device(dir.path());
        store
            .create_module("d", "m", &IdentitySpec::default(), common::T0)
            .unwrap();
        let before = store.get_device("d").unwrap();
        let twin_before = store.get_twin("d", None).unwrap().record.etag;
        assert!(store.set_model_id("d", None, MODEL).unwrap());
        assert!(
            !store.set_model_id("d", None, MODEL).unwrap(),
            "the same id writes nothing"
        );
        let after = store.get_device("d").unwrap();
        assert_eq!(after.model_id.as_deref(), Some(MODEL));
        assert_eq!(after.etag, before.etag);
        let twin = store.get_twin("d", None).unwrap();
        assert_eq!(twin.record.model_id.as_deref(), Some(MODEL));
        assert_eq!(twin.record.etag, twin_before);
        assert!(store.set_model_id("d", Some("m"), "dtmi:a:b;2").unwrap());
        assert_eq!(
            store.get_module("d", "m").unwrap().model_id.as_deref(),
            Some("dtmi:a:b;2")
        );
        assert_eq!(
            store.get_device("d").unwrap().model_id.as_deref(),
            Some(MODEL)
        );
        assert!(matches!(
            store.set_model_id("d", None, "dtmi:no-version"),
            Err(RegistryError::Invalid(_))
        ));
        assert!(matches!(
            store.set_model_id("nobody", None, MODEL),
            Err(RegistryError::DeviceNotFound(_))
        ));
        assert!(matches!(
            store.set_model_id("d", Some("nope"), MODEL),
            Err(RegistryError::ModuleNotFound { .. })
        ));
    }
    let store = common::open(dir.path());
    assert_eq!(
        store.get_device("d").unwrap().model_id.as_deref(),
        Some(MODEL)
    );
    assert_eq!(
        store
            .get_twin("d", None)
            .unwrap()
            .record
            .model_id
            .as_deref(),
        Some(MODEL)
    );
}

#[test]
fn only_a_plug_and_play_twin_records_digital_twin_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store_with_device(dir.path());
    store.record_digital_twin_changes(true);
    store
        .create_device("plain", &IdentitySpec::default(), common::T0)
        .unwrap();
    store.set_model_id("d", None, MODEL).unwrap();
    for id in ["d", "plain"] {
        store
            .patch_reported(id, None, &obj(json!({"serial": "a"})), common::at(1))
            .unwrap();
        store
            .patch_reported(
                id,
                None,
                &obj(json!({"serial": "b", "c1": {"__t": "c", "t": 1}})),
                common::at(2),
            )
            .unwrap();
        // Tags leave the digital twin alone.
        let tags = TwinWrite {
            tags: Some(obj(json!({"x": 1}))),
            desired: None,
        };
        store
            .update_twin(id, None, &tags, &IfMatch::Any, common::at(3))
            .unwrap();
    }
    let all = store.read_notifications(0, 100).unwrap();
    let changes = digital(all);
    assert!(changes.iter().all(|n| n.device_id == "d"));
    assert_eq!(changes.len(), 2);

    // Not recorded while no route takes them.
    store.record_digital_twin_changes(false);
    store
        .patch_reported("d", None, &obj(json!({"serial": "c"})), common::at(4))
        .unwrap();
    assert_eq!(digital(store.read_notifications(0, 100).unwrap()).len(), 2);
    assert!(changes
        .iter()
        .all(|n| n.op == NotificationOp::DigitalTwinUpdate));
    assert_eq!(changes[0].body["modelId"], MODEL);
    let first = changes[0].body["patch"].as_array().unwrap();
    assert!(first.contains(&json!({"op": "add", "path": "/serial", "value": "a"})));
    assert!(first.contains(
        &json!({"op": "add", "path": "/$metadata/serial", "value": {"lastUpdateTime": ms(common::at(1))}})
    ));
    let second = changes[1].body["patch"].as_array().unwrap();
    assert!(second.contains(&json!({"op": "replace", "path": "/serial", "value": "b"})));
    assert!(
        second.contains(&json!({"op": "add", "path": "/c1", "value": {
        "t": 1, "$metadata": {"t": {"lastUpdateTime": ms(common::at(2))}}}}))
    );
}

#[test]
fn a_digital_twin_patch_is_one_desired_patch_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::store_with_device(dir.path());
    store.record_digital_twin_changes(true);
    store.set_model_id("d", None, MODEL).unwrap();
    store
        .patch_reported(
            "d",
            None,
            &obj(json!({"c1": {"__t": "c", "t": 1}})),
            common::at(1),
        )
        .unwrap();
    let before = store.get_twin("d", None).unwrap().record;
    for bad in [
        json!({"op": "add", "path": "/a", "value": 1}),
        json!([{"op": "copy", "from": "/a", "path": "/b"}]),
        json!([{"op": "add", "path": "/$metadata/x", "value": 1}]),
        json!([{"op": "add", "path": "/a", "value": 1}, {"op": "add", "path": "/c1", "value": 3}]),
    ] {
        assert!(
            matches!(
                store.patch_digital_twin("d", None, &bad, &IfMatch::Any, common::at(2)),
                Err(TwinError::Invalid(_))
            ),
            "{bad}"
        );
    }
    let stale = IfMatch::Etag("stale".into());
    let good = json!([{"op": "add", "path": "/c1/target", "value": 21}, {"op": "add", "path": "/fan", "value": 2}]);
    assert!(matches!(
        store.patch_digital_twin("d", None, &good, &stale, common::at(2)),
        Err(TwinError::EtagMismatch { .. })
    ));
    assert!(matches!(
        store.patch_digital_twin("nobody", None, &good, &IfMatch::Any, common::at(2)),
        Err(TwinError::NotFound { .. })
    ));
    assert_eq!(
        store.get_twin("d", None).unwrap().record,
        before,
        "nothing was stored"
    );

    let outcome = store
        .patch_digital_twin(
            "d",
            None,
            &good,
            &IfMatch::Etag(before.etag.clone()),
            common::at(3),
        )
        .unwrap();
    let (desired, version) = outcome.desired_change.unwrap();
    assert_eq!(
        Value::Object(desired),
        json!({"c1": {"__t": "c", "target": 21}, "fan": 2})
    );
    assert_eq!(version, 2);
    let (view, _) = store.get_digital_twin("d", None, &ms).unwrap();
    assert_eq!(
        view["c1"]["$metadata"]["target"],
        json!({"desiredValue": 21, "desiredVersion": 2})
    );
    assert_eq!(
        view["$metadata"]["fan"],
        json!({"desiredValue": 2, "desiredVersion": 2})
    );
    assert_eq!(view["$metadata"]["$model"], MODEL);
    let changes = digital(store.read_notifications(0, 100).unwrap());
    let last = changes.last().unwrap().body["patch"]
        .as_array()
        .unwrap()
        .clone();
    assert!(last.contains(&json!({"op": "add", "path": "/c1/$metadata/target", "value": {"desiredValue": 21, "desiredVersion": 2}})));
}
