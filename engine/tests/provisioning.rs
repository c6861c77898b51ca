//! Enrollments, registration states and assignments (DPS-2 to DPS-5): what the engine stores
//! and the rules an assignment follows.

mod common;

use common::{at, open, T0};
use ferrohub_engine::identity::Assignment;
use ferrohub_engine::model::{AuthType, IdentitySpec, IfMatch, KeysSpec};
use ferrohub_engine::provisioning::{
    AttestationSpec, BulkMode, EnrollmentKind, EnrollmentWrite, ProvisioningError,
    RegistrationStatus, ReprovisionPolicy, Substatus,
};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::Store;
use serde_json::json;

fn individual(id: &str) -> EnrollmentWrite {
    EnrollmentWrite {
        kind: EnrollmentKind::Individual,
        id: id.into(),
        attestation: AttestationSpec::SymmetricKey(KeysSpec::default()),
        device_id: None,
        enabled: true,
        initial_tags: Some(json!({"site": "a"}).to_string()),
        initial_desired: Some(json!({"interval": 5}).to_string()),
        iot_edge: false,
        reprovision: ReprovisionPolicy::default(),
        passthrough: "{}".into(),
    }
}

fn sas(key: &str) -> IdentitySpec {
    IdentitySpec {
        auth_type: AuthType::Sas,
        keys: KeysSpec {
            primary_key: Some(key.into()),
            secondary_key: Some(key.into()),
        },
        ..IdentitySpec::default()
    }
}

const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn assign(
    store: &Store,
    id: &str,
    op: &str,
) -> Result<ferrohub_engine::provisioning::RegistrationRecord, ProvisioningError> {
    let e = store
        .get_enrollment(EnrollmentKind::Individual, id)
        .unwrap();
    store.assign_registration(
        Assignment {
            enrollment_kind: EnrollmentKind::Individual,
            enrollment_id: id.into(),
            enrollment_etag: e.etag,
            registration_id: id.into(),
            credentials: sas(KEY),
            payload: Some(r#"{"modelId":"dtmi:x:y;1"}"#.into()),
            operation_id: op.into(),
            assigned_hub: "hub.example".into(),
        },
        at(1000),
    )
}

#[test]
fn enrollments_are_replaced_under_their_etag_and_keys_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let first = store.put_enrollment(individual("r1"), None, T0).unwrap();
    let generated = match &first.attestation {
        ferrohub_engine::provisioning::Attestation::SymmetricKey(k) => k.clone(),
        other => panic!("{other:?}"),
    };
    assert_ne!(generated.primary_key, generated.secondary_key);
    assert!(matches!(
        store.put_enrollment(individual("r1"), None, at(1)),
        Err(ProvisioningError::AlreadyExists(_))
    ));
    let stale = IfMatch::Etag("\"nope\"".into());
    assert!(matches!(
        store.put_enrollment(individual("r1"), Some(&stale), at(1)),
        Err(ProvisioningError::EtagMismatch { .. })
    ));
    let second = store
        .put_enrollment(
            individual("r1"),
            Some(&IfMatch::Etag(first.etag.clone())),
            at(2),
        )
        .unwrap();
    assert_ne!(second.etag, first.etag);
    assert_eq!(second.created, T0);
    assert_eq!(
        second.attestation, first.attestation,
        "keys kept when none are sent"
    );
    assert!(matches!(
        store.put_enrollment(individual("r2"), Some(&IfMatch::Etag("e".into())), at(3)),
        Err(ProvisioningError::EnrollmentNotFound(_))
    ));
    let mut bad = individual("bad/id");
    assert!(matches!(
        store.put_enrollment(bad.clone(), None, T0),
        Err(ProvisioningError::Invalid(_))
    ));
    bad.id = "ok".into();
    bad.initial_tags = None;
    bad.attestation = AttestationSpec::SymmetricKey(KeysSpec {
        primary_key: Some("not base64!".into()),
        secondary_key: None,
    });
    assert!(matches!(
        store.put_enrollment(bad, None, T0),
        Err(ProvisioningError::Invalid(_))
    ));
    assert!(store
        .get_enrollment(EnrollmentKind::Individual, "ok")
        .is_err());
    store
        .delete_enrollment(EnrollmentKind::Individual, "r1", &IfMatch::Any)
        .unwrap();
    assert!(matches!(
        store.get_enrollment(EnrollmentKind::Individual, "r1"),
        Err(ProvisioningError::EnrollmentNotFound(_))
    ));
}

#[test]
fn listings_page_in_id_order_and_bulk_reports_each_failure() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let items = (0..5)
        .map(|i| (BulkMode::Create, individual(&format!("r{i}")), None))
        .collect();
    assert!(store.bulk_enrollments(items, T0).unwrap().is_empty());
    let page = store
        .list_enrollments(EnrollmentKind::Individual, None, 2)
        .unwrap();
    assert_eq!(page.items.len(), 2);
    let next = page.continuation.unwrap();
    let rest = store
        .list_enrollments(EnrollmentKind::Individual, Some(&next), 10)
        .unwrap();
    let ids: Vec<_> = rest.items.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["r2", "r3", "r4"]);
    assert!(rest.continuation.is_none());
    assert!(store
        .list_enrollments(EnrollmentKind::Group, None, 10)
        .unwrap()
        .items
        .is_empty());
    let errors = store
        .bulk_enrollments(
            vec![
                (BulkMode::Create, individual("r0"), None),
                (BulkMode::Create, individual("r9"), None),
                (
                    BulkMode::UpdateIfMatchEtag,
                    individual("r1"),
                    Some("\"x\"".into()),
                ),
                (BulkMode::Delete, individual("r2"), None),
                (BulkMode::Delete, individual("missing"), None),
            ],
            at(1),
        )
        .unwrap();
    let failed: Vec<_> = errors.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(failed, ["r0", "r1", "missing"]);
    assert!(store
        .get_enrollment(EnrollmentKind::Individual, "r9")
        .is_ok());
    assert!(store
        .get_enrollment(EnrollmentKind::Individual, "r2")
        .is_err());
    let too_many = (0..11)
        .map(|i| (BulkMode::Create, individual(&format!("x{i}")), None))
        .collect();
    assert!(matches!(
        store.bulk_enrollments(too_many, at(2)),
        Err(ProvisioningError::TooManyInBulk { .. })
    ));
}

#[test]
fn a_first_assignment_creates_the_device_with_its_initial_twin_in_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path());
        store.put_enrollment(individual("r1"), None, T0).unwrap();
        let record = assign(&store, "r1", "op1").unwrap();
        assert_eq!(record.status, RegistrationStatus::Assigned);
        assert_eq!(record.substatus, Substatus::InitialAssignment);
        assert_eq!(record.device_id, "r1");
    }
    // Reopened: the device, its twin and the registration state are all durable.
    let store = open(dir.path());
    let device = store.get_device("r1").unwrap();
    assert_eq!(
        device.authentication.symmetric_keys.unwrap().primary_key,
        KEY
    );
    let twin = store.get_twin("r1", None).unwrap();
    assert_eq!(twin.record.tags["site"], "a");
    assert_eq!(twin.record.desired.body["interval"], 5);
    let state = store.get_registration("r1").unwrap();
    assert_eq!(state.operation_id, "op1");
    assert_eq!(
        state.payload.as_deref(),
        Some(r#"{"modelId":"dtmi:x:y;1"}"#)
    );
}

#[test]
fn reprovisioning_follows_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for (id, update, migrate) in [
        ("keep", false, true),
        ("migrate", true, true),
        ("reset", true, false),
    ] {
        let mut w = individual(id);
        w.reprovision = ReprovisionPolicy {
            update_hub_assignment: update,
            migrate_device_data: migrate,
        };
        store.put_enrollment(w, None, T0).unwrap();
        assign(&store, id, "op1").unwrap();
        // The operator changes the twin after the first assignment.
        let write = TwinWrite {
            tags: Some(serde_json::from_value(json!({"site": "moved"})).unwrap()),
            desired: None,
        };
        store
            .update_twin(id, None, &write, &IfMatch::Any, at(500))
            .unwrap();
    }
    let sub = |id| assign(&store, id, "op2").unwrap().substatus;
    assert_eq!(sub("keep"), Substatus::InitialAssignment);
    assert_eq!(sub("migrate"), Substatus::DeviceDataMigrated);
    assert_eq!(sub("reset"), Substatus::DeviceDataReset);
    assert_eq!(
        store.get_twin("reset", None).unwrap().record.tags["site"],
        "a"
    );
    assert_eq!(
        store.get_twin("migrate", None).unwrap().record.tags["site"],
        "moved"
    );
}

#[test]
fn a_changed_or_disabled_enrollment_assigns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let e = store.put_enrollment(individual("r1"), None, T0).unwrap();
    store
        .put_enrollment(individual("r1"), Some(&IfMatch::Any), at(1))
        .unwrap();
    let stale = Assignment {
        enrollment_kind: EnrollmentKind::Individual,
        enrollment_id: "r1".into(),
        enrollment_etag: e.etag,
        registration_id: "r1".into(),
        credentials: sas(KEY),
        payload: None,
        operation_id: "op".into(),
        assigned_hub: "h".into(),
    };
    assert!(matches!(
        store.assign_registration(stale, at(2)),
        Err(ProvisioningError::EnrollmentChanged(_))
    ));
    let mut disabled = individual("r1");
    disabled.enabled = false;
    store
        .put_enrollment(disabled, Some(&IfMatch::Any), at(3))
        .unwrap();
    assert!(matches!(
        assign(&store, "r1", "op"),
        Err(ProvisioningError::EnrollmentDisabled(_))
    ));
    assert!(store.get_device("r1").is_err());
    assert!(store.get_registration("r1").is_err());
}

#[test]
fn an_export_restores_every_record_verbatim() {
    let (from, to) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = open(from.path());
    source.put_enrollment(individual("r1"), None, T0).unwrap();
    let mut group = individual("g1");
    group.kind = EnrollmentKind::Group;
    group.device_id = None;
    source.put_enrollment(group, None, T0).unwrap();
    assign(&source, "r1", "op1").unwrap();
    let (enrollments, registrations) = source.export_provisioning().unwrap();
    assert_eq!((enrollments.len(), registrations.len()), (2, 1));
    let target = open(to.path());
    target
        .restore_provisioning(&enrollments, &registrations)
        .unwrap();
    assert_eq!(
        target.export_provisioning().unwrap(),
        (enrollments, registrations)
    );
    assert_eq!(target.get_registration("r1").unwrap().operation_id, "op1");
}

fn group(id: &str) -> EnrollmentWrite {
    EnrollmentWrite {
        kind: EnrollmentKind::Group,
        device_id: None,
        ..individual(id)
    }
}

#[test]
fn registrations_of_one_group_run_together_and_each_id_gets_one_device() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(open(dir.path()));
    let g = store.put_enrollment(group("line-1"), None, T0).unwrap();
    // 8 threads, 24 registration ids, each id assigned by 3 threads at once.
    let ops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::scope(|s| {
        for t in 0..8 {
            let (store, g, ops) = (store.clone(), g.clone(), ops.clone());
            s.spawn(move || {
                for n in 0..9 {
                    let rid = format!("dev-{}", (t * 9 + n) % 24);
                    let op = format!("op-{t}-{n}");
                    let record = store
                        .assign_registration(
                            Assignment {
                                enrollment_kind: EnrollmentKind::Group,
                                enrollment_id: g.id.clone(),
                                enrollment_etag: g.etag.clone(),
                                registration_id: rid.clone(),
                                credentials: sas(KEY),
                                payload: None,
                                operation_id: op,
                                assigned_hub: "hub.example".into(),
                            },
                            at(1000 + n as i64),
                        )
                        .unwrap();
                    assert_eq!(record.device_id, rid);
                    ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(ops.load(std::sync::atomic::Ordering::Relaxed), 72);
    let devices = store.list_devices(1000).unwrap();
    assert_eq!(devices.len(), 24, "one device per registration id");
    for d in &devices {
        let state = store.get_registration(&d.device_id).unwrap();
        assert_eq!(state.device_id, d.device_id);
        assert_eq!(state.enrollment_id, "line-1");
    }
}

#[test]
fn the_groups_generation_moves_with_group_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let before = store.enrollment_groups_generation().unwrap();
    store.put_enrollment(individual("r1"), None, T0).unwrap();
    assign(&store, "r1", "op1").unwrap();
    assert_eq!(store.enrollment_groups_generation().unwrap(), before);
    let g = store.put_enrollment(group("g1"), None, T0).unwrap();
    let created = store.enrollment_groups_generation().unwrap();
    assert_ne!(created, before);
    store
        .put_enrollment(group("g1"), Some(&IfMatch::Etag(g.etag)), at(1))
        .unwrap();
    let replaced = store.enrollment_groups_generation().unwrap();
    assert_ne!(replaced, created);
    store
        .delete_enrollment(EnrollmentKind::Group, "g1", &IfMatch::Any)
        .unwrap();
    assert_ne!(store.enrollment_groups_generation().unwrap(), replaced);
}
