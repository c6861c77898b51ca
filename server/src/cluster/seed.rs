//! Seeding a new cluster from a hub that lives outside any log: a directory served as a single
//! node, restored (`ferrohub restore`) or backed up (`ferrohub backup`). Its node writes the
//! whole database into the cluster's empty log, as entries of puts, and then serves as the
//! writer; the other nodes apply those entries like any others. This is how a cluster is
//! restored from a backup (docs/cluster.md).
//!
//! # Invariants
//! - Only an empty log is seeded, by the lease holder, with the log's fence: the first entry
//!   expects sequence 0, so a node that appended first (and so initialised a hub of its own)
//!   makes the seed fail instead of mixing two hubs.
//! - The seeding node marks its database as a replica of the log (the last seed entry's
//!   sequence) only once every entry is stored. An interrupted seed leaves a log that holds
//!   part of the hub and a directory still outside it: the node refuses to go on, and the
//!   operator starts the new cluster again from empty NATS storage.

use std::sync::Arc;

use ferrohub_engine::Replica;
use tokio_util::sync::CancellationToken;

use super::lease::{Holder, Promotion, Renewal, WriterLease};
use super::log::JetStreamLog;
use super::{ClusterError, Link};

fn others_first() -> ClusterError {
    ClusterError::Replica(
        "this directory holds a hub that was served or restored as a single node, but the \
         cluster's log is not empty: it cannot join a cluster whose hub is another. A restored \
         hub seeds only a new cluster: start its node first, on empty NATS storage, and the \
         other nodes on empty directories"
            .into(),
    )
}

/// Takes the writer lease, writes `replica`'s whole database into the empty log, and returns
/// the promotion to writer. `None` when `shutdown` came first.
///
/// # Errors
/// The log was not empty or became non-empty, NATS failed, or the database failed.
pub async fn seed_new_cluster(
    link: &Link,
    replica: Arc<Replica>,
    me: &Holder,
    shutdown: &CancellationToken,
) -> Result<Option<Promotion>, ClusterError> {
    let mut tick = tokio::time::interval(link.section.lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lease = loop {
        if link.log_end().await? > 0 {
            return Err(others_first());
        }
        if let Some(taken) = WriterLease::try_acquire(link, me).await? {
            break taken;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tick.tick() => {}
        }
    };
    tracing::info!(node = %me.node, "seeding the new cluster's commit log with this node's hub");
    let log = Arc::new(JetStreamLog::new(
        link.js.clone(),
        tokio::runtime::Handle::current(),
        &me.node,
        0,
        1,
    ));
    let mut seeding = {
        let (replica, log) = (Arc::clone(&replica), Arc::clone(&log));
        tokio::task::spawn_blocking(move || -> Result<(u64, usize), ClusterError> {
            let (mut last, mut entries) = (0, 0);
            replica.seed_entries(|entry| -> Result<(), ClusterError> {
                last = log.append_and_wait(entry).map_err(|e| match e {
                    ferrohub_engine::LogError::Fenced { .. } => others_first(),
                    other => ClusterError::nats("seeding the commit log", other),
                })?;
                entries += 1;
                Ok(())
            })?;
            replica
                .mark_seeded(last)
                .map_err(|e| ClusterError::Replica(e.to_string()))?;
            Ok((last, entries))
        })
    };
    // A large hub takes longer than the lease: keep it meanwhile.
    let seeded = loop {
        tokio::select! {
            done = &mut seeding => break done,
            _ = tick.tick() => {
                if lease.renew().await == Renewal::Lost {
                    tracing::warn!("lost the writer lease while seeding");
                    log.fence();
                }
            }
        }
    };
    let (last, entries) = match seeded {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            lease.release().await;
            return Err(e);
        }
        Err(e) => {
            lease.release().await;
            return Err(ClusterError::Replica(format!("seeding failed: {e}")));
        }
    };
    tracing::info!(entries, last, "seeded the commit log");
    Ok(Some(Promotion {
        lease,
        caught_up_to: last,
    }))
}
