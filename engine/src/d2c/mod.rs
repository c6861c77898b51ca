//! Device-to-cloud partitions (D2C-1..D2C-4): the retained, ordered event streams behind the
//! built-in endpoint, with consumer groups and checkpoints.
//!
//! # Invariants
//! - An event's partition is `crc32(device id) % partition_count`, fixed at hub creation, so a
//!   device's events stay in one partition, in order.
//! - Sequence numbers in a partition start at 0 and increase by one per event, never reused, also
//!   after retention removed every event (the head is recovered from the log and the stored
//!   head at open: see `heads`).
//! - What a reader sees is always a prefix of the partition: sequence numbers are assigned and
//!   batches submitted to the committer under the partition's lock, and the committer writes in
//!   submission order. An append returns only after its event is durable.
//! - Offsets are byte positions: an event's offset is the previous event's offset plus the
//!   previous event's stored size. Enqueued times never decrease within a partition.
//! - What a reader may see of a partition starts at its head's `begin`: retention and endpoint
//!   deletion raise it, and table files wholly below every partition's `begin` are dropped
//!   (keys and segments: the `segments` module).

use std::borrow::Cow;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use smallvec::{smallvec, SmallVec};

use ferrohub_migrations::{cf, record};

use crate::error::{StorageError, ValidationError};
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::{Batch, Raw};
use crate::slots::Endpoint;
use pack::PackWriter;
use segments::Segments;

mod encode;
mod follow;
mod groups;
mod heads;
mod pack;
mod retention;
mod segments;
pub use crate::slots::{partition_of, EndpointSlot, MAX_PARTITIONS};
use crate::Store;

/// The consumer group every hub has and nobody can delete.
pub const DEFAULT_CONSUMER_GROUP: &str = "$Default";
/// Most consumer groups per hub (IoT Hub: 20 on standard tiers).
pub const MAX_CONSUMER_GROUPS: usize = 20;

/// D2C failures.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum D2cError {
    #[error("partition {0} does not exist")]
    NoSuchPartition(u16),
    #[error("consumer group {0} does not exist")]
    NoSuchGroup(String),
    #[error("consumer group {0} already exists")]
    GroupExists(String),
    #[error("the hub already has the maximum of {0} consumer groups")]
    TooManyGroups(usize),
    #[error("the $Default consumer group cannot be deleted")]
    DefaultGroup,
    #[error("endpoint {0} does not exist")]
    NoSuchEndpoint(String),
    #[error("endpoint {0} already exists")]
    EndpointExists(String),
    #[error("endpoint {endpoint} is used by {owner}")]
    EndpointInUse { endpoint: String, owner: String },
    #[error("no room for {0} more partitions (at most {max} in all)", max = MAX_PARTITIONS)]
    NoPartitionSpace(u16),
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct D2cEvent {
    pub partition: u16,
    pub sequence_number: u64,
    pub offset: u64,
    pub enqueued_time: UnixMillis,
    /// IoT Hub system properties by their wire names (`message-id`, `iothub-connection-device-id`, ...).
    pub system_properties: Vec<(String, String)>,
    pub application_properties: Vec<(String, String)>,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// A [`D2cEvent`] as it is encoded, borrowing what the appender gave: the same fields, names
/// and order, so the stored bytes are the same, without copying properties and body first.
#[derive(Serialize)]
struct D2cEventRef<'a> {
    partition: u16,
    sequence_number: u64,
    offset: u64,
    enqueued_time: UnixMillis,
    system_properties: &'a [SystemProperty],
    application_properties: &'a [(String, String)],
    #[serde(with = "serde_bytes")]
    body: &'a [u8],
}

/// A system property of a new event, by its wire name. Most names and some values are fixed
/// strings (`iothub-message-source: Telemetry`), so they are borrowed rather than allocated
/// for every message; stored, they encode as any string does.
pub type SystemProperty = (Cow<'static, str>, Cow<'static, str>);

/// An event to append; the engine assigns partition, sequence number, offset and time.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NewEvent {
    /// Chooses the partition within each endpoint.
    pub device_id: String,
    /// Where the event goes: `None` is the built-in endpoint only; an empty list is nowhere
    /// (routed away); otherwise one copy per endpoint.
    pub endpoints: Option<Vec<EndpointSlot>>,
    pub system_properties: Vec<SystemProperty>,
    pub application_properties: Vec<(String, String)>,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

impl NewEvent {
    /// About the stored payload's size: the body, each property with its MessagePack framing,
    /// and the field names and numbers around them.
    fn encoded_size_hint(&self) -> usize {
        fn props<K: AsRef<str>, V: AsRef<str>>(v: &[(K, V)]) -> usize {
            v.iter()
                .map(|(k, v)| k.as_ref().len() + v.as_ref().len() + 4)
                .sum()
        }
        self.body.len() + props(&self.system_properties) + props(&self.application_properties) + 160
    }
}

/// Where an appended event went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Appended {
    pub partition: u16,
    pub sequence_number: u64,
    pub offset: u64,
    pub enqueued_time: UnixMillis,
}

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPosition {
    /// The oldest retained event.
    Start,
    /// Only events appended after this read (the first call returns nothing).
    End,
    /// The event with this sequence number (or the first after it), inclusive.
    Sequence(u64),
    /// The event at this offset (or the first after it), inclusive.
    Offset(u64),
    /// The first event enqueued at or after this time.
    EnqueuedTime(UnixMillis),
}

/// What `GET .../partitions/{p}` reports, with Event Hubs' names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: u16,
    /// First retained sequence number (the next one to be assigned when empty).
    pub begin_sequence_number: u64,
    /// Last assigned sequence number; `None` before the first event.
    pub last_enqueued_sequence_number: Option<u64>,
    pub last_enqueued_offset: Option<u64>,
    pub last_enqueued_time: Option<UnixMillis>,
    pub is_empty: bool,
}

/// A stored reader position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub sequence_number: u64,
    pub offset: u64,
    pub updated: UnixMillis,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct PartitionHead {
    next_sequence: u64,
    next_offset: u64,
    last_enqueued: UnixMillis,
    last_sequence: Option<u64>,
    last_offset: Option<u64>,
    /// The segment of the partition's last event (since version 7).
    #[serde(default)]
    segment: Option<u32>,
    /// The first sequence number a reader may see; earlier events are expired or deleted.
    #[serde(default)]
    begin: u64,
}

/// Locks held while a batch is staged and submitted: the endpoint list (read), so no endpoint
/// named by the batch is deleted in between, and the partitions written.
pub(crate) struct PartitionGuards<'a>(
    #[allow(dead_code)] parking_lot::RwLockReadGuard<'a, Vec<Endpoint>>,
    Vec<(u16, parking_lot::MutexGuard<'a, PartitionHead>)>,
);

/// Whether staging waits for the endpoint list and partition locks or gives up.
#[derive(Clone, Copy)]
enum Locking {
    Wait,
    /// Gives up, after spinning briefly for a partition lock (see [`lock_briefly`]).
    Try,
}

/// Tries this often, a spin-loop hint apart, for a partition lock another staging holds.
/// Staging holds it for about a microsecond (one event's encoding), while giving up sends
/// the append through a thread hand-off that costs several times that; so a busy partition
/// is worth a few microseconds' wait, and no more (the holder may have been preempted).
const LOCK_SPINS: u32 = 64;

fn lock_briefly<T>(m: &Mutex<T>) -> Option<parking_lot::MutexGuard<'_, T>> {
    for _ in 0..LOCK_SPINS {
        if let Some(guard) = m.try_lock() {
            return Some(guard);
        }
        std::hint::spin_loop();
    }
    None
}

/// A [`Store::try_append_events_then`] that would have had to wait: what it was given, back.
pub struct WouldWait<F> {
    pub events: Vec<NewEvent>,
    pub done: F,
}

/// In-memory partition heads (all [`MAX_PARTITIONS`], loaded at open) and the endpoints.
pub(crate) struct Partitions {
    heads: Vec<Mutex<PartitionHead>>,
    /// Fixed when the hub is created; a follower's store learns it from the log.
    builtin: std::sync::atomic::AtomicU16,
    pub(crate) custom: parking_lot::RwLock<Vec<Endpoint>>,
    segments: Segments,
}

impl Partitions {
    /// Loads every partition head; `builtin` and `custom` say which partitions exist.
    pub(crate) fn load(
        raw: &Raw,
        builtin: u16,
        custom: Vec<Endpoint>,
        segmented: bool,
    ) -> Result<Partitions, StorageError> {
        let mut stored = Vec::with_capacity(MAX_PARTITIONS as usize);
        for p in 0..MAX_PARTITIONS {
            let head: PartitionHead = raw
                .get_record(cf::D2C_STATE, &keys::d2c::head(p))?
                .unwrap_or_default();
            stored.push(head);
        }
        let last_written = stored.iter().filter_map(|h| h.segment).max().unwrap_or(0);
        let segments = Segments::load(raw, segmented, last_written)?;
        let mut recovered = Vec::with_capacity(stored.len());
        for (p, head) in (0..MAX_PARTITIONS).zip(stored) {
            recovered.push(Mutex::new(heads::recover(raw, &segments, p, head)?));
        }
        Ok(Partitions {
            heads: recovered,
            builtin: builtin.into(),
            custom: parking_lot::RwLock::new(custom),
            segments,
        })
    }

    /// The built-in endpoint's partition count.
    pub(crate) fn count(&self) -> u16 {
        self.builtin.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set_count(&self, n: u16) {
        self.builtin.store(n, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn builtin_slot(&self) -> EndpointSlot {
        EndpointSlot {
            base: 0,
            partitions: self.count(),
            id: 0,
        }
    }

    /// Every partition of every endpoint.
    fn all(&self) -> Vec<u16> {
        let mut out: Vec<u16> = (0..self.count()).collect();
        for e in self.custom.read().iter() {
            out.extend(e.slot.base..e.slot.base + e.slot.partitions);
        }
        out
    }
}

impl Store {
    fn partitions(&self) -> &Partitions {
        &self.partitions
    }

    fn check_partition(&self, p: u16) -> Result<(), D2cError> {
        let parts = self.partitions();
        if p < parts.count() || parts.custom.read().iter().any(|e| e.slot.contains(p)) {
            Ok(())
        } else {
            Err(D2cError::NoSuchPartition(p))
        }
    }

    /// How many D2C partitions the hub has.
    pub fn partition_count(&self) -> u16 {
        self.partitions().count()
    }

    /// Assigns partitions, sequence numbers and offsets to `events` and builds them into one
    /// atomic batch, to be submitted before the returned guards are dropped. Events of one
    /// partition keep the order given.
    pub(crate) fn stage_events(
        &self,
        events: Vec<NewEvent>,
        now: UnixMillis,
    ) -> Result<(Batch, Vec<Appended>, PartitionGuards<'_>), D2cError> {
        let staged = self.stage(&events, now, Locking::Wait)?;
        let (batch, out, guards, _) = staged.expect("waiting for locks always stages");
        Ok((batch, out, guards))
    }

    /// [`Store::stage_events`] over borrowed events; with [`Locking::Try`], `None` when the
    /// endpoint list or a partition is locked by another writer. Also returns the partition
    /// heads as they were, so a batch that cannot be queued can be undone.
    #[allow(clippy::type_complexity)]
    fn stage(
        &self,
        events: &[NewEvent],
        now: UnixMillis,
        locking: Locking,
    ) -> Result<
        Option<(
            Batch,
            Vec<Appended>,
            PartitionGuards<'_>,
            Vec<(u16, PartitionHead)>,
        )>,
        D2cError,
    > {
        let builtin = self.partitions().builtin_slot();
        // A slot routed before its endpoint was deleted names nothing any more: its copy is
        // dropped rather than written into a partition range a later endpoint may reuse.
        let endpoints = match locking {
            Locking::Wait => self.partitions().custom.read(),
            Locking::Try => match self.partitions().custom.try_read() {
                Some(guard) => guard,
                None => return Ok(None),
            },
        };
        let live = |s: &EndpointSlot| *s == builtin || endpoints.iter().any(|e| e.slot == *s);
        // Most events go to the built-in endpoint alone: their one partition needs no
        // allocation.
        let targets: Vec<SmallVec<[u16; 2]>> = events
            .iter()
            .map(|e| match &e.endpoints {
                None => smallvec![builtin.partition_of(&e.device_id)],
                Some(slots) => slots
                    .iter()
                    .filter(|s| live(s))
                    .map(|s| s.partition_of(&e.device_id))
                    .collect(),
            })
            .collect();
        let mut wanted: Vec<u16> = targets.iter().flatten().copied().collect();
        wanted.sort_unstable();
        wanted.dedup();
        // IMPORTANT: partition locks in ascending order; held until the batch is submitted so
        // commit order equals sequence order.
        let mut guards: Vec<(u16, parking_lot::MutexGuard<'_, PartitionHead>)> =
            Vec::with_capacity(wanted.len());
        for &p in &wanted {
            let head = &self.partitions().heads[p as usize];
            match locking {
                Locking::Wait => guards.push((p, head.lock())),
                Locking::Try => match lock_briefly(head) {
                    Some(guard) => guards.push((p, guard)),
                    None => return Ok(None),
                },
            }
        }
        let before: Vec<(u16, PartitionHead)> = guards.iter().map(|(p, h)| (*p, **h)).collect();
        // Read under the partition locks: the segment cannot change until they are released.
        let segments = &self.partitions().segments;
        let segment = segments.current();
        let mut staged_bytes = 0u64;
        // What each partition's events will take, to size its pack once.
        let hints: Vec<usize> = events
            .iter()
            .map(|e| e.encoded_size_hint() + record::HEADER_LEN)
            .collect();
        let mut room: SmallVec<[usize; 2]> = smallvec![0; guards.len()];
        for (ps, hint) in targets.iter().zip(&hints) {
            for p in ps {
                room[guards
                    .iter()
                    .position(|(q, _)| q == p)
                    .expect("locked above")] += hint;
            }
        }
        // Usually one pack per partition, and at most one segment index entry per partition.
        let mut batch = Batch::with_capacity(2 * wanted.len());
        let mut packs = PackWriter::new(segment);
        let mut out = Vec::with_capacity(events.len());
        for ((ev, ps), hint) in events.iter().zip(targets).zip(hints) {
            for p in ps {
                let at = guards
                    .iter()
                    .position(|(q, _)| *q == p)
                    .expect("locked above");
                let head = &mut guards[at].1;
                let enqueued = now.max(head.last_enqueued);
                let event = D2cEventRef {
                    partition: p,
                    sequence_number: head.next_sequence,
                    offset: head.next_offset,
                    enqueued_time: enqueued,
                    system_properties: &ev.system_properties,
                    application_properties: &ev.application_properties,
                    body: &ev.body,
                };
                if head.segment != Some(segment) {
                    segments.note_first(&mut batch, p, event.sequence_number, segment);
                }
                let framed_len = packs.push(&mut batch, &event, room[at]);
                room[at] = room[at].saturating_sub(hint);
                staged_bytes += framed_len as u64;
                **head = PartitionHead {
                    next_sequence: event.sequence_number + 1,
                    next_offset: event.offset + framed_len as u64,
                    last_enqueued: enqueued,
                    last_sequence: Some(event.sequence_number),
                    last_offset: Some(event.offset),
                    segment: Some(segment),
                    begin: head.begin,
                };
                out.push(Appended {
                    partition: p,
                    sequence_number: event.sequence_number,
                    offset: event.offset,
                    enqueued_time: enqueued,
                });
            }
        }
        packs.finish(&mut batch);
        // No head record: the events alone say where the partition ends (see `heads`).
        segments.add_bytes(staged_bytes);
        Ok(Some((
            batch,
            out,
            PartitionGuards(endpoints, guards),
            before,
        )))
    }

    /// Appends events durably, as one atomic batch: all are stored or none. Each goes to its
    /// device's partition; events of one partition keep the order given. Returns when the
    /// events are on disk.
    ///
    /// # Errors
    /// Storage errors; then none of the events is acknowledged (the caller must not PUBACK).
    pub fn append_events(
        &self,
        events: Vec<NewEvent>,
        now: UnixMillis,
    ) -> Result<Vec<Appended>, D2cError> {
        let (batch, out, guards) = self.stage_events(events, now)?;
        let ticket = self.raw.submit(batch)?;
        drop(guards);
        self.maybe_switch_segment()?;
        ticket.wait()?;
        Ok(out)
    }

    /// Like [`Store::append_events`] but returns once the events are queued, in order; `done`
    /// runs (on the commit thread) when they are durable. Lets a connection keep reading while
    /// its earlier messages are being synced, without giving up per-device order.
    ///
    /// # Errors
    /// Storage errors at queueing time (then `done` is never called).
    pub fn append_events_then(
        &self,
        events: Vec<NewEvent>,
        now: UnixMillis,
        done: impl FnOnce(Result<Vec<Appended>, StorageError>) + Send + 'static,
    ) -> Result<(), D2cError> {
        let (batch, out, guards) = self.stage_events(events, now)?;
        self.raw
            .submit_with(batch, Box::new(move |r| done(r.map(|()| out))))?;
        drop(guards);
        self.maybe_switch_segment()?;
        Ok(())
    }

    /// Like [`Store::append_events_then`], but never waits for another writer's lock or for
    /// room in the commit queue, so an async caller may run it on its own thread. When it
    /// would wait, nothing is stored or changed and the events and `done` come back.
    ///
    /// # Errors
    /// Storage errors at queueing time (then `done` is never called).
    pub fn try_append_events_then<F>(
        &self,
        events: Vec<NewEvent>,
        now: UnixMillis,
        done: F,
    ) -> Result<Result<(), WouldWait<F>>, D2cError>
    where
        F: FnOnce(Result<Vec<Appended>, StorageError>) + Send + 'static,
    {
        let Some((batch, out, mut guards, before)) = self.stage(&events, now, Locking::Try)? else {
            return Ok(Err(WouldWait { events, done }));
        };
        // Shared with the commit callback so `done` can come back if the queue is full.
        let slot = std::sync::Arc::new(Mutex::new(Some(done)));
        let callback = {
            let slot = std::sync::Arc::clone(&slot);
            Box::new(move |r: Result<(), StorageError>| {
                if let Some(done) = slot.lock().take() {
                    done(r.map(|()| out));
                }
            })
        };
        if self.raw.try_submit_with(batch, callback)? {
            drop(guards);
            self.maybe_switch_segment()?;
            return Ok(Ok(()));
        }
        // Not queued: put the heads back while still holding their locks, so no one saw them.
        for ((_, head), (_, old)) in guards.1.iter_mut().zip(before) {
            **head = old;
        }
        drop(guards);
        let done = slot.lock().take().expect("the callback was dropped unrun");
        Ok(Err(WouldWait { events, done }))
    }

    /// Reads up to `max` events of a partition from `from`.
    ///
    /// # Errors
    /// [`D2cError::NoSuchPartition`] or storage errors (a corrupt event is reported, not skipped).
    pub fn read_events(
        &self,
        partition: u16,
        from: ReadPosition,
        max: usize,
    ) -> Result<Vec<D2cEvent>, D2cError> {
        self.check_partition(partition)?;
        let start_seq = match from {
            ReadPosition::Start => 0,
            ReadPosition::Sequence(s) => s,
            ReadPosition::End => return Ok(Vec::new()),
            ReadPosition::Offset(o) => self.first_sequence_where(partition, |e| e.offset >= o)?,
            ReadPosition::EnqueuedTime(t) => {
                self.first_sequence_where(partition, |e| e.enqueued_time >= t)?
            }
        };
        self.scan_partition(partition, start_seq, max)
    }

    /// Up to `max` readable events of a partition from sequence `from`, in order.
    fn scan_partition(&self, p: u16, from: u64, max: usize) -> Result<Vec<D2cEvent>, D2cError> {
        let from = from.max(self.partitions().heads[p as usize].lock().begin);
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        for segment in self.partitions().segments.segments_from(p, from) {
            // The pack holding `from` starts at or below it (see `pack`).
            self.raw.scan_values_from_prev(
                cf::D2C_LOG,
                keys::d2c::event(segment, p, 0),
                &keys::d2c::event(segment, p, from),
                keys::d2c::segment_partition_end(segment, p),
                |key, value| {
                    pack::for_each_event(key, value, |e, _| {
                        if e.sequence_number >= from {
                            out.push(e);
                        }
                        out.len() < max
                    })
                },
            )?;
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    /// The next sequence number a reader positioned at the end should wait for.
    pub fn next_sequence_number(&self, partition: u16) -> Result<u64, D2cError> {
        self.check_partition(partition)?;
        Ok(self.partitions().heads[partition as usize]
            .lock()
            .next_sequence)
    }

    /// Smallest retained sequence number whose event satisfies a predicate that is monotonic
    /// in sequence order (offsets, enqueued times); the next sequence number if none does.
    fn first_sequence_where(
        &self,
        p: u16,
        pred: impl Fn(&D2cEvent) -> bool,
    ) -> Result<u64, D2cError> {
        let info = self.partition_info(p)?;
        let Some(last) = info.last_enqueued_sequence_number else {
            return Ok(info.begin_sequence_number);
        };
        let (mut lo, mut hi) = (info.begin_sequence_number, last + 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let probe = self.first_event_at_or_after(p, mid)?;
            match probe {
                Some(e) if !pred(&e) => lo = e.sequence_number + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    fn first_event_at_or_after(&self, p: u16, seq: u64) -> Result<Option<D2cEvent>, D2cError> {
        Ok(self.scan_partition(p, seq, 1)?.pop())
    }

    /// Partition information with Event Hubs' field meanings.
    ///
    /// # Errors
    /// [`D2cError::NoSuchPartition`] or storage errors.
    pub fn partition_info(&self, partition: u16) -> Result<PartitionInfo, D2cError> {
        self.check_partition(partition)?;
        let head = *self.partitions().heads[partition as usize].lock();
        let first = self.first_event_at_or_after(partition, head.begin)?;
        Ok(PartitionInfo {
            partition,
            begin_sequence_number: first
                .as_ref()
                .map(|e| e.sequence_number)
                .unwrap_or(head.next_sequence),
            last_enqueued_sequence_number: head.last_sequence,
            last_enqueued_offset: head.last_offset,
            last_enqueued_time: head.last_sequence.map(|_| head.last_enqueued),
            is_empty: first.is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrohub_migrations::record;

    #[test]
    fn a_borrowed_event_encodes_as_the_stored_one() {
        let event = D2cEvent {
            partition: 3,
            sequence_number: 7,
            offset: 900,
            enqueued_time: UnixMillis(1_700_000_000_123),
            system_properties: vec![("message-id".into(), "m1".into())],
            application_properties: vec![("k".into(), "v".into()), ("x".into(), "".into())],
            body: b"{\"t\":21.5}".to_vec(),
        };
        // Borrowed and owned property strings alike, as an appended event holds them.
        let system: Vec<SystemProperty> = vec![("message-id".into(), String::from("m1").into())];
        let borrowed = D2cEventRef {
            partition: event.partition,
            sequence_number: event.sequence_number,
            offset: event.offset,
            enqueued_time: event.enqueued_time,
            system_properties: &system,
            application_properties: &event.application_properties,
            body: &event.body,
        };
        let bytes = record::encode(&borrowed);
        assert_eq!(bytes, record::encode(&event));
        assert_eq!(record::decode::<D2cEvent>(&bytes).unwrap(), event);
    }
}
