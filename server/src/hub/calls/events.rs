//! Event writes: consumer groups and checkpoints of the partitions, custom endpoints, and the
//! routing configuration (whose compiled table the writer swaps in as it stores it).

use ferrohub_engine::d2c::{Checkpoint, D2cError};
use ferrohub_engine::delivery::DeliveryTarget;
use ferrohub_engine::endpoints::Endpoint;
use ferrohub_engine::routing::{Enrichment, Route, RoutingConfig};
use ferrohub_engine::UnixMillis;
use serde::{Deserialize, Serialize};

use super::writer_call;
use crate::hub::delivery::EndpointHealth;
use crate::hub::routes::{compile_stored, install};
use crate::routing::RouteError;

writer_call! {
    pub struct CreateConsumerGroup { pub name: String, pub now: UnixMillis }
    -> Result<(), D2cError>;
    |ctx, c| ctx.store.run(move |s| s.create_consumer_group(&c.name, c.now)).await
}

writer_call! {
    pub struct DeleteConsumerGroup { pub name: String }
    -> Result<(), D2cError>;
    |ctx, c| ctx.store.run(move |s| s.delete_consumer_group(&c.name)).await
}

writer_call! {
    pub struct SetCheckpoint { pub group: String, pub partition: u16, pub checkpoint: Checkpoint }
    -> Result<(), D2cError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.set_checkpoint(&c.group, c.partition, &c.checkpoint))
        .await
}

writer_call! {
    pub struct CreateEndpoint {
        pub name: String,
        pub partitions: u16,
        pub delivery: Option<DeliveryTarget>,
        pub now: UnixMillis,
    }
    -> Result<Endpoint, D2cError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.create_endpoint_delivering(&c.name, c.partitions, c.delivery, c.now))
        .await
}

writer_call! {
    /// Sets or removes where an existing endpoint's events are delivered (the delivery tasks
    /// follow within a second: `hub::delivery`).
    pub struct SetEndpointDelivery { pub name: String, pub delivery: Option<DeliveryTarget> }
    -> Result<Endpoint, D2cError>;
    |ctx, c| ctx
        .store
        .run(move |s| s.set_endpoint_delivery(&c.name, c.delivery))
        .await
}

writer_call! {
    /// Removes an endpoint's target when it is of `kind` (`DeliveryTarget::kind`): `false`
    /// when it has none of that kind. Checked where the store is written, so a node that has
    /// not applied the latest target yet does not answer for it.
    pub struct RemoveEndpointTarget { pub name: String, pub kind: String }
    -> Result<bool, D2cError>;
    |ctx, c| ctx
        .store
        .run(move |s| {
            let current = s.list_endpoints().into_iter().find(|e| e.name == c.name);
            let Some(endpoint) = current else {
                return Err(D2cError::NoSuchEndpoint(c.name));
            };
            if endpoint.delivery.as_ref().map(DeliveryTarget::kind) != Some(c.kind.as_str()) {
                return Ok(false);
            }
            s.set_endpoint_delivery(&c.name, None).map(|_| true)
        })
        .await
}

writer_call! {
    pub struct DeleteEndpoint { pub name: String }
    -> Result<(), D2cError>;
    |ctx, c| ctx.store.run(move |s| s.delete_endpoint(&c.name)).await
}

/// One change of the routing configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RoutingEdit {
    /// Adds the route, or replaces the one of its name.
    PutRoute(Route),
    DeleteRoute(String),
    /// Adds the enrichment, or replaces the one of its key.
    PutEnrichment(Enrichment),
    DeleteEnrichment(String),
    Fallback(bool),
}

impl RoutingEdit {
    fn apply(self, cfg: &mut RoutingConfig) -> Result<(), RouteError> {
        fn upsert<T>(items: &mut Vec<T>, item: T, name: impl Fn(&T) -> &str) {
            match items.iter_mut().find(|x| name(x) == name(&item)) {
                Some(existing) => *existing = item,
                None => items.push(item),
            }
        }
        fn remove<T>(
            items: &mut Vec<T>,
            wanted: &str,
            kind: &str,
            name: impl Fn(&T) -> &str,
        ) -> Result<(), RouteError> {
            let before = items.len();
            items.retain(|x| name(x) != wanted);
            if items.len() == before {
                return Err(RouteError::NotFound(format!("{kind} {wanted}")));
            }
            Ok(())
        }
        match self {
            RoutingEdit::PutRoute(r) => upsert(&mut cfg.routes, r, |r| &r.name),
            RoutingEdit::DeleteRoute(n) => remove(&mut cfg.routes, &n, "route", |r| &r.name)?,
            RoutingEdit::PutEnrichment(e) => upsert(&mut cfg.enrichments, e, |e| &e.key),
            RoutingEdit::DeleteEnrichment(k) => {
                remove(&mut cfg.enrichments, &k, "enrichment", |e| &e.key)?;
            }
            RoutingEdit::Fallback(on) => cfg.fallback_enabled = on,
        }
        Ok(())
    }
}

writer_call! {
    /// Edits the stored routing configuration, refusing any result that does not compile, and
    /// installs the compiled table on the writer, which routes every device message.
    pub struct ChangeRouting { pub edit: RoutingEdit }
    -> Result<RoutingConfig, RouteError>;
    |ctx, c| {
        let router = std::sync::Arc::clone(&ctx.routing);
        ctx.store
            .run(move |s| {
                // Store and install under one lock: the live table is always the stored one's.
                let _order = router.lock_changes();
                let mut compiled = None;
                let config = s.update_routing_config(|cfg| {
                    c.edit.apply(cfg)?;
                    compiled = Some(compile_stored(cfg, s)?);
                    Ok::<_, RouteError>(())
                })?;
                if let Some(table) = compiled {
                    install(&router, table, s);
                }
                Ok::<_, RouteError>(config)
            })
            .await
    }
}

writer_call! {
    /// How deliveries to endpoints outside the hub fare: known only to the node that
    /// delivers (the writer), so any node asks it.
    pub struct EndpointsHealth {}
    -> Result<Vec<EndpointHealth>, D2cError>;
    |ctx, _c| {
        let names: Vec<String> = ctx
            .store
            .run(|s| Ok::<_, D2cError>(s.list_endpoints()))
            .await?
            .into_iter()
            .filter(|e| e.delivery.is_some())
            .map(|e| e.name)
            .collect();
        Ok(ctx.delivery_health.report(&names))
    }
}
