//! Routing configuration (EVT-5): routes, the fallback route and message enrichments, stored
//! as one record so a change is atomic. The engine keeps the text of conditions; the protocol
//! layer compiles and checks them before a configuration is stored.

use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::notifications::EventSource;
use crate::Store;

const ROUTING_KEY: &[u8] = b"routing";

/// One route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub name: String,
    pub source: EventSource,
    /// Routing query condition text (`true` routes everything).
    pub condition: String,
    /// Endpoint names (`events` is the built-in one).
    pub endpoints: Vec<String>,
    pub enabled: bool,
}

/// A message enrichment: an application property added to messages sent to some endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrichment {
    pub key: String,
    /// A static value, `$iothubname`, or a twin reference such as `$twin.tags.site`.
    pub value: String,
    pub endpoints: Vec<String>,
}

/// The hub's routing configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingConfig {
    pub routes: Vec<Route>,
    /// Whether device messages no enabled route matched go to the built-in endpoint.
    pub fallback_enabled: bool,
    pub enrichments: Vec<Enrichment>,
}

impl Default for RoutingConfig {
    /// IoT Hub's defaults: no routes, the fallback route on (so every device message reaches
    /// the built-in endpoint), no enrichments.
    fn default() -> Self {
        RoutingConfig {
            routes: Vec::new(),
            fallback_enabled: true,
            enrichments: Vec::new(),
        }
    }
}

impl Store {
    /// The stored routing configuration, or the default.
    ///
    /// # Errors
    /// Storage errors.
    pub fn routing_config(&self) -> Result<RoutingConfig, StorageError> {
        Ok(self
            .raw
            .get_record(cf::META, ROUTING_KEY)?
            .unwrap_or_default())
    }

    /// Changes the routing configuration: `change` edits a copy and may refuse (then nothing
    /// is stored). Concurrent updates are serialised. Returns the stored configuration.
    ///
    /// # Errors
    /// The closure's error, or storage errors.
    pub fn update_routing_config<E: From<StorageError>>(
        &self,
        change: impl FnOnce(&mut RoutingConfig) -> Result<(), E>,
    ) -> Result<RoutingConfig, E> {
        let _guard = self.hub_lock.lock();
        let mut config = self.routing_config()?;
        change(&mut config)?;
        let mut batch = crate::raw::Batch::default();
        batch.put_record(cf::META, ROUTING_KEY.to_vec(), &config);
        self.raw.commit(batch)?;
        Ok(config)
    }
}
