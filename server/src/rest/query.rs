//! `POST /devices/query` (QRY-1, compat §B4): the twin query language over device twins,
//! module twins and device jobs, paged with `x-ms-max-item-count` and `x-ms-continuation`.
//!
//! # Invariants
//! - A query reads the store directly, page by page, in identity order: every write
//!   acknowledged before a page is read is in it (IoT Hub's own index is only eventually
//!   consistent).
//! - A continuation token is opaque to the client and bound to its query text; the last
//!   page has no `x-ms-continuation` header at all (the Node SDK reads any header, even an
//!   empty one, as "more").
//! - Queries without aggregates scan until the page is full plus one row, so a page that
//!   says "more" always has more; aggregated queries read every row, then page the result.
//! - Nothing here is indexed yet: every query scans the identities in order (see
//!   docs/query.md for what that costs).

use std::sync::Arc;

use base64::Engine as _;
use ferrohub_engine::archive::IdentityRecords;
use ferrohub_engine::twin::store::Twin;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use warp::filters::BoxedFilter;
use warp::http::HeaderValue;
use warp::{Filter, Reply};

use super::error::ApiError;
use super::reply::{one_of, Handled, Response};
use super::twins::twin_json;
use super::{caller, json_body, Context};
use crate::auth::{Permission, Principal};
use crate::routing::query::{Aggregation, Collection, QueryError, Statement};

/// Rows per page unless the client asks otherwise, and the most it may ask for.
pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1_000;
/// Devices read from the store per step of a scan: the first step is small (a page of one
/// row should not read hundreds of devices), then each step doubles up to the largest.
const FIRST_STEP: usize = 8;
const LARGEST_STEP: usize = 256;

#[derive(Debug, Deserialize)]
struct QueryRequest {
    query: Option<Value>,
}

/// Where the next page starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct Position {
    /// Hash of the query text the token belongs to.
    h: u32,
    /// Last device whose rows were all returned (devices), or that the last row came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    /// Last module returned within `d` (module queries).
    #[serde(skip_serializing_if = "Option::is_none")]
    m: Option<String>,
    /// Rows returned so far (TOP), or the offset into an aggregated result.
    n: usize,
}

impl Position {
    fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    fn decode(token: &str, hash: u32) -> Result<Position, ApiError> {
        let bad = || ApiError::argument("the continuation token is not valid for this query");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim())
            .map_err(|_| bad())?;
        let p: Position = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        if p.h != hash {
            return Err(bad());
        }
        Ok(p)
    }
}

/// The query route.
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    one_of([warp::path!("devices" / "query")
        .and(warp::post())
        .and(caller(ctx))
        .and(warp::header::optional::<String>("x-ms-max-item-count"))
        .and(warp::header::optional::<String>("x-ms-continuation"))
        .and(json_body::<QueryRequest>())
        .then(query)
        .boxed()])
}

/// A query's refusal as IoT Hub words a parse failure, with line and column (1-based).
fn parse_failure(text: &str, e: &QueryError) -> ApiError {
    let message = e.to_string();
    let (pos, detail) = message
        .strip_prefix("at ")
        .and_then(|rest| rest.split_once(": "))
        .and_then(|(pos, detail)| Some((pos.parse::<usize>().ok()?, detail.to_string())))
        .unwrap_or((0, message.clone()));
    let before: String = text.chars().take(pos).collect();
    let line = before.matches('\n').count() + 1;
    let column = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
    ApiError::argument(format!(
        "SQL query parse failed due to following errors: Line {line}:{column} {detail}"
    ))
}

fn page_size(header: Option<String>) -> Result<usize, ApiError> {
    match header {
        None => Ok(DEFAULT_PAGE),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .map(|n| n.min(MAX_PAGE))
            .ok_or_else(|| {
                ApiError::format(format!(
                    "x-ms-max-item-count must be a positive integer, not {v:?}"
                ))
            }),
    }
}

async fn query(
    ctx: Context,
    p: Principal,
    max: Option<String>,
    token: Option<String>,
    body: QueryRequest,
) -> Handled {
    if p.require_hub(Permission::ServiceConnect).is_err() {
        p.require_hub(Permission::RegistryRead)?;
    }
    let text = match body.query {
        Some(Value::String(t)) => t,
        _ => {
            return Err(ApiError::argument(
                "the body must be {\"query\": \"SELECT ...\"}",
            ))
        }
    };
    let statement = Statement::parse(&text).map_err(|e| parse_failure(&text, &e))?;
    let size = page_size(max)?;
    let hash = crc32fast::hash(text.as_bytes());
    let position = match token.filter(|t| !t.trim().is_empty()) {
        Some(t) => Position::decode(&t, hash)?,
        None => Position {
            h: hash,
            ..Position::default()
        },
    };
    let item_type = statement.item_type();
    let statement = Arc::new(statement);
    let (rows, next) = ctx
        .store
        .run(move |s| Ok::<_, ferrohub_engine::StorageError>(run(s, &statement, size, position)))
        .await??;
    let mut response = warp::reply::json(&rows).into_response();
    let headers = response.headers_mut();
    headers.insert("x-ms-item-type", HeaderValue::from_static(item_type));
    if let Some(next) = next {
        if let Ok(v) = HeaderValue::from_str(&next.encode()) {
            headers.insert("x-ms-continuation", v);
        }
    }
    Ok(response)
}

/// One page of rows and where the next starts, if there is a next.
fn run(
    s: &ferrohub_engine::Store,
    statement: &Statement,
    size: usize,
    position: Position,
) -> Result<(Vec<Value>, Option<Position>), ApiError> {
    if statement.aggregated() {
        let mut aggregation = Aggregation::new(statement);
        scan(s, statement.from, &Position::default(), |row| {
            if statement.matches(&row) {
                aggregation.add(&row);
            }
            true
        })?;
        let all = aggregation.finish();
        let top = statement.top().unwrap_or(usize::MAX).min(all.len());
        let end = (position.n + size).min(top);
        let page = all
            .get(position.n.min(end)..end)
            .map(<[Value]>::to_vec)
            .unwrap_or_default();
        let next = (end < top).then(|| Position { n: end, ..position });
        return Ok((page, next));
    }
    let remaining = statement
        .top()
        .map_or(usize::MAX, |t| t.saturating_sub(position.n));
    let want = size.min(remaining);
    if want == 0 {
        return Ok((Vec::new(), None));
    }
    let mut rows: Vec<(Value, String, Option<String>)> = Vec::new();
    let mut more = false;
    scan(s, statement.from, &position, |row| {
        if !statement.matches(&row) {
            return true;
        }
        if rows.len() == want {
            more = true;
            return false;
        }
        let device = row["deviceId"].as_str().unwrap_or_default().to_string();
        let module = row
            .get("moduleId")
            .and_then(Value::as_str)
            .map(str::to_string);
        rows.push((statement.project(row), device, module));
        true
    })?;
    let returned = position.n + rows.len();
    let next = match rows.last() {
        Some((_, device, module)) if more && returned < statement.top().unwrap_or(usize::MAX) => {
            Some(Position {
                h: position.h,
                d: Some(device.clone()),
                m: module.clone(),
                n: returned,
            })
        }
        _ => None,
    };
    Ok((rows.into_iter().map(|(r, ..)| r).collect(), next))
}

/// Orders module ids as their keys do: by length, then bytes.
fn module_after(module: &str, last: &str) -> bool {
    (module.len(), module.as_bytes()) > (last.len(), last.as_bytes())
}

fn row_of(records: IdentityRecords) -> Value {
    twin_json(&Twin {
        identity: records.identity,
        record: records.twin,
    })
}

/// Feeds `visit` the rows of `collection` after `from`, in identity order, until it returns
/// false or the rows run out.
fn scan(
    s: &ferrohub_engine::Store,
    collection: Collection,
    from: &Position,
    mut visit: impl FnMut(Value) -> bool,
) -> Result<(), ApiError> {
    // Device jobs are the rows of scheduled jobs, which this hub does not run yet: none.
    if collection == Collection::Jobs {
        return Ok(());
    }
    let mut step = FIRST_STEP;
    let mut page = match (&from.d, &from.m, collection) {
        (Some(d), Some(_), Collection::Modules) => s.archive_page_from(d, step)?,
        (d, _, _) => s.archive_page(d.as_deref(), step)?,
    };
    let mut first = true;
    loop {
        let Some(last) = page.last().map(|d| d.device.identity.device_id.clone()) else {
            return Ok(());
        };
        for device in page {
            match collection {
                Collection::Devices => {
                    if !visit(row_of(device.device)) {
                        return Ok(());
                    }
                }
                _ => {
                    let skip_to = match (&from.d, &from.m) {
                        (Some(d), Some(m)) if first && *d == device.device.identity.device_id => {
                            Some(m.clone())
                        }
                        _ => None,
                    };
                    for module in device.modules {
                        let id = module.identity.module_id.clone().unwrap_or_default();
                        if skip_to.as_deref().is_some_and(|m| !module_after(&id, m)) {
                            continue;
                        }
                        if !visit(row_of(module)) {
                            return Ok(());
                        }
                    }
                }
            }
            first = false;
        }
        step = (step * 2).min(LARGEST_STEP);
        page = s.archive_page(Some(&last), step)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_belong_to_their_query() {
        let p = Position {
            h: 7,
            d: Some("dev/1".into()),
            m: Some("m".into()),
            n: 42,
        };
        let token = p.encode();
        assert!(token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(Position::decode(&token, 7).unwrap(), p);
        assert!(Position::decode(&token, 8).is_err());
        assert!(Position::decode("not a token", 7).is_err());
    }

    #[test]
    fn parse_failures_name_line_and_column() {
        let text = "SELECT *\nFROM devics";
        let e = Statement::parse(text).unwrap_err();
        let refused = parse_failure(text, &e).to_string();
        assert!(
            refused.starts_with(
                "SQL query parse failed due to following errors: Line 2:6 expected a collection"
            ),
            "{refused}"
        );
        assert_eq!(page_size(None).unwrap(), DEFAULT_PAGE);
        assert_eq!(page_size(Some("5000".into())).unwrap(), MAX_PAGE);
        assert!(page_size(Some("0".into())).is_err() && page_size(Some("x".into())).is_err());
    }

    #[test]
    fn modules_order_as_their_keys() {
        assert!(module_after("b", "a") && module_after("aa", "b") && !module_after("a", "a"));
    }
}
