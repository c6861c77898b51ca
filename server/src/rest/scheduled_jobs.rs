//! Scheduled jobs (`/jobs/v2`, issue 15 part 3): create (`PUT /jobs/v2/{id}`) a
//! `scheduleUpdateTwin` or `scheduleDeviceMethod` job over the identities a query condition
//! selects, read it (`GET`), cancel it (`POST …/cancel`), and list jobs (`GET /jobs/v2/query`
//! with `jobType` and `jobStatus`, paged by `x-ms-max-item-count` / `x-ms-continuation`). The
//! work itself is [`crate::hub::scheduled_jobs`]'s.
//!
//! # Invariants
//! - Everything a job will need is checked at creation: its condition parses (IoT Hub's
//!   parse-failure body, columns counted in `SELECT * FROM devices WHERE <condition>`), its
//!   twin patch passes the twin limits, its method call has a name and bounded timeouts. A
//!   job that was accepted runs.
//! - `GET /jobs/v2/query` answers a JSON array, as IoT Hub does, except to the Python
//!   service SDK (its autorest client, `User-Agent` `iothubgatewayserviceapis/…`), which
//!   only reads the object `{type, items, continuationToken}`.

use ferrohub_engine::scheduled_jobs::{ScheduledJob, ScheduledJobKind, ScheduledJobStatus};
use ferrohub_engine::UnixMillis;
use serde::Deserialize;
use serde_json::{json, Value};
use warp::filters::BoxedFilter;
use warp::http::HeaderValue;
use warp::{Filter, Reply};

use super::error::ApiError;
use super::identity_json::format_time;
use super::query::{page_size, parse_failure};
use super::reply::{json, one_of, Handled, Response};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::job_spec::JobSpec;
use crate::hub::twin_rows::job_kind_name;
use crate::routing::query::Statement;

/// IoT Hub's default for `maxExecutionTimeInSeconds` (the Node SDK's too).
const DEFAULT_MAX_EXECUTION_SECS: u64 = 3_600;
/// A job id, like a device id, is at most 128 characters.
const MAX_JOB_ID: usize = 128;

pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    one_of([
        warp::path!("jobs" / "v2" / "query")
            .and(warp::get())
            .and(caller())
            .and(warp::query::<ListFilter>())
            .and(warp::header::optional::<String>("x-ms-max-item-count"))
            .and(warp::header::optional::<String>("x-ms-continuation"))
            .and(warp::header::optional::<String>("user-agent"))
            .then(list)
            .boxed(),
        warp::path!("jobs" / "v2" / PathId)
            .and(warp::put())
            .and(caller())
            .and(json_body::<Value>())
            .then(create)
            .boxed(),
        warp::path!("jobs" / "v2" / PathId)
            .and(warp::get())
            .and(caller())
            .then(get)
            .boxed(),
        warp::path!("jobs" / "v2" / PathId / "cancel")
            .and(warp::post())
            .and(caller())
            .then(cancel)
            .boxed(),
    ])
}

fn may_write(p: &Principal) -> Result<(), ApiError> {
    if p.require_hub(Permission::ServiceConnect).is_err() {
        p.require_hub(Permission::RegistryWrite)?;
    }
    Ok(())
}

fn may_read(p: &Principal) -> Result<(), ApiError> {
    if p.require_hub(Permission::ServiceConnect).is_err() {
        p.require_hub(Permission::RegistryRead)?;
    }
    Ok(())
}

fn kind_of(name: &str) -> Option<ScheduledJobKind> {
    match name {
        "scheduleUpdateTwin" => Some(ScheduledJobKind::UpdateTwin),
        "scheduleDeviceMethod" => Some(ScheduledJobKind::DeviceMethod),
        _ => None,
    }
}

fn status_name(s: ScheduledJobStatus) -> &'static str {
    match s {
        ScheduledJobStatus::Queued => "queued",
        ScheduledJobStatus::Scheduled => "scheduled",
        ScheduledJobStatus::Running => "running",
        ScheduledJobStatus::Completed => "completed",
        ScheduledJobStatus::Failed => "failed",
        ScheduledJobStatus::Cancelled => "cancelled",
    }
}

/// An ISO 8601 time; without a zone it is UTC (the Python samples send naive UTC times).
fn parse_time(text: &str) -> Option<UnixMillis> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(UnixMillis(t.timestamp_millis()));
    }
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|t| UnixMillis(t.and_utc().timestamp_millis()))
}

/// The JobResponse model.
fn job_json(job: &ScheduledJob) -> Value {
    let spec: Value = serde_json::from_str(&job.spec).unwrap_or(Value::Null);
    let s = &job.statistics;
    let mut out = json!({
        "jobId": job.id,
        "queryCondition": job.query_condition,
        "createdTime": format_time(Some(job.created)),
        "startTime": format_time(Some(job.start)),
        "maxExecutionTimeInSeconds": job.max_execution_secs,
        "type": job_kind_name(job.kind),
        "status": status_name(job.status),
        "deviceJobStatistics": {
            "deviceCount": s.device_count,
            "failedCount": s.failed,
            "succeededCount": s.succeeded,
            "runningCount": s.running,
            "pendingCount": s.pending,
        },
    });
    out[match job.kind {
        ScheduledJobKind::UpdateTwin => "updateTwin",
        ScheduledJobKind::DeviceMethod => "cloudToDeviceMethod",
    }] = spec;
    if let Some(end) = job.ended {
        out["endTime"] = Value::String(format_time(Some(end)));
    }
    if let Some(reason) = &job.failure_reason {
        out["failureReason"] = Value::String(reason.clone());
    }
    out
}

/// A job request's field: absent and null are the same.
fn field<'a>(body: &'a Value, name: &str) -> Option<&'a Value> {
    body.get(name).filter(|v| !v.is_null())
}

/// Reads and checks a JobRequest into the job to store.
fn job_of(id: String, body: &Value, now: UnixMillis) -> Result<ScheduledJob, ApiError> {
    if id.is_empty() || id.chars().count() > MAX_JOB_ID {
        return Err(ApiError::argument("a job id is 1 to 128 characters"));
    }
    if !body.is_object() {
        return Err(ApiError::format("the body must be a JobRequest object"));
    }
    if let Some(given) = field(body, "jobId") {
        if given.as_str() != Some(id.as_str()) {
            return Err(ApiError::argument(
                "jobId in the body differs from the job id in the path",
            ));
        }
    }
    let kind = field(body, "type")
        .and_then(Value::as_str)
        .and_then(kind_of)
        .ok_or_else(|| {
            ApiError::argument("type must be scheduleUpdateTwin or scheduleDeviceMethod")
        })?;
    let spec = field(
        body,
        match kind {
            ScheduledJobKind::UpdateTwin => "updateTwin",
            ScheduledJobKind::DeviceMethod => "cloudToDeviceMethod",
        },
    )
    .cloned()
    .unwrap_or(Value::Null);
    JobSpec::read(kind, &spec).map_err(ApiError::argument)?;
    let condition = field(body, "queryCondition")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::argument("queryCondition is required"))?;
    Statement::target(condition).map_err(|e| {
        let text = format!("SELECT * FROM devices WHERE {}", condition.trim());
        parse_failure(&text, &e)
    })?;
    let start = match field(body, "startTime") {
        None => now,
        Some(v) => v
            .as_str()
            .and_then(parse_time)
            .ok_or_else(|| ApiError::argument("startTime must be an ISO 8601 time"))?,
    };
    let max_execution_secs = match field(body, "maxExecutionTimeInSeconds") {
        None => DEFAULT_MAX_EXECUTION_SECS,
        Some(v) => v.as_u64().filter(|s| *s > 0).ok_or_else(|| {
            ApiError::argument("maxExecutionTimeInSeconds must be a positive integer")
        })?,
    };
    Ok(ScheduledJob {
        id,
        kind,
        status: if start > now {
            ScheduledJobStatus::Scheduled
        } else {
            ScheduledJobStatus::Queued
        },
        query_condition: condition.to_string(),
        created: now,
        start,
        max_execution_secs,
        ended: None,
        spec: spec.to_string(),
        failure_reason: None,
        cursor: None,
        statistics: Default::default(),
        cancel_requested: false,
    })
}

async fn create(id: PathId, ctx: Context, p: Principal, body: Value) -> Handled {
    may_write(&p)?;
    let job = job_of(id.0, &body, ctx.clock.now())?;
    ctx.write(crate::hub::calls::CreateScheduledJob { job: job.clone() })
        .await?;
    Ok(json(&job_json(&job)))
}

async fn get(id: PathId, ctx: Context, p: Principal) -> Handled {
    may_read(&p)?;
    let job = ctx.store.run(move |s| s.get_scheduled_job(&id.0)).await?;
    Ok(json(&job_json(&job)))
}

async fn cancel(id: PathId, ctx: Context, p: Principal) -> Handled {
    may_write(&p)?;
    let call = crate::hub::calls::CancelScheduledJob {
        id: id.0,
        now: ctx.clock.now(),
    };
    let job = ctx.write(call).await?;
    Ok(json(&job_json(&job)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ListFilter {
    job_type: Option<String>,
    job_status: Option<String>,
}

async fn list(
    ctx: Context,
    p: Principal,
    filter: ListFilter,
    max: Option<String>,
    token: Option<String>,
    agent: Option<String>,
) -> Handled {
    may_read(&p)?;
    let kind = match filter.job_type.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(kind_of(t).ok_or_else(|| {
            ApiError::argument("jobType must be scheduleUpdateTwin or scheduleDeviceMethod")
        })?),
    };
    let status = filter.job_status.filter(|s| !s.is_empty());
    let size = page_size(max)?;
    let from = match token.filter(|t| !t.trim().is_empty()) {
        None => 0,
        Some(t) => t
            .trim()
            .strip_prefix("jobs:")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| ApiError::argument("the continuation token is not valid"))?,
    };
    let jobs: Vec<Value> = ctx
        .store
        .run(|s| s.list_scheduled_jobs())
        .await?
        .iter()
        .filter(|j| kind.is_none_or(|k| j.kind == k))
        .filter(|j| status.as_deref().is_none_or(|s| status_name(j.status) == s))
        .map(job_json)
        .collect();
    let end = (from + size).min(jobs.len());
    let page = jobs.get(from.min(end)..end).unwrap_or_default().to_vec();
    let next = (end < jobs.len()).then(|| format!("jobs:{end}"));
    let python = agent.is_some_and(|a| a.contains("iothubgatewayserviceapis/"));
    let mut response = if python {
        json(&json!({"type": "jobResponse", "items": page, "continuationToken": next}))
    } else {
        warp::reply::json(&page).into_response()
    };
    let headers = response.headers_mut();
    headers.insert("x-ms-item-type", HeaderValue::from_static("jobResponse"));
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        headers.insert("x-ms-continuation", next);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_with_or_without_a_zone() {
        assert_eq!(parse_time("1970-01-01T00:00:01Z"), Some(UnixMillis(1000)));
        assert_eq!(parse_time("1970-01-01T00:00:01.5"), Some(UnixMillis(1500)));
        assert_eq!(parse_time("1970-01-01T01:00:00+01:00"), Some(UnixMillis(0)));
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn requests_are_checked_before_a_job_exists() {
        let now = UnixMillis(10_000);
        let ok = json!({"type": "scheduleUpdateTwin", "queryCondition": "tags.x = 'y'",
            "updateTwin": {"tags": {"done": true}}, "startTime": "1970-01-01T00:01:00Z"});
        let job = job_of("j".into(), &ok, now).unwrap();
        assert_eq!(job.status, ScheduledJobStatus::Scheduled);
        assert_eq!(job.max_execution_secs, DEFAULT_MAX_EXECUTION_SECS);
        let cases = [
            (json!({"type": "other"}), "type must be"),
            (
                json!({"type": "scheduleDeviceMethod", "queryCondition": "*"}),
                "cloudToDeviceMethod",
            ),
            (
                json!({"type": "scheduleUpdateTwin", "updateTwin": {"tags": {}}, "queryCondition": "tags.x = = 1"}),
                "Line 1:38",
            ),
            (
                json!({"jobId": "k", "type": "scheduleUpdateTwin"}),
                "differs",
            ),
        ];
        for (body, expected) in cases {
            let e = job_of("j".into(), &body, now).unwrap_err().to_string();
            assert!(e.contains(expected), "{body}: {e}");
        }
    }
}
