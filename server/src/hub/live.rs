//! Live traffic between a cluster's nodes (docs/cluster.md, "Serving from every node"): what
//! must reach the node holding a device's connection (desired patches, C2D wake-ups, kicks,
//! direct method calls), and a new connection ending the identity's older one elsewhere.
//! Carried by core NATS on the identity's subjects (`cluster::bus`), heard by the node while
//! it holds a connection of that identity.
//!
//! # Invariants
//! - Every registration announces itself (its node, number and time) once it listens, so an
//!   older connection of the same identity on another node is ended; a registration never
//!   ends itself on its own announcement, nor on an older one's that arrived late.
//! - A desired patch carries the log sequence of the write that made it, and is handed to the
//!   device only once this node's replica applied that sequence: a device that reads its twin
//!   on being notified reads it on this node, and finds the patch there.
//! - A method call reaches the node holding the identity's connection; an identity connected
//!   nowhere is answered at once by NATS ("no responders"), one connected but not subscribed to
//!   methods by [`MethodOutcome::NotSubscribed`]. The caller keeps trying, up to the call's
//!   connect timeout, either way.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::cluster::{Cluster, RollCallAnswer};
use super::connections::{Connections, Outbound, Reach};
use super::methods::{CallFailure, MethodAnswer, PendingCalls};
use super::store_handle::StoreHandle;
use crate::cluster::bus::{identity_subject, Bus};
use crate::ids::{ClientId, DeviceId, Identity};
use ferrohub_engine::c2d::Delivered;

/// What travels on an identity's subject.
#[derive(Debug, Serialize, Deserialize)]
enum Live {
    /// A connection of the identity registered on `node` as number `id`, at `at_micros`.
    Takeover {
        node: String,
        id: u64,
        at_micros: u64,
    },
    /// End the identity's connection (it was disabled or deleted).
    Kick,
    /// A desired-properties change, handed over once the replica applied `after`.
    Desired {
        version: u64,
        #[serde(with = "serde_bytes")]
        body: Vec<u8>,
        after: u64,
    },
    /// The device's C2D queue may have messages to deliver.
    C2dWake,
    /// A direct method call, answered with a [`MethodOutcome`].
    Method {
        method: String,
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
        response_timeout_ms: u64,
    },
    /// A question about the identity's connection here, answered with a `bool`.
    Probe(Probe),
    /// A C2D message locked on send for the device's connection here: hand it over. Answered
    /// with whether it was (the sender returns it to the queue otherwise).
    C2dHand(Box<Delivered>),
}

/// What [`Live::Probe`] asks.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum Probe {
    /// Subscribed to methods.
    TakesMethods,
    /// Receiving C2D messages.
    ReceivesC2d,
}

/// A node's answer to [`Live::Method`].
#[derive(Debug, Serialize, Deserialize)]
pub enum MethodOutcome {
    Answered {
        status: i32,
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    /// Connected here, not subscribed to methods (yet).
    NotSubscribed,
    Failed(Failure),
}

/// [`CallFailure`] on the wire.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum Failure {
    Disconnected,
    Timeout,
}

/// Wall time in microseconds: orders two registrations of one identity on two nodes (the
/// nodes' clocks are assumed close, as IoT Hub's own "newer connection wins" assumes).
fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn encode(live: &Live) -> Bytes {
    Bytes::from(rmp_serde::to_vec_named(live).expect("live messages always encode"))
}

fn live_subject(who: &Identity) -> String {
    format!("{}.live", identity_subject(&who.device_id, who.module()))
}

/// This node's [`Reach`]: its connections' half of the cluster's live traffic.
pub struct LiveReach {
    bus: Bus,
    connections: Weak<Connections>,
    methods: Arc<PendingCalls>,
    cluster: Arc<Cluster>,
    store: StoreHandle,
}

impl LiveReach {
    pub fn new(
        cluster: Arc<Cluster>,
        connections: &Arc<Connections>,
        methods: Arc<PendingCalls>,
        store: StoreHandle,
    ) -> Arc<LiveReach> {
        Arc::new(LiveReach {
            bus: cluster.bus.clone(),
            connections: Arc::downgrade(connections),
            methods,
            cluster,
            store,
        })
    }

    /// How far this node's store holds the log: what a change it just made (or, on a
    /// follower, a forwarded write it just heard back from) is at or below.
    fn position(&self) -> u64 {
        if self.cluster.is_follower() {
            self.cluster.applied()
        } else {
            self.store.last_logged_sequence()
        }
    }

    fn publish(&self, subject: String, live: &Live) {
        let (bus, payload) = (self.bus.clone(), encode(live));
        tokio::spawn(async move { bus.publish(subject, payload).await });
    }

    /// Serves one registration's subjects until `stop`.
    async fn listen(self: Arc<Self>, who: Identity, id: u64, stop: CancellationToken) {
        let registered = now_micros();
        let subscribed = tokio::select! {
            _ = stop.cancelled() => return,
            s = self.bus.subscribe_identity(&who.device_id, who.module()) => s,
        };
        let mut messages = match subscribed {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(identity = %who, error = %e, "cannot hear the cluster for a connection");
                return;
            }
        };
        let me = self.bus.node().to_owned();
        self.bus
            .publish(
                live_subject(&who),
                encode(&Live::Takeover {
                    node: me.clone(),
                    id,
                    at_micros: registered,
                }),
            )
            .await;
        let client_id = who.client_id();
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return,
                m = messages.next() => match m {
                    Some(m) => m,
                    None => return,
                },
            };
            let Some(connections) = self.connections.upgrade() else {
                return;
            };
            if message.subject.as_str().ends_with(".kick-device") {
                connections.kick_client_here(&client_id);
                continue;
            }
            let live = match rmp_serde::from_slice::<Live>(&message.payload) {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!(error = %e, "a live message does not decode");
                    continue;
                }
            };
            match live {
                Live::Takeover {
                    node,
                    id: theirs,
                    at_micros,
                } => {
                    let newer = (at_micros, node.as_str()) > (registered, me.as_str());
                    if newer && (node != me || theirs != id) {
                        connections.replaced_elsewhere(&client_id, id);
                    }
                }
                Live::Kick => connections.kick_client_here(&client_id),
                Live::C2dWake => {
                    connections.wake_c2d_here(&who.device_id);
                }
                Live::Desired {
                    version,
                    body,
                    after,
                } => {
                    let (reach, client_id) = (Arc::clone(&self), client_id.clone());
                    tokio::spawn(async move {
                        if reach.cluster.is_follower() {
                            reach.cluster.applied_through(after).await;
                        }
                        if let Some(c) = reach.connections.upgrade() {
                            c.notify_here(&client_id, Outbound::DesiredPatch { version, body });
                        }
                    });
                }
                Live::Probe(probe) => {
                    let yes = match probe {
                        Probe::TakesMethods => connections.method_target(&client_id).is_some(),
                        Probe::ReceivesC2d => connections.receives_c2d(&who.device_id),
                    };
                    let answer = rmp_serde::to_vec(&yes).expect("a bool always encodes");
                    self.bus.respond(&message, Bytes::from(answer)).await;
                }
                Live::C2dHand(delivered) => {
                    let handed = connections.hand_c2d(&who.device_id, *delivered).is_ok();
                    let answer = rmp_serde::to_vec(&handed).expect("a bool always encodes");
                    self.bus.respond(&message, Bytes::from(answer)).await;
                }
                Live::Method {
                    method,
                    payload,
                    response_timeout_ms,
                } => {
                    let reach = Arc::clone(&self);
                    let client_id = client_id.clone();
                    tokio::spawn(async move {
                        let outcome = reach
                            .call_here(
                                &client_id,
                                method,
                                payload,
                                Duration::from_millis(response_timeout_ms),
                            )
                            .await;
                        let answer = rmp_serde::to_vec_named(&outcome)
                            .expect("method outcomes always encode");
                        reach.bus.respond(&message, Bytes::from(answer)).await;
                    });
                }
            }
        }
    }

    /// A method call to a connection of this node.
    async fn call_here(
        &self,
        client_id: &ClientId,
        method: String,
        payload: Vec<u8>,
        response_timeout: Duration,
    ) -> MethodOutcome {
        let Some(connections) = self.connections.upgrade() else {
            return MethodOutcome::Failed(Failure::Disconnected);
        };
        let Some(target) = connections.method_target(client_id) else {
            return MethodOutcome::NotSubscribed;
        };
        match super::methods::call_connection(
            &connections,
            &self.methods,
            client_id,
            target,
            method,
            payload,
            response_timeout,
        )
        .await
        {
            Ok(MethodAnswer { status, payload }) => MethodOutcome::Answered { status, payload },
            Err(CallFailure::Timeout) => MethodOutcome::Failed(Failure::Timeout),
            Err(_) => MethodOutcome::Failed(Failure::Disconnected),
        }
    }

    /// Asks whichever node holds `who`'s connection to call a method on it.
    ///
    /// # Errors
    /// `None` when no node holds a connection of `who` subscribed to methods (the caller
    /// tries again until its connect timeout); the call's failure otherwise.
    pub async fn call_elsewhere(
        &self,
        who: &Identity,
        method: &str,
        payload: &[u8],
        response_timeout: Duration,
    ) -> Option<Result<MethodAnswer, CallFailure>> {
        let request = encode(&Live::Method {
            method: method.to_owned(),
            payload: payload.to_vec(),
            response_timeout_ms: u64::try_from(response_timeout.as_millis()).unwrap_or(u64::MAX),
        });
        // The holder answers within the response timeout; the margin covers the two hops.
        let answer = self
            .bus
            .request(
                &live_subject(who),
                request,
                response_timeout + Duration::from_secs(2),
            )
            .await;
        let bytes = match answer {
            Ok(b) => b,
            Err(crate::cluster::bus::BusError::NoResponders(_)) => return None,
            Err(_) => return Some(Err(CallFailure::Timeout)),
        };
        match rmp_serde::from_slice::<MethodOutcome>(&bytes) {
            Ok(MethodOutcome::Answered { status, payload }) => {
                Some(Ok(MethodAnswer { status, payload }))
            }
            Ok(MethodOutcome::NotSubscribed) => None,
            Ok(MethodOutcome::Failed(Failure::Timeout)) => Some(Err(CallFailure::Timeout)),
            Ok(MethodOutcome::Failed(Failure::Disconnected)) | Err(_) => {
                Some(Err(CallFailure::Disconnected))
            }
        }
    }
}

/// How long a node holding a connection has to answer a [`Probe`] or [`Live::C2dHand`].
const PROBE_PATIENCE: Duration = Duration::from_secs(2);

impl LiveReach {
    /// Whether another node holds a connection of `who` of which `probe` holds (what a method
    /// job asks before calling an identity, and a C2D send before locking the message for its
    /// receiver, as each asks this node's connections). An identity connected nowhere is
    /// answered at once by NATS; an unanswered probe counts as no.
    pub async fn probe_elsewhere(&self, who: &Identity, probe: Probe) -> bool {
        self.ask_bool(who, &Live::Probe(probe)).await
    }

    /// Hands a C2D message locked on send to the device's connection on another node;
    /// whether it took it (when not, or unanswered, the caller abandons the lock).
    pub async fn hand_c2d_elsewhere(&self, device_id: &DeviceId, delivered: Delivered) -> bool {
        let who = Identity::for_device(device_id.as_str());
        self.ask_bool(&who, &Live::C2dHand(Box::new(delivered)))
            .await
    }

    async fn ask_bool(&self, who: &Identity, live: &Live) -> bool {
        let asked = self
            .bus
            .request(&live_subject(who), encode(live), PROBE_PATIENCE)
            .await;
        asked.is_ok_and(|b| rmp_serde::from_slice::<bool>(&b).unwrap_or(false))
    }
}

/// How long a roll call waits for the nodes' answers.
const ROLL_CALL_WINDOW: Duration = Duration::from_millis(200);

impl LiveReach {
    /// The nodes serving now, this one included, as they answered within
    /// [`ROLL_CALL_WINDOW`]; `None` when the call could not be made.
    pub async fn roll_call(&self) -> Option<Vec<RollCallAnswer>> {
        let answers = self
            .bus
            .gather(
                crate::cluster::bus::ROLL_CALL,
                Bytes::new(),
                ROLL_CALL_WINDOW,
            )
            .await
            .ok()?;
        Some(
            answers
                .iter()
                .filter_map(|b| rmp_serde::from_slice(b).ok())
                .collect(),
        )
    }

    /// Devices connected to any node of the cluster (this one included), as the nodes that
    /// answered the roll call count them.
    pub async fn connected_devices_everywhere(&self) -> Option<u64> {
        let answers = self.roll_call().await?;
        Some(answers.iter().map(|a| a.connected_devices).sum())
    }

    /// Answers the cluster's roll calls for this node, until `stop`.
    pub async fn serve_roll_call(self: Arc<Self>, stop: CancellationToken) {
        let subscribed = self
            .bus
            .subscribe(crate::cluster::bus::ROLL_CALL.to_owned())
            .await;
        let mut asks = match subscribed {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "cannot answer the cluster's roll call"),
        };
        loop {
            let ask = tokio::select! {
                _ = stop.cancelled() => return,
                a = asks.next() => match a {
                    Some(a) => a,
                    None => return,
                },
            };
            let answer = RollCallAnswer {
                node: self.cluster.node().to_owned(),
                incarnation: self.cluster.incarnation(),
                connected_devices: self
                    .connections
                    .upgrade()
                    .map_or(0, |c| c.connected_devices()),
            };
            let bytes = rmp_serde::to_vec(&answer).expect("a roll call answer serialises");
            self.bus.respond(&ask, Bytes::from(bytes)).await;
        }
    }
}

impl Reach for LiveReach {
    fn registered(&self, who: &Identity, id: u64) -> Box<dyn Send + Sync> {
        let stop = CancellationToken::new();
        let this = Arc::new(LiveReach {
            bus: self.bus.clone(),
            connections: Weak::clone(&self.connections),
            methods: Arc::clone(&self.methods),
            cluster: Arc::clone(&self.cluster),
            store: self.store.clone(),
        });
        tokio::spawn(this.listen(who.clone(), id, stop.clone()));
        Box::new(stop.drop_guard())
    }

    fn desired_patch(&self, client_id: &ClientId, version: u64, body: &[u8]) {
        let live = Live::Desired {
            version,
            body: body.to_vec(),
            after: self.position(),
        };
        self.publish(live_subject(&Identity::of_client(client_id)), &live);
    }

    fn wake_c2d(&self, device_id: &DeviceId) {
        self.publish(
            live_subject(&Identity::for_device(device_id.as_str())),
            &Live::C2dWake,
        );
    }

    fn kick(&self, who: &Identity, device_wide: bool) {
        if device_wide {
            let subject = format!("{}.kick-device", identity_subject(&who.device_id, None));
            let bus = self.bus.clone();
            tokio::spawn(async move { bus.publish(subject, Bytes::new()).await });
        } else {
            self.publish(live_subject(who), &Live::Kick);
        }
    }
}
