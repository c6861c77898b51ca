//! The commit thread of a writer with a commit log (cluster mode): groups are appended to the
//! log with several appends in flight, and each is written here once the log stored it.
//!
//! # Invariants
//! - Groups are sent to the log in commit order, and written here and answered strictly in
//!   that order, each only after the log acknowledged its entry (so a majority of the log's
//!   servers stored it). A group is never written before every earlier group was.
//! - At most [`CommitLog::max_in_flight`] appends are unanswered at once. While the log holds
//!   all of them, batches queue and join the next group, so a slow log makes groups larger,
//!   not the queue unbounded.
//! - The first append that fails (refused or unanswered) poisons the committer, and every
//!   group in flight behind it fails with it unwritten: the log fences those appends by the
//!   sequence each expects, and whether an unanswered one was stored only following the log
//!   can tell.
//! - A group's entry sequence and checksum are written with its operations (as on a replica),
//!   and a memtable switch happens after its group's write, before the next group's.
//! - While a [`super::CommitHold`] lives, nothing is sent and nothing is written.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use rocksdb::{WriteBatch, WriteOptions, DB};

use super::group::{
    finish_group, next_batch, ops_batch, take_group, write, Lagging, Next, Pending, Shared,
    MAX_LOG_ENTRY_BYTES,
};
use super::log::{self, Appending, CommitLog, LogError, LogTip};
use super::Durability;
use crate::error::StorageError;

/// The longest the thread sleeps waiting for an answer without a wake-up: answers and urgent
/// batches wake it sooner; this only bounds a wake-up lost to a bug.
const LONGEST_NAP: Duration = Duration::from_millis(20);

/// A group whose entry was sent to the log and is not answered yet.
struct InFlight {
    group: Vec<Pending>,
    /// Its operations, built while the log is asked.
    ops: Result<WriteBatch, StorageError>,
    crc32: u32,
    appending: Appending,
}

pub(super) fn run(
    db: &DB,
    durability: Durability,
    log: &dyn CommitLog,
    rx: &Receiver<Pending>,
    shared: &Shared,
) {
    let depth = log.max_in_flight().max(1);
    let synced_mode = durability == Durability::Synced;
    let mut lagging = Lagging::default();
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(depth);
    let mut closed = false;
    loop {
        while in_flight
            .front_mut()
            .is_some_and(|f| f.appending.is_answered())
        {
            let answered = in_flight.pop_front().expect("a group in flight");
            retire(
                db,
                shared,
                answered,
                synced_mode,
                &mut lagging,
                &mut in_flight,
            );
        }
        if lagging.due() {
            lagging.sync(db, shared);
        }
        if closed && in_flight.is_empty() {
            break;
        }
        if !closed && in_flight.len() < depth {
            let next = if in_flight.is_empty() {
                next_batch(rx, lagging.since)
            } else {
                match rx.try_recv() {
                    Ok(p) => Next::Batch(p),
                    Err(TryRecvError::Empty) => Next::Empty,
                    Err(TryRecvError::Disconnected) => Next::Closed,
                }
            };
            match next {
                Next::Batch(first) => {
                    shared.wait_while_held();
                    let (group, bytes) = take_group(first, rx, shared, MAX_LOG_ENTRY_BYTES);
                    in_flight.push_back(send(db, log, group, bytes, shared));
                    continue;
                }
                Next::SyncDue => {
                    lagging.sync(db, shared);
                    continue;
                }
                Next::Closed => {
                    closed = true;
                    continue;
                }
                Next::Empty => {}
            }
        }
        if in_flight.is_empty() {
            continue;
        }
        if closed || in_flight.len() >= depth {
            // Nothing more may be sent: wait for the oldest answer.
            let head = in_flight.pop_front().expect("a group in flight");
            retire(db, shared, head, synced_mode, &mut lagging, &mut in_flight);
        } else if !in_flight[0].appending.is_answered() {
            // Room for more: sleep until an answer or a batch that may not lag comes.
            let nap = lagging.due_in().map_or(LONGEST_NAP, |d| d.min(LONGEST_NAP));
            shared.wake.nap(nap);
        }
    }
    lagging.finish(db, shared);
}

/// Encodes the group as one log entry, starts its append and builds its RocksDB batch.
fn send(
    db: &DB,
    log: &dyn CommitLog,
    group: Vec<Pending>,
    bytes: usize,
    shared: &Shared,
) -> InFlight {
    let mut entry = log::entry_header(bytes);
    for p in &group {
        log::encode_ops(&mut entry, &p.batch.ops);
    }
    let crc32 = crc32fast::hash(&entry);
    let (outcome, appending) = Appending::start();
    if shared.poisoned.load(Ordering::Acquire) {
        outcome.send(Err(LogError::Unavailable(
            "the writer stopped writing".into(),
        )));
    } else {
        log.start_append(entry, outcome);
    }
    InFlight {
        ops: ops_batch(db, &group, bytes),
        group,
        crc32,
        appending,
    }
}

/// Writes an answered group (or fails it) and answers its batches. A failure fails every group
/// still in flight too.
fn retire(
    db: &DB,
    shared: &Shared,
    answered: InFlight,
    synced_mode: bool,
    lagging: &mut Lagging,
    in_flight: &mut VecDeque<InFlight>,
) {
    shared.wait_while_held();
    let InFlight {
        group,
        ops,
        crc32,
        appending,
    } = answered;
    let result = match appending.wait() {
        Ok(seq) => ops.and_then(|wb| write_logged(db, shared, wb, seq, crc32, synced_mode, &group)),
        Err(e) => {
            if !shared.poisoned.swap(true, Ordering::AcqRel) {
                tracing::error!(error = %e, "commit log append failed; refusing further writes");
            }
            Err(StorageError::WriteFailed(e.to_string()))
        }
    };
    let failed = result.clone().err();
    // No nap after a lagging group here (unlike a single node's thread): answers of later
    // groups wait behind it, and batches join groups while the log is asked anyway.
    finish_group(db, shared, group, result, synced_mode, lagging);
    if let Some(e) = failed {
        for f in in_flight.drain(..) {
            finish_group(db, shared, f.group, Err(e.clone()), synced_mode, lagging);
        }
    }
}

/// Writes a group the log stored as entry `seq`, with the entry's sequence and checksum.
fn write_logged(
    db: &DB,
    shared: &Shared,
    mut wb: WriteBatch,
    seq: u64,
    crc32: u32,
    synced_mode: bool,
    group: &[Pending],
) -> Result<(), StorageError> {
    shared.last_logged.fetch_max(seq, Ordering::AcqRel);
    let Some(meta) = db.cf_handle(ferrohub_migrations::cf::META) else {
        return Err(StorageError::Backend(
            "column family meta is missing".into(),
        ));
    };
    wb.put_cf(
        meta,
        log::APPLIED_KEY,
        ferrohub_migrations::record::encode(&seq),
    );
    wb.put_cf(
        meta,
        log::TIP_KEY,
        ferrohub_migrations::record::encode(&LogTip {
            sequence: seq,
            crc32,
        }),
    );
    let lags = !synced_mode || group.iter().all(|p| p.batch.may_lag);
    let mut wo = WriteOptions::default();
    wo.set_sync(!lags);
    write(db, &wo, wb, shared)
}
