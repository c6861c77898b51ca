//! The runner of scheduled jobs (`/jobs/v2`, issue 15 part 3): from its start time, a job
//! patches the twin of, or calls a method on, every identity its query condition selects,
//! in identity order, a page at a time, for at most its maximum execution time.
//!
//! # Invariants
//! - One runner per job in this process ([`JobRunners::start`] refuses a second).
//! - Progress is the engine's: each page's rows are stored with the job's cursor, so a
//!   runner started after a restart ([`resume`]) carries on after the last stored row. Twin
//!   pages are atomic with their twin writes (each twin patched once); a method call whose
//!   row was not stored before a crash is made again (at least once, like IoT Hub).
//! - A method job calls connected devices as it reaches them; the others wait, as rows
//!   `scheduled`, and are called when they connect, until the job's deadline (start + maximum
//!   execution time), when they fail with `JobRunPreconditionFailed` as on IoT Hub.
//! - A cancelled job changes nothing more: the engine refuses a page of a job that is no
//!   longer active, and the runner stops at its next step.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::scheduled_jobs::{
    DeviceJobRow, DeviceJobStatus, JobTarget, ScheduledJob, ScheduledJobError, ScheduledJobStatus,
};
use ferrohub_engine::{StorageError, UnixMillis};
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::job_spec::{JobSpec, MethodCallSpec};
use super::method_call::CallFailure;
use super::twin_query;
use super::HubContext;
use crate::ids::Identity;
use crate::routing::query::Statement;

/// Identities per page of a twin job (one batch) and of a method job (calls in parallel).
const TWIN_PAGE: usize = 256;
const METHOD_PAGE: usize = 64;
/// How often a waiting runner looks again (start time, devices coming online, cancel).
const POLL: Duration = Duration::from_millis(250);
/// How long a runner waits after a storage error before it tries again.
const RETRY: Duration = Duration::from_secs(1);

const NOT_STARTED: (&str, &str) = (
    "JobRunPreconditionFailed",
    "The job did not start within specified period: either device did not come online or invalid endTime specified.",
);

/// The runners of this process.
pub struct JobRunners {
    shutdown: CancellationToken,
    running: Mutex<HashSet<String>>,
}

impl JobRunners {
    pub fn new(shutdown: CancellationToken) -> Arc<JobRunners> {
        Arc::new(JobRunners {
            shutdown,
            running: Mutex::default(),
        })
    }

    /// Starts the runner of job `id` unless one runs already.
    pub fn start(self: &Arc<Self>, ctx: &HubContext, id: String) {
        if !self.running.lock().insert(id.clone()) {
            return;
        }
        let (ctx, runners) = (ctx.clone(), Arc::clone(self));
        tokio::spawn(async move {
            let shutdown = runners.shutdown.clone();
            tokio::select! {
                () = run(&ctx, &id) => {}
                () = shutdown.cancelled() => {}
            }
            runners.running.lock().remove(&id);
        });
    }
}

/// Starts a runner for every job a stopped hub left queued, scheduled or running.
///
/// # Errors
/// Storage errors reading the jobs.
pub async fn resume(ctx: &HubContext) -> Result<(), StorageError> {
    let jobs = ctx.store.run(|s| s.list_scheduled_jobs()).await?;
    for job in jobs.into_iter().filter(|j| j.status.is_active()) {
        ctx.jobs.start(ctx, job.id);
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Job(#[from] ScheduledJobError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

async fn run(ctx: &HubContext, id: &str) {
    loop {
        match run_once(ctx, id).await {
            Ok(()) => return,
            Err(RunError::Job(ScheduledJobError::NotFound(_))) => return,
            Err(e) => {
                tracing::warn!(job = id, error = %e, "scheduled job runner failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

async fn load(ctx: &HubContext, id: &str) -> Result<ScheduledJob, RunError> {
    let id = id.to_string();
    Ok(ctx.store.run(move |s| s.get_scheduled_job(&id)).await?)
}

fn deadline(job: &ScheduledJob) -> UnixMillis {
    UnixMillis(job.start.0 + (job.max_execution_secs as i64).saturating_mul(1000))
}

async fn finish(
    ctx: &HubContext,
    id: &str,
    status: ScheduledJobStatus,
    reason: Option<String>,
) -> Result<(), RunError> {
    let (id, now) = (id.to_string(), ctx.clock.now());
    ctx.store
        .run(move |s| s.finish_scheduled_job(&id, now, status, reason, NOT_STARTED))
        .await?;
    Ok(())
}

async fn run_once(ctx: &HubContext, id: &str) -> Result<(), RunError> {
    let mut job = load(ctx, id).await?;
    while job.status.is_active() && ctx.clock.now() < job.start {
        let ahead = (job.start.0 - ctx.clock.now().0).max(0) as u64;
        tokio::time::sleep(POLL.min(Duration::from_millis(ahead))).await;
        job = load(ctx, id).await?;
    }
    if !job.status.is_active() {
        return Ok(());
    }
    if job.status != ScheduledJobStatus::Running {
        let id = id.to_string();
        job = ctx
            .store
            .run(move |s| s.update_scheduled_job(&id, |j| j.status = ScheduledJobStatus::Running))
            .await?;
    }
    // Both were checked when the job was created; a stored job that no longer reads is failed.
    let statement = match Statement::target(&job.query_condition) {
        Ok(s) => Arc::new(s),
        Err(e) => return finish(ctx, id, ScheduledJobStatus::Failed, Some(e.to_string())).await,
    };
    let spec = serde_json::from_str::<Value>(&job.spec)
        .map_err(|e| e.to_string())
        .and_then(|v| JobSpec::read(job.kind, &v));
    match spec {
        Ok(JobSpec::UpdateTwin(write)) => twin_job(ctx, id, statement, Arc::new(write)).await,
        Ok(JobSpec::DeviceMethod(call)) => method_job(ctx, id, statement, call).await,
        Err(e) => finish(ctx, id, ScheduledJobStatus::Failed, Some(e)).await,
    }
}

/// The next page of identities after the job's cursor, and whether it is the last.
async fn next_targets(
    ctx: &HubContext,
    job: &ScheduledJob,
    statement: &Arc<Statement>,
    limit: usize,
) -> Result<(Vec<JobTarget>, bool), RunError> {
    let (statement, cursor) = (Arc::clone(statement), job.cursor.clone());
    Ok(ctx
        .store
        .run(move |s| twin_query::targets(s, &statement, cursor.as_ref(), limit))
        .await?)
}

async fn twin_job(
    ctx: &HubContext,
    id: &str,
    statement: Arc<Statement>,
    write: Arc<ferrohub_engine::twin::store::TwinWrite>,
) -> Result<(), RunError> {
    loop {
        let job = load(ctx, id).await?;
        if !job.status.is_active() {
            return Ok(());
        }
        if ctx.clock.now() >= deadline(&job) {
            let reason = "The job did not finish within its maximum execution time.".to_string();
            return finish(ctx, id, ScheduledJobStatus::Failed, Some(reason)).await;
        }
        let (targets, last) = next_targets(ctx, &job, &statement, TWIN_PAGE).await?;
        if !targets.is_empty() {
            let (job_id, write, now) = (id.to_string(), Arc::clone(&write), ctx.clock.now());
            let page = ctx
                .store
                .run(move |s| s.apply_twin_job_batch(&job_id, &targets, &write, now))
                .await?;
            for outcome in &page.outcomes {
                ctx.push_desired(outcome);
            }
        }
        if last {
            return finish(ctx, id, ScheduledJobStatus::Completed, None).await;
        }
    }
}

fn identity_of(row: &DeviceJobRow) -> Identity {
    Identity::new(row.device_id.clone(), row.module_id.clone())
}

/// Connected, on this node or (in a cluster) another, and subscribed to methods.
async fn is_online(ctx: &HubContext, who: &Identity) -> bool {
    if ctx.connections.method_target(&who.client_id()).is_some() {
        return true;
    }
    match &ctx.live {
        Some(live) => {
            live.probe_elsewhere(who, super::live::Probe::TakesMethods)
                .await
        }
        None => false,
    }
}

/// Calls the method on a row's identity and fills in the row with what happened.
async fn call(ctx: &HubContext, call: &MethodCallSpec, mut row: DeviceJobRow) -> DeviceJobRow {
    let result = ctx.call_method(&identity_of(&row), call.request()).await;
    row.last_updated = ctx.clock.now();
    match result {
        Ok(answer) => {
            let payload = if answer.payload.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&answer.payload).unwrap_or_else(|_| {
                    Value::String(String::from_utf8_lossy(&answer.payload).into_owned())
                })
            };
            row.status = DeviceJobStatus::Completed;
            row.outcome =
                json!({"deviceMethodResponse": {"status": answer.status, "payload": payload}})
                    .to_string();
            row.error = None;
        }
        Err(failure) => {
            let (_, code, description) = failure.iot_hub_error();
            let code = if failure == CallFailure::Timeout {
                "DeviceNotOnline"
            } else {
                code
            };
            row.status = DeviceJobStatus::Failed;
            row.outcome = "{}".into();
            row.error = Some((code.to_string(), description.to_string()));
        }
    }
    row
}

fn new_row(job: &ScheduledJob, t: JobTarget, now: UnixMillis) -> DeviceJobRow {
    DeviceJobRow {
        job_id: job.id.clone(),
        device_id: t.device_id,
        module_id: t.module_id,
        kind: job.kind,
        status: DeviceJobStatus::Scheduled,
        created: now,
        start: job.start,
        end: deadline(job),
        last_updated: now,
        outcome: "{}".into(),
        error: None,
    }
}

/// Stores rows; `reached` counts rows new to the job, `was_waiting` rows that were waiting.
async fn record(
    ctx: &HubContext,
    id: &str,
    rows: Vec<DeviceJobRow>,
    was_waiting: bool,
) -> Result<ScheduledJob, RunError> {
    let id = id.to_string();
    Ok(ctx
        .store
        .run(move |s| {
            let cursor = (!was_waiting).then(|| rows.last().cloned()).flatten();
            s.record_device_jobs(&id, &rows, |j| {
                for r in &rows {
                    if was_waiting {
                        j.statistics.pending = j.statistics.pending.saturating_sub(1);
                    } else {
                        j.statistics.device_count += 1;
                    }
                    match r.status {
                        DeviceJobStatus::Completed => j.statistics.succeeded += 1,
                        DeviceJobStatus::Failed => j.statistics.failed += 1,
                        _ => j.statistics.pending += 1,
                    }
                }
                if let Some(last) = cursor {
                    j.cursor = Some(ferrohub_engine::scheduled_jobs::JobCursor {
                        device_id: last.device_id,
                        module_id: last.module_id,
                    });
                }
            })
        })
        .await?)
}

async fn method_job(
    ctx: &HubContext,
    id: &str,
    statement: Arc<Statement>,
    spec: MethodCallSpec,
) -> Result<(), RunError> {
    // Reach every identity once: online ones are called, the others wait.
    loop {
        let job = load(ctx, id).await?;
        if !job.status.is_active() {
            return Ok(());
        }
        if ctx.clock.now() >= deadline(&job) {
            break;
        }
        let (targets, last) = next_targets(ctx, &job, &statement, METHOD_PAGE).await?;
        let now = ctx.clock.now();
        let calls = targets.into_iter().map(|t| {
            let row = new_row(&job, t, now);
            let spec = &spec;
            async move {
                if is_online(ctx, &identity_of(&row)).await {
                    call(ctx, spec, row).await
                } else {
                    row
                }
            }
        });
        let rows = futures::future::join_all(calls).await;
        if !rows.is_empty() {
            record(ctx, id, rows, false).await?;
        }
        if last {
            break;
        }
    }
    // Call the waiting ones as they come online, until the deadline.
    let job_id = id.to_string();
    let mut waiting = ctx.store.run(move |s| s.waiting_rows(&job_id)).await?;
    loop {
        let job = load(ctx, id).await?;
        if !job.status.is_active() {
            return Ok(());
        }
        if waiting.is_empty() || ctx.clock.now() >= deadline(&job) {
            return finish(ctx, id, ScheduledJobStatus::Completed, None).await;
        }
        let checked: Vec<(DeviceJobRow, bool)> = futures::stream::iter(waiting)
            .map(|r| async move {
                let online = is_online(ctx, &identity_of(&r)).await;
                (r, online)
            })
            .buffered(METHOD_PAGE)
            .collect()
            .await;
        let (online, offline): (Vec<_>, Vec<_>) = checked.into_iter().partition(|(_, o)| *o);
        waiting = offline.into_iter().map(|(r, _)| r).collect();
        let online: Vec<DeviceJobRow> = online.into_iter().map(|(r, _)| r).collect();
        for chunk in online.chunks(METHOD_PAGE) {
            let done =
                futures::future::join_all(chunk.iter().cloned().map(|r| call(ctx, &spec, r))).await;
            record(ctx, id, done, true).await?;
        }
        tokio::time::sleep(POLL).await;
    }
}
