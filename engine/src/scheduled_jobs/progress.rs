//! A scheduled job's progress: twin updates applied a page at a time, cancel, and the end of
//! a job with the rows still waiting for their devices.
//!
//! # Invariants
//! - A page of a twin job is one atomic batch: every twin patch, its change notification, the
//!   page's rows and the job's cursor and statistics. After a crash either all of the page is
//!   stored or none of it, so a runner resuming after the cursor patches each twin once.
//! - Nothing is written for a job that is no longer active: once a cancel or the end is
//!   stored, a page still in flight changes nothing.
//! - Lock order: the job lock, then the devices' stripe locks.

use ferrohub_migrations::cf;

use super::{
    job_key, row_key, DeviceJobRow, DeviceJobStatus, JobCursor, ScheduledJob, ScheduledJobError,
    ScheduledJobKind, ScheduledJobStatus,
};
use crate::error::{StorageError, TwinError};
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::twin::store::{TwinOutcome, TwinWrite};
use crate::Store;

/// An identity a job reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTarget {
    pub device_id: String,
    pub module_id: Option<String>,
}

/// What one page of a twin job did.
#[derive(Debug)]
pub struct TwinJobBatch {
    /// The job as stored afterwards.
    pub job: ScheduledJob,
    /// The twins written, for pushing desired changes to connected devices.
    pub outcomes: Vec<TwinOutcome>,
}

fn new_row(job: &ScheduledJob, t: &JobTarget, now: UnixMillis) -> DeviceJobRow {
    DeviceJobRow {
        job_id: job.id.clone(),
        device_id: t.device_id.clone(),
        module_id: t.module_id.clone(),
        kind: job.kind,
        status: DeviceJobStatus::Completed,
        created: now,
        start: job.start,
        end: UnixMillis(job.start.0 + (job.max_execution_secs as i64) * 1000),
        last_updated: now,
        outcome: "{}".to_string(),
        error: None,
    }
}

impl Store {
    /// Applies a twin job's patch to `targets` (the next page, in identity order after the
    /// job's cursor): each existing identity's twin is patched, each gets its row, and the
    /// cursor moves to the last target, all in one batch. Nothing is written when the job is
    /// no longer active.
    ///
    /// # Errors
    /// [`ScheduledJobError::NotFound`] or storage errors. A twin the patch cannot be applied
    /// to (deleted identity, TWN-7 limits) gets a failed row instead.
    pub fn apply_twin_job_batch(
        &self,
        job_id: &str,
        targets: &[JobTarget],
        write: &TwinWrite,
        now: UnixMillis,
    ) -> Result<TwinJobBatch, ScheduledJobError> {
        let _job_guard = self.scheduled_job_lock.0.lock();
        let mut job = self.get_scheduled_job(job_id)?;
        if !job.status.is_active() || job.kind != ScheduledJobKind::UpdateTwin {
            return Ok(TwinJobBatch {
                job,
                outcomes: Vec::new(),
            });
        }
        let _guards = self
            .stripes
            .lock_many(targets.iter().map(|t| t.device_id.as_str()));
        let mut batch = Batch::default();
        let mut notes = Vec::new();
        let mut outcomes = Vec::new();
        for t in targets {
            let mut row = new_row(&job, t, now);
            let staged = match self.find_identity(&t.device_id, t.module_id.as_deref())? {
                None => Err((
                    "DeviceNotFound",
                    "The device was deleted before the job reached it.".to_string(),
                )),
                Some(identity) => match self.stage_twin_patch(identity, write, now, &mut batch) {
                    Ok(done) => Ok(done),
                    Err(TwinError::Storage(e)) => return Err(e.into()),
                    Err(e) => Err(("ArgumentInvalid", e.to_string())),
                },
            };
            match staged {
                Ok((staged_notes, outcome)) => {
                    notes.extend(staged_notes);
                    outcomes.push(outcome);
                    job.statistics.succeeded += 1;
                }
                Err((code, description)) => {
                    row.status = DeviceJobStatus::Failed;
                    row.error = Some((code.to_string(), description));
                    job.statistics.failed += 1;
                }
            }
            job.statistics.device_count += 1;
            batch.put_record(cf::META, row_key(&row), &row);
        }
        if let Some(last) = targets.last() {
            job.cursor = Some(JobCursor {
                device_id: last.device_id.clone(),
                module_id: last.module_id.clone(),
            });
        }
        batch.put_record(cf::META, job_key(job_id), &job);
        self.commit_with_notifications(batch, notes)?;
        Ok(TwinJobBatch { job, outcomes })
    }

    /// Cancels a job: it ends now, `cancelled`, and its rows still waiting for a device become
    /// `canceled`, in one batch. A finished job is returned unchanged.
    ///
    /// # Errors
    /// [`ScheduledJobError::NotFound`] or storage errors.
    pub fn cancel_scheduled_job(
        &self,
        id: &str,
        now: UnixMillis,
    ) -> Result<ScheduledJob, ScheduledJobError> {
        self.end_scheduled_job(id, now, ScheduledJobStatus::Cancelled, None, |row| {
            row.status = DeviceJobStatus::Canceled;
        })
    }

    /// Ends a job with `status` (and a failure reason), now; rows still waiting for a device
    /// get `failed` with IoT Hub's error `code` and `description`, in one batch. A finished
    /// job is returned unchanged.
    ///
    /// # Errors
    /// [`ScheduledJobError::NotFound`] or storage errors.
    pub fn finish_scheduled_job(
        &self,
        id: &str,
        now: UnixMillis,
        status: ScheduledJobStatus,
        failure_reason: Option<String>,
        waiting_error: (&str, &str),
    ) -> Result<ScheduledJob, ScheduledJobError> {
        self.end_scheduled_job(id, now, status, failure_reason, |row| {
            row.status = DeviceJobStatus::Failed;
            row.outcome = "{}".to_string();
            row.error = Some((waiting_error.0.to_string(), waiting_error.1.to_string()));
        })
    }

    fn end_scheduled_job(
        &self,
        id: &str,
        now: UnixMillis,
        status: ScheduledJobStatus,
        failure_reason: Option<String>,
        settle: impl Fn(&mut DeviceJobRow),
    ) -> Result<ScheduledJob, ScheduledJobError> {
        let _guard = self.scheduled_job_lock.0.lock();
        let mut job = self.get_scheduled_job(id)?;
        if !job.status.is_active() {
            return Ok(job);
        }
        let mut batch = Batch::default();
        for mut row in self.waiting_rows(id)? {
            settle(&mut row);
            row.last_updated = now;
            if row.status == DeviceJobStatus::Failed {
                job.statistics.failed += 1;
            }
            batch.put_record(cf::META, row_key(&row), &row);
        }
        job.statistics.pending = 0;
        job.statistics.running = 0;
        job.status = status;
        job.failure_reason = failure_reason;
        job.ended = Some(now);
        job.cancel_requested = status == ScheduledJobStatus::Cancelled;
        batch.put_record(cf::META, job_key(id), &job);
        self.raw.commit(batch)?;
        Ok(job)
    }

    /// The rows of a job still waiting for their device (pending, scheduled or running).
    ///
    /// # Errors
    /// Storage errors.
    pub fn waiting_rows(&self, job_id: &str) -> Result<Vec<DeviceJobRow>, StorageError> {
        let mut rows = self.device_job_rows_of(job_id)?;
        rows.retain(|row| {
            matches!(
                row.status,
                DeviceJobStatus::Pending | DeviceJobStatus::Scheduled | DeviceJobStatus::Running
            )
        });
        Ok(rows)
    }
}
