//! Devices and modules over AMQP (AMQ-5 to AMQ-7): the links a device attaches to its own
//! addresses (`/devices/{d}[/modules/{m}]/...`), each checked against the identity it names.
//!
//! - The first link of an identity authenticates it (its SAS token from SASL PLAIN or CBS, or
//!   the TLS client certificate), registers it with [`Connections`] (a newer connection of the
//!   same identity, over MQTT or AMQP, ends the older one) and records it connected; later
//!   links authenticate again (a token may have expired), then share that registration.
//! - What the hub pushes to the identity (desired patches, method calls) goes out on its twin
//!   and methods links; C2D messages are fetched by its C2D link.
//! - Links of one identity attaching at once (several sessions of one connection) register it
//!   once: its first registration is made under a per-identity turn, and the others share it.
//! - One live link per identity, address kind and direction on a connection: a second one
//!   while the first is attached is refused on its own link (`amqp:resource-locked`); the
//!   connection and its other links go on.
//! - When the connection ends, each identity is recorded disconnected (if still current).
//!
//! # Invariants
//! - A link is served only for an identity whose credentials this connection holds and the
//!   registry accepts now; a device may open only its own (or its modules') addresses.
//! - A kicked identity (replaced, disabled, deleted) ends the whole connection: its links
//!   stop, as an MQTT connection would close.

mod c2d;
pub mod credentials;
pub(crate) mod messages;
pub(crate) mod methods;
pub(crate) mod telemetry;
pub(crate) mod twin;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fe2o3_amqp::acceptor::LinkEndpoint;
use fe2o3_amqp::types::definitions::Error;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::address::DeviceLink;
use super::errors;
use super::replies::Replies;
use crate::hub::connection_state::finish;
use crate::hub::connections::{Outbound, Registration, OUTBOUND_QUEUE};
use crate::hub::{AuthFailure, DeviceAuth, HubContext};
use crate::ids::Identity;
pub use credentials::DeviceCredentials;

/// One identity's presence on this connection.
pub struct Attached {
    pub auth: DeviceAuth,
    pub registration: Registration,
    /// The twin channel's replies and desired-property pushes.
    pub twin: Replies,
    /// Method calls to the device.
    pub methods: Replies,
    /// Whether the device asked for desired-property pushes.
    pub desired: AtomicBool,
    /// When the identity's traffic on this connection last moved its `lastActivityTime`.
    activity: parking_lot::Mutex<crate::hub::activity::ActivityGate>,
}

impl Attached {
    /// Traffic of the identity on any of its links (see `hub::activity`).
    pub fn note_activity(&self, ctx: &HubContext) {
        ctx.note_activity(&self.auth.who, &mut self.activity.lock());
    }
}

/// The device identities of one AMQP connection.
pub struct DeviceLinks {
    ctx: HubContext,
    credentials: DeviceCredentials,
    attached: Mutex<HashMap<Identity, Arc<Attached>>>,
    /// Each identity's turn to register: two of its links attaching at once would otherwise
    /// both register it, and the second registration would kick the first (this connection).
    attaching: Mutex<HashMap<Identity, Arc<tokio::sync::Mutex<()>>>>,
    /// The live links, by identity, kind and whether the hub sends on it.
    live: Arc<Mutex<HashSet<(Identity, DeviceLink, bool)>>>,
    /// Cancelled when one of the identities is kicked: the connection then closes.
    pub kicked: CancellationToken,
}

impl DeviceLinks {
    pub fn new(ctx: HubContext, credentials: DeviceCredentials) -> Arc<Self> {
        Arc::new(DeviceLinks {
            ctx,
            credentials,
            attached: Mutex::new(HashMap::new()),
            attaching: Mutex::new(HashMap::new()),
            live: Arc::default(),
            kicked: CancellationToken::new(),
        })
    }

    /// The connection's device credentials (for `$cbs` put-tokens).
    pub fn credentials(&self) -> DeviceCredentials {
        self.credentials.clone()
    }

    /// Authenticates `who` for a new link, registering it on its first link.
    async fn attach(&self, who: &Identity) -> Result<Arc<Attached>, Error> {
        let token = self.credentials.token(who);
        let leaf = self.credentials.leaf();
        let auth = self
            .ctx
            .auth
            .device(who, token.as_deref(), leaf.as_ref())
            .await
            .map_err(|e| match e {
                AuthFailure::Refused(reason) => errors::unauthorized(&reason.to_string()),
                AuthFailure::Unavailable(e) => errors::internal(&e.to_string()),
            })?;
        let turn = Arc::clone(self.attaching.lock().entry(who.clone()).or_default());
        let _turn = turn.lock().await;
        if let Some(existing) = self.attached.lock().get(who) {
            if existing.registration.is_current() {
                return Ok(Arc::clone(existing));
            }
        }
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let registration = self.ctx.connections.register(who, tx);
        let call = crate::hub::calls::RecordConnection {
            who: who.clone(),
            connection: crate::hub::connection_state::connection_ref(&self.ctx, &registration),
            now: self.ctx.clock.now(),
        };
        let staged = self.ctx.write(call).await;
        if let Err(e) = staged {
            tracing::warn!(error = %e, "cannot record connection state");
        }
        let attached = Arc::new(Attached {
            auth,
            registration,
            twin: Replies::default(),
            methods: Replies::default(),
            desired: AtomicBool::new(false),
            activity: Default::default(),
        });
        tokio::spawn(dispatch(
            self.ctx.clone(),
            Arc::clone(&attached),
            rx,
            self.kicked.clone(),
        ));
        tracing::info!(identity = %who, method = ?attached.auth.method, "AMQP device attached");
        self.attached
            .lock()
            .insert(who.clone(), Arc::clone(&attached));
        Ok(attached)
    }

    /// Serves one device link, or refuses it with IoT Hub's condition.
    pub async fn serve(
        self: Arc<Self>,
        who: Identity,
        kind: DeviceLink,
        link: LinkEndpoint,
        links: &mut JoinSet<()>,
    ) {
        let attached = match self.attach(&who).await {
            Ok(a) => a,
            Err(error) => {
                tracing::info!(identity = %who, ?kind, error = ?error.description, "AMQP device link refused");
                close_with(link, error).await;
                return;
            }
        };
        let key = (who.clone(), kind, matches!(link, LinkEndpoint::Sender(_)));
        if !self.live.lock().insert(key.clone()) {
            tracing::info!(identity = %who, ?kind, "AMQP device link refused: one of its kind is attached");
            close_with(link, errors::link_taken(&format!("{who}'s {kind:?} link"))).await;
            return;
        }
        let live = LiveLink {
            set: Arc::clone(&self.live),
            key,
        };
        let ctx = self.ctx.clone();
        let links = &mut Spawner {
            links,
            live: Some(live),
        };
        match (kind, link) {
            (DeviceLink::Telemetry, LinkEndpoint::Receiver(r)) => {
                links.spawn(telemetry::serve(r, ctx, attached));
            }
            (DeviceLink::CloudToDevice, LinkEndpoint::Sender(s)) => {
                links.spawn(c2d::serve(s, ctx, attached));
            }
            (DeviceLink::Twin, LinkEndpoint::Receiver(r)) => {
                links.spawn(twin::serve_requests(r, ctx, attached));
            }
            (DeviceLink::Twin, LinkEndpoint::Sender(s)) => {
                let task = attached.twin.attach(s);
                links.spawn(async move {
                    let _ = task.await;
                });
            }
            (DeviceLink::Methods, LinkEndpoint::Receiver(r)) => {
                links.spawn(methods::serve_answers(r, ctx, attached));
            }
            (DeviceLink::Methods, LinkEndpoint::Sender(s)) => {
                attached.registration.methods.store(true, Ordering::Release);
                let task = attached.methods.attach(s);
                links.spawn(async move {
                    let _ = task.await;
                });
            }
            // A module's receiver on its own `messages/events` (the Node SDK's input link) or
            // on `inputs`.
            (DeviceLink::Telemetry | DeviceLink::Inputs, LinkEndpoint::Sender(s))
                if who.is_module() =>
            {
                // Module inputs are routed only over MQTT here; the link stays open, empty.
                links.spawn(async move {
                    let mut s = s;
                    let _ = s.on_detach().await;
                });
            }
            (kind, link) => {
                close_with(
                    link,
                    errors::unknown_node(&format!("{kind:?} in this direction")),
                )
                .await;
            }
        }
    }

    /// Records every identity of the connection disconnected (if still current).
    pub async fn finish(&self) {
        let attached: Vec<(Identity, Arc<Attached>)> = self.attached.lock().drain().collect();
        for (who, a) in attached {
            finish(&self.ctx, &who, &a.registration).await;
            tracing::info!(identity = %who, "AMQP device detached");
        }
    }
}

/// A link's place among the live ones, given back when its task ends (or it is refused).
struct LiveLink {
    set: Arc<Mutex<HashSet<(Identity, DeviceLink, bool)>>>,
    key: (Identity, DeviceLink, bool),
}

impl Drop for LiveLink {
    fn drop(&mut self) {
        self.set.lock().remove(&self.key);
    }
}

/// Spawns a link's task holding its [`LiveLink`]; a link not spawned (refused in this
/// direction) gives its place back when the spawner is dropped.
struct Spawner<'a> {
    links: &'a mut JoinSet<()>,
    live: Option<LiveLink>,
}

impl Spawner<'_> {
    fn spawn(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let live = self.live.take();
        self.links.spawn(async move {
            task.await;
            drop(live);
        });
    }
}

async fn close_with(link: LinkEndpoint, error: Error) {
    let _ = match link {
        LinkEndpoint::Sender(s) => s.close_with_error(error).await.map_err(drop),
        LinkEndpoint::Receiver(r) => r.close_with_error(error).await.map_err(drop),
    };
}

/// Forwards what the hub pushes to the identity onto its links, until it is kicked.
async fn dispatch(
    ctx: HubContext,
    attached: Arc<Attached>,
    mut outbound: mpsc::Receiver<Outbound>,
    kicked: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            next = outbound.recv() => next,
            _ = attached.registration.kicked.cancelled() => {
                tracing::info!(identity = %attached.auth.who, reason = ?attached.registration.kick_reason(), "AMQP device kicked; closing its connection");
                kicked.cancel();
                return;
            }
        };
        let Some(item) = next else { return };
        match item {
            Outbound::DesiredPatch { version, body } => {
                if attached.desired.load(Ordering::Acquire) {
                    attached
                        .twin
                        .send(messages::desired_push(version, body))
                        .await;
                }
            }
            Outbound::MethodRequest(call) => {
                attached
                    .methods
                    .send(messages::method_request(
                        &call.rid,
                        &call.method,
                        call.payload,
                    ))
                    .await;
            }
            Outbound::C2d(delivered) => {
                // This connection never asks to be handed messages (its C2D link fetches
                // them); one handed over anyway goes back to the queue at once.
                ctx.abandon_c2d_in_background(
                    attached.auth.who.device_id.clone(),
                    crate::ids::LockToken::new(delivered.lock_token.clone()),
                );
            }
        }
    }
}
