//! How a REST route answers. A handler is a plain `async fn` returning [`Handled`]; a module
//! lists its routes as one table of [`Route`]s, and [`one_of`] joins them and turns an `Err`
//! into the rejection that [`super::error::recover`] renders as IoT Hub's error body. The
//! success shapes (JSON, JSON with the resource's etag, JSON with another status, 204) are built
//! here and nowhere else.
//!
//! # Invariants
//! - A handler's failure travels as a rejection carrying its [`ApiError`], never as a response
//!   built on the spot, so status, error code and body come from `error.rs` alone.
//! - An etag goes out quoted, as IoT Hub sends it; `If-Match` takes it back quoted or bare.

use serde::Serialize;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Reply};

use super::error::ApiError;

/// What a route sends back.
pub type Response = warp::reply::Response;
/// A handler's result: its response, or the failure to report.
pub type Handled = Result<Response, ApiError>;
/// One row of a module's route table: what the request must match and carry, then the handler.
pub type Route = BoxedFilter<(Handled,)>;

/// A module's routes as one filter: the first route whose path, method and inputs match runs
/// its handler, and the handler's error becomes a rejection for [`super::error::recover`].
pub fn one_of(routes: impl IntoIterator<Item = Route>) -> BoxedFilter<(Response,)> {
    first_of(routes)
        .and_then(|handled: Handled| async move { handled.map_err(warp::reject::custom) })
        .boxed()
}

/// The first of `filters` that matches (warp's `or`, over a list). Each is boxed already, so
/// a long list never builds one deeply nested filter type.
///
/// # Panics
/// When `filters` is empty: a route table without rows is a programming error.
pub fn first_of<T: Send + 'static>(
    filters: impl IntoIterator<Item = BoxedFilter<(T,)>>,
) -> BoxedFilter<(T,)> {
    filters
        .into_iter()
        .reduce(|first, next| first.or(next).unify().boxed())
        .expect("a route table has at least one route")
}

/// `value` as JSON, 200.
pub fn json<T: Serialize>(value: &T) -> Response {
    warp::reply::json(value).into_response()
}

/// `value` as JSON with another status (201 for a creation, 400 for a failed bulk request).
pub fn json_with_status<T: Serialize>(value: &T, status: StatusCode) -> Response {
    warp::reply::with_status(json(value), status).into_response()
}

/// `value` as JSON, 200, with the resource's etag in `ETag`.
pub fn json_with_etag<T: Serialize>(value: &T, etag: &str) -> Response {
    let mut response = json(value);
    set_etag(&mut response, etag);
    response
}

/// Puts `etag` in the response's `ETag` header, quoted.
pub fn set_etag(response: &mut Response, etag: &str) {
    if let Ok(v) = format!("\"{etag}\"").parse() {
        response.headers_mut().insert("etag", v);
    }
}

/// 204 with no body: done, nothing to say.
pub fn no_content() -> Response {
    warp::reply::with_status(warp::reply(), StatusCode::NO_CONTENT).into_response()
}
