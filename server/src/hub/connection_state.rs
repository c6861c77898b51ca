//! A device connection's state in the registry (MQT-13), for every transport: recorded when a
//! connection opens and ends, queued without waiting for the disk.

use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::{RegistryError, StorageError, Store};

use super::connections::Registration;
use super::HubContext;
use crate::ids::Identity;

/// [`stage_connection`]'s engine call for a connection that ends, in place when it need not
/// wait, queued without waiting for its sync: closing the socket does not wait on the disk
/// (see `Store::record_connection_then`). The "disconnected" state is recorded only while this
/// is still the client id's current connection, checked under the device's lock, so it never
/// lands after a newer connection's "connected".
pub async fn finish(ctx: &HubContext, who: &Identity, registration: &Registration) {
    if !registration.is_current() {
        return;
    }
    let who = who.clone();
    let now = ctx.clock.now();
    // In a cluster the writer knows whether a newer connection is current, on any node.
    if let Some(connection) = connection_ref(ctx, registration) {
        let call = super::calls::RecordDisconnection {
            who,
            connection,
            now,
        };
        if let Err(e) = ctx.write(call).await {
            tracing::warn!(error = %e, "cannot record connection state");
        }
        return;
    }
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

/// How the cluster's writer names `registration`; `None` on a single node.
pub fn connection_ref(
    ctx: &HubContext,
    registration: &Registration,
) -> Option<super::cluster::ConnectionRef> {
    ctx.cluster
        .as_deref()
        .map(|c| super::cluster::ConnectionRef {
            node: c.node().to_owned(),
            incarnation: c.incarnation(),
            id: registration.id(),
        })
}

/// A connection state to record.
pub enum Change<'a> {
    Connected,
    /// Only while the check says the connection is still the current one.
    Disconnected(&'a dyn Fn() -> bool),
}

/// Records a connection state (MQT-13) for a caller on the store's side of the seam (the
/// CONNECT stages it with the session, in one call). A failure is logged: the state is a
/// debugging aid, and the connection goes on. A call made without waiting that would have
/// waited is not a failure: `Store::without_waiting` reports it, and the call is made again.
pub fn stage_connection(store: &Store, who: &Identity, change: Change<'_>, now: UnixMillis) {
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
