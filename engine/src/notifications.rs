//! The notification outbox (EVT-2, EVT-3, EVT-4, TWN-9): every state change IoT Hub reports as
//! a non-telemetry event (twin updates and replacements, identity creation and deletion,
//! connects and disconnects) writes, in the same atomic batch as the change itself, a record of
//! it. The router turns records into routed events, so none is lost on a crash.
//!
//! # Invariants
//! - Records are keyed by a hub-wide sequence number, assigned and submitted to the committer
//!   under one lock, so the committed records are always a gap-free prefix in key order and
//!   the numbers only grow, also across restarts (the next number comes from the last key).
//! - A record's body is the seed 004 shape with times as Unix milliseconds in strings (the
//!   protocol layer formats them): the twin change for `updateTwin`, the whole twin for
//!   `replaceTwin` and the lifecycle operations, empty for connection state, and for a Plug and
//!   Play twin's change also a digital twin record (`{"patch": [...], "modelId"}`, PNP-5).
//! - The column family is named `twin_changes` on disk: twin changes were its first records
//!   (schema v4), the other operations were added without changing the record shape.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::model::UnixMillis;
use crate::raw::{no_wait, Batch};
use crate::twin::document::json_text;
use crate::Store;

/// IoT Hub's `opType` of a non-telemetry event. New variants go at the end (stored records
/// name earlier ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotificationOp {
    UpdateTwin,
    ReplaceTwin,
    CreateDeviceIdentity,
    DeleteDeviceIdentity,
    DeviceConnected,
    DeviceDisconnected,
    /// A Plug and Play twin's change as its digital twin sees it (PNP-5): written beside the
    /// `UpdateTwin` record of the same write; the body is `{"patch": [JSON Patch], "modelId"}`.
    DigitalTwinUpdate,
    /// As `DigitalTwinUpdate`, beside a `ReplaceTwin` record.
    DigitalTwinReplace,
}

/// Where an event comes from: a route's `source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventSource {
    DeviceMessages,
    TwinChangeEvents,
    DeviceLifecycleEvents,
    DeviceConnectionStateEvents,
    DigitalTwinChangeEvents,
}

impl EventSource {
    /// The name routes and the `iothub-message-source` property use.
    pub fn name(self) -> &'static str {
        match self {
            EventSource::DeviceMessages => "DeviceMessages",
            EventSource::TwinChangeEvents => "TwinChangeEvents",
            EventSource::DeviceLifecycleEvents => "DeviceLifecycleEvents",
            EventSource::DeviceConnectionStateEvents => "DeviceConnectionStateEvents",
            EventSource::DigitalTwinChangeEvents => "DigitalTwinChangeEvents",
        }
    }

    /// Parses a route source, case-insensitively.
    pub fn parse(text: &str) -> Option<Self> {
        [
            EventSource::DeviceMessages,
            EventSource::TwinChangeEvents,
            EventSource::DeviceLifecycleEvents,
            EventSource::DeviceConnectionStateEvents,
            EventSource::DigitalTwinChangeEvents,
        ]
        .into_iter()
        .find(|s| s.name().eq_ignore_ascii_case(text))
    }
}

impl NotificationOp {
    pub fn name(self) -> &'static str {
        match self {
            NotificationOp::UpdateTwin => "updateTwin",
            NotificationOp::ReplaceTwin => "replaceTwin",
            NotificationOp::CreateDeviceIdentity => "createDeviceIdentity",
            NotificationOp::DeleteDeviceIdentity => "deleteDeviceIdentity",
            NotificationOp::DeviceConnected => "deviceConnected",
            NotificationOp::DeviceDisconnected => "deviceDisconnected",
            // IoT Hub names a digital twin change by the twin operation behind it.
            NotificationOp::DigitalTwinUpdate => "updateTwin",
            NotificationOp::DigitalTwinReplace => "replaceTwin",
        }
    }

    pub fn source(self) -> EventSource {
        match self {
            NotificationOp::UpdateTwin | NotificationOp::ReplaceTwin => {
                EventSource::TwinChangeEvents
            }
            NotificationOp::CreateDeviceIdentity | NotificationOp::DeleteDeviceIdentity => {
                EventSource::DeviceLifecycleEvents
            }
            NotificationOp::DeviceConnected | NotificationOp::DeviceDisconnected => {
                EventSource::DeviceConnectionStateEvents
            }
            NotificationOp::DigitalTwinUpdate | NotificationOp::DigitalTwinReplace => {
                EventSource::DigitalTwinChangeEvents
            }
        }
    }
}

/// One stored notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    pub sequence: u64,
    pub device_id: String,
    pub module_id: Option<String>,
    pub op: NotificationOp,
    pub time: UnixMillis,
    #[serde(with = "json_text")]
    pub body: Map<String, Value>,
}

/// A notification before its sequence number is assigned.
#[derive(Debug, Clone)]
pub(crate) struct PendingNotification {
    pub device_id: String,
    pub module_id: Option<String>,
    pub op: NotificationOp,
    pub time: UnixMillis,
    pub body: Map<String, Value>,
}

pub(crate) fn key(sequence: u64) -> Vec<u8> {
    sequence.to_be_bytes().to_vec()
}

/// Called after notifications became durable (the router's wake-up).
pub type NotificationHook = Box<dyn Fn() + Send + Sync>;

/// Stages `notes` in `batch` as change records numbered from `*next`, which it advances. The
/// caller holds the sequence lock until the batch is queued.
fn number_notifications(batch: &mut Batch, notes: Vec<PendingNotification>, next: &mut u64) {
    for n in notes {
        let record = Notification {
            sequence: *next,
            device_id: n.device_id,
            module_id: n.module_id,
            op: n.op,
            time: n.time,
            body: n.body,
        };
        batch.put_record(cf::TWIN_CHANGES, key(*next), &record);
        *next += 1;
    }
}

impl Store {
    /// Commits `batch` together with `notes`, numbered in commit order; waits until durable.
    pub(crate) fn commit_with_notifications(
        &self,
        mut batch: Batch,
        notes: Vec<PendingNotification>,
    ) -> Result<(), StorageError> {
        if notes.is_empty() {
            return self.raw.commit(batch);
        }
        // The batch hook reads (the query index's old entries), so it runs before the lock;
        // the writer's stripe locks already order the writes of each twin it touches.
        self.raw.stage_derived(&mut batch)?;
        let ticket = {
            // IMPORTANT: assign and submit under one lock so records commit in key order.
            let mut next = self.twin_sequence.lock();
            number_notifications(&mut batch, notes, &mut next);
            self.raw.submit_staged(batch)?
        };
        ticket.wait()?;
        if let Some(hook) = self.notification_hook.get() {
            hook();
        }
        Ok(())
    }

    /// Like [`Store::commit_with_notifications`] without waiting: the batch is pipelined
    /// (its twin writes are seen by the next read-modify-write at once, see `raw::inflight`)
    /// and `done` runs on the commit thread once it is durable, after the notification hook.
    /// On `Err` nothing was queued and `done` is dropped unrun.
    pub(crate) fn submit_with_notifications_then(
        &self,
        batch: Batch,
        notes: Vec<PendingNotification>,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<(), StorageError> {
        let hook = self.notification_hook.get().cloned();
        let announce = !notes.is_empty();
        // Staging reads (the query index's old entries, the twin in flight), so it runs before
        // the sequence lock, which every twin write in the hub takes: held across those reads it
        // serialised all devices' patches. The caller's stripe locks order each twin's writes.
        let mut staged = self.raw.stage_pipelined(batch)?;
        // IMPORTANT: assign and submit under one lock so records commit in key order. Its
        // holder may wait for room in the commit queue, so a call without waiting only tries it.
        let mut next = if no_wait::active() {
            self.twin_sequence.try_lock().ok_or_else(no_wait::refuse)?
        } else {
            self.twin_sequence.lock()
        };
        let first = *next;
        number_notifications(staged.batch_mut(), notes, &mut next);
        let result = self.raw.queue_pipelined(
            staged,
            Box::new(move |result| {
                if let (Ok(()), true, Some(hook)) = (&result, announce, hook) {
                    hook();
                }
                done(result)
            }),
        );
        if result.is_err() {
            // Nothing was queued, and the lock is still held: the numbers are free again.
            *next = first;
        }
        result
    }

    /// Installs the function called after notifications become durable (once per store).
    pub fn set_notification_hook(&self, hook: NotificationHook) {
        let _ = self.notification_hook.set(std::sync::Arc::from(hook));
    }

    /// Notifications with sequence numbers from `from`, at most `max`, in order.
    ///
    /// # Errors
    /// Storage errors (a corrupt record is reported, not skipped).
    pub fn read_notifications(
        &self,
        from: u64,
        max: usize,
    ) -> Result<Vec<Notification>, StorageError> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        self.raw
            .scan_records::<Notification>(cf::TWIN_CHANGES, &key(from), None, |_, c| {
                out.push(c);
                out.len() < max
            })?;
        Ok(out)
    }
}

/// Slot for the hook in [`Store`].
pub(crate) type HookCell = OnceLock<std::sync::Arc<dyn Fn() + Send + Sync>>;
