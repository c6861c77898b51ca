//! REG-1..REG-3: registry rules at the engine level.

mod common;

use ferrohub_engine::identity::{BulkItem, ImportMode};
use ferrohub_engine::model::{
    AuthType, IdentitySpec, IfMatch, KeysSpec, Status, UnixMillis, MAX_MODULES_PER_DEVICE,
};
use ferrohub_engine::RegistryError;

#[test]
fn etags_change_and_guard_updates() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let d = store
        .create_device("d1", &IdentitySpec::default(), common::T0)
        .unwrap();
    assert!(matches!(
        store.create_device("d1", &IdentitySpec::default(), common::T0),
        Err(RegistryError::DeviceAlreadyExists(_))
    ));
    let u = store
        .update_device(
            "d1",
            &common::disabled("maintenance"),
            &IfMatch::Etag(d.etag.clone()),
            common::T0,
        )
        .unwrap();
    assert_ne!(u.etag, d.etag);
    assert_eq!(u.generation_id, d.generation_id);
    assert_eq!(
        u.authentication, d.authentication,
        "keys are kept when the update names none"
    );
    let stale = store.update_device(
        "d1",
        &IdentitySpec::default(),
        &IfMatch::Etag(d.etag.clone()),
        common::T0,
    );
    assert!(matches!(stale, Err(RegistryError::EtagMismatch { .. })));
    assert_eq!(
        store.get_device("d1").unwrap(),
        u,
        "a refused update changes nothing"
    );
    assert!(matches!(
        store.delete_device("d1", &IfMatch::Etag(d.etag), UnixMillis(0)),
        Err(RegistryError::EtagMismatch { .. })
    ));
    store
        .delete_device("d1", &IfMatch::Etag(u.etag), UnixMillis(0))
        .unwrap();
    assert!(matches!(
        store.get_device("d1"),
        Err(RegistryError::DeviceNotFound(_))
    ));
    let again = store
        .create_device("d1", &IdentitySpec::default(), common::T0)
        .unwrap();
    assert_ne!(
        again.generation_id, d.generation_id,
        "a re-created device has a new generation"
    );
}

#[test]
fn statistics_follow_status() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("a", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .create_device("b", &common::disabled("x"), common::T0)
        .unwrap();
    let s = store.registry_statistics().unwrap();
    assert_eq!(
        (
            s.total_device_count,
            s.enabled_device_count,
            s.disabled_device_count
        ),
        (2, 1, 1)
    );
    store
        .update_device("b", &IdentitySpec::default(), &IfMatch::Any, common::T0)
        .unwrap();
    store
        .delete_device("a", &IfMatch::Any, UnixMillis(0))
        .unwrap();
    let s = store.registry_statistics().unwrap();
    assert_eq!(
        (
            s.total_device_count,
            s.enabled_device_count,
            s.disabled_device_count
        ),
        (1, 1, 0)
    );
}

#[test]
fn modules_are_limited_and_deleted_with_their_device() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    assert!(matches!(
        store.create_module("nope", "m", &IdentitySpec::default(), common::T0),
        Err(RegistryError::DeviceNotFound(_))
    ));
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .create_device("d0", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .create_module("d0", "other", &IdentitySpec::default(), common::T0)
        .unwrap();
    for i in 0..MAX_MODULES_PER_DEVICE {
        store
            .create_module("d", &format!("m{i}"), &IdentitySpec::default(), common::T0)
            .unwrap();
    }
    assert!(matches!(
        store.create_module("d", "one-too-many", &IdentitySpec::default(), common::T0),
        Err(RegistryError::TooManyModules { .. })
    ));
    assert_eq!(
        store.list_modules("d").unwrap().len(),
        MAX_MODULES_PER_DEVICE
    );
    store
        .delete_device("d", &IfMatch::Any, UnixMillis(0))
        .unwrap();
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    assert!(
        store.list_modules("d").unwrap().is_empty(),
        "modules died with their device"
    );
    assert_eq!(
        store.list_modules("d0").unwrap().len(),
        1,
        "a device with a prefix-sharing id is untouched"
    );
}

#[test]
fn invalid_input_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    assert!(matches!(
        store.create_device(&"x".repeat(129), &IdentitySpec::default(), common::T0),
        Err(RegistryError::Invalid(_))
    ));
    assert!(matches!(
        store.create_device("a b", &IdentitySpec::default(), common::T0),
        Err(RegistryError::Invalid(_))
    ));
    let long_reason = IdentitySpec {
        status_reason: Some("r".repeat(129)),
        ..IdentitySpec::default()
    };
    assert!(matches!(
        store.create_device("ok", &long_reason, common::T0),
        Err(RegistryError::Invalid(_))
    ));
    let bad_key = IdentitySpec {
        keys: KeysSpec {
            primary_key: Some("short".into()),
            secondary_key: None,
        },
        ..IdentitySpec::default()
    };
    assert!(matches!(
        store.create_device("ok", &bad_key, common::T0),
        Err(RegistryError::Invalid(_))
    ));
    assert!(store.list_devices(10).unwrap().is_empty());
    assert_eq!(store.registry_statistics().unwrap().total_device_count, 0);
}

#[test]
fn bulk_applies_good_items_and_reports_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("exists", &IdentitySpec::default(), common::T0)
        .unwrap();
    let item = |id: &str, mode| BulkItem {
        device_id: id.into(),
        module_id: None,
        mode,
        etag: None,
        spec: IdentitySpec::default(),
        twin: None,
    };
    let mut items: Vec<BulkItem> = (0..98)
        .map(|i| item(&format!("bulk{i}"), ImportMode::Create))
        .collect();
    items.push(item("exists", ImportMode::Create));
    items.push(BulkItem {
        module_id: Some("m".into()),
        ..item("bulk0", ImportMode::Create)
    });
    let errors = store.bulk(&items, common::T0).unwrap();
    assert_eq!(errors.len(), 1);
    assert!(matches!(
        errors[0].error,
        RegistryError::DeviceAlreadyExists(_)
    ));
    assert_eq!(store.registry_statistics().unwrap().total_device_count, 99);
    assert_eq!(
        store.list_modules("bulk0").unwrap().len(),
        1,
        "a module may join a device created in the same request"
    );
    let too_many: Vec<BulkItem> = (0..101)
        .map(|i| item(&format!("x{i}"), ImportMode::Create))
        .collect();
    assert!(matches!(
        store.bulk(&too_many, common::T0),
        Err(RegistryError::TooManyInBulk { .. })
    ));
    let deletes = vec![
        item("bulk1", ImportMode::Delete),
        BulkItem {
            etag: Some("nope".into()),
            ..item("bulk2", ImportMode::DeleteIfMatchETag)
        },
    ];
    let errors = store.bulk(&deletes, common::T0).unwrap();
    assert_eq!(errors.len(), 1);
    assert!(matches!(
        errors[0].error,
        RegistryError::EtagMismatch { .. }
    ));
    assert!(store.get_device("bulk1").is_err() && store.get_device("bulk2").is_ok());
}

#[test]
fn x509_and_none_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let mut spec = IdentitySpec {
        auth_type: AuthType::SelfSigned,
        ..IdentitySpec::default()
    };
    assert!(
        store.create_device("x", &spec, common::T0).is_err(),
        "selfSigned needs a thumbprint"
    );
    spec.thumbprints.primary = Some("ab".repeat(20));
    let d = store.create_device("x", &spec, common::T0).unwrap();
    assert_eq!(
        d.authentication.thumbprints.unwrap().primary.unwrap(),
        "AB".repeat(20)
    );
    assert!(d.authentication.symmetric_keys.is_none());
    let none = IdentitySpec {
        auth_type: AuthType::None,
        status: Status::Enabled,
        ..IdentitySpec::default()
    };
    assert_eq!(
        store
            .create_device("n", &none, common::T0)
            .unwrap()
            .authentication
            .kind,
        AuthType::None
    );
}

#[test]
fn twins_die_with_their_identities() {
    use ferrohub_engine::twin::store::TwinWrite;
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .create_module("d", "m", &IdentitySpec::default(), common::T0)
        .unwrap();
    let tags = serde_json::json!({"a": 1}).as_object().cloned();
    let write = TwinWrite {
        tags,
        desired: None,
    };
    store
        .update_twin("d", None, &write, &IfMatch::Any, common::T0)
        .unwrap();
    store
        .update_twin("d", Some("m"), &write, &IfMatch::Any, common::T0)
        .unwrap();
    store
        .delete_module("d", "m", &IfMatch::Any, UnixMillis(0))
        .unwrap();
    store
        .create_module("d", "m", &IdentitySpec::default(), common::T0)
        .unwrap();
    assert!(store
        .get_twin("d", Some("m"))
        .unwrap()
        .record
        .tags
        .is_empty());
    assert_eq!(store.get_twin("d", None).unwrap().record.tags.len(), 1);
    store
        .delete_device("d", &IfMatch::Any, UnixMillis(0))
        .unwrap();
    store
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    let fresh = store.get_twin("d", None).unwrap().record;
    assert!(fresh.tags.is_empty());
    assert_eq!(
        (fresh.version, fresh.desired.version, fresh.reported.version),
        (1, 1, 1)
    );
}
