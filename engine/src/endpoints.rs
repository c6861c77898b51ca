//! Custom endpoints (EVT-6): more partitioned event streams inside the hub, beside the built-in
//! `events` endpoint, read through the same read API; and the routed append of non-telemetry
//! events with the router's cursor.
//!
//! # Invariants
//! - Every endpoint's partitions are a contiguous range of the global partition numbering
//!   (`slots::MAX_PARTITIONS`); ranges never overlap, and custom ranges start at
//!   [`CUSTOM_BASE`], above any built-in count.
//! - Deleting an endpoint removes its events with one range delete per partition; partition
//!   heads stay, so a range reused later continues its sequence numbers.
//! - An endpoint may carry a delivery target (`crate::delivery`): it is stored in the
//!   endpoint's record, and the endpoint's delivery cursors go with the endpoint.
//! - The router's cursor (the next notification to route) advances in the same batch as the
//!   events it produced, and the routed notifications are deleted in that batch: a crash
//!   neither loses nor repeats a non-telemetry event.

use ferrohub_migrations::cf;

use crate::d2c::{Appended, D2cError, NewEvent};
use crate::delivery::DeliveryTarget;
use crate::error::{StorageError, ValidationError};
use crate::keys;
use crate::model::UnixMillis;
use crate::raw::Raw;
pub use crate::slots::Endpoint;
use crate::slots::{EndpointSlot, MAX_PARTITIONS};
use crate::Store;

/// The built-in endpoint's name (IoT Hub's `events`).
pub const BUILTIN_ENDPOINT: &str = "events";
/// First global partition of custom endpoints.
pub const CUSTOM_BASE: u16 = 32;
/// Most partitions of one custom endpoint.
pub const MAX_ENDPOINT_PARTITIONS: u16 = 32;

pub(crate) const ENDPOINT_PREFIX: &[u8] = b"endpoint/";
const ROUTER_CURSOR: &[u8] = b"router/next_notification";

fn endpoint_key(name: &str) -> Vec<u8> {
    let mut k = ENDPOINT_PREFIX.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

pub(crate) fn load(raw: &Raw) -> Result<Vec<Endpoint>, StorageError> {
    let mut out = Vec::new();
    raw.scan_records(
        cf::D2C_STATE,
        ENDPOINT_PREFIX,
        keys::prefix_end(ENDPOINT_PREFIX),
        |_, e: Endpoint| {
            out.push(e);
            true
        },
    )?;
    Ok(out)
}

/// The router's stored cursor (0 before anything was routed).
pub(crate) fn stored_cursor(raw: &Raw) -> Result<u64, StorageError> {
    Ok(raw.get_record(cf::D2C_STATE, ROUTER_CURSOR)?.unwrap_or(0))
}

fn validate_name(name: &str) -> Result<(), ValidationError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
        && !name.eq_ignore_ascii_case(BUILTIN_ENDPOINT);
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "endpoint",
            "must be 1 to 64 letters, digits, '-' or '_', and not 'events'",
        ))
    }
}

/// The first free range of `n` partitions at or above [`CUSTOM_BASE`].
fn allocate(existing: &[Endpoint], n: u16) -> Option<u16> {
    let mut used: Vec<(u16, u16)> = existing
        .iter()
        .map(|e| (e.slot.base, e.slot.base + e.slot.partitions))
        .collect();
    used.sort_unstable();
    let mut candidate = CUSTOM_BASE;
    for (start, end) in used {
        if candidate + n <= start {
            break;
        }
        candidate = candidate.max(end);
    }
    (candidate as u32 + n as u32 <= MAX_PARTITIONS as u32).then_some(candidate)
}

impl Store {
    /// The slot of an endpoint by name (`events` is the built-in one).
    pub fn endpoint_slot(&self, name: &str) -> Option<EndpointSlot> {
        if name == BUILTIN_ENDPOINT {
            return Some(self.partitions.builtin_slot());
        }
        self.partitions
            .custom
            .read()
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.slot)
    }

    /// The custom endpoints, by name.
    pub fn list_endpoints(&self) -> Vec<Endpoint> {
        let mut out = self.partitions.custom.read().clone();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Creates a custom endpoint with `partitions` partitions.
    ///
    /// # Errors
    /// [`D2cError::Invalid`] (name, count), [`D2cError::EndpointExists`],
    /// [`D2cError::NoPartitionSpace`], storage.
    pub fn create_endpoint(
        &self,
        name: &str,
        partitions: u16,
        now: UnixMillis,
    ) -> Result<Endpoint, D2cError> {
        self.create_endpoint_delivering(name, partitions, None, now)
    }

    /// Creates a custom endpoint whose events are also delivered to `delivery`.
    ///
    /// # Errors
    /// As [`Store::create_endpoint`], and [`D2cError::Invalid`] for a target's settings.
    pub fn create_endpoint_delivering(
        &self,
        name: &str,
        partitions: u16,
        delivery: Option<DeliveryTarget>,
        now: UnixMillis,
    ) -> Result<Endpoint, D2cError> {
        validate_name(name)?;
        if let Some(target) = &delivery {
            target.validate()?;
        }
        if !(1..=MAX_ENDPOINT_PARTITIONS).contains(&partitions) {
            return Err(ValidationError::new(
                "partitionCount",
                format!("must be 1 to {MAX_ENDPOINT_PARTITIONS}"),
            )
            .into());
        }
        let _guard = self.hub_lock.lock();
        let mut custom = self.partitions.custom.write();
        if custom.iter().any(|e| e.name == name) {
            return Err(D2cError::EndpointExists(name.to_string()));
        }
        let base = allocate(&custom, partitions).ok_or(D2cError::NoPartitionSpace(partitions))?;
        let endpoint = Endpoint {
            name: name.to_string(),
            slot: EndpointSlot {
                base,
                partitions,
                id: rand::random::<u64>() | 1,
            },
            created: now,
            delivery,
        };
        let mut batch = crate::raw::Batch::default();
        batch.put_record(cf::D2C_STATE, endpoint_key(name), &endpoint);
        self.raw.commit(batch)?;
        custom.push(endpoint.clone());
        Ok(endpoint)
    }

    /// Deletes a custom endpoint and its events, unless a route or enrichment names it.
    ///
    /// # Errors
    /// [`D2cError::NoSuchEndpoint`], [`D2cError::EndpointInUse`], storage.
    pub fn delete_endpoint(&self, name: &str) -> Result<(), D2cError> {
        // The routing configuration is changed under the same lock, so no route can start
        // naming the endpoint between this check and the deletion.
        let _guard = self.hub_lock.lock();
        let routing = self.routing_config()?;
        let user = routing
            .routes
            .iter()
            .find(|r| r.endpoints.iter().any(|e| e == name))
            .map(|r| format!("route {}", r.name))
            .or_else(|| {
                routing
                    .enrichments
                    .iter()
                    .find(|e| e.endpoints.iter().any(|n| n == name))
                    .map(|e| format!("enrichment {}", e.key))
            });
        if let Some(owner) = user {
            return Err(D2cError::EndpointInUse {
                endpoint: name.to_string(),
                owner,
            });
        }
        let mut custom = self.partitions.custom.write();
        let i = custom
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| D2cError::NoSuchEndpoint(name.to_string()))?;
        let slot = custom[i].slot;
        let mut batch = crate::raw::Batch::default();
        batch.delete(cf::D2C_STATE, endpoint_key(name));
        crate::delivery::stage_delete_cursors(&mut batch, name);
        self.stage_hide_partitions(&mut batch, slot.base..slot.base + slot.partitions);
        self.raw.commit(batch)?;
        custom.remove(i);
        Ok(())
    }

    /// The next sequence number to deliver from a global partition of `endpoint` (0 before
    /// anything was delivered).
    ///
    /// # Errors
    /// Storage errors.
    pub fn delivery_cursor(&self, endpoint: &str, partition: u16) -> Result<u64, StorageError> {
        Ok(self
            .raw
            .get_record(
                cf::D2C_STATE,
                &crate::delivery::cursor_key(endpoint, partition),
            )?
            .unwrap_or(0))
    }

    /// Moves a partition's delivery cursor to `next` (the sequence number after the last event
    /// the target accepted), unless it is already there or beyond.
    ///
    /// # Errors
    /// [`D2cError::NoSuchEndpoint`] when the endpoint is gone or has no target, storage.
    pub fn advance_delivery_cursor(
        &self,
        endpoint: &str,
        partition: u16,
        next: u64,
    ) -> Result<(), D2cError> {
        let _guard = self.hub_lock.lock();
        let delivered = self
            .list_endpoints()
            .into_iter()
            .any(|e| e.name == endpoint && e.delivery.is_some() && e.slot.contains(partition));
        if !delivered {
            return Err(D2cError::NoSuchEndpoint(endpoint.to_string()));
        }
        if self.delivery_cursor(endpoint, partition)? >= next {
            return Ok(());
        }
        let mut batch = crate::raw::Batch::default();
        batch.put_record(
            cf::D2C_STATE,
            crate::delivery::cursor_key(endpoint, partition),
            &next,
        );
        Ok(self.raw.commit(batch)?)
    }

    /// Sets (or with `None` removes) where a custom endpoint's events are delivered; its
    /// events stay. A removed target's delivery cursors go with it: a target set again later
    /// starts from the oldest event the endpoint still holds.
    ///
    /// # Errors
    /// [`D2cError::NoSuchEndpoint`], [`D2cError::Invalid`] for the target's settings, storage.
    pub fn set_endpoint_delivery(
        &self,
        name: &str,
        delivery: Option<DeliveryTarget>,
    ) -> Result<Endpoint, D2cError> {
        if let Some(target) = &delivery {
            target.validate()?;
        }
        let _guard = self.hub_lock.lock();
        let mut custom = self.partitions.custom.write();
        let endpoint = custom
            .iter_mut()
            .find(|e| e.name == name)
            .ok_or_else(|| D2cError::NoSuchEndpoint(name.to_string()))?;
        let mut changed = endpoint.clone();
        changed.delivery = delivery;
        let mut batch = crate::raw::Batch::default();
        batch.put_record(cf::D2C_STATE, endpoint_key(name), &changed);
        if changed.delivery.is_none() {
            crate::delivery::stage_delete_cursors(&mut batch, name);
        }
        self.raw.commit(batch)?;
        *endpoint = changed.clone();
        Ok(changed)
    }

    /// The next notification the router has not routed yet.
    ///
    /// # Errors
    /// Storage errors.
    pub fn router_cursor(&self) -> Result<u64, StorageError> {
        stored_cursor(&self.raw)
    }

    /// Appends the events routed from the notifications numbered `routed` (ascending), moves
    /// the router's cursor past the last of them, and deletes them, in one batch: durable when
    /// this returns if it appended an event, written (and synced within
    /// [`crate::LAG_SYNC_WITHIN`]) if not.
    ///
    /// # Errors
    /// Storage errors; then nothing is appended and the cursor stays.
    pub fn append_routed_notifications(
        &self,
        events: Vec<NewEvent>,
        now: UnixMillis,
        routed: &[u64],
    ) -> Result<Vec<Appended>, D2cError> {
        let Some(last) = routed.last() else {
            return Ok(Vec::new());
        };
        let routed_nowhere = events.is_empty();
        let (mut batch, out, guards) = self.stage_events(events, now)?;
        batch.put_record(cf::D2C_STATE, ROUTER_CURSOR.to_vec(), &(last + 1));
        // With no event appended the cursor may lag: after a machine crash the router reads
        // those notifications again and routes them nowhere again. Appended events are
        // synced, since readers see them and their sequence numbers.
        if routed_nowhere {
            batch.may_lag();
        }
        // Point deletes, not a range: every read of the change log fragments all the range
        // tombstones in the memtable, and one per router pass made each read cost more than the
        // last (27% of the hub's CPU under a connect storm, issue 19). The reader seeks past
        // these keys, so their tombstones cost it nothing.
        for &sequence in routed {
            batch.delete(cf::TWIN_CHANGES, crate::notifications::key(sequence));
        }
        let ticket = self.raw.submit(batch)?;
        drop(guards);
        ticket.wait()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(base: u16, partitions: u16) -> Endpoint {
        Endpoint {
            delivery: None,
            name: format!("e{base}"),
            slot: EndpointSlot {
                base,
                partitions,
                id: 1,
            },
            created: UnixMillis(0),
        }
    }

    #[test]
    fn allocation_takes_the_first_gap() {
        assert_eq!(allocate(&[], 4), Some(CUSTOM_BASE));
        assert_eq!(allocate(&[ep(32, 4)], 2), Some(36));
        assert_eq!(allocate(&[ep(36, 4)], 4), Some(32));
        assert_eq!(allocate(&[ep(36, 4)], 5), Some(40));
        assert_eq!(allocate(&[ep(32, 200)], 30), None);
        assert_eq!(allocate(&[ep(32, 200)], 24), Some(232));
    }
}
