//! What an MQTT connection records when it opens and when it ends: its connection state
//! (MQT-13), queued without waiting for the disk, and its Will (MQT-8), sent as telemetry when
//! the connection ends without a DISCONNECT.

use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::{RegistryError, StorageError, Store};

use crate::hub::connections::Registration;
use crate::hub::HubContext;
use crate::ids::Identity;
use crate::telemetry::{self, DeviceMessage};

use super::authenticate::Authenticated;
use super::property_bag;
use super::topics::{self, Inbound};

/// [`stage_connection`]'s engine call for a connection that ends, in place when it need not
/// wait, queued without waiting for its sync: closing the socket does not wait on the disk
/// (see `Store::record_connection_then`). The "disconnected" state is recorded only while this
/// is still the client id's current connection, checked under the device's lock, so it never
/// lands after a newer connection's "connected".
pub(super) async fn finish(ctx: &HubContext, auth: &Authenticated, registration: &Registration) {
    if !registration.is_current() {
        return;
    }
    let who = auth.who.clone();
    let now = ctx.clock.now();
    let current = registration.current_check();
    let staged = ctx
        .store
        .run_quick(move |s| {
            stage_connection(s, &who, Change::Disconnected(&current), now);
            Ok::<(), StorageError>(())
        })
        .await;
    if let Err(e) = staged {
        tracing::warn!(error = %e, "cannot record connection state");
    }
}

/// A connection state to record.
pub(super) enum Change<'a> {
    Connected,
    /// Only while the check says the connection is still the current one.
    Disconnected(&'a dyn Fn() -> bool),
}

/// Records a connection state (MQT-13) for a caller on the store's side of the seam (the
/// CONNECT stages it with the session, in one call). A failure is logged: the state is a
/// debugging aid, and the connection goes on. A call made without waiting that would have
/// waited is not a failure: `Store::without_waiting` reports it, and the call is made again.
pub(super) fn stage_connection(store: &Store, who: &Identity, change: Change<'_>, now: UnixMillis) {
    let durable = |result: Result<(), StorageError>| {
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot record connection state");
        }
    };
    let (d, m) = (who.device_id.as_str(), who.module_id.as_deref());
    let recorded = match change {
        Change::Connected => store.record_connection_then(d, m, true, now, durable),
        Change::Disconnected(current) => {
            store.record_disconnection_then(d, m, now, current, durable)
        }
    };
    match recorded {
        Ok(_) | Err(RegistryError::Storage(StorageError::WouldBlock)) => {}
        Err(e) => tracing::warn!(error = %e, "cannot record connection state"),
    }
}

/// Sends the Will as telemetry with `iothub-MessageType=Will` (MQT-8).
pub(super) async fn publish_will(
    ctx: &HubContext,
    auth: &Authenticated,
    topic: &str,
    payload: Vec<u8>,
    retain: bool,
) {
    let Ok(Inbound::Telemetry { bag }) = topics::parse_publish(topic, &auth.who) else {
        tracing::debug!(
            topic,
            "will topic is not a telemetry topic of this identity; dropped"
        );
        return;
    };
    let Ok(properties) = property_bag::parse(bag) else {
        return;
    };
    let mut msg = DeviceMessage {
        properties,
        body: payload,
    };
    telemetry::add_application_property(&mut msg, "iothub-MessageType", "Will");
    if retain {
        mark_retained(&mut msg);
    }
    match telemetry::to_event(&auth.record, auth.method, msg) {
        Ok(event) => {
            let lane = ctx.telemetry_lane();
            let appended = ctx
                .append_telemetry(&lane, vec![event], auth.who.module_id.clone())
                .await;
            if let Err(e) = appended.await {
                tracing::error!(error = %e, "cannot store the will message");
            }
        }
        Err(e) => tracing::debug!(error = %e, "will message refused"),
    }
}

/// MQT-7: RETAIN is not kept; the message carries it as application properties.
pub(super) fn mark_retained(msg: &mut DeviceMessage) {
    telemetry::add_application_property(msg, "x-opt-retain", "true");
    telemetry::add_application_property(msg, "mqtt-retain", "true");
}
