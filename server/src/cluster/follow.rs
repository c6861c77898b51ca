//! A node that is not the writer: apply the commit log to the local replica, entry by entry,
//! and take the writer lease when it is free, then catch up to the log's end.
//!
//! # Invariants
//! - Entries are applied in log order, each with its sequence in the same write (the engine's
//!   [`ferrohub_engine::Replica`]), so a restart resumes after the last one applied.
//! - [`follow_until_writer`] returns a lease only once the replica holds the whole log as it
//!   stood after the lease was taken; the caller closes the replica (and every handle to its
//!   store) before it opens a writing store on the same directory.
//! - What the replica applied is published ([`Progress`]) after each batch of entries is
//!   written, so a follower serving clients can wait for a forwarded write to be applied
//!   before it answers. A batch is what the reader already holds (at most [`READ_BATCH`]
//!   entries); it is written on the blocking pool, never on a runtime worker.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use ferrohub_engine::{OpenError, Replica};
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use super::lease::{Holder, Promotion, Renewal, WriterLease};
use super::link::LOG_STREAM;
use super::standing::{Role, Standing};
use super::{ClusterError, Link};

/// Where a follower's applying is told: the sequence applied, and the partitions each entry
/// added events to (so readers of them are woken).
pub struct Progress {
    pub applied: tokio::sync::watch::Sender<u64>,
    pub advanced: Box<dyn Fn(&[(u16, u64)]) + Send + Sync>,
    /// The node's standing: what it applied and the log's state go there too.
    pub standing: Arc<Standing>,
}

impl Progress {
    fn applied(&self, applied: u64) {
        self.applied.send_replace(applied);
        self.standing.set_applied(applied);
    }
}

/// Reads the log's state from its stream leader into the node's standing; its end.
async fn read_log_state(link: &Link, standing: &Standing) -> Result<u64, ClusterError> {
    let (first, end, bytes) = link.log_state().await?;
    standing.set_log(first, end, bytes);
    Ok(end)
}

/// Opens the replica, waiting while an earlier handle of this process (the store of a writer
/// that just stepped down) still holds the database.
pub async fn open_replica(
    db: &Path,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<Replica>>, ClusterError> {
    for _ in 0..300 {
        let path = db.to_path_buf();
        match tokio::task::spawn_blocking(move || Replica::open(&path)).await {
            Ok(Ok(r)) => return Ok(Some(Arc::new(r))),
            Ok(Err(OpenError::InUse { .. })) => {}
            Ok(Err(e)) => return Err(ClusterError::Replica(e.to_string())),
            Err(e) => return Err(ClusterError::Replica(e.to_string())),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    Err(ClusterError::Replica(format!(
        "{} stayed in use for 30 s",
        db.display()
    )))
}

/// Tells the cluster how far this replica holds the log on disk (see [`super::trim`]); a
/// failure only delays trimming.
async fn report_progress(link: &Link, replica: &Arc<Replica>) {
    let replica = Arc::clone(replica);
    match tokio::task::spawn_blocking(move || replica.synced_applied_sequence()).await {
        Ok(Ok(applied)) => {
            if let Err(e) = super::trim::report(link, applied).await {
                tracing::debug!(error = %e, "cannot report this node's progress");
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot sync the replica"),
        Err(e) => tracing::warn!(error = %e, "cannot sync the replica"),
    }
}

/// Entries a log reader asks JetStream for at once, so what a catching-up follower buffers is
/// bounded in bytes: at most this many entries of at most the engine's largest entry (4 MiB),
/// 128 MiB (the library's default, 500, allowed 2 GiB). The client asks for the next batch
/// while half of one is still to apply, so reading stays ahead of applying.
const READ_BATCH: i64 = 32;

/// How long the log reader may stay quiet while the log holds more before it is started again.
const STALL: Duration = Duration::from_secs(2);

/// An ordered reader of the log from `start`.
async fn open_reader(link: &Link, start: u64) -> Result<pull::Ordered, ClusterError> {
    let stream = link
        .js
        .get_stream(LOG_STREAM)
        .await
        .map_err(|e| ClusterError::nats("the commit log stream", e))?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            max_batch: READ_BATCH,
            ..Default::default()
        })
        .await
        .map_err(|e| ClusterError::nats("reading the commit log", e))?;
    consumer
        .messages()
        .await
        .map_err(|e| ClusterError::nats("reading the commit log", e))
}

/// Follows the log until this node holds the writer lease and has applied the log to its end.
/// `None` when `shutdown` came first.
///
/// # Errors
/// NATS failures (the caller follows again after a pause) and replica failures.
pub async fn follow_until_writer(
    link: &Link,
    replica: &Arc<Replica>,
    me: &Holder,
    progress: &Progress,
    shutdown: &CancellationToken,
) -> Result<Option<Promotion>, ClusterError> {
    let replica_err = |e: ferrohub_engine::StorageError| ClusterError::Replica(e.to_string());
    if replica.holds_a_hub_outside_the_log().map_err(replica_err)? {
        // Only a new cluster's empty log takes it (see `seed`).
        return super::seed::seed_new_cluster(link, Arc::clone(replica), me, shutdown).await;
    }
    let mut applied = replica.applied_sequence().map_err(replica_err)?;
    progress.standing.set_role(Role::Follower);
    progress.applied(applied);
    super::lineage::check_same_log(link, replica, applied).await?;
    super::trim::check_can_follow(link, applied).await?;
    read_log_state(link, &progress.standing).await?;
    tracing::info!(node = %link.section.node, applied, "following the commit log");
    let mut state = Following {
        entries: open_reader(link, applied + 1).await?,
        last_entry: Instant::now(),
        lease: None,
        target: u64::MAX,
    };
    let mut tick = tokio::time::interval(link.section.lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while applied < state.target {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            entry = state.entries.next() => {
                let batch = ready_batch(entry, &mut state.entries)?;
                let (last, advanced) = apply_batch(replica, batch).await?;
                applied = applied.max(last);
                progress.applied(applied);
                if !advanced.is_empty() {
                    (progress.advanced)(&advanced);
                }
                state.last_entry = Instant::now();
            }
            _ = tick.tick() => {
                // A stream or bucket without a leader (NATS electing one) holds a request for
                // up to the client's timeout: a round bounded by the tick leaves this node
                // free to take the lease on the next one, when the leader is back.
                let round = tokio::time::timeout(
                    link.section.lease / 3,
                    tick_round(link, replica, me, applied, &progress.standing, &mut state),
                )
                .await;
                match round {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => tracing::debug!("a follower's round went unanswered; next tick"),
                }
            }
        }
    }
    let Following { entries, lease, .. } = state;
    drop(entries);
    let lease = lease.ok_or_else(|| ClusterError::Replica("caught up without a lease".into()))?;
    Ok(Some(Promotion {
        lease,
        caught_up_to: applied,
    }))
}

type Entry = Option<Result<async_nats::jetstream::Message, pull::OrderedError>>;

/// The entry the reader just gave and those it already holds behind it (at most
/// [`READ_BATCH`]), as (sequence, payload) in log order.
fn ready_batch(
    first: Entry,
    entries: &mut pull::Ordered,
) -> Result<Vec<(u64, bytes::Bytes)>, ClusterError> {
    let decode = |entry: Entry| -> Result<(u64, bytes::Bytes), ClusterError> {
        let message = entry
            .ok_or_else(|| ClusterError::Nats("the commit log reader ended".into()))?
            .map_err(|e| ClusterError::nats("reading the commit log", e))?;
        let seq = message
            .info()
            .map_err(|e| ClusterError::nats("a commit log entry", e))?
            .stream_sequence;
        Ok((seq, message.message.payload))
    };
    let mut batch = vec![decode(first)?];
    while batch.len() < READ_BATCH as usize {
        // Only what is already buffered: waiting here would hold back what is in hand.
        match entries.next().now_or_never() {
            Some(entry) => batch.push(decode(entry)?),
            None => break,
        }
    }
    Ok(batch)
}

/// Applies `batch` in order on the blocking pool (each entry is a RocksDB write, which must
/// not hold a runtime worker); the last sequence applied and the partitions the entries added
/// events to.
async fn apply_batch(
    replica: &Arc<Replica>,
    batch: Vec<(u64, bytes::Bytes)>,
) -> Result<(u64, Vec<(u16, u64)>), ClusterError> {
    let replica = Arc::clone(replica);
    tokio::task::spawn_blocking(move || {
        let mut last = 0;
        let mut advanced = Vec::new();
        for (seq, payload) in batch {
            if let Some(added) = replica
                .apply(seq, &payload)
                .map_err(|e| ClusterError::Replica(e.to_string()))?
            {
                advanced.extend(added);
            }
            last = seq;
        }
        Ok((last, advanced))
    })
    .await
    .map_err(|e| ClusterError::Replica(format!("applying commit log entries: {e}")))?
}

/// What a follower keeps between its entries and rounds.
struct Following {
    entries: pull::Ordered,
    /// When the reader last gave an entry (or was started).
    last_entry: Instant,
    lease: Option<WriterLease>,
    /// The log's end when this node took the lease: it becomes the writer once it applied
    /// that far. `u64::MAX` while it holds no lease.
    target: u64,
}

/// One tick of a follower: restart a stalled reader, report progress, take or keep the
/// lease.
async fn tick_round(
    link: &Link,
    replica: &Arc<Replica>,
    me: &Holder,
    applied: u64,
    standing: &Standing,
    state: &mut Following,
) -> Result<(), ClusterError> {
    // A stream electing a leader does not answer: the next tick asks again.
    let log_end = match read_log_state(link, standing).await {
        Ok(end) => Some(end),
        Err(e) => {
            tracing::debug!(error = %e, "the commit log's state is not known this round");
            None
        }
    };
    // An ordered consumer notices a lost server only after missing two idle heartbeats
    // (30 s): a reader quiet while the log has more is started again.
    if state.last_entry.elapsed() >= STALL && log_end.is_some_and(|end| end > applied) {
        super::trim::check_can_follow(link, applied).await?;
        tracing::info!(applied, "the commit log reader stalled; reading again");
        state.entries = open_reader(link, applied + 1).await?;
        state.last_entry = Instant::now();
    }
    report_progress(link, replica).await;
    let (lease, target) = (&mut state.lease, &mut state.target);
    match lease.as_mut() {
        None => {
            if let Some(taken) = WriterLease::try_acquire(link, me).await? {
                *target = link.log_end().await?;
                tracing::info!(
                    applied,
                    log_end = *target,
                    "took the writer lease; catching up"
                );
                *lease = Some(taken);
                // Only once the lease is held: a round cut short before leaves a follower.
                standing.set_role(Role::CatchingUp);
            }
        }
        // Catching up may take longer than the lease: keep it.
        Some(held) => {
            if held.renew().await == Renewal::Lost {
                tracing::warn!("lost the writer lease while catching up");
                standing.set_role(Role::Follower);
                *lease = None;
                *target = u64::MAX;
            }
        }
    }
    Ok(())
}
