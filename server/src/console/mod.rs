//! The web console (CON-*): a single-page application served under `/console/` on the HTTPS
//! listener, and the few read-only endpoints it needs that IoT Hub's REST API lacks
//! (`/console/api/...`: the node's uptime, metrics and their last hour, recent warnings, the
//! policy list, the provisioning service's scope and keys, the hub-wide event stream, and a
//! routing condition tester).
//!
//! # Invariants
//! - Nothing here is reachable outside `/console/` but `GET /`, which redirects there (the
//!   address an operator types first); every other path falls through to the REST API
//!   untouched, so the SDKs see exactly the API they saw before.
//! - The console has no powers of its own: the browser signs SAS tokens with the policy key the
//!   user pasted, and every API call (the console's own included) is authorised as that policy,
//!   but for the hub's CA certificate, which is public (`GET /console/api/ca.pem`).
//! - Assets are built into the binary (`FERROHUB_CONSOLE_DIR` may point at the source folder
//!   instead, for working on the console without rebuilding), and every page is served with a
//!   Content-Security-Policy that allows no outside origin.

mod access;
mod api;
mod assets;
pub mod history;
mod policies;
mod provisioning;
pub mod recent_log;
mod stream;

use warp::filters::BoxedFilter;
use warp::Filter;

use crate::hub::HubContext;

/// What the console reports about the node serving it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The cluster node's name, `None` for a single node.
    pub node: Option<String>,
    pub started: chrono::DateTime<chrono::Utc>,
    /// This node's counters over the last hour ([`history`]), sampled by [`history::keep`].
    pub history: std::sync::Arc<history::History>,
    /// The hub's CA certificate (public), offered for download while the hub serves the
    /// certificate it issued itself; `None` when it serves one of its operator's own.
    pub ca_file: Option<std::path::PathBuf>,
}

/// `/console/...`: the assets and the console's API. A request outside `/console` is rejected
/// before anything else runs, so it reaches the routes after this one.
pub fn routes(ctx: HubContext, node: NodeInfo) -> BoxedFilter<(warp::reply::Response,)> {
    let root = warp::path::end()
        .and(warp::get())
        .map(assets::redirect_to_folder);
    warp::path("console")
        .and(
            api::routes(ctx, node)
                .or(assets::routes())
                .unify()
                .recover(crate::rest::error::recover)
                .unify(),
        )
        .or(root)
        .unify()
        .boxed()
}
