//! The provisioning service's HTTPS surface (DPS-1, DPS-4) on the hub's own listener: the
//! device API under `/{idScope}/registrations/...` and the service API under `/enrollments`,
//! `/enrollmentGroups` and `/registrations`. Neither shape collides with an IoT Hub path.
//!
//! # Invariants
//! - Every refusal carries DPS's error body ([`ApiError::Provisioning`]), not IoT Hub's.
//! - Service calls are signed by a provisioning policy (never a hub policy) and checked for
//!   the right they need before anything is read.

mod device;
pub(crate) mod enrollment_json;
pub(crate) mod service;

use ferrohub_engine::provisioning::ProvisioningError;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Rejection};

use super::error::ApiError;
use super::reply::Response;
use super::Context;
use crate::hub::provisioning::DpsFailure;

pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    super::reply::first_of([service::routes(ctx.clone()), device::routes(ctx)]).boxed()
}

/// A DPS refusal.
fn refusal(status: StatusCode, code: u32, message: impl Into<String>) -> ApiError {
    ApiError::Provisioning {
        status,
        code,
        message: message.into(),
        retry_after: None,
    }
}

/// A 400 for a body or parameter of the wrong shape.
fn bad_request(message: impl Into<String>) -> ApiError {
    refusal(StatusCode::BAD_REQUEST, 400004, message)
}

impl From<DpsFailure> for ApiError {
    fn from(f: DpsFailure) -> Self {
        let (status, code) = f.status_and_code();
        ApiError::Provisioning {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            message: f.to_string(),
            retry_after: f.retry_after_secs(),
        }
    }
}

/// Engine refusals as DPS reports them.
fn engine_error(e: ProvisioningError) -> ApiError {
    use ProvisioningError as E;
    let (status, code) = match &e {
        E::EnrollmentNotFound(_) => (StatusCode::NOT_FOUND, 404201),
        E::GroupNotFound(_) => (StatusCode::NOT_FOUND, 404202),
        E::RegistrationNotFound(_) => (StatusCode::NOT_FOUND, 404203),
        E::EtagMismatch { .. } => (StatusCode::PRECONDITION_FAILED, 412001),
        E::AlreadyExists(_) | E::EnrollmentChanged(_) => (StatusCode::CONFLICT, 409001),
        E::EnrollmentDisabled(_) | E::TooManyInBulk { .. } | E::Invalid(_) | E::Registry(_) => {
            (StatusCode::BAD_REQUEST, 400004)
        }
        E::Storage(s) => return ApiError::Storage(s.clone()),
    };
    refusal(status, code, e.to_string())
}

/// A JSON body, refused with DPS's 400 when it does not parse.
fn json_body() -> impl Filter<Extract = (serde_json::Value,), Error = Rejection> + Clone {
    warp::body::content_length_limit(4 << 20)
        .and(warp::body::bytes())
        .and_then(|bytes: bytes::Bytes| async move {
            serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| {
                warp::reject::custom(bad_request(format!("the body is not valid JSON: {e}")))
            })
        })
}

/// Requires an `api-version` query parameter, as DPS does.
fn api_version() -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::query::raw()
        .or(warp::any().map(String::new))
        .unify()
        .and_then(|query: String| async move {
            let has = query.split('&').any(|p| {
                p.split('=').next() == Some("api-version") && p.len() > "api-version=".len()
            });
            if has {
                Ok(())
            } else {
                Err(warp::reject::custom(bad_request(
                    "the api-version query parameter is required",
                )))
            }
        })
        .untuple_one()
}
