//! Every REST failure as IoT Hub reports it: status, reason phrase, and the registry-style
//! body `{"Message":"ErrorCode:{Name};{text}","ExceptionMessage":"Tracking ID:...","errorCode":N}`.
//! The status is chosen here and nowhere else (see [`ApiError::status_and_code`]); for engine
//! errors it comes from [`crate::error_codes`], the table MQTT answers from too.

use std::convert::Infallible;

use ferrohub_engine::{RegistryError, StorageError, TwinError};
use warp::http::StatusCode;
use warp::reject::Reject;
use warp::Reply;

use crate::auth::AuthError;
use crate::error_codes::{self, ErrorCode};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(#[from] AuthError),
    #[error("{0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Twin(#[from] TwinError),
    #[error("{message}")]
    BadRequest {
        code: &'static str,
        number: u32,
        message: String,
    },
    #[error("{0}")]
    Storage(#[from] StorageError),
    /// A refusal named where it arises (a status, IoT Hub's error name and number).
    #[error("{message}")]
    Coded {
        status: StatusCode,
        code: &'static str,
        number: u32,
        message: String,
    },
    #[error("no such resource: {0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("request body too large")]
    PayloadTooLarge,
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Events(#[from] ferrohub_engine::d2c::D2cError),
    #[error("{0}")]
    Hub(#[from] ferrohub_engine::HubError),
    #[error("{0}")]
    C2d(#[from] ferrohub_engine::c2d::C2dError),
    #[error("{0}")]
    Routing(#[from] crate::routing::RouteError),
    #[error("{0}")]
    Job(#[from] ferrohub_engine::jobs::JobError),
    #[error("{0}")]
    ScheduledJob(#[from] ferrohub_engine::scheduled_jobs::ScheduledJobError),
    #[error("the {} throttle is exceeded; retry after {:.1} s", .0.operation.name(), .0.retry_after.as_secs_f64())]
    Throttled(crate::hub::throttle::Throttled),
    #[error("the daily message quota is used up until {}", crate::clock::iso7(.0.resets_at))]
    QuotaExceeded(crate::hub::daily_quota::QuotaExceeded),
    /// A refusal of the provisioning service, answered with DPS's error body
    /// (`{"errorCode","trackingId","message","timestampUtc"}`) instead of IoT Hub's.
    #[error("{message}")]
    Provisioning {
        status: StatusCode,
        code: u32,
        message: String,
        /// Seconds for `Retry-After` (a throttled or unavailable service).
        retry_after: Option<u64>,
    },
}

impl Reject for ApiError {}

impl ApiError {
    /// A 400 for an input that does not parse or has the wrong shape.
    pub fn format(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            code: "IotHubFormatError",
            number: 400006,
            message: message.into(),
        }
    }

    /// A 400 for an input that parses but is not allowed.
    pub fn argument(message: impl Into<String>) -> Self {
        ApiError::BadRequest {
            code: "ArgumentInvalid",
            number: 400004,
            message: message.into(),
        }
    }

    /// `(status, IoT Hub error name, IoT Hub error number)`; engine errors as
    /// [`crate::error_codes`] maps them for every protocol.
    pub fn status_and_code(&self) -> ErrorCode {
        match self {
            ApiError::Unauthorized(_) => {
                (StatusCode::UNAUTHORIZED, "IotHubUnauthorizedAccess", 401002)
            }
            ApiError::BadRequest { code, number, .. } => (StatusCode::BAD_REQUEST, code, *number),
            ApiError::Storage(e) => error_codes::storage(e),
            ApiError::Coded {
                status,
                code,
                number,
                ..
            } => (*status, code, *number),
            ApiError::NotFound(_) => error_codes::NOT_FOUND,
            ApiError::MethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, "InvalidOperation", 405000)
            }
            ApiError::PayloadTooLarge | ApiError::TooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "MessageTooLarge", 413001)
            }
            ApiError::Routing(e) => {
                use crate::routing::RouteError as E;
                match e {
                    E::BadCondition { .. } | E::UnknownEndpoint { .. } | E::Invalid(_) => {
                        error_codes::ARGUMENT_INVALID
                    }
                    E::NotFound(_) => error_codes::NOT_FOUND,
                    E::Storage(e) => error_codes::storage(e),
                }
            }
            ApiError::Registry(e) => error_codes::registry(e),
            ApiError::Twin(e) => error_codes::twin(e),
            ApiError::Hub(e) => error_codes::hub(e),
            ApiError::C2d(e) => error_codes::c2d(e),
            ApiError::Events(e) => error_codes::d2c(e),
            ApiError::Throttled(_) => {
                (StatusCode::TOO_MANY_REQUESTS, "ThrottlingException", 429001)
            }
            ApiError::QuotaExceeded(_) => (StatusCode::FORBIDDEN, "IotHubQuotaExceeded", 403002),
            ApiError::Provisioning { status, code, .. } => (*status, "ProvisioningError", *code),
            ApiError::Job(e) => {
                use ferrohub_engine::jobs::JobError as E;
                match e {
                    E::AnotherActive { .. } => (StatusCode::FORBIDDEN, "JobQuotaExceeded", 403003),
                    E::NotFound(_) => (StatusCode::NOT_FOUND, "JobNotFound", 404002),
                    E::Storage(e) => error_codes::storage(e),
                }
            }
            ApiError::ScheduledJob(e) => {
                use ferrohub_engine::scheduled_jobs::ScheduledJobError as E;
                match e {
                    E::AlreadyExists(_) => (StatusCode::CONFLICT, "JobAlreadyExists", 409001),
                    E::NotFound(_) => (StatusCode::NOT_FOUND, "JobNotFound", 404002),
                    E::Storage(e) => error_codes::storage(e),
                }
            }
        }
    }

    pub fn into_response(&self) -> warp::reply::Response {
        let (status, name, number) = self.status_and_code();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else if status == StatusCode::TOO_MANY_REQUESTS {
            // A flood must not become a flood of log lines: the metrics count these.
            metrics::counter!("ferrohub_requests_refused_total", "protocol" => "https", "code" => name)
                .increment(1);
            tracing::debug!(code = name, number, error = %self, "request throttled");
        } else {
            metrics::counter!("ferrohub_requests_refused_total", "protocol" => "https", "code" => name)
                .increment(1);
            tracing::info!(
                status = status.as_u16(),
                code = name,
                number,
                error = %self,
                "request refused"
            );
        }
        let now = chrono::Utc::now().format("%Y-%m-%d %H:%M:%SZ");
        let tracking = format!("{:032x}", rand::random::<u128>());
        let body = if let ApiError::Provisioning { .. } = self {
            serde_json::json!({
                "errorCode": number,
                "trackingId": tracking,
                "message": self.to_string(),
                "timestampUtc": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            })
        } else {
            serde_json::json!({
                "Message": format!("ErrorCode:{name};{self}"),
                "ExceptionMessage": format!("Tracking ID:{tracking}-TimeStamp:{now}"),
                "errorCode": number,
            })
        };
        let mut response =
            warp::reply::with_status(warp::reply::json(&body), status).into_response();
        let retry_after = match self {
            // Whole seconds, rounded up: the earliest a retry can be admitted.
            ApiError::Throttled(t) => {
                Some((t.retry_after.as_secs() + u64::from(t.retry_after.subsec_nanos() > 0)).max(1))
            }
            ApiError::Provisioning { retry_after, .. } => *retry_after,
            _ => None,
        };
        if let Some(v) =
            retry_after.and_then(|s| warp::http::HeaderValue::from_str(&s.to_string()).ok())
        {
            response.headers_mut().insert("retry-after", v);
        }
        response
    }
}

/// The one place rejections become responses.
pub async fn recover(rejection: warp::Rejection) -> Result<warp::reply::Response, Infallible> {
    let error = if let Some(e) = rejection.find::<ApiError>() {
        return Ok(e.into_response());
    } else if rejection.is_not_found() {
        ApiError::NotFound("no such endpoint".into())
    } else if rejection.find::<warp::reject::PayloadTooLarge>().is_some() {
        // Before MethodNotAllowed: the route that refused the body matched the method, while
        // routes for other methods on the same path add a MethodNotAllowed to the rejection.
        ApiError::PayloadTooLarge
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        ApiError::MethodNotAllowed
    } else if let Some(e) = rejection.find::<warp::reject::InvalidQuery>() {
        ApiError::format(e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::InvalidHeader>() {
        ApiError::format(e.to_string())
    } else {
        ApiError::format(format!("{rejection:?}"))
    };
    Ok(error.into_response())
}
