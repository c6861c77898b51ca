//! The running hub's local control socket, `DIR/control.sock`: how `ferrohub backup` asks a
//! hub that serves the directory for an online backup.
//!
//! One JSON request per connection, one line; one JSON answer, one line. The socket is made
//! with mode 0600 in the data directory, so only the hub's own user (who can read every key in
//! that directory anyway) may use it; nothing is reachable from the network.
//!
//! # Invariants
//! - A socket file left by a hub that died is replaced at start; the socket is removed when the
//!   hub stops.
//! - A request is handled on the blocking pool: a long backup never stalls the runtime.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context as _};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::backup::{OnlineBackups, TlsIdentity};
use crate::hub::backups::online_backup;
use crate::hub::HubContext;
use crate::layout::control_socket;

/// Longest request line read.
const MAX_REQUEST: u64 = 64 * 1024;
/// How long the command waits for a backup to be made.
const BACKUP_WAIT: Duration = Duration::from_secs(6 * 3600);

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "camelCase", deny_unknown_fields)]
enum Request {
    #[serde(rename_all = "camelCase")]
    Backup { to: PathBuf, include_tls: bool },
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Answer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Whether a hub serves `data_dir` (its control socket answers a connection).
pub fn serving(data_dir: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(control_socket(data_dir)).is_ok()
}

/// Asks the hub serving `data_dir` for an online backup into `to` (absolute, new).
///
/// # Errors
/// No hub answering, or the hub's refusal (an existing `to`, storage or file errors).
pub fn request_backup(data_dir: &Path, to: &Path, tls: TlsIdentity) -> anyhow::Result<PathBuf> {
    let socket = control_socket(data_dir);
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .with_context(|| format!("connecting to the running hub at {}", socket.display()))?;
    stream.set_read_timeout(Some(BACKUP_WAIT))?;
    let request = Request::Backup {
        to: to.to_path_buf(),
        include_tls: tls == TlsIdentity::Include,
    };
    let mut line = serde_json::to_vec(&request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer)?;
    let answer: Answer = serde_json::from_str(&answer)
        .map_err(|e| anyhow!("the running hub answered {answer:?}: {e}"))?;
    match (answer.path, answer.error) {
        (Some(path), None) => Ok(path),
        (_, Some(error)) => Err(anyhow!("the running hub refused the backup: {error}")),
        (None, None) => Err(anyhow!("the running hub gave no answer")),
    }
}

/// Serves the control socket of the hub in `backups.data_dir` until `shutdown`.
///
/// # Errors
/// The socket cannot be made (the data directory is not writable).
pub fn serve(
    ctx: HubContext,
    backups: OnlineBackups,
    shutdown: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use std::os::unix::fs::PermissionsExt;
    let path = control_socket(&backups.data_dir);
    // A socket file left by a hub that died: this process holds the data directory's lock,
    // so no other hub serves it.
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "control socket accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let (ctx, backups) = (ctx.clone(), backups.clone());
            tokio::spawn(async move { answer(stream, &ctx, &backups).await });
        }
        let _ = std::fs::remove_file(&path);
    }))
}

async fn answer(stream: tokio::net::UnixStream, ctx: &HubContext, backups: &OnlineBackups) {
    use tokio::io::AsyncReadExt;
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read.take(MAX_REQUEST));
    if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
        return; // A probe (`serving`), or a client that gave up.
    }
    let answer = match serde_json::from_str::<Request>(&line) {
        Err(e) => Answer {
            error: Some(format!("not a request: {e}")),
            ..Answer::default()
        },
        Ok(Request::Backup { to, .. }) if !to.is_absolute() => Answer {
            error: Some(format!("{} is not an absolute path", to.display())),
            ..Answer::default()
        },
        Ok(Request::Backup { to, include_tls }) => {
            let tls = if include_tls {
                TlsIdentity::Include
            } else {
                TlsIdentity::Exclude
            };
            match online_backup(ctx, backups, to, tls).await {
                Ok(path) => Answer {
                    path: Some(path),
                    error: None,
                },
                Err(e) => Answer {
                    path: None,
                    error: Some(format!("{e:#}")),
                },
            }
        }
    };
    let mut out = serde_json::to_vec(&answer).unwrap_or_default();
    out.push(b'\n');
    let _ = write.write_all(&out).await;
}
