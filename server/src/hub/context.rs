//! [`HubContext`]: everything a protocol handler may use, and the device-message path through
//! routing into the engine.

use std::future::Future;
use std::sync::Arc;

use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::notifications::EventSource;

use super::append_lane::AppendLane;
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
    /// Routing, including `$twin` reads, runs behind the store seam.
    pub async fn append_telemetry(
        &self,
        lane: &AppendLane,
        events: Vec<NewEvent>,
        module_id: Option<ModuleId>,
    ) -> impl Future<Output = Result<Vec<Appended>, D2cError>> + Send + 'static {
        let router = Arc::clone(&self.routing);
        let now = self.clock.now();
        lane.append(
            Box::new(move |store| {
                let twins = routes::StoreTwins(store);
                events
                    .into_iter()
                    .flat_map(|event| {
                        router.route(
                            &twins,
                            event,
                            module_id.as_deref(),
                            EventSource::DeviceMessages,
                            iso7(now),
                        )
                    })
                    .collect()
            }),
            now,
        )
        .await
    }
}
