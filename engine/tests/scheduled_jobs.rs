//! Scheduled job records (issue 15, part 3): one job per id, rows and progress written
//! together, finished jobs frozen, and everything still there after a reopen.

mod common;

use ferrohub_engine::model::{IdentitySpec, UnixMillis};
use ferrohub_engine::scheduled_jobs::{
    DeviceJobRow, DeviceJobStatus, JobCursor, JobTarget, ScheduledJob, ScheduledJobError,
    ScheduledJobKind, ScheduledJobStatus,
};
use ferrohub_engine::twin::store::TwinWrite;

fn job(id: &str) -> ScheduledJob {
    ScheduledJob {
        id: id.into(),
        kind: ScheduledJobKind::UpdateTwin,
        status: ScheduledJobStatus::Queued,
        query_condition: "tags.x = 'y'".into(),
        created: common::T0,
        start: common::T0,
        max_execution_secs: 3600,
        ended: None,
        spec: r#"{"tags":{"done":true}}"#.into(),
        failure_reason: None,
        cursor: None,
        statistics: Default::default(),
        cancel_requested: false,
    }
}

fn row(job_id: &str, device: &str, module: Option<&str>) -> DeviceJobRow {
    DeviceJobRow {
        job_id: job_id.into(),
        device_id: device.into(),
        module_id: module.map(str::to_string),
        kind: ScheduledJobKind::UpdateTwin,
        status: DeviceJobStatus::Completed,
        created: common::T0,
        start: common::T0,
        end: UnixMillis(common::T0.0 + 1_000),
        last_updated: UnixMillis(common::T0.0 + 1_000),
        outcome: "{}".into(),
        error: None,
    }
}

#[test]
fn one_job_per_id_rows_with_progress_and_finished_jobs_frozen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = common::open(dir.path());
        store.create_scheduled_job(&job("j1")).unwrap();
        store.create_scheduled_job(&job("j2")).unwrap();
        assert!(matches!(
            store.create_scheduled_job(&job("j1")),
            Err(ScheduledJobError::AlreadyExists(id)) if id == "j1"
        ));
        assert!(matches!(
            store.get_scheduled_job("nope"),
            Err(ScheduledJobError::NotFound(_))
        ));
        // Rows and the cursor land together.
        let stored = store
            .record_device_jobs(
                "j1",
                &[
                    row("j1", "b", None),
                    row("j1", "a", None),
                    row("j1", "a", Some("m")),
                ],
                |j| {
                    j.status = ScheduledJobStatus::Running;
                    j.cursor = Some(JobCursor {
                        device_id: "b".into(),
                        module_id: None,
                    });
                    j.statistics.succeeded = 3;
                },
            )
            .unwrap();
        assert_eq!(stored.statistics.succeeded, 3);
        store
            .record_device_jobs("j2", &[row("j2", "a", None)], |_| {})
            .unwrap();
        let rows: Vec<_> = store
            .device_job_rows_of("j1")
            .unwrap()
            .into_iter()
            .map(|r| (r.device_id, r.module_id))
            .collect();
        assert_eq!(
            rows,
            [
                ("a".into(), None),
                ("a".into(), Some("m".into())),
                ("b".into(), None)
            ]
        );
        // Paging over every job's rows, in (job, identity) order.
        let first = store.device_job_rows(None, 2).unwrap();
        let rest = store.device_job_rows(Some(&first[1].0), 10).unwrap();
        let all: Vec<_> = first
            .iter()
            .chain(&rest)
            .map(|(_, r)| (r.job_id.clone(), r.device_id.clone()))
            .collect();
        assert_eq!(all.len(), 4);
        assert_eq!(all[3], ("j2".into(), "a".into()));
        // A finished job changes no more, and its rows are not added to.
        store
            .update_scheduled_job("j1", |j| {
                j.status = ScheduledJobStatus::Cancelled;
                j.ended = Some(common::T0);
            })
            .unwrap();
        let after = store
            .record_device_jobs("j1", &[row("j1", "c", None)], |j| {
                j.status = ScheduledJobStatus::Running
            })
            .unwrap();
        assert_eq!(after.status, ScheduledJobStatus::Cancelled);
        assert_eq!(store.device_job_rows_of("j1").unwrap().len(), 3);
    }
    // Durable: the records are there after a reopen.
    let store = common::open(dir.path());
    let jobs = store.list_scheduled_jobs().unwrap();
    assert_eq!(
        jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        ["j1", "j2"]
    );
    assert_eq!(
        jobs[0].cursor,
        Some(JobCursor {
            device_id: "b".into(),
            module_id: None
        })
    );
    assert_eq!(store.device_job_rows(None, 100).unwrap().len(), 4);
}

fn target(device: &str) -> JobTarget {
    JobTarget {
        device_id: device.into(),
        module_id: None,
    }
}

fn tag_write() -> TwinWrite {
    let tags = serde_json::json!({"done": true, "n": 1});
    TwinWrite {
        tags: tags.as_object().cloned(),
        desired: serde_json::json!({"mode": "eco"}).as_object().cloned(),
    }
}

#[test]
fn a_twin_job_page_is_one_batch_of_twins_rows_notifications_and_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    for d in ["a", "b", "c"] {
        store
            .create_device(d, &IdentitySpec::default(), common::T0)
            .unwrap();
    }
    store.create_scheduled_job(&job("tj")).unwrap();
    let before = store.read_notifications(0, 100).unwrap().len();
    let now = UnixMillis(common::T0.0 + 10);
    let page = store
        .apply_twin_job_batch(
            "tj",
            &[target("a"), target("gone"), target("c")],
            &tag_write(),
            now,
        )
        .unwrap();
    assert_eq!(page.outcomes.len(), 2);
    assert_eq!(page.job.cursor.as_ref().unwrap().device_id, "c");
    let stats = page.job.statistics;
    assert_eq!(
        (stats.device_count, stats.succeeded, stats.failed),
        (3, 2, 1)
    );
    // Twins patched once each, with one change notification each.
    for d in ["a", "c"] {
        let twin = store.get_twin(d, None).unwrap();
        assert_eq!(twin.record.tags["done"], serde_json::json!(true));
        assert_eq!(twin.record.desired.version, 2);
    }
    assert_eq!(store.get_twin("b", None).unwrap().record.tags.len(), 0);
    assert_eq!(store.read_notifications(0, 100).unwrap().len(), before + 2);
    let rows = store.device_job_rows_of("tj").unwrap();
    let statuses: Vec<_> = rows
        .iter()
        .map(|r| (r.device_id.as_str(), r.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("a", DeviceJobStatus::Completed),
            ("c", DeviceJobStatus::Completed),
            ("gone", DeviceJobStatus::Failed)
        ]
    );
    assert_eq!(rows[2].error.as_ref().unwrap().0, "DeviceNotFound");

    // A cancelled job takes no further page.
    let cancelled = store.cancel_scheduled_job("tj", now).unwrap();
    assert_eq!(cancelled.status, ScheduledJobStatus::Cancelled);
    let after = store
        .apply_twin_job_batch("tj", &[target("b")], &tag_write(), now)
        .unwrap();
    assert!(after.outcomes.is_empty());
    assert_eq!(store.get_twin("b", None).unwrap().record.version, 1);
    assert_eq!(store.device_job_rows_of("tj").unwrap().len(), 3);
}

#[test]
fn ending_a_job_settles_the_rows_still_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::open(dir.path());
    let mut method_job = job("mj");
    method_job.kind = ScheduledJobKind::DeviceMethod;
    store.create_scheduled_job(&method_job).unwrap();
    let mut waiting = row("mj", "offline", None);
    waiting.status = DeviceJobStatus::Scheduled;
    let done = row("mj", "online", None);
    store
        .record_device_jobs("mj", &[waiting, done], |j| {
            j.statistics.device_count = 2;
            j.statistics.pending = 1;
            j.statistics.succeeded = 1;
        })
        .unwrap();
    assert_eq!(store.waiting_rows("mj").unwrap().len(), 1);
    let end = UnixMillis(common::T0.0 + 5_000);
    let job = store
        .finish_scheduled_job(
            "mj",
            end,
            ScheduledJobStatus::Completed,
            None,
            ("JobRunPreconditionFailed", "did not come online"),
        )
        .unwrap();
    assert_eq!(job.status, ScheduledJobStatus::Completed);
    assert_eq!(job.ended, Some(end));
    assert_eq!(
        (
            job.statistics.failed,
            job.statistics.succeeded,
            job.statistics.pending
        ),
        (1, 1, 0)
    );
    let rows = store.device_job_rows_of("mj").unwrap();
    let offline = rows.iter().find(|r| r.device_id == "offline").unwrap();
    assert_eq!(offline.status, DeviceJobStatus::Failed);
    assert_eq!(
        offline.error.as_ref().unwrap().0,
        "JobRunPreconditionFailed"
    );
    assert!(store.waiting_rows("mj").unwrap().is_empty());
    // Finished: a cancel changes nothing.
    let again = store.cancel_scheduled_job("mj", end).unwrap();
    assert_eq!(again.status, ScheduledJobStatus::Completed);
}
