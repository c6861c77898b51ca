//! ENG-5: a damaged record is reported as corruption with its key, never served.

mod common;

use ferrohub_engine::model::IdentitySpec;
use ferrohub_engine::{RegistryError, StorageError};

#[test]
fn flipped_byte_is_reported_with_the_key() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path());
        store
            .create_device("victim", &IdentitySpec::default(), common::T0)
            .unwrap();
        store
            .create_device("bystander", &IdentitySpec::default(), common::T0)
            .unwrap();
        store.close().unwrap();
    }
    {
        let db = common::raw_db(dir.path());
        let cf = db.cf_handle("devices").unwrap();
        let mut value = db.get_cf(cf, b"victim").unwrap().unwrap();
        let last = value.len() - 1;
        value[last] ^= 0x20;
        db.put_cf(cf, b"victim", value).unwrap();
    }
    let store = common::open(dir.path());
    match store.get_device("victim") {
        Err(RegistryError::Storage(StorageError::Corruption { cf, key, .. })) => {
            assert_eq!(cf, "devices");
            assert!(key.to_string().contains("victim"), "key shown as {key}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    // The error message names the key, and other records are still served.
    let msg = store.get_device("victim").unwrap_err().to_string();
    assert!(msg.contains("victim") && msg.contains("corrupt"), "{msg}");
    assert!(store.get_device("bystander").is_ok());
    // A listing that meets the damaged record fails rather than skipping it silently.
    assert!(matches!(
        store.list_devices(10),
        Err(RegistryError::Storage(StorageError::Corruption { .. }))
    ));
}
