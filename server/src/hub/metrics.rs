//! The hub's Prometheus metrics: the process-wide recorder, and a scrape with the gauges read
//! from outside the `metrics` facade (process memory and descriptors, commit counts, RocksDB's
//! own properties, connected devices, consumer lag) refreshed first. Served by the ops
//! listener (`transport::ops`) and the web console (`console`).
//!
//! # Invariants
//! - A scrape never shows gauges older than itself; RocksDB is read on the blocking pool.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::HubContext;

/// Buckets of histograms that count messages, not seconds.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The process-wide Prometheus recorder, installed on first use (one per process: in-process
/// tests may start several nodes).
pub fn recorder() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(crate::latency::BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("ferrohub_cluster_forwarded_batch_messages".into()),
                        BATCH_BUCKETS,
                    )
                })
                .unwrap_or_else(|_| PrometheusBuilder::new());
            builder.install_recorder().unwrap_or_else(|_| {
                // Another recorder is installed (a test harness): render this one unexported.
                PrometheusBuilder::new().build_recorder().handle()
            })
        })
        .clone()
}

/// The Prometheus text of a scrape, its gauges refreshed first (the ops listener's `/metrics`,
/// and the console's).
pub async fn render(ctx: &HubContext) -> String {
    refresh(ctx).await;
    let mut text = recorder().render();
    crate::latency::render_into(&mut text);
    text
}

/// The metrics of a node that serves no hub now (a cluster node between roles, or cut off):
/// the process's and the cluster's.
pub fn render_without_hub() -> String {
    if let Some((rss, fds)) = process_usage() {
        metrics::gauge!("process_resident_memory_bytes").set(rss as f64);
        metrics::gauge!("process_open_fds").set(fds as f64);
    }
    let mut text = recorder().render();
    crate::latency::render_into(&mut text);
    text
}

/// Sets the gauges read from outside the metrics facade.
async fn refresh(ctx: &HubContext) {
    if let Some((rss, fds)) = process_usage() {
        metrics::gauge!("process_resident_memory_bytes").set(rss as f64);
        metrics::gauge!("process_open_fds").set(fds as f64);
    }
    metrics::gauge!("ferrohub_connected_devices").set(ctx.connections.connected_devices() as f64);
    metrics::gauge!("ferrohub_daily_quota_used_chunks").set(ctx.throttles.quota.used() as f64);
    metrics::gauge!("ferrohub_outbound_queue_high_water")
        .set(ctx.connections.outbound_high_water() as f64);
    let positions = ctx.readers.positions();
    let stats = ctx
        .store
        .run(move |s| {
            let ends = positions
                .into_iter()
                .filter_map(|(p, group, next)| {
                    let end = s.next_sequence_number(p).ok()?;
                    Some((p, group, end.saturating_sub(next)))
                })
                .collect::<Vec<_>>();
            Ok::<_, ferrohub_engine::StorageError>((s.commit_stats(), s.storage_stats(), ends))
        })
        .await;
    if let Ok((commits, storage, lags)) = stats {
        for (partition, group, lag) in lags {
            metrics::gauge!("ferrohub_d2c_consumer_lag_events", "partition" => partition.to_string(), "consumer_group" => group)
                .set(lag as f64);
        }
        metrics::gauge!("ferrohub_c2d_messages_queued_estimate")
            .set(storage.c2d_messages_estimate as f64);
        metrics::counter!("ferrohub_commits_total").absolute(commits.commits);
        metrics::counter!("ferrohub_commit_writes_total").absolute(commits.writes);
        metrics::counter!("ferrohub_commit_syncs_total").absolute(commits.syncs);
        if commits.writes > 0 {
            // Group commit: batches acknowledged per durable write, since start.
            metrics::gauge!("ferrohub_commit_batches_per_write")
                .set(commits.commits as f64 / commits.writes as f64);
        }
        metrics::gauge!("ferrohub_rocksdb_write_stopped")
            .set(u8::from(storage.write_stopped) as f64);
        metrics::gauge!("ferrohub_rocksdb_delayed_write_rate_bytes")
            .set(storage.actual_delayed_write_rate as f64);
        metrics::gauge!("ferrohub_rocksdb_pending_compaction_bytes")
            .set(storage.pending_compaction_bytes as f64);
        metrics::gauge!("ferrohub_rocksdb_sst_bytes").set(storage.sst_bytes as f64);
        metrics::gauge!("ferrohub_rocksdb_memtable_bytes").set(storage.memtable_bytes as f64);
    }
    metrics::gauge!("ferrohub_storage_poisoned").set(u8::from(ctx.store.is_poisoned()) as f64);
}

/// Resident memory (bytes) and open descriptors of this process, from /proc.
fn process_usage() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some((rss_kb * 1024, fds))
}
