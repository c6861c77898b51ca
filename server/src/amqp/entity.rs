//! Event Hubs entities of the hub: the built-in endpoint under the hub's name (or IoT Hub's
//! own path `messages/events`), and each custom routing endpoint under its name. Partition ids
//! are the entity's own (`0..partition_count`); consumer groups are hub-wide.

use ferrohub_engine::d2c::{D2cError, EndpointSlot, DEFAULT_CONSUMER_GROUP};
use ferrohub_engine::endpoints::BUILTIN_ENDPOINT;
use ferrohub_engine::{StorageError, UnixMillis};

use crate::hub::HubContext;

/// An entity an Event Hubs client can read.
#[derive(Debug, Clone)]
pub struct Entity {
    /// The name as the hub reports it.
    pub name: String,
    pub slot: EndpointSlot,
    pub created: UnixMillis,
}

impl Entity {
    /// Partition ids as clients name them.
    pub fn partition_ids(&self) -> Vec<String> {
        (0..self.slot.partitions).map(|p| p.to_string()).collect()
    }

    /// The engine's partition for a client's partition id.
    pub fn partition(&self, id: &str) -> Result<u16, EntityError> {
        id.parse::<u16>()
            .ok()
            .filter(|p| *p < self.slot.partitions)
            .map(|p| self.slot.base + p)
            .ok_or_else(|| EntityError::NoPartition {
                entity: self.name.clone(),
                partition: id.to_string(),
                count: self.slot.partitions,
            })
    }
}

/// Why a name does not lead to something readable.
#[derive(Debug, thiserror::Error)]
pub enum EntityError {
    #[error("the messaging entity {0:?} could not be found")]
    NoEntity(String),
    #[error("the consumer group {group:?} of {entity:?} could not be found")]
    NoGroup { entity: String, group: String },
    #[error("partition {partition:?} of {entity:?} does not exist (it has partitions 0 to {})", count.saturating_sub(1))]
    NoPartition {
        entity: String,
        partition: String,
        count: u16,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<D2cError> for EntityError {
    fn from(e: D2cError) -> Self {
        match e {
            D2cError::Storage(s) => EntityError::Storage(s),
            other => EntityError::Storage(StorageError::Backend(other.to_string())),
        }
    }
}

/// The entity `name` designates.
pub async fn entity(ctx: &HubContext, name: &str) -> Result<Entity, EntityError> {
    let hub_name = ctx.settings.hub_name.clone();
    let builtin =
        name.eq_ignore_ascii_case(&hub_name) || name.eq_ignore_ascii_case("messages/events");
    if builtin {
        let slot = ctx
            .store
            .run(|s| Ok::<_, StorageError>(s.endpoint_slot(BUILTIN_ENDPOINT)))
            .await?
            .ok_or_else(|| EntityError::NoEntity(name.to_string()))?;
        return Ok(Entity {
            name: hub_name,
            slot,
            created: ctx.settings.created,
        });
    }
    let wanted = name.to_string();
    ctx.store
        .run(move |s| {
            Ok::<_, StorageError>(
                s.list_endpoints()
                    .into_iter()
                    .find(|e| e.name.eq_ignore_ascii_case(&wanted)),
            )
        })
        .await?
        .map(|e| Entity {
            name: e.name,
            slot: e.slot,
            created: e.created,
        })
        .ok_or_else(|| EntityError::NoEntity(name.to_string()))
}

/// The stored name of consumer group `group` (names match in any case, as in Event Hubs).
pub async fn consumer_group(
    ctx: &HubContext,
    entity: &Entity,
    group: &str,
) -> Result<String, EntityError> {
    if group.eq_ignore_ascii_case(DEFAULT_CONSUMER_GROUP) {
        return Ok(DEFAULT_CONSUMER_GROUP.to_string());
    }
    let groups = ctx.store.run(|s| s.list_consumer_groups()).await?;
    groups
        .into_iter()
        .find(|g| g.eq_ignore_ascii_case(group))
        .ok_or_else(|| EntityError::NoGroup {
            entity: entity.name.clone(),
            group: group.to_string(),
        })
}
