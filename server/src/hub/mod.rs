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
}
