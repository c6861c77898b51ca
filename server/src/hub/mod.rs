//! Shared hub state the protocol layers use: the store seam, who is connected, the wake-ups
//! for D2C readers, and C2D deadlines.

pub mod c2d;
pub mod connections;
pub mod d2c_notify;
pub mod methods;
pub mod retention;
pub mod store_handle;

use std::sync::Arc;

use ferrohub_engine::hub::HubSettings;

pub use connections::Connections;
pub use d2c_notify::D2cNotify;
pub use store_handle::StoreHandle;

/// Everything a protocol handler may use, cheap to clone.
#[derive(Clone)]
pub struct HubContext {
    pub store: StoreHandle,
    pub settings: Arc<HubSettings>,
    pub connections: Arc<Connections>,
    pub d2c: Arc<D2cNotify>,
    pub methods: Arc<methods::PendingCalls>,
    pub c2d: Arc<c2d::C2d>,
    pub routing: Arc<crate::routing::Router>,
}

impl HubContext {
    /// Routes a device message (EVT-5): the events to append, each carrying its endpoints.
    /// May read the twin when a condition or enrichment names `$twin` (a point read).
    pub fn route_telemetry(
        &self,
        event: ferrohub_engine::d2c::NewEvent,
        module_id: Option<&str>,
    ) -> Vec<ferrohub_engine::d2c::NewEvent> {
        self.routing.route(
            self.store.store(),
            event,
            module_id,
            ferrohub_engine::notifications::EventSource::DeviceMessages,
            crate::routing::notifications::iso7(crate::rest::now().0),
        )
    }
}
