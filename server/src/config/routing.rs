//! The `[routing]` section: routes, endpoints (with their delivery targets) and enrichments
//! declared in the file, and the bound on a delivered endpoint's backlog.

use serde::Deserialize;

use super::targets::{BrokerConfig, StorageConfig, WebhookConfig};

/// Routing (EVT-5, EVT-6) declared in the file: applied at start, on top of what the REST API
/// stored (a route, enrichment or endpoint named here is created or replaced).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingSection {
    /// The fallback route; left as stored when absent (on for a new hub).
    pub fallback: Option<bool>,
    pub endpoints: Vec<EndpointConfig>,
    pub routes: Vec<RouteConfig>,
    pub enrichments: Vec<EnrichmentConfig>,
    /// The most events an endpoint with a target may hold undelivered before routes send it
    /// nothing more (docs/routing.md, "Endpoints outside the hub"); default 1,000,000.
    pub endpoint_backlog_limit: Option<u64>,
}

impl RoutingSection {
    pub fn endpoint_backlog_limit(&self) -> u64 {
        self.endpoint_backlog_limit.unwrap_or(1_000_000)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub name: String,
    pub partitions: u16,
    /// Delivers the endpoint's events to a webhook (docs/routing.md); when no target is
    /// configured, a target the REST API set is kept.
    pub webhook: Option<WebhookConfig>,
    /// Delivers them to a NATS JetStream stream instead.
    pub nats: Option<BrokerConfig>,
    /// Delivers them to an MQTT broker instead.
    pub mqtt: Option<BrokerConfig>,
    /// Writes them to an Azure Storage container instead.
    pub storage_container: Option<StorageConfig>,
}

impl EndpointConfig {
    /// The configured target, its files read; `None` when none is configured.
    ///
    /// # Errors
    /// More than one target, or one that cannot be read.
    pub fn target(&self) -> Result<Option<ferrohub_engine::delivery::DeliveryTarget>, String> {
        let configured = [
            self.webhook.is_some(),
            self.nats.is_some(),
            self.mqtt.is_some(),
            self.storage_container.is_some(),
        ];
        if configured.iter().filter(|c| **c).count() > 1 {
            return Err("give one of webhook, nats, mqtt or storage_container".into());
        }
        if let Some(s) = &self.storage_container {
            return s.target().map(Some);
        }
        if let Some(w) = &self.webhook {
            return w.target().map(Some);
        }
        if let Some(b) = &self.nats {
            return b.target(true).map(Some);
        }
        self.mqtt.as_ref().map(|b| b.target(false)).transpose()
    }
}

fn yes() -> bool {
    true
}

fn true_condition() -> String {
    "true".into()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    /// DeviceMessages, TwinChangeEvents, DeviceLifecycleEvents, DeviceConnectionStateEvents or DigitalTwinChangeEvents.
    pub source: String,
    #[serde(default = "true_condition")]
    pub condition: String,
    pub endpoints: Vec<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrichmentConfig {
    pub key: String,
    pub value: String,
    pub endpoints: Vec<String>,
}
