//! Which log a replica came from: a node follows only that one.
//!
//! # Invariants
//! - A replica records the identity of the log it follows (the stream's name and creation
//!   time) the first time it follows one, and with every entry it applies, that entry's
//!   sequence and checksum (the engine's [`LogTip`]).
//! - A node refuses to follow, and so to lead, a log with another identity (NATS storage wiped
//!   and the stream made anew), a log that ends before the replica's last entry (the log lost
//!   its tail), or a log holding another entry at that sequence: following any of them would
//!   skip what the replica holds beyond the log, or apply entries onto a state they were not
//!   written against. The error says what to do; nothing is written.

use std::sync::Arc;

use ferrohub_engine::{LogTip, Replica, StorageError};

use super::{ClusterError, Link};

/// What an operator does about a replica that cannot follow the log.
const HELP: &str = "restore this node's data directory from a `ferrohub backup` of a node \
    that follows the current log (docs/cluster.md, \"Adding or replacing a node\"); if every \
    node says so, NATS lost the log: `ferrohub export` one node's directory, `ferrohub restore` \
    the export into a new directory and seed a new cluster from it (docs/cluster.md, \"Backup \
    and restore of a cluster\")";

/// What a replica holds of the log it came from.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub identity: Option<String>,
    pub tip: Option<LogTip>,
    pub applied: u64,
}

/// The log as NATS holds it now.
#[derive(Debug, Clone)]
pub struct LogNow {
    pub identity: String,
    pub first: u64,
    pub last: u64,
}

impl Recorded {
    /// Whether the log's entry at the replica's last sequence must be compared with it.
    fn tip_to_compare(&self, now: &LogNow) -> Option<LogTip> {
        self.tip
            .filter(|t| t.sequence == self.applied && self.applied > 0)
            .filter(|t| now.first <= t.sequence && t.sequence <= now.last)
    }
}

/// Whether a replica that recorded `recorded` may follow the log `now`; `entry` is the log's
/// entry at the replica's last sequence, when [`Recorded::tip_to_compare`] asked for it.
fn judge(recorded: &Recorded, now: &LogNow, entry: Option<&[u8]>) -> Result<(), ClusterError> {
    // A replica that applied nothing holds nothing another log could contradict.
    if recorded.applied == 0 {
        return Ok(());
    }
    if let Some(identity) = &recorded.identity {
        if *identity != now.identity {
            return Err(ClusterError::Diverged(format!(
                "this replica came from the commit log {identity}, and NATS now holds {}: {HELP}",
                now.identity
            )));
        }
    }
    if now.last < recorded.applied {
        return Err(ClusterError::Diverged(format!(
            "the commit log ends at entry {}, and this replica applied up to {}: the log lost \
             entries this node holds (NATS storage lost, or a power loss under a sync_interval \
             other than \"always\"); {HELP}",
            now.last, recorded.applied
        )));
    }
    if let (Some(tip), Some(entry)) = (recorded.tip_to_compare(now), entry) {
        if LogTip::of(tip.sequence, entry) != tip {
            return Err(ClusterError::Diverged(format!(
                "entry {} of the commit log is not the one this replica applied: the log was \
                 made anew or rewritten; {HELP}",
                tip.sequence
            )));
        }
    }
    Ok(())
}

/// How long a log that ends before the replica's last entry is read again before it is judged
/// to have lost its tail: a NATS server just restarted may lead the stream for a moment before
/// it caught up with the others, and report the end it had.
const TAIL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// The log as NATS reports it, read again (for up to [`TAIL_PATIENCE`]) while it is the log
/// the replica came from and ends before the replica's last entry.
async fn log_now(link: &Link, recorded: &Recorded) -> Result<LogNow, ClusterError> {
    let applied = recorded.applied;
    let give_up = tokio::time::Instant::now() + TAIL_PATIENCE;
    let mut told = false;
    loop {
        let (identity, first, last) = link.log_identity().await?;
        let another_log = recorded
            .identity
            .as_ref()
            .is_some_and(|mine| *mine != identity);
        if last >= applied || another_log || tokio::time::Instant::now() >= give_up {
            return Ok(LogNow {
                identity,
                first,
                last,
            });
        }
        if !told {
            tracing::info!(
                log_end = last,
                applied,
                "the commit log ends before this replica's last entry; reading it again while NATS catches up"
            );
            told = true;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Refuses a log this replica did not come from (see the module invariants); records the
/// log's identity in a replica that has none yet.
///
/// # Errors
/// [`ClusterError::Diverged`] with what to do, NATS failures, the replica's failures.
pub async fn check_same_log(
    link: &Link,
    replica: &Arc<Replica>,
    applied: u64,
) -> Result<(), ClusterError> {
    let recorded = {
        let replica = Arc::clone(replica);
        tokio::task::spawn_blocking(move || {
            Ok::<_, StorageError>(Recorded {
                identity: replica.log_identity()?,
                tip: replica.log_tip()?,
                applied,
            })
        })
        .await
        .map_err(|e| ClusterError::Replica(e.to_string()))??
    };
    let now = log_now(link, &recorded).await?;
    let entry = match recorded.tip_to_compare(&now) {
        Some(tip) => Some(link.log_entry(tip.sequence).await?),
        None => None,
    };
    judge(&recorded, &now, entry.as_deref())?;
    if recorded.identity.as_deref() != Some(now.identity.as_str()) {
        let replica = Arc::clone(replica);
        let identity = now.identity.clone();
        tokio::task::spawn_blocking(move || replica.record_log_identity(&identity))
            .await
            .map_err(|e| ClusterError::Replica(e.to_string()))??;
        tracing::info!(log = %now.identity, "this replica follows the commit log");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(identity: &str, first: u64, last: u64) -> LogNow {
        LogNow {
            identity: identity.into(),
            first,
            last,
        }
    }

    fn replica(identity: Option<&str>, applied: u64, entry: &[u8]) -> Recorded {
        Recorded {
            identity: identity.map(Into::into),
            tip: Some(LogTip::of(applied, entry)),
            applied,
        }
    }

    fn diverged(r: Result<(), ClusterError>) -> String {
        match r {
            Err(ClusterError::Diverged(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_same_log_further_on_is_followed() {
        let r = replica(Some("log A"), 7, b"seven");
        let log = now("log A", 1, 9);
        assert_eq!(r.tip_to_compare(&log), r.tip);
        judge(&r, &log, Some(b"seven")).unwrap();
    }

    #[test]
    fn a_log_made_anew_is_refused() {
        let why = diverged(judge(
            &replica(Some("log A"), 7, b"seven"),
            &now("log B", 1, 9),
            Some(b"seven"),
        ));
        assert!(
            why.contains("log A") && why.contains("log B") && why.contains("backup"),
            "{why}"
        );
    }

    #[test]
    fn a_log_that_ends_before_the_replica_is_refused() {
        let r = replica(Some("log A"), 7, b"seven");
        let log = now("log A", 1, 5);
        assert_eq!(
            r.tip_to_compare(&log),
            None,
            "entry 7 is not in the log to compare"
        );
        let why = diverged(judge(&r, &log, None));
        assert!(
            why.contains("ends at entry 5") && why.contains("applied up to 7"),
            "{why}"
        );
    }

    #[test]
    fn another_entry_at_the_replicas_last_sequence_is_refused() {
        let why = diverged(judge(
            &replica(Some("log A"), 7, b"seven"),
            &now("log A", 1, 9),
            Some(b"not seven"),
        ));
        assert!(why.contains("entry 7"), "{why}");
    }

    #[test]
    fn a_replica_without_records_follows_and_a_trimmed_tip_is_not_compared() {
        let unrecorded = Recorded {
            identity: None,
            tip: None,
            applied: 3,
        };
        judge(&unrecorded, &now("log A", 1, 3), None).unwrap();
        // One that applied nothing follows any log (and records it).
        let empty = Recorded {
            identity: Some("log A".into()),
            tip: None,
            applied: 0,
        };
        judge(&empty, &now("log B", 1, 0), None).unwrap();
        let r = replica(Some("log A"), 7, b"seven");
        assert_eq!(r.tip_to_compare(&now("log A", 8, 9)), None);
        judge(&r, &now("log A", 8, 9), None).unwrap();
    }
}
