//! The operations listener (OPS-1): Prometheus `/metrics`, `/health/live`, `/health/ready` and the
//! hub's public CA certificate at `/ca.pem`,
//! plain HTTP on its own address (loopback by default), off the device and service ports.
//!
//! # Invariants
//! - A single node is ready when the engine is open, every listener is bound, the hub is not
//!   shutting down, and the engine is not poisoned by a failed durable write. A cluster node
//!   says itself when it is ready (`node::health`): it serves as the writer or a follower in
//!   good standing. Live means the process answers.
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

/// What the operations listener reports: a single node's hub, or a cluster node whose hub
/// comes and goes with its role.
pub trait OpsSource: Send + Sync + 'static {
    /// `Ok` when the node serves clients; why not otherwise.
    fn ready(&self) -> Result<(), String>;
    /// The Prometheus text of `/metrics`.
    fn metrics(self: Arc<Self>) -> futures::future::BoxFuture<'static, String>;
    /// `/health/cluster`'s JSON text; `None` (404) outside cluster mode.
    fn cluster(&self) -> Option<String> {
        None
    }
}

/// A single node's hub, ready once its listeners are bound.
pub struct HubOps {
    pub ctx: HubContext,
    pub readiness: Readiness,
}

impl OpsSource for HubOps {
    fn ready(&self) -> Result<(), String> {
        if self.ctx.store.is_poisoned() {
            Err(
                "storage failed a durable write; writes resume once the disk takes them again"
                    .into(),
            )
        } else if !self.readiness.get() {
            Err("starting or shutting down".into())
        } else {
            Ok(())
        }
    }

    fn metrics(self: Arc<Self>) -> futures::future::BoxFuture<'static, String> {
        Box::pin(async move { crate::hub::metrics::render(&self.ctx).await })
    }
}

/// Binds the listener and serves `source` until `shutdown`; returns the bound address.
/// `ca_file` is the hub's CA certificate (public), served at `/ca.pem` for clients and test
/// suites to trust, as the hub's own tools print it.
///
/// # Errors
/// The address cannot be bound.
pub fn serve(
    addr: SocketAddr,
    source: Arc<dyn OpsSource>,
    ca_file: std::path::PathBuf,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), String> {
    // Installed before any traffic, so counters count from the start, not from the first scrape.
    crate::hub::metrics::recorder();
    let metrics_source = Arc::clone(&source);
    let metrics = warp::path!("metrics").and(warp::get()).then(move || {
        let source = Arc::clone(&metrics_source);
        async move {
            let text = source.metrics().await;
            warp::reply::with_header(
                text,
                "content-type",
                "text/plain; version=0.0.4; charset=utf-8",
            )
        }
    });
    let live = warp::path!("health" / "live")
        .and(warp::get())
        .map(|| warp::reply::with_status("live\n".to_string(), StatusCode::OK));
    let ready_source = Arc::clone(&source);
    let ready = warp::path!("health" / "ready")
        .and(warp::get())
        .map(move || match ready_source.ready() {
            Ok(()) => warp::reply::with_status("ready\n".to_string(), StatusCode::OK),
            Err(why) => warp::reply::with_status(
                format!("not ready: {why}\n"),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
        });
    let cluster = warp::path!("health" / "cluster")
        .and(warp::get())
        .map(move || match source.cluster() {
            Some(report) => Box::new(warp::reply::with_header(
                report,
                "content-type",
                "application/json",
            )) as Box<dyn warp::Reply>,
            None => Box::new(warp::reply::with_status(
                "not a cluster node\n",
                StatusCode::NOT_FOUND,
            )),
        });
    // Read at each request: a cluster node receives its CA only once it joined.
    let ca = warp::path!("ca.pem").and(warp::get()).then(move || {
        let path = ca_file.clone();
        async move {
            match crate::tls::ca_pem_reply(&path).await {
                Some(pem) => Box::new(pem) as Box<dyn warp::Reply>,
                None => Box::new(warp::reply::with_status(
                    "no CA certificate yet\n",
                    StatusCode::NOT_FOUND,
                )),
            }
        }
    });
    let routes = metrics
        .map(|r| Box::new(r) as Box<dyn warp::Reply>)
        .or(live.map(|r| Box::new(r) as Box<dyn warp::Reply>))
        .unify()
        .or(ready.map(|r| Box::new(r) as Box<dyn warp::Reply>))
        .unify()
        .or(cluster)
        .unify()
        .or(ca)
        .unify();
    let (bound, server) = warp::serve(routes)
        .try_bind_with_graceful_shutdown(addr, async move { shutdown.cancelled().await })
        .map_err(|e| e.to_string())?;
    Ok((bound, tokio::spawn(server)))
}
