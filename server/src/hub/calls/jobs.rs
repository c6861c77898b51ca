//! Job and configuration writes: import/export jobs, scheduled (`/jobs/v2`) jobs, automatic
//! device configurations. Their runners and the configuration reconciler run on the writer,
//! so the writer starts or wakes them as it stores what they act on.

use std::sync::{Arc, OnceLock};

use ferrohub_engine::configurations::{Configuration, ConfigurationError};
use ferrohub_engine::jobs::{JobError, JobRecord, JobStatus};
use ferrohub_engine::model::IfMatch;
use ferrohub_engine::scheduled_jobs::{ScheduledJob, ScheduledJobError};
use ferrohub_engine::UnixMillis;

use super::writer_call;
use crate::hub::HubContext;

/// Starts an import/export job's runner (the REST layer's, which owns the `devices.txt`
/// format and the blob streams): set once by the node before it serves.
#[derive(Default)]
pub struct ImportExportStarter(OnceLock<Arc<dyn Fn(&HubContext, JobRecord) + Send + Sync>>);

impl ImportExportStarter {
    pub fn set(&self, start: Arc<dyn Fn(&HubContext, JobRecord) + Send + Sync>) {
        let _ = self.0.set(start);
    }

    fn start(&self, ctx: &HubContext, job: JobRecord) {
        match self.0.get() {
            Some(start) => start(ctx, job),
            None => tracing::error!(job = %job.id, "no import/export runner: the job stays queued"),
        }
    }
}

writer_call! {
    /// Stores a queued import/export job and starts its runner.
    pub struct CreateJob { pub job: JobRecord }
    -> Result<(), JobError>;
    |ctx, c| {
        let stored = c.job.clone();
        ctx.store.run(move |s| s.create_job(&stored)).await?;
        ctx.import_export.start(&ctx, c.job);
        Ok(())
    }
}

writer_call! {
    /// Asks a job's runner to stop; a queued job is cancelled at once.
    pub struct CancelJob { pub id: String, pub now: UnixMillis }
    -> Result<JobRecord, JobError>;
    |ctx, c| ctx
        .store
        .run(move |s| {
            s.update_job(&c.id, |j| {
                j.cancel_requested = true;
                if j.status == JobStatus::Queued {
                    j.status = JobStatus::Cancelled;
                    j.ended = Some(c.now);
                }
            })
        })
        .await
}

writer_call! {
    /// Stores a scheduled job and starts its runner.
    pub struct CreateScheduledJob { pub job: ScheduledJob }
    -> Result<(), ScheduledJobError>;
    |ctx, c| {
        let id = c.job.id.clone();
        ctx.store.run(move |s| s.create_scheduled_job(&c.job)).await?;
        ctx.jobs.start(&ctx, id);
        Ok(())
    }
}

writer_call! {
    pub struct CancelScheduledJob { pub id: String, pub now: UnixMillis }
    -> Result<ScheduledJob, ScheduledJobError>;
    |ctx, c| ctx.store.run(move |s| s.cancel_scheduled_job(&c.id, c.now)).await
}

writer_call! {
    /// Stores an automatic device configuration and wakes the reconciler.
    pub struct PutConfiguration {
        pub configuration: Configuration,
        pub if_match: Option<IfMatch>,
        pub now: UnixMillis,
    }
    -> Result<Configuration, ConfigurationError>;
    |ctx, c| {
        let stored = ctx
            .store
            .run(move |s| s.put_configuration(c.configuration, c.if_match.as_ref(), c.now))
            .await?;
        ctx.configurations.configurations_changed();
        Ok(stored)
    }
}

writer_call! {
    pub struct DeleteConfiguration { pub id: String, pub if_match: IfMatch }
    -> Result<(), ConfigurationError>;
    |ctx, c| {
        ctx.store
            .run(move |s| s.delete_configuration(&c.id, &c.if_match))
            .await?;
        ctx.configurations.configurations_changed();
        Ok(())
    }
}
