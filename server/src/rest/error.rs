//! Every REST failure as IoT Hub reports it: status, reason phrase, and the registry-style
//! body `{"Message":"ErrorCode:{Name};{text}","ExceptionMessage":"Tracking ID:...","errorCode":N}`.
//! The status is chosen here and nowhere else (see [`ApiError::status_and_code`]).

use std::convert::Infallible;

use ferrohub_engine::{RegistryError, StorageError};
use warp::http::StatusCode;
use warp::reject::Reject;
use warp::Reply;

use crate::auth::AuthError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(#[from] AuthError),
    #[error("{0}")]
    Registry(#[from] RegistryError),
    #[error("{message}")]
    BadRequest {
        code: &'static str,
        number: u32,
        message: String,
    },
    #[error("{0}")]
    Storage(#[from] StorageError),
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

    /// `(status, IoT Hub error name, IoT Hub error number)`.
    pub fn status_and_code(&self) -> (StatusCode, &'static str, u32) {
        use RegistryError as R;
        match self {
            ApiError::Unauthorized(_) => {
                (StatusCode::UNAUTHORIZED, "IotHubUnauthorizedAccess", 401002)
            }
            ApiError::Registry(e) => match e {
                R::DeviceNotFound(_) => (StatusCode::NOT_FOUND, "DeviceNotFound", 404001),
                R::ModuleNotFound { .. } => (StatusCode::NOT_FOUND, "ModuleNotFound", 404010),
                R::DeviceAlreadyExists(_) => (StatusCode::CONFLICT, "DeviceAlreadyExists", 409001),
                R::ModuleAlreadyExists { .. } => {
                    (StatusCode::CONFLICT, "ModuleAlreadyExistsOnDevice", 409301)
                }
                R::EtagMismatch { .. } => (
                    StatusCode::PRECONDITION_FAILED,
                    "PreconditionFailed",
                    412001,
                ),
                R::TooManyModules { .. } => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "TooManyModulesOnDevice",
                    413003,
                ),
                R::TooManyInBulk { .. } => {
                    (StatusCode::PAYLOAD_TOO_LARGE, "TooManyDevices", 413002)
                }
                R::Invalid(_) => (StatusCode::BAD_REQUEST, "ArgumentInvalid", 400004),
                R::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError", 500001),
            },
            ApiError::BadRequest { code, number, .. } => (StatusCode::BAD_REQUEST, code, *number),
            ApiError::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError", 500001),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "IotHubNotFound", 404000),
            ApiError::MethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, "InvalidOperation", 405000)
            }
            ApiError::PayloadTooLarge | ApiError::TooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, "MessageTooLarge", 413001)
            }
            ApiError::Hub(ferrohub_engine::HubError::Invalid(_)) => {
                (StatusCode::BAD_REQUEST, "ArgumentInvalid", 400004)
            }
            ApiError::Hub(_) => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError", 500001),
            ApiError::Routing(e) => {
                use crate::routing::RouteError as E;
                match e {
                    E::BadCondition { .. } | E::UnknownEndpoint { .. } | E::Invalid(_) => {
                        (StatusCode::BAD_REQUEST, "ArgumentInvalid", 400004)
                    }
                    E::NotFound(_) => (StatusCode::NOT_FOUND, "IotHubNotFound", 404000),
                    E::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError", 500001),
                }
            }
            ApiError::C2d(e) => {
                use ferrohub_engine::c2d::C2dError as E;
                match e {
                    E::DeviceNotFound(_) => (StatusCode::NOT_FOUND, "DeviceNotFound", 404001),
                    E::QueueFull { .. } => (
                        StatusCode::FORBIDDEN,
                        "DeviceMaximumQueueDepthExceeded",
                        403004,
                    ),
                    E::BadLockToken(_) => (StatusCode::BAD_REQUEST, "ArgumentInvalid", 400004),
                    E::LockLost(_) => (
                        StatusCode::PRECONDITION_FAILED,
                        "DeviceMessageLockLost",
                        412002,
                    ),
                    E::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError", 500001),
                }
            }
            ApiError::Events(e) => {
                use ferrohub_engine::d2c::D2cError as E;
                match e {
                    E::NoSuchPartition(_) => (StatusCode::NOT_FOUND, "PartitionNotFound", 404000),
                    E::NoSuchGroup(_) => (StatusCode::NOT_FOUND, "ConsumerGroupNotFound", 404000),
                    E::GroupExists(_) => {
                        (StatusCode::CONFLICT, "ConsumerGroupAlreadyExists", 409000)
                    }
                    E::TooManyGroups(_) => (StatusCode::FORBIDDEN, "IotHubQuotaExceeded", 403002),
                    E::DefaultGroup => (StatusCode::BAD_REQUEST, "ArgumentInvalid", 400004),
                    E::EndpointInUse { .. } => (StatusCode::CONFLICT, "EndpointInUse", 409000),
                    E::NoSuchEndpoint(_) => (StatusCode::NOT_FOUND, "EndpointNotFound", 404000),
                    E::EndpointExists(_) => (StatusCode::CONFLICT, "EndpointAlreadyExists", 409000),
                    E::NoPartitionSpace(_) => {
                        (StatusCode::FORBIDDEN, "IotHubQuotaExceeded", 403002)
                    }
                    E::Invalid(_) => (StatusCode::BAD_REQUEST, "ArgumentInvalid", 400004),
                    E::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "ServerError", 500001),
                }
            }
        }
    }

    pub fn into_response(&self) -> warp::reply::Response {
        let (status, name, number) = self.status_and_code();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::debug!(error = %self, "request refused");
        }
        let now = chrono::Utc::now().format("%Y-%m-%d %H:%M:%SZ");
        let tracking = format!("{:032x}", rand::random::<u128>());
        let body = serde_json::json!({
            "Message": format!("ErrorCode:{name};{self}"),
            "ExceptionMessage": format!("Tracking ID:{tracking}-TimeStamp:{now}"),
            "errorCode": number,
        });
        warp::reply::with_status(warp::reply::json(&body), status).into_response()
    }
}

/// The one place rejections become responses.
pub async fn recover(rejection: warp::Rejection) -> Result<warp::reply::Response, Infallible> {
    let error = if let Some(e) = rejection.find::<ApiError>() {
        return Ok(e.into_response());
    } else if rejection.is_not_found() {
        ApiError::NotFound("no such endpoint".into())
    } else if rejection.find::<warp::reject::MethodNotAllowed>().is_some() {
        ApiError::MethodNotAllowed
    } else if rejection.find::<warp::reject::PayloadTooLarge>().is_some() {
        ApiError::PayloadTooLarge
    } else if let Some(e) = rejection.find::<warp::reject::InvalidQuery>() {
        ApiError::format(e.to_string())
    } else if let Some(e) = rejection.find::<warp::reject::InvalidHeader>() {
        ApiError::format(e.to_string())
    } else {
        ApiError::format(format!("{rejection:?}"))
    };
    Ok(error.into_response())
}
