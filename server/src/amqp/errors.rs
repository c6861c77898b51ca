//! AMQP error conditions for what the hub refuses, with IoT Hub's error name and number in
//! the description (`ErrorCode:{name};{message}`, as IoT Hub writes them) and as `info`.

use fe2o3_amqp::types::definitions::{AmqpError, Error, ErrorCondition, Fields, LinkError};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use ferrohub_engine::c2d::C2dError;

use super::message::BadMessage;
use crate::error_codes;

fn error(condition: impl Into<ErrorCondition>, name: &str, code: u32, message: &str) -> Error {
    let mut info = Fields::default();
    info.insert(Symbol::from("status-code"), Value::Int(code as i32));
    Error::new(condition, format!("ErrorCode:{name};{message}"), Some(info))
}

/// A refused C2D send.
pub fn c2d(e: &C2dError) -> Error {
    let (_, name, code) = error_codes::c2d(e);
    let condition: ErrorCondition = match e {
        C2dError::DeviceNotFound(_) => AmqpError::NotFound.into(),
        C2dError::QueueFull { .. } => AmqpError::ResourceLimitExceeded.into(),
        C2dError::BadLockToken(_) => AmqpError::InvalidField.into(),
        C2dError::LockLost(_) => AmqpError::PreconditionFailed.into(),
        C2dError::Storage(_) => AmqpError::InternalError.into(),
    };
    error(condition, name, code, &e.to_string())
}

/// A send refused by its throttle (IoT Hub's `ThrottlingException`, 429001).
pub fn throttled(t: &crate::hub::throttle::Throttled) -> Error {
    error(
        AmqpError::ResourceLimitExceeded,
        "ThrottlingException",
        429001,
        &format!(
            "the {} throttle is exceeded; retry after {:.1} s",
            t.operation.name(),
            t.retry_after.as_secs_f64()
        ),
    )
}

/// A send refused because the daily message quota is used up (`IotHubQuotaExceeded`, 403002).
pub fn quota_exceeded(q: &crate::hub::daily_quota::QuotaExceeded) -> Error {
    error(
        AmqpError::ResourceLimitExceeded,
        "IotHubQuotaExceeded",
        403002,
        &format!(
            "the daily message quota is used up until {}",
            crate::clock::iso7(q.resets_at)
        ),
    )
}

/// A message that cannot be a C2D message.
pub fn bad_message(e: &BadMessage) -> Error {
    match e {
        BadMessage::Field(m) => error(AmqpError::InvalidField, "ArgumentInvalid", 400004, m),
        BadMessage::TooLarge(m) => {
            error(LinkError::MessageSizeExceeded, "MessageTooLarge", 413001, m)
        }
    }
}

/// A link used without a claim that allows it.
pub fn unauthorized(reason: &str) -> Error {
    error(
        AmqpError::UnauthorizedAccess,
        "IotHubUnauthorizedAccess",
        401002,
        reason,
    )
}

/// The redirect of a receiver on IoT Hub's `messages/events/...` to the built-in endpoint's
/// Event Hubs-compatible address (AMQ-8): `hostname`, `network-host`, `port` (an int) and
/// `address`, with symbol keys, as the official samples read them.
pub fn redirect(host: &str, address: &str) -> Error {
    let mut info = Fields::default();
    info.insert(Symbol::from("hostname"), Value::String(host.to_string()));
    info.insert(
        Symbol::from("network-host"),
        Value::String(host.to_string()),
    );
    info.insert(Symbol::from("port"), Value::Int(5671));
    info.insert(Symbol::from("address"), Value::String(address.to_string()));
    Error::new(
        LinkError::Redirect,
        format!("the built-in endpoint is the Event Hubs-compatible entity at {address}"),
        Some(info),
    )
}

/// A second live link of the same identity, address and direction on one connection.
pub fn link_taken(what: &str) -> Error {
    error(
        AmqpError::ResourceLocked,
        "DeviceAlreadyConnected",
        409002,
        &format!("{what} is already attached on this connection; detach it first"),
    )
}

/// A failure of the hub itself (storage).
pub fn internal(message: &str) -> Error {
    error(AmqpError::InternalError, "ServerError", 500001, message)
}

/// A link to an address the hub does not serve.
pub fn unknown_node(address: &str) -> Error {
    error(
        AmqpError::NotFound,
        "IotHubNotFound",
        404000,
        &format!("no AMQP node {address:?}: the service endpoint serves $cbs, /messages/devicebound, /messages/serviceBound/feedback, /messages/serviceBound/filenotifications, $management and {{entity}}/ConsumerGroups/{{group}}/Partitions/{{partition}}"),
    )
}
