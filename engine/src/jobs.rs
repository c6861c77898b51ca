//! Import/export job records (JOB-3): what was asked, how far the job got, how it ended.
//!
//! The engine only keeps the records; running a job (reading and writing blobs, applying
//! lines) is the server's. Records live in `meta` under `job/{id}`.
//!
//! # Invariants
//! - At most one job is active (queued or running): [`Store::create_job`] checks and writes
//!   under one lock, so two concurrent creates cannot both succeed.
//! - A job that is finished (completed, failed, cancelled) is never changed again.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::Batch;
use crate::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobKind {
    Export,
    Import,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobStatus {
    Queued,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub fn is_active(self) -> bool {
        matches!(self, JobStatus::Queued | JobStatus::Running)
    }
}

/// One import or export job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub kind: JobKind,
    pub status: JobStatus,
    /// Percent done, 0 to 100.
    pub progress: u8,
    pub created: UnixMillis,
    pub started: Option<UnixMillis>,
    pub ended: Option<UnixMillis>,
    pub input_container: Option<String>,
    pub output_container: String,
    pub input_blob: String,
    pub output_blob: String,
    pub exclude_keys: bool,
    pub failure_reason: Option<String>,
    /// Identities (export) or input lines (import) processed so far.
    pub processed: u64,
    /// Import lines refused (written to the error log).
    pub errors: u64,
    /// A cancel was asked for; the runner stops at its next step.
    pub cancel_requested: bool,
}

/// Why a job was not created.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum JobError {
    #[error("job {active} is {status:?}; one import/export job runs at a time")]
    AnotherActive { active: String, status: JobStatus },
    #[error("job {0} not found")]
    NotFound(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Serialises job creation and state changes.
#[derive(Default)]
pub(crate) struct JobLock(Mutex<()>);

fn job_key(id: &str) -> Vec<u8> {
    let mut k = keys::meta::JOB_PREFIX.to_vec();
    k.extend_from_slice(id.as_bytes());
    k
}

impl Store {
    /// All job records, in id order.
    ///
    /// # Errors
    /// Storage errors.
    pub fn list_jobs(&self) -> Result<Vec<JobRecord>, StorageError> {
        let prefix = keys::meta::JOB_PREFIX;
        let mut out = Vec::new();
        self.raw.scan_records::<JobRecord>(
            cf::META,
            prefix,
            keys::prefix_end(prefix),
            |_, j| {
                out.push(j);
                true
            },
        )?;
        Ok(out)
    }

    /// # Errors
    /// [`JobError::NotFound`] or storage errors.
    pub fn get_job(&self, id: &str) -> Result<JobRecord, JobError> {
        self.raw
            .get_record(cf::META, &job_key(id))?
            .ok_or_else(|| JobError::NotFound(id.to_string()))
    }

    /// Stores a new job unless another is active.
    ///
    /// # Errors
    /// [`JobError::AnotherActive`] or storage errors.
    pub fn create_job(&self, job: &JobRecord) -> Result<(), JobError> {
        let _guard = self.job_lock.0.lock();
        if let Some(active) = self.list_jobs()?.into_iter().find(|j| j.status.is_active()) {
            return Err(JobError::AnotherActive {
                active: active.id,
                status: active.status,
            });
        }
        self.put_job(job)?;
        Ok(())
    }

    /// Changes a job with `f`, unless it is finished; returns the job as stored afterwards.
    ///
    /// # Errors
    /// [`JobError::NotFound`] or storage errors.
    pub fn update_job(
        &self,
        id: &str,
        f: impl FnOnce(&mut JobRecord),
    ) -> Result<JobRecord, JobError> {
        let _guard = self.job_lock.0.lock();
        let mut job = self.get_job(id)?;
        if job.status.is_active() {
            f(&mut job);
            self.put_job(&job)?;
        }
        Ok(job)
    }

    fn put_job(&self, job: &JobRecord) -> Result<(), StorageError> {
        let mut batch = Batch::default();
        batch.put_record(cf::META, job_key(&job.id), job);
        self.raw.commit(batch)
    }
}
