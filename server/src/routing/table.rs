//! The routing table: the stored [`RoutingConfig`] compiled (conditions parsed, endpoint names
//! resolved to partition slots) and evaluated per event.
//!
//! Semantics (IoT Hub's): every enabled route of the event's source whose condition matches
//! sends the event to its endpoints (each endpoint once); a device message no enabled route
//! matched goes to the built-in endpoint if the fallback route is on; a non-telemetry event
//! goes nowhere unless routed. Enrichments add application properties to the copies sent to
//! the endpoints they name.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferrohub_engine::d2c::{EndpointSlot, NewEvent};
use ferrohub_engine::endpoints::BUILTIN_ENDPOINT;
use ferrohub_engine::notifications::EventSource;
use ferrohub_engine::routing::RoutingConfig;
use ferrohub_engine::{StorageError, UnixMillis};
use parking_lot::RwLock;
use serde_json::Value;

use super::query::{Condition, QueryError};
use super::view::{EventView, NoTwins, TwinSource};

/// Why a routing configuration is refused.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum RouteError {
    #[error("route {route}: condition {condition:?} is invalid: {error}")]
    BadCondition {
        route: String,
        condition: String,
        error: QueryError,
    },
    #[error("{owner} names endpoint {endpoint}, which does not exist")]
    UnknownEndpoint { owner: String, endpoint: String },
    #[error("{0}")]
    Invalid(String),
    #[error("no such {0}")]
    NotFound(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

struct CompiledRoute {
    name: String,
    source: EventSource,
    condition: Condition,
    endpoints: Vec<String>,
    enabled: bool,
}

enum EnrichValue {
    Static(String),
    HubName,
    Twin(Vec<String>),
}

struct CompiledEnrichment {
    key: String,
    value: EnrichValue,
    endpoints: Vec<String>,
}

/// One compiled version of the configuration.
pub struct Table {
    /// Some device-message route condition or enrichment reads `$twin`.
    reads_twins: bool,
    /// Every device message goes to the built-in endpoint alone, unchanged (see
    /// [`Router::sends_device_messages_to_builtin_only`]).
    builtin_only: bool,
    /// The sources some enabled route (or, for device messages, the fallback route) takes.
    routed_sources: Vec<EventSource>,
    routes: Vec<CompiledRoute>,
    fallback: bool,
    enrichments: Vec<CompiledEnrichment>,
    slots: HashMap<String, EndpointSlot>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn compile_enrichment_value(value: &str) -> Result<EnrichValue, RouteError> {
    if value.eq_ignore_ascii_case("$iothubname") {
        return Ok(EnrichValue::HubName);
    }
    if let Some(path) = value.strip_prefix("$twin.") {
        let steps: Vec<String> = path.split('.').map(str::to_string).collect();
        let ok = matches!(
            steps.first().map(String::as_str),
            Some("tags") | Some("properties")
        ) && steps.iter().all(|s| !s.is_empty());
        if !ok {
            return Err(RouteError::Invalid(format!(
                "enrichment value {value:?}: a twin reference is $twin.tags.<path> or $twin.properties.(desired|reported).<path>"
            )));
        }
        return Ok(EnrichValue::Twin(steps));
    }
    if value.starts_with('$') {
        return Err(RouteError::Invalid(format!(
            "enrichment value {value:?}: only $iothubname and $twin references are supported"
        )));
    }
    Ok(EnrichValue::Static(value.to_string()))
}

/// Compiles and checks a configuration against the endpoints that exist now, which
/// `endpoint` resolves by name.
///
/// # Errors
/// [`RouteError`] naming the first problem; nothing is compiled.
pub fn compile(
    config: &RoutingConfig,
    endpoint: &dyn Fn(&str) -> Option<EndpointSlot>,
) -> Result<Table, RouteError> {
    let mut slots = HashMap::new();
    let mut resolve = |owner: &str, name: &str| -> Result<(), RouteError> {
        let slot = endpoint(name).ok_or_else(|| RouteError::UnknownEndpoint {
            owner: owner.to_string(),
            endpoint: name.to_string(),
        })?;
        slots.insert(name.to_string(), slot);
        Ok(())
    };
    let mut routes = Vec::new();
    for r in &config.routes {
        if !valid_name(&r.name) {
            return Err(RouteError::Invalid(format!(
                "route name {:?} must be 1 to 64 letters, digits, '-', '_' or '.'",
                r.name
            )));
        }
        if r.endpoints.is_empty() {
            return Err(RouteError::Invalid(format!(
                "route {} names no endpoint",
                r.name
            )));
        }
        let condition =
            Condition::parse(&r.condition).map_err(|error| RouteError::BadCondition {
                route: r.name.clone(),
                condition: r.condition.clone(),
                error,
            })?;
        for e in &r.endpoints {
            resolve(&format!("route {}", r.name), e)?;
        }
        routes.push(CompiledRoute {
            name: r.name.clone(),
            source: r.source,
            condition,
            endpoints: r.endpoints.clone(),
            enabled: r.enabled,
        });
    }
    let mut enrichments = Vec::new();
    for e in &config.enrichments {
        if e.key.is_empty() || e.key.len() > 64 {
            return Err(RouteError::Invalid(
                "an enrichment key must be 1 to 64 characters".into(),
            ));
        }
        for name in &e.endpoints {
            resolve(&format!("enrichment {}", e.key), name)?;
        }
        enrichments.push(CompiledEnrichment {
            key: e.key.clone(),
            value: compile_enrichment_value(&e.value)?,
            endpoints: e.endpoints.clone(),
        });
    }
    resolve("the fallback route", BUILTIN_ENDPOINT)?;
    let reads_twins = routes
        .iter()
        .any(|r| r.enabled && r.source == EventSource::DeviceMessages && r.condition.reads_twin())
        || enrichments
            .iter()
            .any(|e| matches!(e.value, EnrichValue::Twin(_)));
    let builtin_only = config.fallback_enabled
        && !routes
            .iter()
            .any(|r| r.enabled && r.source == EventSource::DeviceMessages)
        && !enrichments
            .iter()
            .any(|e| e.endpoints.iter().any(|n| n == BUILTIN_ENDPOINT));
    let mut routed_sources: Vec<EventSource> = routes
        .iter()
        .filter(|r| r.enabled)
        .map(|r| r.source)
        .collect();
    if config.fallback_enabled {
        routed_sources.push(EventSource::DeviceMessages);
    }
    Ok(Table {
        reads_twins,
        builtin_only,
        routed_sources,
        routes,
        fallback: config.fallback_enabled,
        enrichments,
        slots,
    })
}

/// The live routing table.
pub struct Router {
    table: RwLock<Arc<Table>>,
    hub_name: String,
    /// Held across "store a configuration, install its table", so tables are installed in the
    /// order their configurations were stored.
    changes: parking_lot::Mutex<()>,
    /// Delivered endpoints whose backlog reached the hub's limit (set by the delivery tasks'
    /// backlog watch): routes send them nothing until it drains.
    full: RwLock<Arc<HashSet<String>>>,
    /// Whether `full` is non-empty: the routing of every message reads this flag alone while
    /// no endpoint is full, as it almost never is.
    any_full: AtomicBool,
}

impl Router {
    /// A router for a compiled table.
    pub fn new(table: Table, hub_name: &str) -> Router {
        Router {
            table: RwLock::new(Arc::new(table)),
            hub_name: hub_name.to_string(),
            changes: parking_lot::Mutex::new(()),
            full: RwLock::default(),
            any_full: AtomicBool::new(false),
        }
    }

    /// Replaces the set of endpoints whose backlog is full. A message a route sends to one of
    /// them goes to the built-in endpoint instead when the fallback route is on (a device
    /// message), else is dropped; either way it is counted against the endpoint
    /// (`ferrohub_endpoint_deliveries_total{outcome="sent_to_fallback"|"dropped"}`), as IoT
    /// Hub treats an endpoint that cannot take messages.
    pub fn set_full_endpoints(&self, names: HashSet<String>) {
        let mut full = self.full.write();
        self.any_full.store(!names.is_empty(), Ordering::Release);
        *full = Arc::new(names);
    }

    /// Serialises configuration changes; see [`Router::install`].
    pub fn lock_changes(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.changes.lock()
    }

    /// Replaces the table. Callers hold [`Router::lock_changes`] from storing the
    /// configuration to installing its table.
    pub fn install(&self, table: Table) {
        *self.table.write() = Arc::new(table);
    }

    pub fn hub_name(&self) -> &str {
        &self.hub_name
    }

    /// Decides where `event` goes: one event per distinct set of enrichments, each carrying
    /// its endpoints. An event routed nowhere comes back with an empty endpoint list.
    pub fn route(
        &self,
        twins: &dyn TwinSource,
        event: NewEvent,
        module_id: Option<&str>,
        source: EventSource,
        enqueued: UnixMillis,
    ) -> Vec<NewEvent> {
        let table = Arc::clone(&self.table.read());
        self.route_by(&table, twins, event, module_id, source, enqueued)
    }

    /// Whether the current table sends every device message to the built-in endpoint alone
    /// and unchanged: no enabled device-message route, the fallback route on, no enrichment
    /// for the built-in endpoint. Such messages need no routing: an event whose endpoints are
    /// `None` goes to the built-in endpoint, as the fallback route would send it.
    pub fn sends_device_messages_to_builtin_only(&self) -> bool {
        self.table.read().builtin_only
    }

    /// Whether any event of `source` can go anywhere under the current table: an enabled route
    /// takes the source, or it is device messages and the fallback route is on. Events of
    /// other sources are routed nowhere whatever they hold, so they need not be shaped.
    pub fn routes_source(&self, source: EventSource) -> bool {
        self.table.read().routed_sources.contains(&source)
    }

    /// Routes a device message when the current table reads no twin, so no storage is
    /// needed; otherwise gives the message back, for [`Router::route`] with a twin source.
    /// Runs on any thread: it only evaluates conditions.
    ///
    /// # Errors
    /// The event, unrouted, when the table reads `$twin`.
    pub fn route_without_store(
        &self,
        event: NewEvent,
        module_id: Option<&str>,
        enqueued: UnixMillis,
    ) -> Result<Vec<NewEvent>, NewEvent> {
        let table = Arc::clone(&self.table.read());
        if table.reads_twins {
            return Err(event);
        }
        Ok(self.route_by(
            &table,
            &NoTwins,
            event,
            module_id,
            EventSource::DeviceMessages,
            enqueued,
        ))
    }

    /// Takes the endpoints whose backlog is full out of `names`; with `fallback`, the built-in
    /// endpoint takes their place (once).
    fn divert_from_full<'a>(&self, names: &mut Vec<&'a str>, fallback: bool) {
        if !self.any_full.load(Ordering::Acquire) {
            return;
        }
        let full = Arc::clone(&self.full.read());
        let outcome = if fallback {
            "sent_to_fallback"
        } else {
            "dropped"
        };
        let before = names.len();
        names.retain(|name| {
            let keep = !full.contains(*name);
            if !keep {
                metrics::counter!("ferrohub_endpoint_deliveries_total", "endpoint" => name.to_string(), "outcome" => outcome)
                    .increment(1);
            }
            keep
        });
        if fallback && names.len() < before && !names.contains(&BUILTIN_ENDPOINT) {
            names.push(BUILTIN_ENDPOINT);
        }
    }

    fn route_by(
        &self,
        table: &Table,
        twins: &dyn TwinSource,
        mut event: NewEvent,
        module_id: Option<&str>,
        source: EventSource,
        enqueued: UnixMillis,
    ) -> Vec<NewEvent> {
        let view = EventView::new(&event, module_id, enqueued, twins);
        let mut names: Vec<&str> = Vec::new();
        for r in table
            .routes
            .iter()
            .filter(|r| r.enabled && r.source == source)
        {
            if r.condition.matches(&view) {
                metrics::counter!("ferrohub_route_matched_total", "route" => r.name.clone())
                    .increment(1);
                for e in &r.endpoints {
                    if !names.contains(&e.as_str()) {
                        names.push(e);
                    }
                }
            }
        }
        let matched = !names.is_empty();
        if matched {
            self.divert_from_full(
                &mut names,
                table.fallback && source == EventSource::DeviceMessages,
            );
        }
        if !matched && source == EventSource::DeviceMessages {
            // IoT Hub's fallback and orphaned telemetry: matched by no route, sent to the
            // built-in endpoint by the fallback route, or (with it off) dropped.
            let outcome = if table.fallback {
                "fallback"
            } else {
                "orphaned"
            };
            metrics::counter!("ferrohub_routing_unmatched_total", "outcome" => outcome)
                .increment(1);
            if table.fallback {
                names.push(BUILTIN_ENDPOINT);
            }
        }
        // Enrichment values per endpoint, then endpoints grouped by identical additions.
        let mut groups: Vec<(Vec<(String, String)>, Vec<EndpointSlot>)> = Vec::new();
        for name in &names {
            let added: Vec<(String, String)> = table
                .enrichments
                .iter()
                .filter(|e| e.endpoints.iter().any(|n| n == name))
                .filter_map(|e| {
                    let value = match &e.value {
                        EnrichValue::Static(v) => v.clone(),
                        EnrichValue::HubName => self.hub_name.clone(),
                        EnrichValue::Twin(path) => match view.twin_value(path)? {
                            Value::String(s) => s,
                            other => other.to_string(),
                        },
                    };
                    Some((e.key.clone(), value))
                })
                .collect();
            let Some(&slot) = table.slots.get(*name) else {
                continue;
            };
            match groups.iter_mut().find(|(a, _)| *a == added) {
                Some((_, slots)) => slots.push(slot),
                None => groups.push((added, vec![slot])),
            }
        }
        drop(view);
        if groups.is_empty() {
            event.endpoints = Some(Vec::new());
            return vec![event];
        }
        let last = groups.len() - 1;
        let mut out = Vec::with_capacity(groups.len());
        for (i, (added, slots)) in groups.into_iter().enumerate() {
            let mut copy = if i == last {
                std::mem::take(&mut event)
            } else {
                event.clone()
            };
            for (k, v) in added {
                copy.application_properties.retain(|(name, _)| *name != k);
                copy.application_properties.push((k, v));
            }
            copy.endpoints = Some(slots);
            out.push(copy);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use ferrohub_engine::routing::{Enrichment, Route};

    use super::*;

    fn slot(_: &str) -> Option<EndpointSlot> {
        Some(EndpointSlot {
            base: 0,
            partitions: 4,
            id: 0,
        })
    }

    fn router(conditions: &[(&str, bool)], enrichment: Option<&str>) -> Router {
        let config = RoutingConfig {
            routes: conditions
                .iter()
                .enumerate()
                .map(|(i, (condition, enabled))| Route {
                    name: format!("r{i}"),
                    source: EventSource::DeviceMessages,
                    condition: condition.to_string(),
                    endpoints: vec![BUILTIN_ENDPOINT.into()],
                    enabled: *enabled,
                })
                .collect(),
            fallback_enabled: true,
            enrichments: enrichment
                .map(|value| Enrichment {
                    key: "k".into(),
                    value: value.into(),
                    endpoints: vec![BUILTIN_ENDPOINT.into()],
                })
                .into_iter()
                .collect(),
        };
        Router::new(compile(&config, &slot).expect("compiles"), "hub")
    }

    fn message() -> NewEvent {
        NewEvent {
            device_id: "d".into(),
            application_properties: vec![("level".into(), "high".into())],
            ..NewEvent::default()
        }
    }

    #[test]
    fn only_a_table_without_device_routes_or_builtin_enrichment_skips_routing() {
        assert!(router(&[], None).sends_device_messages_to_builtin_only());
        // A disabled route is never evaluated.
        let disabled = router(&[("level = 'high'", false)], None);
        assert!(disabled.sends_device_messages_to_builtin_only());
        let enabled = router(&[("level = 'high'", true)], None);
        assert!(!enabled.sends_device_messages_to_builtin_only());
        let enriched = router(&[], Some("static"));
        assert!(!enriched.sends_device_messages_to_builtin_only());
        let no_fallback = RoutingConfig {
            fallback_enabled: false,
            ..RoutingConfig::default()
        };
        let dropping = Router::new(compile(&no_fallback, &slot).expect("compiles"), "hub");
        assert!(!dropping.sends_device_messages_to_builtin_only());
        // What routing itself does with such a table: the message, unchanged, to one endpoint.
        let routed = router(&[], None)
            .route_without_store(message(), None, UnixMillis(1))
            .expect("no twin read");
        assert_eq!(routed.len(), 1);
        assert_eq!(
            routed[0].application_properties,
            message().application_properties
        );
        assert_eq!(routed[0].endpoints.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn a_full_endpoint_gets_nothing_its_messages_going_to_the_fallback_or_nowhere() {
        fn slots(name: &str) -> Option<EndpointSlot> {
            Some(EndpointSlot {
                base: if name == BUILTIN_ENDPOINT { 0 } else { 32 },
                partitions: 4,
                id: 0,
            })
        }
        let config = |fallback_enabled| RoutingConfig {
            routes: vec![Route {
                name: "all".into(),
                source: EventSource::DeviceMessages,
                condition: "true".into(),
                endpoints: vec!["hook".into()],
                enabled: true,
            }],
            fallback_enabled,
            enrichments: Vec::new(),
        };
        let bases = |router: &Router| -> Vec<u16> {
            router
                .route_without_store(message(), None, UnixMillis(1))
                .expect("no twin read")
                .into_iter()
                .flat_map(|e| e.endpoints.unwrap_or_default())
                .map(|slot| slot.base)
                .collect()
        };
        let full = || HashSet::from(["hook".to_string()]);
        let with_fallback = Router::new(compile(&config(true), &slots).expect("compiles"), "hub");
        assert_eq!(bases(&with_fallback), vec![32]);
        with_fallback.set_full_endpoints(full());
        assert_eq!(bases(&with_fallback), vec![0]);
        with_fallback.set_full_endpoints(HashSet::new());
        assert_eq!(bases(&with_fallback), vec![32]);
        let without = Router::new(compile(&config(false), &slots).expect("compiles"), "hub");
        without.set_full_endpoints(full());
        assert!(bases(&without).is_empty());
    }

    #[test]
    fn only_sources_an_enabled_route_or_the_fallback_takes_are_routed() {
        let table = |routes: Vec<(EventSource, bool)>, fallback_enabled| {
            let config = RoutingConfig {
                routes: routes
                    .into_iter()
                    .enumerate()
                    .map(|(i, (source, enabled))| Route {
                        name: format!("r{i}"),
                        source,
                        condition: "true".into(),
                        endpoints: vec![BUILTIN_ENDPOINT.into()],
                        enabled,
                    })
                    .collect(),
                fallback_enabled,
                enrichments: Vec::new(),
            };
            Router::new(compile(&config, &slot).expect("compiles"), "hub")
        };
        let none = table(Vec::new(), true);
        assert!(none.routes_source(EventSource::DeviceMessages));
        assert!(!none.routes_source(EventSource::DeviceConnectionStateEvents));
        assert!(!none.routes_source(EventSource::TwinChangeEvents));
        let connections = table(
            vec![
                (EventSource::DeviceConnectionStateEvents, true),
                (EventSource::TwinChangeEvents, false),
            ],
            false,
        );
        assert!(connections.routes_source(EventSource::DeviceConnectionStateEvents));
        assert!(!connections.routes_source(EventSource::TwinChangeEvents));
        assert!(!connections.routes_source(EventSource::DeviceMessages));
    }

    #[test]
    fn routing_without_storage_is_refused_only_when_a_twin_is_read() {
        let enqueued = || UnixMillis(1_767_225_600_000);
        for pure in [
            router(&[], None),
            router(&[("level = 'high' OR $body.x = 1", true)], Some("static")),
            // A disabled route is never evaluated.
            router(&[("$twin.tags.site = 'a'", false)], Some("$iothubname")),
        ] {
            let routed = pure
                .route_without_store(message(), None, enqueued())
                .expect("routed without storage");
            assert_eq!(routed.len(), 1);
        }
        for reads_twin in [
            router(
                &[
                    ("level = 'high'", true),
                    ("NOT ($twin.tags.site = 'a')", true),
                ],
                None,
            ),
            router(&[("IS_DEFINED($twin.properties.reported.fw)", true)], None),
            router(&[], Some("$twin.tags.site")),
        ] {
            let back = reads_twin
                .route_without_store(message(), None, enqueued())
                .expect_err("needs the twin");
            assert_eq!(
                back.application_properties,
                message().application_properties
            );
        }
    }
}
