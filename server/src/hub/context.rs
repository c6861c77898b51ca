//! [`HubContext`]: everything a protocol handler may use, and the device-message path through
//! routing into the engine.

use std::future::Future;
use std::sync::Arc;

use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::notifications::EventSource;
use ferrohub_engine::UnixMillis;

use super::append_lane::{AppendLane, Message};
use super::authenticator::Authenticator;
use super::connections::Connections;
use super::d2c_notify::D2cNotify;
use super::store_handle::StoreHandle;
use super::{c2d, methods, routes};
use crate::clock::{iso7, Clock};
use crate::ids::ModuleId;

/// Everything a protocol handler may use, cheap to clone.
#[derive(Clone)]
pub struct HubContext {
    pub store: StoreHandle,
    pub settings: Arc<HubSettings>,
    pub clock: Clock,
    pub auth: Authenticator,
    pub connections: Arc<Connections>,
    pub d2c: Arc<D2cNotify>,
    pub methods: Arc<methods::PendingCalls>,
    pub c2d: Arc<c2d::C2d>,
    pub routing: Arc<crate::routing::Router>,
}

impl HubContext {
    /// A new ordered lane for one connection's (or request's) device messages.
    pub fn telemetry_lane(&self) -> AppendLane {
        self.store.lane(Arc::clone(&self.d2c))
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

    /// The lane message for `events`: routed now when no route needs storage, else from the
    /// first event that does, on the blocking pool (earlier ones stay routed as they were).
    fn route_telemetry(
        &self,
        events: Vec<NewEvent>,
        module_id: Option<ModuleId>,
        now: UnixMillis,
    ) -> Message {
        let mut routed = Vec::with_capacity(events.len());
        let mut events = events.into_iter();
        while let Some(event) = events.next() {
            match self
                .routing
                .route_without_store(event, module_id.as_deref(), iso7(now))
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
                                iso7(now),
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
