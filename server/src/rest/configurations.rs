//! Automatic device configurations (ADM, issue 15 part 4): `PUT`, `GET`, `DELETE`
//! `/configurations/{id}`, `GET /configurations?top=`, and `POST /configurations/testQueries`.
//! Applying them to twins is [`crate::hub::configurations`]'s.
//!
//! # Invariants
//! - A configuration is checked whole before it is stored: its content (desired paths), its
//!   target condition and its metric queries (at most five) all parse, and content and target
//!   agree on devices or modules. What is stored, the reconciler can apply.
//! - `PUT` without `If-Match` creates (409 when the id exists); with one it updates, etag
//!   checked (412), and content may not change (400).
//! - Metrics are counted when the configuration is read, over every acknowledged write.

use ferrohub_engine::configurations::{Configuration, ConfigurationError};
use ferrohub_engine::model::IfMatch;
use ferrohub_engine::UnixMillis;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::error::ApiError;
use super::identity_json::format_time;
use super::reply::{json, no_content, one_of, Handled, Response};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::hub::config_content::{read_content, Compiled, MAX_METRICS};
use crate::hub::twin_query;
use crate::routing::query::{Collection, Statement};

/// Configurations listed unless `top` says otherwise, and the most.
const DEFAULT_TOP: usize = 100;

pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let if_match = || warp::header::optional::<String>("if-match");
    one_of([
        warp::path!("configurations" / "testQueries")
            .and(warp::post())
            .and(caller())
            .and(json_body::<Value>())
            .then(test_queries)
            .boxed(),
        warp::path!("configurations")
            .and(warp::get())
            .and(caller())
            .and(warp::query::<ListQuery>())
            .then(list)
            .boxed(),
        warp::path!("configurations" / PathId)
            .and(warp::put())
            .and(caller())
            .and(if_match())
            .and(json_body::<Value>())
            .then(put)
            .boxed(),
        warp::path!("configurations" / PathId)
            .and(warp::get())
            .and(caller())
            .then(get)
            .boxed(),
        warp::path!("configurations" / PathId)
            .and(warp::delete())
            .and(caller())
            .and(if_match())
            .then(delete)
            .boxed(),
    ])
}

impl From<ConfigurationError> for ApiError {
    fn from(e: ConfigurationError) -> Self {
        match e {
            ConfigurationError::Storage(e) => ApiError::Storage(e),
            ConfigurationError::NotFound(_) => ApiError::Coded {
                status: StatusCode::NOT_FOUND,
                code: "ConfigurationNotFound",
                number: 404_001,
                message: e.to_string(),
            },
            ConfigurationError::AlreadyExists(_) => ApiError::Coded {
                status: StatusCode::CONFLICT,
                code: "ConfigurationAlreadyExists",
                number: 409_001,
                message: e.to_string(),
            },
            ConfigurationError::EtagMismatch { .. } => ApiError::Coded {
                status: StatusCode::PRECONDITION_FAILED,
                code: "PreconditionFailed",
                number: 412_001,
                message: e.to_string(),
            },
            ConfigurationError::ContentChanged(_) => ApiError::argument(e.to_string()),
        }
    }
}

/// `If-Match`, quoted (Node) or bare (Python); `*` is unconditional.
fn if_match_of(header: Option<String>) -> Option<IfMatch> {
    header.map(|h| {
        let h = h.trim().trim_matches('"');
        if h.is_empty() || h == "*" {
            IfMatch::Any
        } else {
            IfMatch::Etag(h.to_string())
        }
    })
}

fn object_of<'a>(body: &'a Value, name: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(ApiError::format(format!("{name} must be a JSON object"))),
    }
}

/// The custom metric queries `{name: query}`, each parsed.
fn metric_queries(body: &Value) -> Result<Map<String, Value>, ApiError> {
    let queries = object_of(body, "metrics")?
        .and_then(|m| m.get("queries"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if queries.len() > MAX_METRICS {
        return Err(ApiError::argument(
            "a configuration has at most 5 custom metrics",
        ));
    }
    for (name, query) in &queries {
        let text = query.as_str().ok_or_else(|| {
            ApiError::argument(format!("metric {name}: the query must be a string"))
        })?;
        Statement::parse(text).map_err(|e| ApiError::argument(format!("metric {name}: {e}")))?;
    }
    Ok(queries)
}

/// Reads and checks a Configuration body into the record to store.
fn configuration_of(id: String, body: &Value) -> Result<Configuration, ApiError> {
    if id.is_empty() || id.chars().count() > 128 {
        return Err(ApiError::argument(
            "a configuration id is 1 to 128 characters",
        ));
    }
    if !body.is_object() {
        return Err(ApiError::format("the body must be a Configuration object"));
    }
    if let Some(given) = body.get("id").filter(|v| !v.is_null()) {
        if given.as_str() != Some(id.as_str()) {
            return Err(ApiError::argument(
                "id in the body differs from the id in the path",
            ));
        }
    }
    let labels = object_of(body, "labels")?.cloned().unwrap_or_default();
    if labels.values().any(|v| !v.is_string()) {
        return Err(ApiError::format("labels must map names to strings"));
    }
    let content = body.get("content").cloned().unwrap_or(Value::Null);
    let priority = match body.get("priority") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_i64()
            .filter(|p| *p >= 0)
            .ok_or_else(|| ApiError::argument("priority must be a non-negative integer"))?,
    };
    let target = body
        .get("targetCondition")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let config = Configuration {
        id,
        schema_version: body
            .get("schemaVersion")
            .and_then(Value::as_str)
            .unwrap_or("1.0")
            .to_string(),
        labels: Value::Object(labels).to_string(),
        content: content.to_string(),
        target_condition: target,
        priority,
        created: UnixMillis(0),
        last_updated: UnixMillis(0),
        metrics: Value::Object(metric_queries(body)?).to_string(),
        etag: String::new(),
    };
    read_content(&content).map_err(ApiError::argument)?;
    Compiled::compile(&config).map_err(ApiError::argument)?;
    Ok(config)
}

/// The system metric queries, as IoT Hub words them.
fn system_queries(c: &Configuration, collection: Collection) -> (String, String) {
    let from = match collection {
        Collection::Modules => "devices.modules",
        _ => "devices",
    };
    let target = c.target_condition.trim();
    let targeted = match target {
        "" | "*" => format!("select deviceId from {from}"),
        t if t.to_ascii_lowercase().starts_with("from ") => format!("select deviceId {t}"),
        t => format!("select deviceId from {from} where {t}"),
    };
    let applied = format!(
        "select deviceId from {from} where configurations.[[{}]].status = 'Applied'",
        c.id
    );
    (targeted, applied)
}

/// The Configuration model, with its metrics counted now.
fn configuration_json(s: &ferrohub_engine::Store, c: &Configuration) -> Result<Value, ApiError> {
    let compiled = Compiled::compile(c).map_err(ApiError::argument)?;
    let (targeted_query, applied_query) = system_queries(c, compiled.target.from);
    let count = |text: &str| -> Result<u64, ApiError> {
        let statement = Statement::parse(text).map_err(|e| ApiError::argument(e.to_string()))?;
        Ok(twin_query::count(s, &statement)?)
    };
    let queries: Map<String, Value> = serde_json::from_str(&c.metrics).unwrap_or_default();
    let mut results = Map::new();
    for (name, query) in &queries {
        results.insert(
            name.clone(),
            json!(count(query.as_str().unwrap_or_default())?),
        );
    }
    Ok(json!({
        "id": c.id,
        "schemaVersion": c.schema_version,
        "labels": serde_json::from_str::<Value>(&c.labels).unwrap_or(json!({})),
        "content": serde_json::from_str::<Value>(&c.content).unwrap_or(json!({})),
        "targetCondition": c.target_condition,
        "createdTimeUtc": format_time(Some(c.created)),
        "lastUpdatedTimeUtc": format_time(Some(c.last_updated)),
        "priority": c.priority,
        "systemMetrics": {
            "results": {
                "targetedCount": twin_query::count(s, &compiled.target)?,
                "appliedCount": count(&applied_query)?,
            },
            "queries": {"targetedCount": targeted_query, "appliedCount": applied_query},
        },
        "metrics": {"results": results, "queries": queries},
        "etag": c.etag,
    }))
}

fn may_write(p: &Principal) -> Result<(), ApiError> {
    Ok(p.require_hub(Permission::RegistryWrite)?)
}

fn may_read(p: &Principal) -> Result<(), ApiError> {
    Ok(p.require_hub(Permission::RegistryRead)?)
}

async fn put(
    id: PathId,
    ctx: Context,
    p: Principal,
    if_match: Option<String>,
    body: Value,
) -> Handled {
    may_write(&p)?;
    let config = configuration_of(id.0, &body)?;
    let (condition, now) = (if_match_of(if_match), ctx.clock.now());
    let call = crate::hub::calls::PutConfiguration {
        configuration: config,
        if_match: condition,
        now,
    };
    let stored = ctx.write(call).await?;
    let reply = ctx
        .store
        .run(move |s| configuration_json(s, &stored))
        .await?;
    Ok(json(&reply))
}

async fn get(id: PathId, ctx: Context, p: Principal) -> Handled {
    may_read(&p)?;
    let reply = ctx
        .store
        .run(move |s| configuration_json(s, &s.get_configuration(&id.0)?))
        .await?;
    Ok(json(&reply))
}

async fn delete(id: PathId, ctx: Context, p: Principal, if_match: Option<String>) -> Handled {
    may_write(&p)?;
    let condition = if_match_of(if_match).unwrap_or(IfMatch::Any);
    let call = crate::hub::calls::DeleteConfiguration {
        id: id.0,
        if_match: condition,
    };
    ctx.write(call).await?;
    Ok(no_content())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListQuery {
    top: Option<usize>,
}

async fn list(ctx: Context, p: Principal, q: ListQuery) -> Handled {
    may_read(&p)?;
    let top = q.top.unwrap_or(DEFAULT_TOP).clamp(1, DEFAULT_TOP);
    let reply = ctx
        .store
        .run(move |s| {
            let mut all = s.list_configurations()?;
            all.sort_by_key(|c| c.created);
            all.iter()
                .take(top)
                .map(|c| configuration_json(s, c))
                .collect::<Result<Vec<_>, ApiError>>()
        })
        .await?;
    Ok(json(&reply))
}

/// Checks a target condition and metric queries; the errors are in the body, always 200.
async fn test_queries(ctx: Context, p: Principal, body: Value) -> Handled {
    let _ = ctx;
    may_read(&p)?;
    let target = body
        .get("targetCondition")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let target_error = match Statement::target(target) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    let metrics: Map<String, Value> = body
        .get("customMetricQueries")
        .and_then(Value::as_object)
        .map(|queries| {
            queries
                .iter()
                .map(|(name, q)| {
                    let error = match q.as_str().map(Statement::parse) {
                        Some(Ok(_)) => String::new(),
                        Some(Err(e)) => e.to_string(),
                        None => "the query must be a string".into(),
                    };
                    (name.clone(), Value::String(error))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(json(&json!({
        "targetConditionError": target_error,
        "customMetricQueryErrors": metrics,
    })))
}
