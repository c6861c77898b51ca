//! The operations listener (OPS-1): Prometheus `/metrics`, `/health/live` and `/health/ready`,
//! plain HTTP on its own address (loopback by default), off the device and service ports.
//!
//! # Invariants
//! - Ready means: the engine is open, every listener is bound, the hub is not shutting down,
//!   and the engine is not poisoned by a failed durable write. Live means the process answers.
//! - Gauges read from elsewhere (process memory and descriptors, commit counts, RocksDB's own
//!   properties, connected devices) are refreshed at each scrape, so a scrape never shows
//!   values older than itself; RocksDB is read on the blocking pool.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use warp::http::StatusCode;
use warp::Filter;

use crate::hub::HubContext;

/// Whether the node serves (see the module invariants); set by the node.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Binds the listener and serves until `shutdown`; returns the bound address.
///
/// # Errors
/// The address cannot be bound.
pub fn serve(
    addr: SocketAddr,
    ctx: HubContext,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), String> {
    // Installed before any traffic, so counters count from the start, not from the first scrape.
    crate::hub::metrics::recorder();
    let metrics_ctx = ctx.clone();
    let metrics = warp::path!("metrics").and(warp::get()).then(move || {
        let ctx = metrics_ctx.clone();
        async move {
            let text = crate::hub::metrics::render(&ctx).await;
            warp::reply::with_header(
                text,
                "content-type",
                "text/plain; version=0.0.4; charset=utf-8",
            )
        }
    });
    let live = warp::path!("health" / "live")
        .and(warp::get())
        .map(|| warp::reply::with_status("live\n", StatusCode::OK));
    let ready = warp::path!("health" / "ready")
        .and(warp::get())
        .map(move || {
            let (status, text) = if ctx.store.is_poisoned() {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: storage failed a durable write; restart the hub\n",
                )
            } else if !readiness.get() {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: starting or shutting down\n",
                )
            } else {
                (StatusCode::OK, "ready\n")
            };
            warp::reply::with_status(text, status)
        });
    let routes = metrics
        .map(|r| Box::new(r) as Box<dyn warp::Reply>)
        .or(live.map(|r| Box::new(r) as Box<dyn warp::Reply>))
        .unify()
        .or(ready.map(|r| Box::new(r) as Box<dyn warp::Reply>))
        .unify();
    let (bound, server) = warp::serve(routes)
        .try_bind_with_graceful_shutdown(addr, async move { shutdown.cancelled().await })
        .map_err(|e| e.to_string())?;
    Ok((bound, tokio::spawn(server)))
}
