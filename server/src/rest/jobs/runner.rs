//! Runs one import or export job: streams blobs in and out, applies import lines in batches,
//! records progress, honours cancel.
//!
//! # Invariants
//! - An import batch is one engine commit ([`Store::import_batch`]): its lines are all
//!   applied or none, so a stop between batches leaves no identity half-written.
//! - Job progress is written after each batch that was applied, never before, so `processed`
//!   never counts a line that is not durable.
//! - Memory is bounded by one batch (and the blob buffers), whatever the blob's size.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ferrohub_engine::identity::BulkItem;
use ferrohub_engine::jobs::{JobError, JobKind, JobRecord, JobStatus};
use ferrohub_engine::Store;

use super::super::identity_json::import_mode_name;
use super::line::{error_log_line, export_line, import_item, LineError};
use super::IMPORT_ERRORS_BLOB;
use crate::blob::{BlobContainer, BlobError, BlobWriter};
use crate::error_codes;
use crate::hub::HubContext;

/// Devices read per export page (each with its modules and twins).
const EXPORT_PAGE: usize = 500;
/// Import lines applied per commit.
const IMPORT_BATCH: usize = 500;
/// How often progress is written to the job record and logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Why a job stopped early.
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("cancelled")]
    Cancelled,
    #[error("{0}")]
    Blob(#[from] BlobError),
    #[error("{0}")]
    Failed(String),
}

impl From<JobError> for Stop {
    fn from(e: JobError) -> Self {
        Stop::Failed(e.to_string())
    }
}

impl From<ferrohub_engine::StorageError> for Stop {
    fn from(e: ferrohub_engine::StorageError) -> Self {
        Stop::Failed(format!("storage: {e}"))
    }
}

impl From<ferrohub_engine::RegistryError> for Stop {
    fn from(e: ferrohub_engine::RegistryError) -> Self {
        Stop::Failed(format!("registry: {e}"))
    }
}

pub(super) async fn run(
    ctx: HubContext,
    job: JobRecord,
    input: Option<BlobContainer>,
    output: BlobContainer,
) {
    let id = job.id.clone();
    let now = ctx.clock.now();
    let started = update(&ctx, &id, move |j| {
        if !j.cancel_requested {
            j.status = JobStatus::Running;
            j.started = Some(now);
        }
    })
    .await;
    match started {
        Ok(j) if j.status == JobStatus::Running => {}
        // Cancelled while queued, or the store is gone: nothing to run.
        _ => return,
    }
    tracing::info!(job = %id, "import/export job running");
    let result = match (job.kind, input) {
        (JobKind::Export, _) => export(&ctx, &job, &output).await,
        (JobKind::Import, Some(input)) => import(&ctx, &job, &input, &output).await,
        (JobKind::Import, None) => Err(Stop::Failed("no input container".into())),
    };
    let end = ctx.clock.now();
    let outcome = update(&ctx, &id, move |j| {
        j.ended = Some(end);
        match result {
            Ok(()) => {
                j.status = JobStatus::Completed;
                j.progress = 100;
            }
            Err(Stop::Cancelled) => j.status = JobStatus::Cancelled,
            Err(e) => {
                j.status = JobStatus::Failed;
                j.failure_reason = Some(e.to_string());
            }
        }
    })
    .await;
    match outcome {
        Ok(j) => tracing::info!(
            job = %id,
            status = ?j.status,
            processed = j.processed,
            errors = j.errors,
            reason = j.failure_reason.as_deref().unwrap_or(""),
            "import/export job finished"
        ),
        Err(e) => {
            tracing::error!(job = %id, error = %e, "import/export job could not record its end")
        }
    }
}

async fn update(
    ctx: &HubContext,
    id: &str,
    f: impl FnOnce(&mut JobRecord) + Send + 'static,
) -> Result<JobRecord, JobError> {
    let id = id.to_string();
    ctx.store.run(move |s: &Store| s.update_job(&id, f)).await
}

/// Stops when a cancel was asked for (a read, checked after every batch).
async fn check_cancel(ctx: &HubContext, id: &str) -> Result<(), Stop> {
    let id = id.to_string();
    let job = ctx.store.run(move |s: &Store| s.get_job(&id)).await?;
    if job.cancel_requested {
        Err(Stop::Cancelled)
    } else {
        Ok(())
    }
}

/// Records progress; stops when a cancel was asked for.
async fn progress(
    ctx: &HubContext,
    id: &str,
    processed: u64,
    errors: u64,
    percent: u8,
) -> Result<(), Stop> {
    let j = update(ctx, id, move |j| {
        j.processed = processed;
        j.errors = errors;
        j.progress = percent.min(99);
    })
    .await?;
    tracing::info!(job = %id, processed, errors, percent, "import/export job progress");
    if j.cancel_requested {
        Err(Stop::Cancelled)
    } else {
        Ok(())
    }
}

async fn export(ctx: &HubContext, job: &JobRecord, output: &BlobContainer) -> Result<(), Stop> {
    let total = ctx
        .store
        .run(|s| s.registry_statistics())
        .await?
        .total_device_count
        .max(1);
    let mut writer = output.writer(&job.output_blob)?;
    let result = export_pages(ctx, job, &mut writer, total).await;
    match result {
        Ok(()) => Ok(writer.finish().await?),
        Err(e) => {
            writer.abort().await;
            Err(e)
        }
    }
}

async fn export_pages(
    ctx: &HubContext,
    job: &JobRecord,
    writer: &mut BlobWriter,
    total: u64,
) -> Result<(), Stop> {
    let exclude_keys = job.exclude_keys;
    let mut after: Option<String> = None;
    let mut done = 0u64;
    let mut last_report = Instant::now();
    loop {
        let from = after.clone();
        // Pages are read and formatted on the blocking pool: a million identities of JSON is
        // CPU work that must not sit on a runtime thread.
        let (bytes, count, last) = ctx
            .store
            .run(move |s| {
                let page = s.archive_page(from.as_deref(), EXPORT_PAGE)?;
                let mut out = Vec::with_capacity(page.len() * 1024);
                for d in &page {
                    for r in std::iter::once(&d.device).chain(&d.modules) {
                        serde_json::to_writer(&mut out, &export_line(r, exclude_keys))
                            .map_err(|e| ferrohub_engine::StorageError::Backend(e.to_string()))?;
                        out.push(b'\n');
                    }
                }
                let last = page.last().map(|d| d.device.identity.device_id.clone());
                Ok::<_, ferrohub_engine::StorageError>((out, page.len() as u64, last))
            })
            .await?;
        if count == 0 {
            break;
        }
        writer.write(&bytes).await?;
        done += count;
        after = last;
        check_cancel(ctx, &job.id).await?;
        if last_report.elapsed() >= PROGRESS_EVERY {
            last_report = Instant::now();
            progress(ctx, &job.id, done, 0, (done * 100 / total) as u8).await?;
        }
    }
    progress(ctx, &job.id, done, 0, 99).await
}

/// The error log, created at the first refused line.
struct ErrorLog {
    writer: BlobWriter,
    count: u64,
}

impl ErrorLog {
    async fn add(&mut self, line_number: u64, e: &LineError, code: &str) -> Result<(), Stop> {
        let mut text = error_log_line(line_number, e, code);
        text.push('\n');
        self.writer.write(text.as_bytes()).await?;
        self.count += 1;
        Ok(())
    }
}

async fn import(
    ctx: &HubContext,
    job: &JobRecord,
    input: &BlobContainer,
    output: &BlobContainer,
) -> Result<(), Stop> {
    let (mut lines, size) = input.lines(&job.input_blob).await.map_err(|e| match e {
        BlobError::NotFound(_) => Stop::Failed(format!(
            "the input container has no blob {}",
            job.input_blob
        )),
        other => Stop::Blob(other),
    })?;
    let mut log = ErrorLog {
        writer: output.writer(IMPORT_ERRORS_BLOB)?,
        count: 0,
    };
    let result = import_lines(ctx, job, &mut lines, size.max(1), &mut log).await;
    match result {
        Ok(()) => {
            log.writer.finish().await?;
            Ok(())
        }
        Err(e) => {
            // What was refused so far is still worth having.
            let _ = log.writer.finish().await;
            Err(e)
        }
    }
}

async fn import_lines(
    ctx: &HubContext,
    job: &JobRecord,
    lines: &mut crate::blob::BlobLines,
    size: u64,
    log: &mut ErrorLog,
) -> Result<(), Stop> {
    let mut batch: Vec<(u64, BulkItem)> = Vec::with_capacity(IMPORT_BATCH);
    let mut in_batch: HashSet<(String, Option<String>)> = HashSet::new();
    let mut line_number = 0u64;
    let mut bytes_read = 0u64;
    let mut last_report = Instant::now();
    loop {
        let next = lines
            .next_line()
            .await
            .map_err(|e| Stop::Failed(format!("reading {}: {e}", job.input_blob)))?;
        let Some(text) = next else { break };
        line_number += 1;
        bytes_read += text.len() as u64 + 1;
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        match import_item(text) {
            Ok(item) => {
                let key = (item.device_id.clone(), item.module_id.clone());
                // An id named again waits for the next batch, so the file's order holds.
                if in_batch.contains(&key) {
                    apply(ctx, &mut batch, log).await?;
                    in_batch.clear();
                }
                in_batch.insert(key);
                batch.push((line_number, item));
            }
            Err(e) => log.add(line_number, &e, "400004").await?,
        }
        if batch.len() >= IMPORT_BATCH {
            apply(ctx, &mut batch, log).await?;
            in_batch.clear();
            check_cancel(ctx, &job.id).await?;
            if last_report.elapsed() >= PROGRESS_EVERY {
                last_report = Instant::now();
                progress(
                    ctx,
                    &job.id,
                    line_number,
                    log.count,
                    (bytes_read * 100 / size) as u8,
                )
                .await?;
            }
        }
    }
    apply(ctx, &mut batch, log).await?;
    progress(ctx, &job.id, line_number, log.count, 99).await
}

async fn apply(
    ctx: &HubContext,
    batch: &mut Vec<(u64, BulkItem)>,
    log: &mut ErrorLog,
) -> Result<(), Stop> {
    if batch.is_empty() {
        return Ok(());
    }
    let taken = std::mem::take(batch);
    let now = ctx.clock.now();
    let (taken, errors) = ctx
        .store
        .run(move |s| {
            let items: Vec<BulkItem> = taken.iter().map(|(_, i)| i.clone()).collect();
            let errors = s.import_batch(&items, now)?;
            Ok::<_, ferrohub_engine::RegistryError>((taken, errors))
        })
        .await?;
    for e in errors {
        let line_number = taken
            .iter()
            .find(|(_, i)| i.device_id == e.device_id && i.module_id == e.module_id)
            .map(|(n, _)| *n)
            .unwrap_or(0);
        let (_, name, number) = error_codes::registry(&e.error);
        let le = LineError {
            device_id: Some(e.device_id.clone()),
            module_id: e.module_id.clone(),
            import_mode: Some(import_mode_name(e.mode).to_string()),
            message: format!("{name}: {}", e.error),
        };
        log.add(line_number, &le, &number.to_string()).await?;
    }
    Ok(())
}
