//! Scheduled job records (issue 15, part 3): one job per id, rows and progress written
//! together, finished jobs frozen, and everything still there after a reopen.

mod common;

use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::scheduled_jobs::{
    DeviceJobRow, DeviceJobStatus, JobCursor, ScheduledJob, ScheduledJobError, ScheduledJobKind,
    ScheduledJobStatus,
};

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
