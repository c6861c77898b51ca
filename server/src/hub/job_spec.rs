//! What a scheduled job does to each identity it reaches: the twin patch of a
//! `scheduleUpdateTwin` job or the method call of a `scheduleDeviceMethod` job, read from the
//! request's `updateTwin` / `cloudToDeviceMethod` (stored as sent, read again on resume).
//!
//! # Invariants
//! - A spec that [`JobSpec::read`] accepts at creation is accepted again when the job resumes:
//!   both read the same JSON through the same checks.

use std::time::Duration;

use ferrohub_engine::scheduled_jobs::ScheduledJobKind;
use ferrohub_engine::twin::store::TwinWrite;
use serde_json::{Map, Value};

use super::method_call::MethodRequest;

/// The largest method payload, as for direct calls (MTH-1).
const MAX_PAYLOAD: usize = 128 * 1024;
/// IoT Hub's defaults and bounds for a method call's timeouts, in seconds.
const DEFAULT_RESPONSE_TIMEOUT: u64 = 30;
const RESPONSE_TIMEOUTS: std::ops::RangeInclusive<u64> = 5..=300;

/// A job's work for one identity.
#[derive(Debug, Clone)]
pub enum JobSpec {
    UpdateTwin(TwinWrite),
    DeviceMethod(MethodCallSpec),
}

/// A method call of a job.
#[derive(Debug, Clone)]
pub struct MethodCallSpec {
    pub method: String,
    /// The payload, serialized.
    pub payload: Vec<u8>,
    pub response_timeout: Duration,
}

impl MethodCallSpec {
    /// The call to one identity. A job waits for offline devices itself, so the call does
    /// not.
    pub fn request(&self) -> MethodRequest {
        MethodRequest {
            method: self.method.clone(),
            payload: self.payload.clone(),
            connect_timeout: Duration::ZERO,
            response_timeout: self.response_timeout,
        }
    }
}

fn object(v: Option<&Value>, what: &str) -> Result<Option<Map<String, Value>>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(_) => Err(format!("{what} must be a JSON object")),
    }
}

impl JobSpec {
    /// Reads the `updateTwin` (a Twin: `tags` and `properties.desired`, anything else
    /// ignored as in a twin PATCH) or `cloudToDeviceMethod` of a job of `kind`.
    ///
    /// # Errors
    /// Why the spec is not acceptable, in words for a 400.
    pub fn read(kind: ScheduledJobKind, spec: &Value) -> Result<JobSpec, String> {
        match kind {
            ScheduledJobKind::UpdateTwin => {
                let Value::Object(twin) = spec else {
                    return Err(
                        "updateTwin is required: a Twin with tags or desired properties".into(),
                    );
                };
                let properties = object(twin.get("properties"), "updateTwin.properties")?;
                let write = TwinWrite {
                    tags: object(twin.get("tags"), "updateTwin.tags")?,
                    desired: object(
                        properties.as_ref().and_then(|p| p.get("desired")),
                        "updateTwin.properties.desired",
                    )?,
                };
                if write.tags.is_none() && write.desired.is_none() {
                    return Err(
                        "updateTwin changes nothing: give tags or properties.desired".into(),
                    );
                }
                write.check_patch().map_err(|e| e.to_string())?;
                Ok(JobSpec::UpdateTwin(write))
            }
            ScheduledJobKind::DeviceMethod => {
                let Value::Object(call) = spec else {
                    return Err("cloudToDeviceMethod is required".into());
                };
                let method = call
                    .get("methodName")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if method.is_empty() || method.len() > 256 {
                    return Err("cloudToDeviceMethod.methodName must be 1 to 256 characters".into());
                }
                let response_timeout = match call.get("responseTimeoutInSeconds") {
                    None | Some(Value::Null) => DEFAULT_RESPONSE_TIMEOUT,
                    Some(v) => v
                        .as_u64()
                        .filter(|t| RESPONSE_TIMEOUTS.contains(t))
                        .ok_or("responseTimeoutInSeconds must be 5 to 300")?,
                };
                let payload = serde_json::to_vec(call.get("payload").unwrap_or(&Value::Null))
                    .map_err(|e| e.to_string())?;
                if payload.len() > MAX_PAYLOAD {
                    return Err(format!(
                        "method payload of {} bytes; at most 128 KB",
                        payload.len()
                    ));
                }
                Ok(JobSpec::DeviceMethod(MethodCallSpec {
                    method: method.to_string(),
                    payload,
                    response_timeout: Duration::from_secs(response_timeout),
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn twin_specs_take_tags_and_desired_and_refuse_nothing_to_do() {
        let spec = json!({"etag": "*", "tags": {"x": "y"}, "properties": {"desired": {"m": 1}}});
        let JobSpec::UpdateTwin(w) = JobSpec::read(ScheduledJobKind::UpdateTwin, &spec).unwrap()
        else {
            panic!("a twin spec")
        };
        assert_eq!(w.tags.unwrap()["x"], "y");
        assert_eq!(w.desired.unwrap()["m"], 1);
        for bad in [json!(null), json!({"etag": "*"}), json!({"tags": 3})] {
            assert!(
                JobSpec::read(ScheduledJobKind::UpdateTwin, &bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn method_specs_have_a_name_and_bounded_timeouts() {
        let ok = json!({"methodName": "reboot", "payload": {"a": 1}});
        let JobSpec::DeviceMethod(m) = JobSpec::read(ScheduledJobKind::DeviceMethod, &ok).unwrap()
        else {
            panic!("a method spec")
        };
        assert_eq!(
            (m.method.as_str(), m.response_timeout.as_secs()),
            ("reboot", 30)
        );
        assert_eq!(m.payload, br#"{"a":1}"#);
        for bad in [
            json!({"methodName": ""}),
            json!({"methodName": "m", "responseTimeoutInSeconds": 1}),
            json!(null),
        ] {
            assert!(
                JobSpec::read(ScheduledJobKind::DeviceMethod, &bad).is_err(),
                "{bad}"
            );
        }
    }
}
