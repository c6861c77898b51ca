//! IoT Hub's answer to each engine error: HTTP status, error name and error number. REST puts
//! all three into its error body (`rest::error`); MQTT twin responses carry the status alone
//! (`mqtt::twin`). Both read this one table, so the two protocols cannot disagree about what a
//! failure is.
//!
//! Errors the server itself raises (authentication, malformed requests, routing configuration)
//! are mapped beside their own types; this module only knows the engine's.

use ferrohub_engine::c2d::C2dError;
use ferrohub_engine::d2c::D2cError;
use ferrohub_engine::{HubError, RegistryError, StorageError, TwinError};
use warp::http::StatusCode;

/// `(HTTP status, IoT Hub error name, IoT Hub error number)`.
pub type ErrorCode = (StatusCode, &'static str, u32);

/// A failure of the hub itself (storage), never of the request.
pub const SERVER_ERROR: ErrorCode = (StatusCode::INTERNAL_SERVER_ERROR, "ServerError", 500001);
/// The hub cannot take writes now (a durable write failed: a full disk, an I/O error); reads
/// still work. IoT Hub's ServiceUnavailable, which clients retry.
pub const SERVICE_UNAVAILABLE: ErrorCode = (
    StatusCode::SERVICE_UNAVAILABLE,
    "ServiceUnavailable",
    503001,
);

/// A storage failure: 503 while writes are refused, otherwise a server error.
pub fn storage(e: &StorageError) -> ErrorCode {
    match e {
        // A cluster writer nobody reached may or may not have taken the write: a 503, as IoT
        // Hub answers when it cannot say (the SDKs retry it).
        StorageError::WriteFailed(_)
        | StorageError::Poisoned
        | StorageError::Closed
        | StorageError::Unavailable(_) => SERVICE_UNAVAILABLE,
        _ => SERVER_ERROR,
    }
}

/// Input that parses but is not allowed.
pub const ARGUMENT_INVALID: ErrorCode = (StatusCode::BAD_REQUEST, "ArgumentInvalid", 400004);
/// A resource the service does not name more precisely.
pub const NOT_FOUND: ErrorCode = (StatusCode::NOT_FOUND, "IotHubNotFound", 404000);
const DEVICE_NOT_FOUND: ErrorCode = (StatusCode::NOT_FOUND, "DeviceNotFound", 404001);
const MODULE_NOT_FOUND: ErrorCode = (StatusCode::NOT_FOUND, "ModuleNotFound", 404010);
const PRECONDITION_FAILED: ErrorCode = (
    StatusCode::PRECONDITION_FAILED,
    "PreconditionFailed",
    412001,
);
const QUOTA_EXCEEDED: ErrorCode = (StatusCode::FORBIDDEN, "IotHubQuotaExceeded", 403002);

/// Devices and modules.
pub fn registry(e: &RegistryError) -> ErrorCode {
    use RegistryError as E;
    match e {
        E::DeviceNotFound(_) => DEVICE_NOT_FOUND,
        E::ModuleNotFound { .. } => MODULE_NOT_FOUND,
        E::DeviceAlreadyExists(_) => (StatusCode::CONFLICT, "DeviceAlreadyExists", 409001),
        E::ModuleAlreadyExists { .. } => {
            (StatusCode::CONFLICT, "ModuleAlreadyExistsOnDevice", 409301)
        }
        E::EtagMismatch { .. } => PRECONDITION_FAILED,
        E::TooManyModules { .. } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "TooManyModulesOnDevice",
            413003,
        ),
        E::TooManyInBulk { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "TooManyDevices", 413002),
        E::Invalid(_) => ARGUMENT_INVALID,
        E::Storage(e) => storage(e),
    }
}

/// Twins: the identity's own not-found code, 412 for a stale etag, 400 for a broken limit.
pub fn twin(e: &TwinError) -> ErrorCode {
    match e {
        TwinError::NotFound {
            module_id: None, ..
        } => DEVICE_NOT_FOUND,
        TwinError::NotFound { .. } => MODULE_NOT_FOUND,
        TwinError::EtagMismatch { .. } => PRECONDITION_FAILED,
        TwinError::Invalid(_) => ARGUMENT_INVALID,
        TwinError::Storage(e) => storage(e),
    }
}

/// Cloud-to-device queues and feedback.
pub fn c2d(e: &C2dError) -> ErrorCode {
    match e {
        C2dError::DeviceNotFound(_) => DEVICE_NOT_FOUND,
        C2dError::QueueFull { .. } => (
            StatusCode::FORBIDDEN,
            "DeviceMaximumQueueDepthExceeded",
            403004,
        ),
        C2dError::BadLockToken(_) => ARGUMENT_INVALID,
        C2dError::LockLost(_) => (
            StatusCode::PRECONDITION_FAILED,
            "DeviceMessageLockLost",
            412002,
        ),
        C2dError::Storage(e) => storage(e),
    }
}

/// Device-to-cloud partitions, consumer groups and endpoints.
pub fn d2c(e: &D2cError) -> ErrorCode {
    use D2cError as E;
    match e {
        E::NoSuchPartition(_) => (StatusCode::NOT_FOUND, "PartitionNotFound", 404000),
        E::NoSuchGroup(_) => (StatusCode::NOT_FOUND, "ConsumerGroupNotFound", 404000),
        E::GroupExists(_) => (StatusCode::CONFLICT, "ConsumerGroupAlreadyExists", 409000),
        E::TooManyGroups(_) | E::NoPartitionSpace(_) => QUOTA_EXCEEDED,
        E::DefaultGroup | E::Invalid(_) => ARGUMENT_INVALID,
        E::EndpointInUse { .. } => (StatusCode::CONFLICT, "EndpointInUse", 409000),
        E::NoSuchEndpoint(_) => (StatusCode::NOT_FOUND, "EndpointNotFound", 404000),
        E::EndpointExists(_) => (StatusCode::CONFLICT, "EndpointAlreadyExists", 409000),
        E::Storage(e) => storage(e),
    }
}

/// Hub settings and policies.
pub fn hub(e: &HubError) -> ErrorCode {
    match e {
        HubError::Invalid(_) => ARGUMENT_INVALID,
        HubError::NotInitialised => SERVER_ERROR,
        HubError::PolicyNotFound(_) => (StatusCode::NOT_FOUND, "KeyNameNotFound", 404000),
        HubError::Storage(e) => storage(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_failures_answer_as_the_registry_does() {
        let device = TwinError::NotFound {
            device_id: "d".into(),
            module_id: None,
        };
        let module = TwinError::NotFound {
            device_id: "d".into(),
            module_id: Some("m".into()),
        };
        assert_eq!(
            twin(&device),
            registry(&RegistryError::DeviceNotFound("d".into()))
        );
        assert_eq!(
            twin(&module),
            registry(&RegistryError::ModuleNotFound {
                device_id: "d".into(),
                module_id: "m".into()
            })
        );
        assert_eq!(device.to_string(), "device d not registered");
        assert_eq!(module.to_string(), "module m on device d not registered");
        let stale = TwinError::EtagMismatch {
            given: "a".into(),
            current: "b".into(),
        };
        assert_eq!(twin(&stale).0, StatusCode::PRECONDITION_FAILED);
    }
}
