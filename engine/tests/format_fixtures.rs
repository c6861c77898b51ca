//! ENG-4: old databases open and migrate; newer ones are refused untouched.
//!
//! `migrations/fixtures/format_v1` is a database written at schema version 1 by
//! `write_fixture_v1` below (run it with `--ignored` only to regenerate the fixture).

mod common;

use std::path::{Path, PathBuf};

use ferrohub_engine::identity::RegistryStatistics;
use ferrohub_engine::model::{
    AuthType, Authentication, ConnectionState, Identity, IdentitySpec, Status, SymmetricKeys,
    UnixMillis,
};
use ferrohub_engine::{OpenError, Store, StoreConfig, SCHEMA_VERSION};
use ferrohub_migrations::{record, MigrationError, VERSION_KEY};

fn fixture_dir() -> PathBuf {
    manifest_dir().join("../migrations/fixtures/format_v1")
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn v1_device(id: &str, status: Status) -> Identity {
    Identity {
        device_id: id.into(),
        module_id: None,
        generation_id: format!("00000000000000000{}", id.len()),
        etag: "MQ==".into(),
        status,
        status_reason: None,
        status_updated_time: UnixMillis(1_700_000_000_000),
        connection_state: ConnectionState::Disconnected,
        connection_state_updated_time: None,
        last_activity_time: None,
        cloud_to_device_message_count: 0,
        authentication: Authentication {
            kind: AuthType::Sas,
            symmetric_keys: Some(SymmetricKeys {
                primary_key: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=".into(),
                secondary_key: "HxwdHhsaGRgXFhUUExIREA8ODQwLCgkIBwYFBAMCAQA=".into(),
            }),
            thumbprints: None,
        },
        iot_edge: false,
        device_scope: None,
        parent_scopes: vec![],
        managed_by: None,
        model_id: None,
    }
}

#[test]
#[ignore = "regenerates the committed fixture"]
fn write_fixture_v1() {
    let dir = fixture_dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    drop(Store::open_at_version(&dir, StoreConfig::default(), 1).unwrap());
    let db = common::raw_db(&dir);
    let devices = db.cf_handle("devices").unwrap();
    for (id, status) in [
        ("alpha", Status::Enabled),
        ("beta", Status::Enabled),
        ("gamma", Status::Disabled),
    ] {
        db.put_cf(devices, id, record::encode(&v1_device(id, status)))
            .unwrap();
    }
    db.flush_cf(devices).unwrap();
    drop(db);
    // Keep the fixture small and stable: drop RocksDB's info logs.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with("LOG") || name == "LOCK" {
            std::fs::remove_file(dir.join(name)).unwrap();
        }
    }
}

#[test]
fn version_1_fixture_opens_and_migrates() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture_dir(), dir.path());
    {
        let db = common::raw_db(dir.path());
        let meta = db.cf_handle("meta").unwrap();
        let v: u32 = record::decode(&db.get_cf(meta, VERSION_KEY).unwrap().unwrap()).unwrap();
        assert_eq!(v, 1, "the fixture must be a version-1 database");
        assert!(db.cf_handle("counters").is_none());
    }
    let store = common::open(dir.path());
    // m0002 computed the counters from the three stored devices.
    assert_eq!(
        store.registry_statistics().unwrap(),
        RegistryStatistics {
            total_device_count: 3,
            enabled_device_count: 2,
            disabled_device_count: 1
        }
    );
    let alpha = store.get_device("alpha").unwrap();
    assert_eq!(alpha, v1_device("alpha", Status::Enabled));
    // And the migrated database keeps working.
    store
        .create_device("delta", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .delete_device(
            "gamma",
            &ferrohub_engine::model::IfMatch::Any,
            ferrohub_engine::UnixMillis(0),
        )
        .unwrap();
    assert_eq!(
        store.registry_statistics().unwrap(),
        RegistryStatistics {
            total_device_count: 3,
            enabled_device_count: 3,
            disabled_device_count: 0
        }
    );
    drop(store);
    let db = common::raw_db(dir.path());
    let meta = db.cf_handle("meta").unwrap();
    let v: u32 = record::decode(&db.get_cf(meta, VERSION_KEY).unwrap().unwrap()).unwrap();
    assert_eq!(v, SCHEMA_VERSION);
}

#[test]
fn newer_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    common::open(dir.path())
        .create_device("d", &IdentitySpec::default(), common::T0)
        .unwrap();
    {
        let db = common::raw_db(dir.path());
        let meta = db.cf_handle("meta").unwrap();
        db.put_cf(meta, VERSION_KEY, record::encode(&(SCHEMA_VERSION + 1)))
            .unwrap();
    }
    let err = match Store::open(dir.path(), StoreConfig::default()) {
        Err(e) => e,
        Ok(_) => panic!("a newer database must not open"),
    };
    assert!(
        matches!(err, OpenError::Schema(MigrationError::TooNew { found, latest }) if found == SCHEMA_VERSION + 1 && latest == SCHEMA_VERSION)
    );
    assert!(err.to_string().contains("newer"), "{err}");
    let db = common::raw_db(dir.path());
    let meta = db.cf_handle("meta").unwrap();
    let v: u32 = record::decode(&db.get_cf(meta, VERSION_KEY).unwrap().unwrap()).unwrap();
    assert_eq!(v, SCHEMA_VERSION + 1, "the version must be left as found");
}

/// The package directory of the tree under test, read when the test runs: a compile-time path
/// would point at whichever checkout first built this binary into the shared target directory.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
