//! Trimming the commit log: every node says how far its replica holds the log (the key of its
//! name in the [`NODES_BUCKET`](super::link::NODES_BUCKET) bucket), and the writer drops the
//! entries every node holds, so the log does not grow without bound.
//!
//! # Invariants
//! - A node reports only what is on its disk: the applied sequence read before a sync of its
//!   write-ahead log (replicas apply unsynced), so a power loss cannot take it below what it
//!   reported.
//! - The writer drops only entries older than `log_keeps_absent_nodes_for` (by its own record
//!   of the log's end over time: a new writer trims nothing until it has watched that long),
//!   and only up to the lowest sequence reported by the nodes heard from within that time. So
//!   a node away for less than that, or a new one starting within it, finds every entry it
//!   needs; a node silent for longer no longer holds trimming back. If the log was trimmed past
//!   a node, it cannot follow, says so when it starts, and is restored from a backup of another
//!   node's directory (which follows on from its own sequence).

use std::collections::VecDeque;
use std::sync::Weak;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use ferrohub_engine::Store;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{ClusterError, Link};

/// What a node last said about its replica.
#[derive(Debug, Serialize, Deserialize)]
struct Progress {
    /// The last log sequence it holds on disk.
    applied: u64,
    /// When it said so (milliseconds since the Unix epoch, its clock).
    at_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Says that this node holds the log up to `applied` on disk.
///
/// # Errors
/// NATS unreachable.
pub async fn report(link: &Link, applied: u64) -> Result<(), ClusterError> {
    let progress = Progress {
        applied,
        at_ms: now_ms(),
    };
    let value = serde_json::to_vec(&progress).expect("progress serialises");
    link.nodes
        .put(&link.section.node, Bytes::from(value))
        .await
        .map_err(|e| ClusterError::nats("reporting this node's progress", e))?;
    Ok(())
}

/// An error for a replica the log was trimmed past: it cannot follow.
pub fn behind_the_log(applied: u64, first: u64) -> ClusterError {
    ClusterError::Replica(format!(
        "this node holds the commit log up to sequence {applied}, but the log now starts at \
         {first}: the entries between were trimmed while it was away. Restore its data \
         directory from a backup of another node's (`ferrohub backup` of a stopped node) and \
         start it again"
    ))
}

/// Fails when the log no longer holds the entry after `applied`.
///
/// # Errors
/// [`behind_the_log`], or NATS unreachable.
pub async fn check_can_follow(link: &Link, applied: u64) -> Result<(), ClusterError> {
    let (first, last) = link.log_span().await?;
    if last > applied && first > applied + 1 {
        return Err(behind_the_log(applied, first));
    }
    Ok(())
}

/// The lowest sequence reported by the nodes heard from within `fresh`; `None` if none was.
async fn trim_floor(link: &Link, fresh: Duration) -> Result<Option<u64>, ClusterError> {
    let mut keys = link
        .nodes
        .keys()
        .await
        .map_err(|e| ClusterError::nats("listing the nodes' progress", e))?;
    let oldest = now_ms().saturating_sub(fresh.as_millis() as u64);
    let mut floor: Option<u64> = None;
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| ClusterError::nats("listing the nodes' progress", e))?;
        let Some(value) = link
            .nodes
            .get(&key)
            .await
            .map_err(|e| ClusterError::nats("reading a node's progress", e))?
        else {
            continue;
        };
        match serde_json::from_slice::<Progress>(&value) {
            Ok(p) if p.at_ms >= oldest => {
                floor = Some(floor.map_or(p.applied, |f| f.min(p.applied)))
            }
            Ok(_) => {
                tracing::info!(node = %key, "a node silent for too long no longer holds the log back")
            }
            Err(e) => tracing::warn!(node = %key, error = %e, "unreadable node progress"),
        }
    }
    Ok(floor)
}

/// Drops the entries up to `aged` (the log's end a while ago) that every recently heard node
/// holds. Returns the last sequence dropped, if any were.
///
/// # Errors
/// NATS unreachable.
pub async fn trim_once(link: &Link, aged: u64) -> Result<Option<u64>, ClusterError> {
    let Some(floor) = trim_floor(link, link.section.log_keeps_absent_nodes_for).await? else {
        return Ok(None);
    };
    let floor = floor.min(aged);
    let (first, _) = link.log_span().await?;
    if floor < first {
        return Ok(None);
    }
    link.trim_log_through(floor).await?;
    Ok(Some(floor))
}

/// The log's end as the writer saw it over time, to tell which entries are old enough to drop.
#[derive(Default)]
struct EndHistory {
    /// (when, the log's end then), oldest first.
    samples: VecDeque<(Instant, u64)>,
}

impl EndHistory {
    fn record(&mut self, end: u64) {
        self.samples.push_back((Instant::now(), end));
    }

    /// The log's end at least `age` ago (0 when this writer has not watched that long), and
    /// forgets the samples older than the one it returns.
    fn end_before(&mut self, age: Duration) -> u64 {
        while self.samples.len() > 1 && self.samples[1].0.elapsed() >= age {
            self.samples.pop_front();
        }
        match self.samples.front() {
            Some((at, end)) if at.elapsed() >= age => *end,
            _ => 0,
        }
    }
}

/// The writer's part: every `log_trim_interval`, report its own store's progress and trim.
/// Holds the store only for each report, so a closing store is not kept open.
pub async fn run_on_writer(link: Link, store: Weak<Store>, stop: CancellationToken) {
    let mut history = EndHistory::default();
    let mut tick = tokio::time::interval(link.section.log_trim_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let store = store.clone();
        let applied = tokio::task::spawn_blocking(move || {
            store.upgrade().map(|s| s.synced_applied_log_sequence())
        })
        .await;
        let applied = match applied {
            Ok(Some(Ok(a))) => a,
            Ok(None) => return,
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "cannot read the writer's applied sequence");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the writer's applied sequence");
                continue;
            }
        };
        if let Err(e) = report(&link, applied).await {
            tracing::warn!(error = %e, "cannot report the writer's progress");
            continue;
        }
        match link.log_span().await {
            Ok((_, end)) => history.record(end),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the commit log's end");
                continue;
            }
        }
        let aged = history.end_before(link.section.log_keeps_absent_nodes_for);
        if aged == 0 {
            continue;
        }
        match trim_once(&link, aged).await {
            Ok(Some(through)) => tracing::info!(through, "trimmed the commit log"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot trim the commit log"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ends_old_enough_are_trimmed_through() {
        let mut h = EndHistory::default();
        assert_eq!(
            h.end_before(Duration::from_millis(30)),
            0,
            "nothing watched yet"
        );
        h.record(10);
        std::thread::sleep(Duration::from_millis(40));
        h.record(20);
        assert_eq!(h.end_before(Duration::from_millis(30)), 10);
        std::thread::sleep(Duration::from_millis(40));
        h.record(30);
        assert_eq!(h.end_before(Duration::from_millis(30)), 20);
        assert_eq!(h.samples.len(), 2, "older samples forgotten");
        assert_eq!(h.end_before(Duration::from_secs(60)), 0, "nothing that old");
    }
}
