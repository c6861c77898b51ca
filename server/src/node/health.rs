//! A cluster node's operations listener: one for the node's whole life, whatever its role,
//! so a balancer's health check and a metrics scraper reach every node, serving or not.
//!
//! # Invariants
//! - `/health/ready` answers 200 only while the node serves clients in good standing (the
//!   writer within its lease, a follower reaching NATS and caught up: [`Standing::ready`]);
//!   HAProxy takes a node out of rotation on anything else.
//! - `/metrics` carries the hub's metrics while the node serves (the current role's context)
//!   and the cluster's gauges always; `/health/cluster` is the standing as JSON.

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;

use crate::cluster::standing::Standing;
use crate::hub::HubContext;
use crate::transport::ops::OpsSource;

/// The node's standing, and the hub it serves now (if any).
pub struct ClusterOps {
    pub standing: Arc<Standing>,
    serving: Mutex<Option<HubContext>>,
}

impl ClusterOps {
    pub fn new(standing: Arc<Standing>) -> Arc<ClusterOps> {
        Arc::new(ClusterOps {
            standing,
            serving: Mutex::new(None),
        })
    }

    /// The node serves `ctx` now.
    pub fn attach(&self, ctx: HubContext) {
        *self.serving.lock() = Some(ctx);
        self.standing.set_serving(true);
    }

    /// The node stopped serving (it drains).
    pub fn detach(&self) {
        self.standing.set_serving(false);
        *self.serving.lock() = None;
    }
}

impl OpsSource for ClusterOps {
    fn ready(&self) -> Result<(), String> {
        if self
            .serving
            .lock()
            .as_ref()
            .is_some_and(|ctx| ctx.store.is_poisoned())
        {
            return Err("this node's store refuses writes after a failed write".into());
        }
        self.standing.ready()
    }

    fn metrics(self: Arc<Self>) -> BoxFuture<'static, String> {
        Box::pin(async move {
            self.standing.recheck();
            let ctx = self.serving.lock().clone();
            match ctx {
                Some(ctx) => crate::hub::metrics::render(&ctx).await,
                None => crate::hub::metrics::render_without_hub(),
            }
        })
    }

    fn cluster(&self) -> Option<String> {
        serde_json::to_string(&self.standing.report()).ok()
    }
}
