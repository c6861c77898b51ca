//! The JSON every device-side transport answers with (DPS's `RegistrationOperationStatus`,
//! `DeviceRegistrationResult` and error body), and the service API's
//! `DeviceRegistrationState`: one shape for MQTT, HTTPS and AMQP.
//!
//! Status strings are lower case: the SDKs compare them case-sensitively.

use ferrohub_engine::provisioning::{RegistrationRecord, RegistrationStatus, Substatus};
use serde_json::{json, Value};

use super::{DpsFailure, Operation, OperationState};
use crate::clock::iso7;

fn status_name(s: RegistrationStatus) -> &'static str {
    match s {
        RegistrationStatus::Assigned => "assigned",
        RegistrationStatus::Disabled => "disabled",
        RegistrationStatus::Failed => "failed",
    }
}

fn substatus_name(s: Substatus) -> &'static str {
    match s {
        Substatus::InitialAssignment => "initialAssignment",
        Substatus::DeviceDataMigrated => "deviceDataMigrated",
        Substatus::DeviceDataReset => "deviceDataReset",
    }
}

/// A registration state (`DeviceRegistrationResult` / `DeviceRegistrationState`).
pub fn registration_state(r: &RegistrationRecord) -> Value {
    let mut v = json!({
        "registrationId": r.registration_id,
        "createdDateTimeUtc": iso7(r.created),
        "assignedHub": r.assigned_hub,
        "deviceId": r.device_id,
        "status": status_name(r.status),
        "substatus": substatus_name(r.substatus),
        "lastUpdatedDateTimeUtc": iso7(r.last_updated),
        "etag": r.etag,
    });
    if let Some(p) = r
        .payload
        .as_deref()
        .and_then(|p| serde_json::from_str::<Value>(p).ok())
    {
        v["payload"] = p;
    }
    v
}

/// An operation (`RegistrationOperationStatus`).
pub fn operation(op: &Operation) -> Value {
    match &op.state {
        OperationState::Assigning => json!({
            "operationId": op.operation_id,
            "status": "assigning",
        }),
        OperationState::Assigned(record) => json!({
            "operationId": op.operation_id,
            "status": "assigned",
            "registrationState": registration_state(record),
        }),
        OperationState::Disabled => json!({
            "operationId": op.operation_id,
            "status": "disabled",
            "registrationState": {
                "registrationId": op.registration_id,
                "status": "disabled",
            },
        }),
        OperationState::Failed { code, message } => json!({
            "operationId": op.operation_id,
            "status": "failed",
            "registrationState": {
                "registrationId": op.registration_id,
                "status": "failed",
                "errorCode": code,
                "errorMessage": message,
            },
        }),
    }
}

/// DPS's error body.
pub fn failure(f: &DpsFailure, now: ferrohub_engine::UnixMillis) -> Value {
    let (_, code) = f.status_and_code();
    let u = rand::random::<u128>();
    json!({
        "errorCode": code,
        "trackingId": format!("{u:032x}"),
        "message": f.to_string(),
        "timestampUtc": iso7(now),
    })
}

/// Serialises with every non-ASCII character escaped: Node's MQTT transport decodes the
/// payload as ASCII.
pub fn to_ascii_json(v: &Value) -> String {
    let text = v.to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}
