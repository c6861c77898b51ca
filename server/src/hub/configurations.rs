//! The reconciler of automatic device configurations (ADM, issue 15 part 4): keeps every
//! twin's desired properties and `configurations` map as the configurations decide
//! ([`super::config_content::decide`]), for twins that match now and twins that start
//! matching later.
//!
//! # Invariants
//! - Triggers: at start, and after any configuration is stored or deleted, every twin is
//!   swept; a twin whose tags, reported properties, identity or connection changed (the event
//!   router hands over the change records it routed) is decided again on its own. A change
//!   record lost in a crash is covered by the sweep at the next start.
//! - A decision is written only onto the twin it was made from (etag-conditional); a twin
//!   that changed meanwhile is read and decided again.
//! - Desired changes reach connected devices as ordinary desired-property patches.
//! - Its own writes touch only desired properties, which trigger nothing, so it does not loop.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::notifications::{Notification, NotificationOp};
use ferrohub_engine::twin::store::{Twin, TwinOutcome};
use ferrohub_engine::{StorageError, Store, TwinError, UnixMillis};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::config_content::{decide, Compiled};
use super::twin_query::each_twin;
use super::twin_rows::twin_json;
use super::HubContext;
use crate::routing::query::Collection;

/// How often a twin that keeps changing under a decision is tried before the next trigger.
const ATTEMPTS: usize = 3;

type TwinId = (String, Option<String>);

/// What the reconciler has to do next.
pub struct Reconciler {
    wake: Notify,
    sweep: AtomicBool,
    dirty: Mutex<HashSet<TwinId>>,
    /// Configurations stored when last looked; no twin needs deciding while there are none
    /// (a configuration's creation sweeps anyway).
    configurations: AtomicUsize,
}

impl Reconciler {
    /// A reconciler that sweeps once when it starts.
    pub fn new() -> Arc<Reconciler> {
        Arc::new(Reconciler {
            wake: Notify::new(),
            sweep: AtomicBool::new(true),
            dirty: Mutex::default(),
            configurations: AtomicUsize::new(0),
        })
    }

    /// A configuration was stored or deleted: every twin is decided again.
    pub fn configurations_changed(&self) {
        self.sweep.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Change records were routed: the twins whose targeting may have changed are decided
    /// again.
    pub fn twins_changed(&self, notes: &[Notification]) {
        if self.configurations.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut dirty = self.dirty.lock();
        for n in notes.iter().filter(|n| may_retarget(n)) {
            dirty.insert((n.device_id.clone(), n.module_id.clone()));
        }
        drop(dirty);
        self.wake.notify_one();
    }
}

/// Whether a change can change which configurations target a twin: anything but a deletion or
/// a change of desired properties alone (which is what the reconciler itself writes).
fn may_retarget(n: &Notification) -> bool {
    match n.op {
        // A digital twin change comes with the twin change it describes, which decides.
        NotificationOp::DeleteDeviceIdentity
        | NotificationOp::DigitalTwinUpdate
        | NotificationOp::DigitalTwinReplace => false,
        NotificationOp::UpdateTwin => {
            n.body.contains_key("tags")
                || n.body
                    .get("properties")
                    .and_then(|p| p.get("reported"))
                    .is_some()
        }
        _ => true,
    }
}

/// Runs the reconciler until shutdown.
pub async fn run(ctx: HubContext, shutdown: CancellationToken) {
    let reconciler = Arc::clone(&ctx.configurations);
    loop {
        let sweep = reconciler.sweep.swap(false, Ordering::AcqRel);
        let dirty: Vec<TwinId> = reconciler.dirty.lock().drain().collect();
        if sweep || !dirty.is_empty() {
            let (now, counter) = (ctx.clock.now(), Arc::clone(&reconciler));
            let done = ctx
                .store
                .run(move |s| reconcile(s, sweep, &dirty, now, &counter))
                .await;
            match done {
                Ok(outcomes) => {
                    for o in &outcomes {
                        ctx.push_desired(o);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciling configurations failed; retrying");
                    reconciler.sweep.store(true, Ordering::Release);
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            }
            continue;
        }
        tokio::select! {
            () = reconciler.wake.notified() => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Decides and writes every twin (`sweep`) or the `dirty` ones; returns the writes that
/// changed desired properties.
fn reconcile(
    s: &Store,
    sweep: bool,
    dirty: &[TwinId],
    now: UnixMillis,
    reconciler: &Reconciler,
) -> Result<Vec<TwinOutcome>, StorageError> {
    let stored = s.list_configurations()?;
    reconciler
        .configurations
        .store(stored.len(), Ordering::Release);
    let configs: Vec<Compiled> = stored
        .iter()
        .filter_map(|c| match Compiled::compile(c) {
            Ok(compiled) => Some(compiled),
            Err(e) => {
                tracing::warn!(configuration = %c.id, error = %e, "configuration skipped");
                None
            }
        })
        .collect();
    let mut outcomes = Vec::new();
    if sweep {
        for collection in [Collection::Devices, Collection::Modules] {
            let mut twins = Vec::new();
            each_twin(s, collection, |twin| {
                // Only twins with something to do are kept. A twin's query row is read only
                // by a configuration's target condition: with none stored (the sweep at every
                // start, usually) it is not built, which spared about 30 allocations a twin.
                let row = if configs.is_empty() {
                    serde_json::Value::Null
                } else {
                    twin_json(&twin)
                };
                if decide(&configs, &twin, &row).is_some() {
                    twins.push(twin);
                }
                true
            })?;
            for twin in twins {
                let id = (
                    twin.identity.device_id.clone(),
                    twin.identity.module_id.clone(),
                );
                outcomes.extend(settle(s, &configs, Some(twin), &id, now, reconciler)?);
            }
        }
    }
    for id in dirty {
        outcomes.extend(settle(s, &configs, None, id, now, reconciler)?);
    }
    Ok(outcomes)
}

/// Decides one twin (read here unless given) and writes the decision; a twin that changed
/// meanwhile is read and decided again, and after [`ATTEMPTS`] left for the next round.
fn settle(
    s: &Store,
    configs: &[Compiled],
    mut given: Option<Twin>,
    id: &TwinId,
    now: UnixMillis,
    reconciler: &Reconciler,
) -> Result<Option<TwinOutcome>, StorageError> {
    let storage = |e: TwinError| match e {
        TwinError::Storage(e) => e,
        other => StorageError::Backend(other.to_string()),
    };
    for _ in 0..ATTEMPTS {
        let twin = match given.take() {
            Some(t) => t,
            None => match s.get_twin(&id.0, id.1.as_deref()) {
                Ok(t) => t,
                Err(TwinError::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(storage(e)),
            },
        };
        let Some(decision) = decide(configs, &twin, &twin_json(&twin)) else {
            return Ok(None);
        };
        match s.apply_configured_twin(&id.0, id.1.as_deref(), &twin.record.etag, &decision, now) {
            Ok(outcome) => return Ok(outcome),
            Err(TwinError::EtagMismatch { .. }) => continue,
            Err(TwinError::NotFound { .. }) => return Ok(None),
            Err(TwinError::Invalid(e)) => {
                tracing::warn!(device = %id.0, module = ?id.1, error = %e, "configurations cannot be applied to this twin");
                return Ok(None);
            }
            Err(e) => return Err(storage(e)),
        }
    }
    reconciler.dirty.lock().insert(id.clone());
    reconciler.wake.notify_one();
    Ok(None)
}
