//! Scheduled job records (`/jobs/v2`, issue 15 part 3): a twin update or a direct method for
//! every identity a query selects, from a start time, for at most a maximum execution time;
//! and the per-identity rows `SELECT * FROM devices.jobs` reads.
//!
//! The engine keeps the records; choosing identities, calling methods and writing twins is the
//! server's runner. Records live in `meta`: jobs under `sjob/{id}`, rows under
//! `sjobrow/{len}{job id}{len}{device id}[{len}{module id}]`, so one job's rows are contiguous
//! and in identity order.
//!
//! # Invariants
//! - A job id names at most one job ([`Store::create_scheduled_job`] checks and writes under
//!   one lock).
//! - A finished job (completed, failed, cancelled) is never changed again.
//! - Rows and the job's progress (cursor, statistics) are written in one atomic batch
//!   ([`Store::record_device_jobs`]), so after a crash the cursor names exactly the last
//!   identity whose row is stored: a runner that resumes after it neither repeats nor skips.

mod progress;

pub use progress::{JobTarget, TwinJobBatch};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

const JOB_PREFIX: &[u8] = b"sjob/";
const ROW_PREFIX: &[u8] = b"sjobrow/";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduledJobKind {
    UpdateTwin,
    DeviceMethod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScheduledJobStatus {
    Queued,
    Scheduled,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl ScheduledJobStatus {
    pub fn is_active(self) -> bool {
        matches!(
            self,
            ScheduledJobStatus::Queued
                | ScheduledJobStatus::Scheduled
                | ScheduledJobStatus::Running
        )
    }
}

/// IoT Hub's `deviceJobStatistics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceJobStatistics {
    pub device_count: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub running: u64,
    pub pending: u64,
}

/// Where a runner got to: the last identity whose row is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobCursor {
    pub device_id: String,
    pub module_id: Option<String>,
}

/// One scheduled job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledJob {
    pub id: String,
    pub kind: ScheduledJobKind,
    pub status: ScheduledJobStatus,
    /// As the back-end sent it (`*`, a condition, or `FROM devices.modules WHERE ...`).
    pub query_condition: String,
    pub created: UnixMillis,
    pub start: UnixMillis,
    pub max_execution_secs: u64,
    pub ended: Option<UnixMillis>,
    /// The request's `cloudToDeviceMethod` or `updateTwin`, as JSON text.
    pub spec: String,
    pub failure_reason: Option<String>,
    pub cursor: Option<JobCursor>,
    pub statistics: DeviceJobStatistics,
    /// A cancel was asked for; the runner stops at its next step.
    pub cancel_requested: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeviceJobStatus {
    Pending,
    Scheduled,
    Running,
    Completed,
    Failed,
    Canceled,
}

/// What a job did to one identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceJobRow {
    pub job_id: String,
    pub device_id: String,
    pub module_id: Option<String>,
    pub kind: ScheduledJobKind,
    pub status: DeviceJobStatus,
    pub created: UnixMillis,
    pub start: UnixMillis,
    pub end: UnixMillis,
    pub last_updated: UnixMillis,
    /// The outcome as JSON text (a method's `{"deviceMethodResponse": {...}}`, `{}` for twins).
    pub outcome: String,
    /// IoT Hub's error code and description, for a failed row.
    pub error: Option<(String, String)>,
}

#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ScheduledJobError {
    #[error("a job with id {0} already exists")]
    AlreadyExists(String),
    #[error("job {0} not found")]
    NotFound(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Serialises job creation and changes.
#[derive(Default)]
pub(crate) struct ScheduledJobLock(pub(crate) Mutex<()>);

fn push_part(k: &mut Vec<u8>, s: &str) {
    // Job, device and module ids are at most 128 bytes; two length bytes leave room anyway.
    k.extend_from_slice(&(s.len() as u16).to_be_bytes());
    k.extend_from_slice(s.as_bytes());
}

pub(crate) fn job_key(id: &str) -> Vec<u8> {
    let mut k = JOB_PREFIX.to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

pub(crate) fn rows_of(job_id: &str) -> Vec<u8> {
    let mut k = ROW_PREFIX.to_vec();
    push_part(&mut k, job_id);
    k
}

pub(crate) fn row_key(row: &DeviceJobRow) -> Vec<u8> {
    let mut k = rows_of(&row.job_id);
    push_part(&mut k, &row.device_id);
    if let Some(m) = &row.module_id {
        push_part(&mut k, m);
    }
    k
}

impl Store {
    /// Stores a new scheduled job.
    ///
    /// # Errors
    /// [`ScheduledJobError::AlreadyExists`] or storage errors.
    pub fn create_scheduled_job(&self, job: &ScheduledJob) -> Result<(), ScheduledJobError> {
        let _guard = self.scheduled_job_lock.0.lock();
        if self
            .raw
            .get_record::<ScheduledJob>(cf::META, &job_key(&job.id))?
            .is_some()
        {
            return Err(ScheduledJobError::AlreadyExists(job.id.clone()));
        }
        let mut batch = Batch::default();
        batch.put_record(cf::META, job_key(&job.id), job);
        self.raw.commit(batch)?;
        Ok(())
    }

    /// # Errors
    /// [`ScheduledJobError::NotFound`] or storage errors.
    pub fn get_scheduled_job(&self, id: &str) -> Result<ScheduledJob, ScheduledJobError> {
        self.raw
            .get_record(cf::META, &job_key(id))?
            .ok_or_else(|| ScheduledJobError::NotFound(id.to_string()))
    }

    /// Every scheduled job, in id order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_scheduled_jobs(&self) -> Result<Vec<ScheduledJob>, StorageError> {
        let mut out = Vec::new();
        self.raw.scan_records::<ScheduledJob>(
            cf::META,
            JOB_PREFIX,
            keys::prefix_end(JOB_PREFIX),
            |_, j| {
                out.push(j);
                true
            },
        )?;
        Ok(out)
    }

    /// Changes a job with `f` unless it is finished; returns the job as stored afterwards.
    ///
    /// # Errors
    /// [`ScheduledJobError::NotFound`] or storage errors.
    pub fn update_scheduled_job(
        &self,
        id: &str,
        f: impl FnOnce(&mut ScheduledJob),
    ) -> Result<ScheduledJob, ScheduledJobError> {
        self.record_device_jobs(id, &[], f)
    }

    /// Stores rows of a job and changes the job with `f` (its cursor and statistics), in one
    /// atomic batch; nothing is written for a finished job. Returns the job as stored.
    ///
    /// # Errors
    /// [`ScheduledJobError::NotFound`] or storage errors.
    pub fn record_device_jobs(
        &self,
        id: &str,
        rows: &[DeviceJobRow],
        f: impl FnOnce(&mut ScheduledJob),
    ) -> Result<ScheduledJob, ScheduledJobError> {
        let _guard = self.scheduled_job_lock.0.lock();
        let mut job = self.get_scheduled_job(id)?;
        if !job.status.is_active() {
            return Ok(job);
        }
        f(&mut job);
        let mut batch = Batch::default();
        for row in rows.iter().filter(|r| r.job_id == id) {
            batch.put_record(cf::META, row_key(row), row);
        }
        batch.put_record(cf::META, job_key(id), &job);
        self.raw.commit(batch)?;
        Ok(job)
    }

    /// Up to `limit` rows of every job, in (job, identity) order, after the row `after` (a
    /// key this method returned); with the key of each, to read on from.
    ///
    /// # Errors
    /// Storage errors.
    pub fn device_job_rows(
        &self,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, DeviceJobRow)>, StorageError> {
        let from = match after {
            Some(k) => {
                let mut k = k.to_vec();
                k.push(0);
                k
            }
            None => ROW_PREFIX.to_vec(),
        };
        let mut out = Vec::new();
        self.raw.scan_records::<DeviceJobRow>(
            cf::META,
            &from,
            keys::prefix_end(ROW_PREFIX),
            |k, row| {
                out.push((k.to_vec(), row));
                out.len() < limit
            },
        )?;
        Ok(out)
    }

    /// The rows of one job, in identity order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn device_job_rows_of(&self, job_id: &str) -> Result<Vec<DeviceJobRow>, StorageError> {
        let prefix = rows_of(job_id);
        let mut out = Vec::new();
        self.raw.scan_records::<DeviceJobRow>(
            cf::META,
            &prefix,
            keys::prefix_end(&prefix),
            |_, row| {
                out.push(row);
                true
            },
        )?;
        Ok(out)
    }
}
