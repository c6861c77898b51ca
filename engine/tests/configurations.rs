//! Automatic device configuration records and what they write to twins (issue 15, part 4):
//! create-or-409, etag-checked updates with immutable content, delete; and conditional
//! writes of the desired patch and the `configurations` map.

mod common;

use std::collections::BTreeMap;

use ferrohub_engine::configurations::{Configuration, ConfigurationError};
use ferrohub_engine::model::{IdentitySpec, IfMatch, UnixMillis};
use ferrohub_engine::twin::configured::ConfiguredTwin;
use ferrohub_engine::twin::record::AppliedConfiguration;
use ferrohub_engine::TwinError;

fn config(id: &str) -> Configuration {
    Configuration {
        id: id.into(),
        schema_version: "1.0".into(),
        labels: "{}".into(),
        content: r#"{"deviceContent":{"properties.desired.a":1}}"#.into(),
        target_condition: "*".into(),
        priority: 1,
        created: UnixMillis(0),
        last_updated: UnixMillis(0),
        metrics: "{}".into(),
        etag: String::new(),
    }
}

#[test]
fn configurations_are_created_once_updated_by_etag_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let created = store
        .put_configuration(config("c"), None, common::T0)
        .unwrap();
    assert_eq!(created.created, common::T0);
    assert!(matches!(
        store.put_configuration(config("c"), None, common::T0),
        Err(ConfigurationError::AlreadyExists(_))
    ));
    let stale = IfMatch::Etag("nope".into());
    assert!(matches!(
        store.put_configuration(config("c"), Some(&stale), common::T0),
        Err(ConfigurationError::EtagMismatch { .. })
    ));
    let mut changed = config("c");
    changed.content = "{}".into();
    assert!(matches!(
        store.put_configuration(changed, Some(&IfMatch::Any), common::T0),
        Err(ConfigurationError::ContentChanged(_))
    ));
    let mut raised = config("c");
    raised.priority = 9;
    let later = UnixMillis(common::T0.0 + 5);
    let updated = store
        .put_configuration(raised, Some(&IfMatch::Etag(created.etag.clone())), later)
        .unwrap();
    assert_eq!(
        (updated.priority, updated.created, updated.last_updated),
        (9, common::T0, later)
    );
    assert_ne!(updated.etag, created.etag);
    assert_eq!(store.list_configurations().unwrap().len(), 1);
    assert!(store.delete_configuration("c", &stale).is_err());
    store.delete_configuration("c", &IfMatch::Any).unwrap();
    assert!(matches!(
        store.get_configuration("c"),
        Err(ConfigurationError::NotFound(_))
    ));
}

#[test]
fn configured_twins_are_written_only_onto_the_twin_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let before = store.get_twin("d", None).unwrap();
    let mut map = BTreeMap::new();
    map.insert(
        "c".to_string(),
        AppliedConfiguration {
            status: "Applied".into(),
            owned: vec!["a".into()],
        },
    );
    let decision = ConfiguredTwin {
        desired: serde_json::json!({"a": 1}).as_object().cloned(),
        configurations: map.clone(),
    };
    let outcome = store
        .apply_configured_twin("d", None, &before.record.etag, &decision, common::T0)
        .unwrap()
        .expect("desired changed");
    assert_eq!(outcome.twin.record.desired.body["a"], 1);
    assert_eq!(outcome.twin.record.configurations, map);
    // The etag read before is stale now: nothing is written.
    assert!(matches!(
        store.apply_configured_twin("d", None, &before.record.etag, &decision, common::T0),
        Err(TwinError::EtagMismatch { .. })
    ));
    // A map-only change keeps the twin's version and etag.
    let now = store.get_twin("d", None).unwrap();
    let targeted = ConfiguredTwin {
        desired: None,
        configurations: BTreeMap::new(),
    };
    assert!(store
        .apply_configured_twin("d", None, &now.record.etag, &targeted, common::T0)
        .unwrap()
        .is_none());
    let after = store.get_twin("d", None).unwrap();
    assert!(after.record.configurations.is_empty());
    assert_eq!(
        (after.record.version, &after.record.etag),
        (now.record.version, &now.record.etag)
    );
}
