//! File upload (FUP-1), device side: `POST /devices/{id}/files` grants a short-lived SAS for
//! `{deviceId}/{blobName}` in the configured account; `POST /devices/{id}/files/notifications`
//! reports the outcome and, when notifications are on, queues one for the service.

use ferrohub_engine::model::Status;
use serde::Deserialize;
use serde_json::json;
use warp::filters::BoxedFilter;
use warp::Filter;

use super::error::ApiError;
use super::reply::{json, no_content, one_of, Handled, Response};
use super::telemetry::authorise;
use super::{caller, json_body, Context, PathId};
use crate::auth::Principal;
use crate::hub::file_uploads::{FileUploads, UploadError};

#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    one_of([
        warp::path!("devices" / PathId / "files").and(warp::post()).and(caller()).and(json_body()).then(grant_handler).boxed(),
        warp::path!("devices" / PathId / "files" / "notifications").and(warp::post()).and(caller()).and(json_body()).then(notify_handler).boxed(),
    ])
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GrantRequest {
    blob_name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UploadReport {
    correlation_id: String,
    is_success: bool,
    #[serde(default)]
    status_code: Option<i64>,
    #[serde(default)]
    status_description: Option<String>,
}

fn uploads(ctx: &Context) -> Result<&FileUploads, ApiError> {
    ctx.uploads.as_deref().ok_or_else(|| {
        ApiError::argument(
            "file upload is not configured for this hub (no [file_upload] storage account)",
        )
    })
}

/// The device must exist and be enabled, and the caller must act for it.
async fn check_device(ctx: &Context, p: &Principal, device_id: &str) -> Result<(), ApiError> {
    authorise(p, device_id, None)?;
    let id = device_id.to_string();
    let device = ctx.store.run(move |s| s.get_device(&id)).await?;
    if device.status == Status::Disabled {
        return Err(ApiError::Registry(
            ferrohub_engine::RegistryError::DeviceNotFound(device_id.to_string()),
        ));
    }
    Ok(())
}

async fn grant_handler(id: PathId, ctx: Context, p: Principal, body: GrantRequest) -> Handled {
    check_device(&ctx, &p, &id.0).await?;
    let name = body.blob_name.trim_start_matches('/');
    if name.is_empty()
        || name.len() > 1024
        || name
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(ApiError::argument(format!(
            "blobName {:?} is not a valid blob name",
            body.blob_name
        )));
    }
    let up = uploads(&ctx)?;
    let (correlation_id, grant) = up
        .grant(&id.0, name, ctx.clock.now())
        .await
        .map_err(|e| ApiError::argument(e.to_string()))?;
    tracing::info!(device = %id.0, blob = %grant.blob_name, "file upload granted");
    Ok(json(&json!({
        "correlationId": correlation_id,
        "hostName": grant.host_name,
        "containerName": grant.container,
        "blobName": grant.blob_name,
        "sasToken": grant.sas_token,
    })))
}

async fn notify_handler(id: PathId, ctx: Context, p: Principal, body: UploadReport) -> Handled {
    check_device(&ctx, &p, &id.0).await?;
    let up = uploads(&ctx)?;
    let now = ctx.clock.now();
    let notification = up
        .complete(&id.0, &body.correlation_id, body.is_success, now)
        .await
        .map_err(|e| match e {
            UploadError::UnknownCorrelation(_) => ApiError::argument(e.to_string()),
            UploadError::Blob(b) => ApiError::argument(format!(
                "the upload was reported successful but its blob cannot be read: {b}"
            )),
        })?;
    tracing::info!(
        device = %id.0,
        success = body.is_success,
        status = body.status_code.unwrap_or_default(),
        description = body.status_description.as_deref().unwrap_or(""),
        "file upload reported"
    );
    if let Some(notification) = notification {
        let call = crate::hub::calls::EnqueueFileNotification { notification, now };
        ctx.write(call).await?;
    }
    Ok(no_content())
}
