//! The hub's side of message routing: the compiled table loaded from the store, the
//! configuration file's `[routing]` section applied at start, and the twin reads that `$twin`
//! conditions and enrichments need. Routing itself ([`crate::routing`]) is pure; everything
//! here runs behind the store seam.

use ferrohub_engine::notifications::EventSource;
use ferrohub_engine::routing::{Enrichment, Route, RoutingConfig};
use ferrohub_engine::{Store, UnixMillis};

use crate::config::RoutingSection;
use crate::routing::table::{compile, Table};
use crate::routing::view::{twin_doc, TwinDoc, TwinSource};
use crate::routing::{RouteError, Router};

/// Twins read from the store: a point read, made only when a condition or enrichment asks.
pub struct StoreTwins<'a>(pub &'a Store);

impl TwinSource for StoreTwins<'_> {
    fn twin(&self, device_id: &str, module_id: Option<&str>) -> Option<TwinDoc> {
        let twin = self.0.get_twin(device_id, module_id).ok()?;
        Some(twin_doc(&twin.record))
    }
}

/// Compiles `config` against the endpoints the store has now.
///
/// # Errors
/// [`RouteError`] naming the first problem.
pub fn compile_stored(config: &RoutingConfig, store: &Store) -> Result<Table, RouteError> {
    compile(config, &|name| store.endpoint_slot(name))
}

/// The router for the stored configuration.
///
/// # Errors
/// A stored configuration that no longer compiles (an endpoint vanished), or storage.
pub fn load_router(store: &Store, hub_name: &str) -> Result<Router, RouteError> {
    let table = compile_stored(&store.routing_config()?, store)?;
    let router = Router::new(table, hub_name);
    follow_digital_twin_routes(&router, store);
    Ok(router)
}

/// Installs `table` and tells the store whether to record digital twin changes: only while a
/// route takes them (PNP-5), so Plug and Play twins cost nothing more without one. Callers hold
/// [`Router::lock_changes`].
pub fn install(router: &Router, table: Table, store: &Store) {
    router.install(table);
    follow_digital_twin_routes(router, store);
}

fn follow_digital_twin_routes(router: &Router, store: &Store) {
    store.record_digital_twin_changes(router.routes_source(EventSource::DigitalTwinChangeEvents));
}

/// Applies the configuration file's `[routing]` section at start: creates its endpoints (an
/// existing one is kept as it is), then upserts its routes and enrichments by name and sets the
/// fallback route, refusing the whole section if the result does not compile.
///
/// # Errors
/// [`RouteError`] naming the first problem.
pub fn apply_config(
    store: &Store,
    section: &RoutingSection,
    now: UnixMillis,
) -> Result<(), RouteError> {
    for e in &section.endpoints {
        let invalid = |err: String| RouteError::Invalid(format!("endpoint {}: {err}", e.name));
        let delivery = e.target().map_err(invalid)?;
        if let Some(target) = &delivery {
            super::delivery::sender::check(target).map_err(invalid)?;
        }
        let stored = store
            .list_endpoints()
            .into_iter()
            .find(|s| s.name == e.name);
        match stored {
            Some(stored) => {
                if stored.slot.partitions != e.partitions {
                    tracing::warn!(
                        endpoint = %e.name, stored = stored.slot.partitions, configured = e.partitions,
                        "an endpoint's partition count is fixed when it is created; keeping the stored one"
                    );
                }
                if delivery.is_some() && delivery != stored.delivery {
                    store
                        .set_endpoint_delivery(&e.name, delivery)
                        .map_err(|err| invalid(err.to_string()))?;
                }
            }
            None => {
                store
                    .create_endpoint_delivering(&e.name, e.partitions, delivery, now)
                    .map_err(|err| invalid(err.to_string()))?;
            }
        }
    }
    if section.routes.is_empty() && section.enrichments.is_empty() && section.fallback.is_none() {
        return Ok(());
    }
    store.update_routing_config(|cfg| {
        for r in &section.routes {
            let source = EventSource::parse(&r.source).ok_or_else(|| {
                RouteError::Invalid(format!("route {}: unknown source {:?}", r.name, r.source))
            })?;
            let route = Route {
                name: r.name.clone(),
                source,
                condition: r.condition.clone(),
                endpoints: r.endpoints.clone(),
                enabled: r.enabled,
            };
            match cfg.routes.iter_mut().find(|x| x.name == r.name) {
                Some(existing) => *existing = route,
                None => cfg.routes.push(route),
            }
        }
        for e in &section.enrichments {
            let enrichment = Enrichment {
                key: e.key.clone(),
                value: e.value.clone(),
                endpoints: e.endpoints.clone(),
            };
            match cfg.enrichments.iter_mut().find(|x| x.key == e.key) {
                Some(existing) => *existing = enrichment,
                None => cfg.enrichments.push(enrichment),
            }
        }
        if let Some(f) = section.fallback {
            cfg.fallback_enabled = f;
        }
        compile_stored(cfg, store).map(drop)
    })?;
    Ok(())
}
