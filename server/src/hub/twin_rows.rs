//! How twins and device-job rows read as JSON: IoT Hub's Twin model (TWN-3, compat §B2) and
//! `devices.jobs` rows, shared by REST replies, queries and the scheduled-job runner (queries
//! filter on exactly the JSON a client reads back).

use ferrohub_engine::model::{AuthType, ConnectionState, Status, UnixMillis};
use ferrohub_engine::scheduled_jobs::{DeviceJobRow, DeviceJobStatus, ScheduledJobKind};
use ferrohub_engine::twin::store::Twin;
use serde_json::{json, Value};

/// `0001-01-01T00:00:00Z` for "never", otherwise UTC with 7 fractional digits as IoT Hub sends.
pub fn format_time(t: Option<UnixMillis>) -> String {
    match t.and_then(|t| chrono::DateTime::from_timestamp_millis(t.0)) {
        // Seven fractional digits (100 ns ticks), as IoT Hub writes them; chrono has no %.7f.
        Some(dt) => format!(
            "{}.{:07}Z",
            dt.format("%Y-%m-%dT%H:%M:%S"),
            dt.timestamp_subsec_nanos() / 100
        ),
        None => "0001-01-01T00:00:00Z".to_string(),
    }
}

/// `authentication.type` as IoT Hub spells it.
pub fn auth_type_name(kind: AuthType) -> &'static str {
    match kind {
        AuthType::Sas => "sas",
        AuthType::SelfSigned => "selfSigned",
        AuthType::CertificateAuthority => "certificateAuthority",
        AuthType::None => "none",
    }
}

/// `status` as IoT Hub spells it.
pub fn status_name(status: Status) -> &'static str {
    match status {
        Status::Enabled => "enabled",
        Status::Disabled => "disabled",
    }
}

/// `connectionState` as IoT Hub spells it.
pub fn connection_state(s: ConnectionState) -> &'static str {
    match s {
        ConnectionState::Connected => "Connected",
        ConnectionState::Disconnected => "Disconnected",
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, the `$metadata` time format (TWN-6).
pub fn metadata_time(t: UnixMillis) -> String {
    chrono::DateTime::from_timestamp_millis(t.0)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

/// The Twin model.
pub fn twin_json(t: &Twin) -> Value {
    let i = &t.identity;
    let r = &t.record;
    let thumbprints = i.authentication.thumbprints.clone().unwrap_or_default();
    let mut out = json!({
        "deviceId": i.device_id,
        "etag": r.etag,
        "deviceEtag": i.etag,
        "status": status_name(i.status),
        "statusReason": i.status_reason,
        "statusUpdateTime": format_time(Some(i.status_updated_time)),
        "connectionState": connection_state(i.connection_state),
        "lastActivityTime": format_time(i.last_activity_time),
        "cloudToDeviceMessageCount": i.cloud_to_device_message_count,
        "authenticationType": auth_type_name(i.authentication.kind),
        "x509Thumbprint": {"primaryThumbprint": thumbprints.primary, "secondaryThumbprint": thumbprints.secondary},
        "modelId": i.model_id.as_deref().unwrap_or_default(),
        "version": r.version,
        "tags": Value::Object(r.tags.clone()),
        "properties": {
            "desired": r.desired.to_json(&metadata_time, true),
            "reported": r.reported.to_json(&metadata_time, false),
        },
        "capabilities": {"iotEdge": i.iot_edge},
    });
    if let Some(m) = &i.module_id {
        out["moduleId"] = Value::String(m.clone());
    }
    if !r.configurations.is_empty() {
        let configurations: serde_json::Map<String, Value> = r
            .configurations
            .iter()
            .map(|(id, c)| (id.clone(), json!({"status": c.status})))
            .collect();
        out["configurations"] = Value::Object(configurations);
    }
    out
}

/// A job's `type` as IoT Hub spells it.
pub fn job_kind_name(kind: ScheduledJobKind) -> &'static str {
    match kind {
        ScheduledJobKind::UpdateTwin => "scheduleUpdateTwin",
        ScheduledJobKind::DeviceMethod => "scheduleDeviceMethod",
    }
}

fn device_job_status_name(s: DeviceJobStatus) -> &'static str {
    match s {
        DeviceJobStatus::Pending => "pending",
        DeviceJobStatus::Scheduled => "scheduled",
        DeviceJobStatus::Running => "running",
        DeviceJobStatus::Completed => "completed",
        DeviceJobStatus::Failed => "failed",
        // IoT Hub spells a device row's status with one "l" and a job's with two.
        DeviceJobStatus::Canceled => "canceled",
    }
}

/// A `devices.jobs` row (item type `deviceJob`).
pub fn device_job_json(row: &DeviceJobRow) -> Value {
    let outcome: Value = serde_json::from_str(&row.outcome).unwrap_or_else(|_| json!({}));
    let mut out = json!({
        "deviceId": row.device_id,
        "jobId": row.job_id,
        "jobType": job_kind_name(row.kind),
        "status": device_job_status_name(row.status),
        "startTimeUtc": format_time(Some(row.start)),
        "endTimeUtc": format_time(Some(row.end)),
        "createdDateTimeUtc": format_time(Some(row.created)),
        "lastUpdatedDateTimeUtc": format_time(Some(row.last_updated)),
        "outcome": outcome,
    });
    if let Some(m) = &row.module_id {
        out["moduleId"] = Value::String(m.clone());
    }
    if let Some((code, description)) = &row.error {
        out["error"] = json!({"code": code, "description": description});
    }
    out
}
