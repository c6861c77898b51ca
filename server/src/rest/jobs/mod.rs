//! Import/export jobs (JOB-1..JOB-3): `POST /jobs/create`, `GET /jobs`, `GET /jobs/{id}`,
//! `DELETE /jobs/{id}`, with IoT Hub's JobProperties shape.
//!
//! # Invariants
//! - A job is stored before it is answered, and runs on its own task; every state change the
//!   runner makes is written to the job record first, so `GET` shows what was done.
//! - At most one job is queued or running (the engine checks it under a lock); a second is
//!   refused with 403 `JobQuotaExceeded`.
//! - A job the hub stopped under is failed at the next start with a reason
//!   ([`fail_interrupted`]); since every import batch commits whole, the identities it names
//!   are each either fully applied or untouched.

pub mod line;
mod runner;

use ferrohub_engine::jobs::{JobKind, JobRecord, JobStatus};
use ferrohub_engine::{StorageError, Store, UnixMillis};
use serde::Deserialize;
use serde_json::{json, Value};
use warp::filters::BoxedFilter;
use warp::Filter;

use super::error::ApiError;
use super::identity_json::format_time;
use super::reply::{json, one_of, Handled, Response};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::blob::BlobContainer;

/// The blob an export writes and an import reads when the job names none (seed 002).
pub const DEVICES_BLOB: &str = "devices.txt";
/// Where an import writes the lines it refused.
pub const IMPORT_ERRORS_BLOB: &str = "importErrors.log";

/// The route table.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    one_of([
        warp::path!("jobs" / "create").and(warp::post()).and(caller()).and(json_body()).then(create_handler).boxed(),
        warp::path!("jobs").and(warp::get()).and(caller()).then(list_handler).boxed(),
        warp::path!("jobs" / PathId).and(warp::get()).and(caller()).then(get_handler).boxed(),
        warp::path!("jobs" / PathId).and(warp::delete()).and(caller()).then(cancel_handler).boxed(),
    ])
}

/// The writable part of JobProperties.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct CreateJob {
    #[serde(rename = "type")]
    kind: Option<String>,
    input_blob_container_uri: Option<String>,
    output_blob_container_uri: Option<String>,
    input_blob_name: Option<String>,
    output_blob_name: Option<String>,
    exclude_keys_in_export: Option<bool>,
    storage_authentication_type: Option<String>,
    include_configurations: Option<bool>,
}

fn kind_name(k: JobKind) -> &'static str {
    match k {
        JobKind::Export => "export",
        JobKind::Import => "import",
    }
}

fn status_name(s: JobStatus) -> &'static str {
    match s {
        JobStatus::Queued => "queued",
        JobStatus::Running => "running",
        JobStatus::Completed => "completed",
        JobStatus::Failed => "failed",
        JobStatus::Cancelled => "cancelled",
    }
}

/// JobProperties as IoT Hub returns them.
fn job_json(j: &JobRecord) -> Value {
    let time = |t: Option<UnixMillis>| t.map(|t| format_time(Some(t)));
    json!({
        "jobId": j.id,
        "type": kind_name(j.kind),
        "status": status_name(j.status),
        "progress": j.progress,
        "creationTime": format_time(Some(j.created)),
        "startTimeUtc": time(j.started),
        "endTimeUtc": time(j.ended),
        "inputBlobContainerUri": j.input_container,
        "outputBlobContainerUri": j.output_container,
        "inputBlobName": j.input_blob,
        "outputBlobName": j.output_blob,
        "excludeKeysInExport": j.exclude_keys,
        "failureReason": j.failure_reason,
        "storageAuthenticationType": "keyBased",
        "includeConfigurations": false,
    })
}

fn new_job_id() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn container(uri: Option<&str>, field: &str) -> Result<(String, BlobContainer), ApiError> {
    let uri = uri
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| ApiError::argument(format!("{field} is required for this job")))?;
    let c = BlobContainer::parse(uri).map_err(|e| ApiError::argument(format!("{field}: {e}")))?;
    Ok((uri.to_string(), c))
}

async fn create_handler(ctx: Context, p: Principal, body: CreateJob) -> Handled {
    let kind = match body.kind.as_deref() {
        Some("export" | "exportDevices") => JobKind::Export,
        Some("import" | "importDevices") => JobKind::Import,
        Some(other) => {
            return Err(ApiError::argument(format!(
                "type {other:?} is not an import/export job type (export, import)"
            )))
        }
        None => return Err(ApiError::argument("type is required (export or import)")),
    };
    p.require_hub(match kind {
        JobKind::Export => Permission::RegistryRead,
        JobKind::Import => Permission::RegistryWrite,
    })?;
    if body
        .storage_authentication_type
        .as_deref()
        .is_some_and(|t| !t.eq_ignore_ascii_case("keyBased"))
    {
        return Err(ApiError::argument(
            "storageAuthenticationType: only keyBased (SAS URIs) is supported",
        ));
    }
    if body.include_configurations == Some(true) {
        return Err(ApiError::argument(
            "includeConfigurations: configurations are not part of import/export jobs here",
        ));
    }
    let (output_uri, output) = container(
        body.output_blob_container_uri.as_deref(),
        "outputBlobContainerUri",
    )?;
    let input = match kind {
        JobKind::Import => Some(container(
            body.input_blob_container_uri.as_deref(),
            "inputBlobContainerUri",
        )?),
        JobKind::Export => None,
    };
    let blob_name = |n: &Option<String>| {
        n.clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| DEVICES_BLOB.to_string())
    };
    let job = JobRecord {
        id: new_job_id(),
        kind,
        status: JobStatus::Queued,
        progress: 0,
        created: ctx.clock.now(),
        started: None,
        ended: None,
        input_container: input.as_ref().map(|(u, _)| u.clone()),
        output_container: output_uri,
        input_blob: blob_name(&body.input_blob_name),
        output_blob: blob_name(&body.output_blob_name),
        exclude_keys: body.exclude_keys_in_export.unwrap_or(false),
        failure_reason: None,
        processed: 0,
        errors: 0,
        cancel_requested: false,
    };
    tracing::info!(job = %job.id, kind = kind_name(kind), output = %output.shown(), "import/export job queued");
    ctx.write(crate::hub::calls::CreateJob { job: job.clone() })
        .await?;
    Ok(json(&job_json(&job)))
}

/// Starts the runner of a stored, queued job (on the node that writes: see
/// `hub::calls::CreateJob`), its blob containers opened again from the URIs it records.
pub fn start_runner(ctx: &Context, job: JobRecord) {
    let output = match BlobContainer::parse(&job.output_container) {
        Ok(c) => c,
        Err(e) => {
            return tracing::error!(job = %job.id, error = %e, "the job's output container does not parse")
        }
    };
    let input = match job
        .input_container
        .as_deref()
        .map(BlobContainer::parse)
        .transpose()
    {
        Ok(c) => c,
        Err(e) => {
            return tracing::error!(job = %job.id, error = %e, "the job's input container does not parse")
        }
    };
    tokio::spawn(runner::run(ctx.clone(), job, input, output));
}

async fn list_handler(ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let jobs = ctx.store.run(|s| s.list_jobs()).await?;
    Ok(json(&Value::Array(jobs.iter().map(job_json).collect())))
}

async fn get_handler(id: PathId, ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let job = ctx
        .store
        .run(move |s| s.get_job(&id.0).map_err(ApiError::from))
        .await?;
    Ok(json(&job_json(&job)))
}

/// Asks the runner to stop; a queued job is cancelled at once. The answer is the job as it
/// stands (`running` until the runner reaches its next step).
async fn cancel_handler(id: PathId, ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryWrite)?;
    let call = crate::hub::calls::CancelJob {
        id: id.0,
        now: ctx.clock.now(),
    };
    let job = ctx.write(call).await?;
    tracing::info!(job = %job.id, "import/export job cancel requested");
    Ok(json(&job_json(&job)))
}

/// Fails every job left queued or running by a hub that stopped, with a reason that says how
/// far it got. Called once at start, before the REST API serves.
///
/// # Errors
/// Storage errors.
pub fn fail_interrupted(store: &Store, now: UnixMillis) -> Result<usize, StorageError> {
    let mut failed = 0;
    for job in store.list_jobs()? {
        if !job.status.is_active() {
            continue;
        }
        let what = match job.kind {
            JobKind::Import => format!(
                "{} input lines had been read and applied; every identity is either fully imported or untouched, and repeating the job applies the rest (createOrUpdate lines are safe to repeat)",
                job.processed
            ),
            JobKind::Export => format!(
                "{} identities had been written; the output blob was not completed",
                job.processed
            ),
        };
        let result = store.update_job(&job.id, |j| {
            j.status = JobStatus::Failed;
            j.ended = Some(now);
            j.failure_reason = Some(format!(
                "the hub stopped while the job was {}: {what}",
                status_name(job.status)
            ));
        });
        match result {
            Ok(_) => failed += 1,
            Err(ferrohub_engine::jobs::JobError::Storage(e)) => return Err(e),
            Err(_) => {}
        }
        tracing::warn!(job = %job.id, "import/export job interrupted by a stop; marked failed");
    }
    Ok(failed)
}
