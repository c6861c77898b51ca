//! A connection's writes: its persistent session (MQTT), and the connection state it records
//! in the registry when it opens and ends (MQT-13), on every transport.

use ferrohub_engine::sessions::SessionRecord;
use ferrohub_engine::{RegistryError, StorageError, UnixMillis};

use super::writer_call;
use crate::hub::cluster::ConnectionRef;
use crate::hub::connection_state::{stage_connection, Change};
use crate::ids::{ClientId, Identity};

/// The writer's record of whose connection is current (cluster mode; see `Owners`).
fn note_connected(
    ctx: &crate::hub::HubContext,
    who: &Identity,
    connection: &Option<ConnectionRef>,
) {
    if let (Some(owners), Some(c)) = (ctx.cluster.as_deref().and_then(|c| c.owners()), connection) {
        owners.connected(&who.client_id(), c.clone());
    }
}

writer_call! {
    /// An MQTT connection's start: its stored session (a persistent one is loaded, a clean
    /// one deleted) and its "connected" state, in one call made in place when nothing in it
    /// waits (issue 19). The state is the call's one write, and its last.
    pub struct OpenSession {
        pub who: Identity,
        pub persistent: bool,
        /// The connection, in a cluster.
        pub connection: Option<ConnectionRef>,
        pub now: UnixMillis,
    }
    -> Result<Option<SessionRecord>, StorageError>;
    |ctx, c| {
        note_connected(&ctx, &c.who, &c.connection);
        let (who, persistent, now) = (c.who, c.persistent, c.now);
        ctx.store
            .run_quick(move |s| {
                let id = who.client_id();
                let session = if persistent {
                    s.load_session(&id)?
                } else {
                    s.delete_session(&id)?;
                    None
                };
                stage_connection(s, &who, Change::Connected, now);
                Ok::<_, StorageError>(session)
            })
            .await
    }
}

writer_call! {
    /// A connection's "connected" state alone (AMQP: the first link of an identity).
    pub struct RecordConnection {
        pub who: Identity,
        pub connection: Option<ConnectionRef>,
        pub now: UnixMillis,
    }
    -> Result<(), StorageError>;
    |ctx, c| {
        note_connected(&ctx, &c.who, &c.connection);
        let (who, now) = (c.who, c.now);
        ctx.store
            .run_quick(move |s| {
                stage_connection(s, &who, Change::Connected, now);
                Ok::<(), StorageError>(())
            })
            .await
    }
}

writer_call! {
    /// A cluster connection's end: "disconnected" is recorded only while the writer knows
    /// `connection` as the identity's current one (a single node checks its own
    /// registrations instead, `connection_state::finish`).
    pub struct RecordDisconnection {
        pub who: Identity,
        pub connection: ConnectionRef,
        pub now: UnixMillis,
    }
    -> Result<(), StorageError>;
    |ctx, c| {
        let cluster = ctx.cluster.clone();
        let (who, connection, now) = (c.who, c.connection, c.now);
        ctx.store
            .run_quick(move |s| {
                let client: ClientId = who.client_id();
                let current = || {
                    cluster
                        .as_deref()
                        .and_then(|c| c.owners())
                        .is_none_or(|o| o.ends(&client, &connection))
                };
                stage_connection(s, &who, Change::Disconnected(&current), now);
                Ok::<(), StorageError>(())
            })
            .await
    }
}

writer_call! {
    /// A device's traffic moving its `lastActivityTime` (see `hub::activity`): queued without
    /// waiting for its sync, as a connection state is.
    pub struct RecordActivity {
        pub who: Identity,
        pub now: UnixMillis,
    }
    -> Result<(), StorageError>;
    |ctx, c| {
        let (who, now) = (c.who, c.now);
        ctx.store
            .run_quick(move |s| {
                let written = |result: Result<(), StorageError>| {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "cannot record the last activity time");
                    }
                };
                let (d, m) = (who.device_id.as_str(), who.module_id.as_deref());
                match s.record_activity_then(d, m, now, written) {
                    // A call that would have waited is made again by `run_quick`.
                    Ok(_) | Err(RegistryError::Storage(StorageError::WouldBlock)) => {}
                    Err(e) => tracing::debug!(error = %e, "cannot record the last activity time"),
                }
                Ok::<(), StorageError>(())
            })
            .await
    }
}

writer_call! {
    /// Stores (replaces) a persistent MQTT session before its SUBACK or UNSUBACK.
    pub struct SaveSession { pub client_id: String, pub session: SessionRecord }
    -> Result<(), StorageError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.save_session(&c.client_id, &c.session))
        .await
}
