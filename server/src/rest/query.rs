//! `POST /devices/query` (QRY-1, compat §B4): the twin query language over device twins,
//! module twins and device jobs, paged with `x-ms-max-item-count` and `x-ms-continuation`.
//!
//! The pages themselves are read by [`crate::hub::twin_query`].
//!
//! # Invariants
//! - A continuation token is opaque to the client and bound to its query text; the last
//!   page has no `x-ms-continuation` header at all (the Node SDK reads any header, even an
//!   empty one, as "more").

use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;
use warp::filters::BoxedFilter;
use warp::http::HeaderValue;
use warp::{Filter, Reply};

use super::error::ApiError;
use super::reply::{one_of, Handled, Response};
use super::{caller, json_body, Context};
use crate::auth::{Permission, Principal};
use crate::hub::twin_query::{self, Position};
use crate::routing::query::{QueryError, Statement};

/// Rows per page unless the client asks otherwise, and the most it may ask for.
pub const DEFAULT_PAGE: usize = 100;
pub const MAX_PAGE: usize = 1_000;

#[derive(Debug, Deserialize)]
struct QueryRequest {
    query: Option<Value>,
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
pub fn parse_failure(text: &str, e: &QueryError) -> ApiError {
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

/// The page size a request asks for (`x-ms-max-item-count`), within bounds.
pub fn page_size(header: Option<String>) -> Result<usize, ApiError> {
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
    let position = match token.filter(|t| !t.trim().is_empty()) {
        Some(t) => Position::decode(&t, &text).map_err(|e| ApiError::argument(e.to_string()))?,
        None => Position::start(&text),
    };
    let item_type = statement.item_type();
    let statement = Arc::new(statement);
    let (rows, next) = ctx
        .store
        .run(move |s| twin_query::page(s, &statement, size, position))
        .await?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
