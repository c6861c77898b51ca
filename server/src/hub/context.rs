//! [`HubContext`]: everything a protocol handler may use, and the device-message path through
//! routing into the engine.

use std::future::Future;
use std::sync::Arc;

use ferrohub_engine::c2d::{C2dError, C2dMessage, FeedbackMessage, Settle};
use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::notifications::EventSource;
use ferrohub_engine::{StorageError, UnixMillis};

use super::append_lane::{AppendLane, Message};
use super::authenticator::Authenticator;
use super::connections::Connections;
use super::d2c_notify::D2cNotify;
use super::live::Probe;
use super::partition_readers::PartitionReaders;
use super::store_handle::StoreHandle;
use super::{c2d, methods, routes};
use crate::clock::Clock;
use crate::ids::{DeviceId, Identity, LockToken, ModuleId};

/// Everything a protocol handler may use: one pointer, so cloning it (per request, per
/// connection, per background settle) costs one reference count, not one per part.
#[derive(Clone)]
pub struct HubContext(Arc<HubParts>);

impl HubContext {
    /// Admits an Event Hubs reader of `partition` in `group` (on this node, or in a cluster
    /// on every node that answers).
    ///
    /// # Errors
    /// [`ReaderRefusal`]: a higher owner level reads, or too many plain readers do.
    pub async fn admit_reader(
        &self,
        partition: u16,
        group: &str,
        owner_level: Option<i64>,
        shown: &str,
    ) -> Result<super::partition_readers::Lease, super::partition_readers::ReaderRefusal> {
        match &self.readers_everywhere {
            Some(everywhere) => everywhere.admit(partition, group, owner_level, shown).await,
            None => self.readers.admit(partition, group, owner_level, shown),
        }
    }

    pub fn new(parts: HubParts) -> Self {
        HubContext(Arc::new(parts))
    }
}

impl std::ops::Deref for HubContext {
    type Target = HubParts;

    fn deref(&self) -> &HubParts {
        &self.0
    }
}

/// The parts of a [`HubContext`].
pub struct HubParts {
    pub store: StoreHandle,
    /// The settings the hub started with; its policies as they stand now are
    /// [`HubParts::policies`].
    pub settings: Arc<HubSettings>,
    /// The shared access policies as they stand now (they change while the hub serves).
    pub policies: Arc<super::policies::LivePolicies>,
    pub clock: Clock,
    pub auth: Authenticator,
    /// The provisioning service's device side (DPS-1 to DPS-3).
    pub provisioning: super::provisioning::Provisioning,
    pub connections: Arc<Connections>,
    pub d2c: Arc<D2cNotify>,
    pub readers: PartitionReaders,
    /// In a cluster, admission of partition readers across the nodes.
    pub readers_everywhere: Option<Arc<super::readers_everywhere::ReadersEverywhere>>,
    pub methods: Arc<methods::PendingCalls>,
    pub c2d: Arc<c2d::C2d>,
    pub routing: Arc<crate::routing::Router>,
    /// Operation throttles (THR-1).
    pub throttles: Arc<super::throttle::Throttles>,
    /// File uploads, when a storage account is configured.
    pub uploads: Option<Arc<super::file_uploads::FileUploads>>,
    /// The runners of scheduled jobs.
    pub jobs: Arc<super::scheduled_jobs::JobRunners>,
    /// The reconciler of automatic device configurations.
    pub configurations: Arc<super::configurations::Reconciler>,
    /// Limits on slow and silent clients.
    pub timeouts: crate::config::TimeoutsSection,
    /// This node's part in a cluster; `None` on a single node.
    pub cluster: Option<Arc<super::cluster::Cluster>>,
    /// A cluster's live traffic to connections on other nodes (method calls among it).
    pub live: Option<Arc<super::live::LiveReach>>,
    /// On a cluster follower, the way its clients' telemetry goes to the writer.
    pub forwarding: Option<Arc<super::forwarded_appends::Forwarding>>,
    /// Starts import/export job runners (see `calls::CreateJob`).
    pub import_export: Arc<super::calls::ImportExportStarter>,
    /// How device traffic moves `lastActivityTime`.
    pub activity: Arc<super::activity::Activity>,
    /// How deliveries to endpoints outside the hub fare (on the node that delivers).
    pub delivery_health: Arc<super::delivery::DeliveryHealth>,
    /// Online backups, on a single node once it serves (a cluster has none yet).
    pub backups: Arc<std::sync::OnceLock<crate::backup::OnlineBackups>>,
}

impl HubContext {
    /// Queues a C2D message for a device (C2D-1, C2D-2), durably, and wakes its connection and
    /// the expiry task. The message's size was checked by the protocol that received it.
    ///
    /// # Errors
    /// [`C2dError`]: an unknown device, a full queue (nothing stored), storage.
    ///
    /// When the device's connection is receiving and its queue is empty, the send also locks
    /// the message for that connection (one commit, not a send and then the connection's
    /// receive) and hands it over; in a cluster the connection may be on another node, which
    /// is asked first and handed the message over `live`. A message that cannot be handed over (the connection went
    /// meanwhile) is abandoned at once, so the next connection gets it without waiting for the
    /// lock to expire; that delivery stays counted, as for a connection that ends with a
    /// message unacknowledged.
    pub async fn send_c2d(&self, device_id: DeviceId, message: C2dMessage) -> Result<(), C2dError> {
        let here = self.connections.receives_c2d(&device_id);
        let elsewhere = match &self.live {
            Some(live) if !here => {
                let who = Identity::for_device(device_id.as_str());
                live.probe_elsewhere(&who, Probe::ReceivesC2d).await
            }
            _ => false,
        };
        let call = super::calls::SendC2d {
            device_id: device_id.to_string(),
            message,
            lock_for_receiver: here || elsewhere,
            now: self.clock.now(),
        };
        let delivered = self.write(call).await?;
        metrics::counter!("ferrohub_c2d_sent_total").increment(1);
        let Some(delivered) = delivered else {
            self.connections.wake_c2d(&device_id);
            return Ok(());
        };
        let lock_token = LockToken::new(delivered.lock_token.clone());
        let handed = match (&self.live, here) {
            (Some(live), false) => live.hand_c2d_elsewhere(&device_id, delivered).await,
            _ => self.connections.hand_c2d(&device_id, delivered).is_ok(),
        };
        if !handed {
            self.abandon_c2d_in_background(device_id, lock_token);
        }
        Ok(())
    }

    /// Returns a locked message to its queue and wakes the device's connection to fetch it.
    pub fn abandon_c2d_in_background(&self, device_id: DeviceId, lock_token: LockToken) {
        let ctx = self.clone();
        tokio::spawn(async move {
            let call = super::calls::SettleC2d {
                device_id: device_id.to_string(),
                lock_token: lock_token.to_string(),
                action: Settle::Abandon,
                now: ctx.clock.now(),
            };
            let settled = ctx.write(call).await;
            if let Err(e) = settled {
                tracing::debug!(device = %device_id, error = %e, "c2d abandon refused");
            }
            ctx.connections.wake_c2d(&device_id);
        });
    }

    /// TWN-8: pushes a twin write's desired change, as the back-end sent it with its new
    /// `$version`, to the identity's connection if it is connected (REST writes, and later
    /// twin jobs and configurations, all notify the same way).
    pub fn push_desired(&self, outcome: &ferrohub_engine::twin::store::TwinOutcome) {
        let Some((change, version)) = &outcome.desired_change else {
            return;
        };
        let mut change = change.clone();
        change.insert("$version".into(), serde_json::Value::from(*version));
        let who = &outcome.twin.identity;
        let client_id =
            crate::ids::Identity::new(who.device_id.clone(), who.module_id.clone()).client_id();
        let body = serde_json::Value::Object(change).to_string().into_bytes();
        self.connections.notify(
            &client_id,
            super::connections::Outbound::DesiredPatch {
                version: *version,
                body,
            },
        );
    }

    /// Before a read a client may make right after a write through another node: on a cluster
    /// follower, waits until this node holds every write acknowledged before now (see
    /// [`super::cluster::Cluster::caught_up_for_read`]); at once anywhere else.
    pub async fn caught_up_for_read(&self) {
        if let Some(cluster) = &self.cluster {
            cluster.caught_up_for_read().await;
        }
    }

    /// A new ordered lane for one connection's (or request's) device messages; on a cluster
    /// follower, one whose messages the writer appends.
    pub fn telemetry_lane(&self) -> AppendLane {
        match &self.forwarding {
            Some(forwarding) => self
                .store
                .forwarding_lane(Arc::clone(&self.d2c), forwarding.lane()),
            None => self.store.lane(Arc::clone(&self.d2c)),
        }
    }

    /// The cluster bus, on a follower.
    fn follower_bus(&self) -> Option<&crate::cluster::bus::Bus> {
        self.cluster
            .as_deref()
            .filter(|c| c.is_follower())
            .map(|c| &c.bus)
    }

    /// Routes (EVT-5) and appends device messages of one identity on `lane`, once admitted,
    /// as one atomic batch; the returned future resolves when every routed copy is durable.
    /// Routing that reads `$twin` runs behind the store seam; other routing is pure and runs
    /// here.
    pub async fn append_telemetry(
        &self,
        lane: &AppendLane,
        events: Vec<NewEvent>,
        module_id: Option<ModuleId>,
    ) -> impl Future<Output = Result<Vec<Appended>, D2cError>> + Send + 'static {
        let now = self.clock.now();
        let message = self.route_telemetry(events, module_id, now);
        lane.append(message, now).await
    }

    /// Like [`HubContext::append_telemetry`] for a burst of one connection's telemetry, one
    /// event per device message, appended as one write and answered in order through the
    /// lane's ticket window, one ticket per message (see [`AppendLane::append_in_order`]);
    /// `now` is the burst's arrival in wall time. Whether admission had to wait.
    pub async fn append_telemetry_in_order(
        &self,
        lane: &AppendLane,
        events: Vec<NewEvent>,
        module_id: Option<ModuleId>,
        now: UnixMillis,
    ) -> bool {
        let count = u32::try_from(events.len()).expect("a burst is bounded by the in-flight limit");
        let message = self.route_telemetry(events, module_id, now);
        lane.append_in_order(message, count, now).await
    }

    /// Locks the next feedback message (C2D-5) for a back-end, if there is one, and tells the
    /// lock and expiry tasks.
    ///
    /// # Errors
    /// Storage.
    pub async fn receive_feedback(&self) -> Result<Option<FeedbackMessage>, StorageError> {
        let now = self.clock.now();
        self.write(super::calls::ReceiveFeedback { now }).await
    }

    /// Completes, abandons or dead-letters a locked feedback message.
    ///
    /// # Errors
    /// [`C2dError::LockLost`] or a malformed token, storage.
    pub async fn settle_feedback(&self, token: LockToken, action: Settle) -> Result<(), C2dError> {
        let call = super::calls::SettleFeedback {
            lock_token: token.to_string(),
            action,
            now: self.clock.now(),
        };
        self.write(call).await.map(drop)
    }

    /// The lane message for `events`: routed now when no route needs storage, else from the
    /// first event that does, on the blocking pool (earlier ones stay routed as they were).
    fn route_telemetry(
        &self,
        events: Vec<NewEvent>,
        module_id: Option<ModuleId>,
        now: UnixMillis,
    ) -> Message {
        // A follower routes nothing: the writer does, with its own table and twins.
        if self.follower_bus().is_some() {
            return Message::ToWriter {
                events,
                module_id: module_id.map(String::from),
            };
        }
        // The common table (no device routes): the events stay as they came, with no
        // endpoints named, which is the built-in endpoint alone.
        if self.routing.sends_device_messages_to_builtin_only()
            && events.iter().all(|e| e.endpoints.is_none())
        {
            return Message::Routed(events);
        }
        let mut routed = Vec::with_capacity(events.len());
        let mut events = events.into_iter();
        while let Some(event) = events.next() {
            match self
                .routing
                .route_without_store(event, module_id.as_deref(), now)
            {
                Ok(copies) => routed.extend(copies),
                Err(event) => {
                    let rest: Vec<NewEvent> = std::iter::once(event).chain(events).collect();
                    let router = Arc::clone(&self.routing);
                    return Message::Unrouted(Box::new(move |store| {
                        let twins = routes::StoreTwins(store);
                        for event in rest {
                            routed.extend(router.route(
                                &twins,
                                event,
                                module_id.as_deref(),
                                EventSource::DeviceMessages,
                                now,
                            ));
                        }
                        routed
                    }));
                }
            }
        }
        Message::Routed(routed)
    }
}
