//! Export pages, exact restore, import batches with twins, job records and the
//! file-notification queue.

mod common;

use ferrohub_engine::c2d::file_notifications::{FileNotification, FileNotificationSettings};
use ferrohub_engine::c2d::{C2dError, Settle};
use ferrohub_engine::identity::{BulkItem, ImportMode};
use ferrohub_engine::jobs::{JobError, JobKind, JobRecord, JobStatus};
use ferrohub_engine::model::{IdentitySpec, IfMatch, KeysSpec, UnixMillis};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::RegistryError;
use serde_json::json;

fn obj(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().cloned().unwrap()
}

#[test]
fn pages_hold_whole_devices_and_restore_gives_them_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    for i in 0..25 {
        store
            .create_device(&format!("dev{i:02}"), &IdentitySpec::default(), common::T0)
            .unwrap();
    }
    store
        .create_module("dev03", "m1", &IdentitySpec::default(), common::T0)
        .unwrap();
    store
        .update_twin(
            "dev03",
            None,
            &TwinWrite {
                tags: Some(obj(json!({"site": "a"}))),
                desired: Some(obj(json!({"x": 1}))),
            },
            &IfMatch::Any,
            common::T0,
        )
        .unwrap();
    store
        .patch_reported("dev03", None, &obj(json!({"y": 2})), common::T0)
        .unwrap();

    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = store.archive_page(after.as_deref(), 10).unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        after = Some(page.last().unwrap().device.identity.device_id.clone());
        all.extend(page);
    }
    assert_eq!(all.len(), 25);
    assert!(all
        .windows(2)
        .all(|w| w[0].device.identity.device_id < w[1].device.identity.device_id));
    let dev03 = all
        .iter()
        .find(|d| d.device.identity.device_id == "dev03")
        .unwrap();
    assert_eq!(dev03.modules.len(), 1);
    assert_eq!(dev03.device.twin.reported.body["y"], json!(2));

    let dir2 = tempfile::tempdir().unwrap();
    let restored = common::open(dir2.path());
    restored.restore_devices(&all).unwrap();
    assert_eq!(
        restored.registry_statistics().unwrap().total_device_count,
        25
    );
    for d in &all {
        let id = &d.device.identity.device_id;
        assert_eq!(
            restored.get_device(id).unwrap(),
            store.get_device(id).unwrap()
        );
        assert_eq!(
            restored.get_twin(id, None).unwrap().record,
            store.get_twin(id, None).unwrap().record
        );
    }
    assert_eq!(
        restored.get_module("dev03", "m1").unwrap(),
        store.get_module("dev03", "m1").unwrap()
    );
    // A second restore of the same devices is refused whole: nothing is overwritten.
    let err = restored.restore_devices(&all[..2]).unwrap_err();
    assert!(matches!(err, RegistryError::DeviceAlreadyExists(_)));
    assert_eq!(
        restored.registry_statistics().unwrap().total_device_count,
        25
    );
}

fn item(id: &str, mode: ImportMode, twin: Option<TwinWrite>) -> BulkItem {
    BulkItem {
        device_id: id.into(),
        module_id: None,
        mode,
        etag: None,
        spec: IdentitySpec::default(),
        twin,
    }
}

#[test]
fn import_batches_apply_identity_and_twin_together_and_refuse_bad_twins_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let good = TwinWrite {
        tags: Some(obj(json!({"plant": "Redmond43"}))),
        desired: Some(obj(json!({"interval": 30}))),
    };
    let bad = TwinWrite {
        tags: Some(obj(json!({"$bad": 1}))),
        desired: None,
    };
    // More than a REST bulk request may carry, in one commit.
    let mut items: Vec<BulkItem> = (0..150)
        .map(|i| {
            item(
                &format!("i{i}"),
                ImportMode::CreateOrUpdate,
                Some(good.clone()),
            )
        })
        .collect();
    items.push(item("refused", ImportMode::Create, Some(bad)));
    let errors = store.import_batch(&items, common::T0).unwrap();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].device_id, "refused");
    assert!(matches!(errors[0].error, RegistryError::Invalid(_)));
    assert!(matches!(
        store.get_device("refused"),
        Err(RegistryError::DeviceNotFound(_))
    ));
    let twin = store.get_twin("i7", None).unwrap().record;
    assert_eq!(twin.tags["plant"], json!("Redmond43"));
    assert_eq!(twin.desired.body["interval"], json!(30));
    assert_eq!(twin.version, 2);
    // Update keeps keys it was not given and replaces the twin parts it was given.
    let before = store.get_device("i7").unwrap();
    let update = TwinWrite {
        tags: Some(obj(json!({"plant": "Lyon"}))),
        desired: None,
    };
    let errors = store
        .import_batch(&[item("i7", ImportMode::Update, Some(update))], common::T0)
        .unwrap();
    assert!(errors.is_empty());
    let after = store.get_device("i7").unwrap();
    assert_eq!(after.authentication, before.authentication);
    assert_ne!(after.etag, before.etag);
    let twin = store.get_twin("i7", None).unwrap().record;
    assert_eq!(twin.tags["plant"], json!("Lyon"));
    assert_eq!(twin.desired.body["interval"], json!(30));
    // Given keys are stored as given.
    let keyed = BulkItem {
        spec: IdentitySpec {
            keys: KeysSpec {
                primary_key: Some("cHJpbWFyeWtleXByaW1hcnlrZXk=".into()),
                secondary_key: None,
            },
            ..IdentitySpec::default()
        },
        ..item("keyed", ImportMode::Create, None)
    };
    store.import_batch(&[keyed], common::T0).unwrap();
    let k = store
        .get_device("keyed")
        .unwrap()
        .authentication
        .symmetric_keys
        .unwrap();
    assert_eq!(k.primary_key, "cHJpbWFyeWtleXByaW1hcnlrZXk=");
}

fn job(id: &str) -> JobRecord {
    JobRecord {
        id: id.into(),
        kind: JobKind::Import,
        status: JobStatus::Queued,
        progress: 0,
        created: common::T0,
        started: None,
        ended: None,
        input_container: Some("file:///in".into()),
        output_container: "file:///out".into(),
        input_blob: "devices.txt".into(),
        output_blob: "devices.txt".into(),
        exclude_keys: false,
        failure_reason: None,
        processed: 0,
        errors: 0,
        cancel_requested: false,
    }
}

#[test]
fn one_active_job_and_finished_jobs_do_not_change() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    store.create_job(&job("a")).unwrap();
    assert!(matches!(
        store.create_job(&job("b")),
        Err(JobError::AnotherActive { active, .. }) if active == "a"
    ));
    store
        .update_job("a", |j| j.status = JobStatus::Completed)
        .unwrap();
    let after = store
        .update_job("a", |j| j.status = JobStatus::Running)
        .unwrap();
    assert_eq!(after.status, JobStatus::Completed);
    store.create_job(&job("b")).unwrap();
    drop(store);
    let store = common::open(dir.path());
    let ids: Vec<String> = store
        .list_jobs()
        .unwrap()
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(matches!(store.get_job("zz"), Err(JobError::NotFound(_))));
}

#[test]
fn file_notifications_lock_complete_abandon_and_expire() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let settings = FileNotificationSettings {
        ttl_ms: 10_000,
        lock_timeout_ms: 1_000,
        max_delivery_count: 2,
    };
    let n = |name: &str| FileNotification {
        device_id: "d".into(),
        blob_name: format!("d/{name}"),
        blob_uri: format!("http://x/c/d/{name}"),
        blob_size: 5,
        last_updated: common::T0,
    };
    let t = |ms: i64| UnixMillis(common::T0.0 + ms);
    store
        .enqueue_file_notification(n("a"), t(0), &settings)
        .unwrap();
    store
        .enqueue_file_notification(n("b"), t(0), &settings)
        .unwrap();
    let first = store
        .receive_file_notification(t(1), &settings)
        .unwrap()
        .unwrap();
    assert_eq!(first.notification.blob_name, "d/a");
    // While a is locked, b comes next; then nothing.
    let second = store
        .receive_file_notification(t(2), &settings)
        .unwrap()
        .unwrap();
    assert_eq!(second.notification.blob_name, "d/b");
    assert!(store
        .receive_file_notification(t(3), &settings)
        .unwrap()
        .is_none());
    store
        .settle_file_notification(&second.lock_token, Settle::Complete, t(4))
        .unwrap();
    // a's lock expires: it comes back, delivered a second time, and a stale token is refused.
    let again = store
        .receive_file_notification(t(2_000), &settings)
        .unwrap()
        .unwrap();
    assert_eq!(again.notification.blob_name, "d/a");
    assert_eq!(again.delivery_count, 2);
    assert!(matches!(
        store.settle_file_notification(&first.lock_token, Settle::Complete, t(2_001)),
        Err(C2dError::LockLost(_))
    ));
    store
        .settle_file_notification(&again.lock_token, Settle::Abandon, t(2_002))
        .unwrap();
    // Delivered twice already: dropped at the next receive.
    assert!(store
        .receive_file_notification(t(2_003), &settings)
        .unwrap()
        .is_none());
    // TTL: an old notification is never delivered.
    store
        .enqueue_file_notification(n("c"), t(3_000), &settings)
        .unwrap();
    assert!(store
        .receive_file_notification(t(13_001), &settings)
        .unwrap()
        .is_none());
}
