//! The hub: state shared by every protocol adapter, between them and the engine.
//!
//! # Layout
//! - [`store_handle`] and [`append_lane`]: the one async seam to the engine;
//!   [`storage_recovery`] reopens a store that refuses writes once space returns.
//! - [`authenticator`]: credentials in, a principal (or a typed refusal) out.
//! - [`connections`]: who is connected, and the outbound queues to them.
//! - [`methods`]: direct method calls in flight.
//! - [`context`]: [`HubContext`], what every protocol handler gets.
//! - [`c2d`] and [`c2d_sweeper`]: C2D settings and alarms, and the two deadline tasks.
//! - [`d2c_notify`]: wake-ups of D2C readers.
//! - [`partition_readers`]: who reads which partition, with owner levels (epochs).
//! - [`routes`] and [`event_router`]: the routing table's storage side, and the task that
//!   routes non-telemetry events.
//! - [`retention`]: the D2C retention pass.
//! - [`twin_rows`] and [`twin_query`]: twins and device-job rows as JSON, and the query
//!   language run over them page by page.
//! - [`config_content`] and [`configurations`]: what automatic device configurations make
//!   of a twin, and the reconciler task that keeps twins so.
//! - [`scheduled_jobs`]: the runner of `/jobs/v2` jobs (twin updates and method calls over a
//!   query's identities).
//!
//! # Invariants
//! - Protocol adapters (`mqtt`, `rest`) use the hub and never the engine directly; the hub
//!   never knows which protocol a request came in on.

pub mod activity;
pub mod append_lane;
pub mod appends_from_followers;
pub mod authenticator;
pub mod backups;
pub mod c2d;
pub mod c2d_sweeper;
pub mod calls;
pub mod cluster;
pub mod config_content;
pub mod configurations;
pub mod connection_state;
pub mod connections;
pub mod context;
pub mod d2c_notify;
pub mod daily_quota;
pub mod delivery;
pub mod departed_nodes;
pub mod event_router;
pub mod fair_share;
pub mod file_uploads;
pub mod follower;
pub mod forwarded_appends;
pub mod job_spec;
pub mod lane_acks;
pub mod limits;
pub mod live;
pub mod method_call;
pub mod methods;
pub mod metrics;
pub mod partition_readers;
pub mod policies;
pub mod provisioning;
pub mod read_index;
pub mod readers_everywhere;
pub mod retention;
pub mod routes;
pub mod scheduled_jobs;
mod staging_pool;
pub mod storage_recovery;
pub mod store_handle;
pub mod store_slot;
pub mod throttle;
pub mod twin_query;
pub mod twin_rows;

pub use append_lane::{AppendLane, Message};
pub use authenticator::{AuthFailure, Authenticator, DeviceAuth, ServiceClaim};
pub use connections::Connections;
pub use context::{HubContext, HubParts};
pub use d2c_notify::D2cNotify;
pub use partition_readers::PartitionReaders;
pub use store_handle::StoreHandle;
