//! Online backups of a running single node (not an IoT Hub API): `POST /backups` with
//! `{"name": "...", "includeTls": true}` makes one in the configured backups directory
//! (`[backup] directory`), `GET /backups` lists them. RegistryWrite to make one (a backup holds
//! every key), RegistryRead to list. See docs/operations.md, "Backups".

use std::time::SystemTime;

use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::error::ApiError;
use super::reply::{json, one_of, Handled, Response};
use super::{caller, json_body, Context};
use crate::auth::{Permission, Principal};
use crate::backup::{self, OnlineBackups, TlsIdentity};

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BackupBody {
    /// Default: `backup-{UTC time}`.
    name: Option<String>,
    /// Default true: a hub restored from the backup keeps its CA.
    include_tls: Option<bool>,
}

/// The backup route table.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    one_of([
        warp::path!("backups").and(warp::post()).and(caller()).and(json_body()).then(create_handler).boxed(),
        warp::path!("backups").and(warp::get()).and(caller()).then(list_handler).boxed(),
    ])
}

/// A backup that could not be made (disk full, permissions): IoT Hub's generic server error.
fn failed(message: String) -> ApiError {
    ApiError::Coded {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "ServerError",
        number: 500001,
        message,
    }
}

fn online(ctx: &Context) -> Result<&OnlineBackups, ApiError> {
    ctx.backups.get().ok_or_else(|| ApiError::Coded {
        status: StatusCode::NOT_IMPLEMENTED,
        code: "NotSupported",
        number: 501000,
        message: "online backups are made by a single node; in cluster mode back up a stopped \
                  node's data directory (ferrohub backup)"
            .into(),
    })
}

async fn create_handler(ctx: Context, p: Principal, body: BackupBody) -> Handled {
    p.require_hub(Permission::RegistryWrite)?;
    let backups = online(&ctx)?.clone();
    let name = body
        .name
        .unwrap_or_else(|| format!("backup-{}", chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ")));
    if !backup::valid_name(&name) {
        return Err(ApiError::argument(format!(
            "backup name {name:?}: 1 to 128 letters, digits, '.', '-' or '_', not starting with '.'"
        )));
    }
    let to = backups.directory.join(&name);
    if to.exists() {
        return Err(ApiError::Coded {
            status: StatusCode::CONFLICT,
            code: "BackupAlreadyExists",
            number: 409000,
            message: format!("a backup named {name:?} exists"),
        });
    }
    let tls = if body.include_tls.unwrap_or(true) {
        TlsIdentity::Include
    } else {
        TlsIdentity::Exclude
    };
    std::fs::create_dir_all(&backups.directory)
        .map_err(|e| failed(format!("{}: {e}", backups.directory.display())))?;
    let made = crate::hub::backups::online_backup(&ctx, &backups, to, tls)
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    Ok(json(&entry_json(&name, &made, tls == TlsIdentity::Include)))
}

async fn list_handler(ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let dir = online(&ctx)?.directory.clone();
    let entries = tokio::task::spawn_blocking(move || {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.join("db").is_dir() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let tls = path.join("tls").join("ca.pem").exists();
                found.push(entry_json(&name, &path, tls));
            }
        }
        found.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        found
    })
    .await
    .map_err(|e| failed(e.to_string()))?;
    Ok(json(&entries))
}

fn entry_json(name: &str, path: &std::path::Path, tls: bool) -> serde_json::Value {
    let created = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    serde_json::json!({
        "name": name,
        "path": path.display().to_string(),
        "createdTimeUtc": chrono::DateTime::<chrono::Utc>::from(created).to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "sizeBytes": backup::size_of(&path.join("db")),
        "includesTlsIdentity": tls,
    })
}
