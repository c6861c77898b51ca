//! The read API for device-to-cloud events (D2C-4, D2C-6), ServiceConnect at hub scope.
//! Documented in `docs/read-api.md`.
//!
//! - `GET /events/partitions`, `GET /events/partitions/{p}`
//! - `GET /events/consumergroups`, `PUT|DELETE /events/consumergroups/{group}`
//! - `GET /events/consumergroups/{group}/partitions/{p}/messages?from=...&max=...&timeout=...`
//! - `GET|PUT /events/consumergroups/{group}/partitions/{p}/checkpoint`
//!
//! Every partition path also exists under `/endpoints/{name}/` for a custom endpoint (EVT-6):
//! partition ids are the endpoint's own (0-based); consumer groups are hub-wide.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ferrohub_engine::d2c::{
    Checkpoint, D2cError, D2cEvent, EndpointSlot, PartitionInfo, ReadPosition,
};
use ferrohub_engine::{StorageError, UnixMillis};
use serde::{Deserialize, Serialize};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Rejection};

use super::error::ApiError;
use super::identity_json::format_time;
use super::reply::{json, json_with_status, no_content, one_of, Handled, Response};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};

/// Most events one read returns.
const MAX_BATCH: usize = 1000;
/// Longest long-poll.
const MAX_WAIT: Duration = Duration::from_secs(60);

fn time_ms(t: UnixMillis) -> String {
    chrono::DateTime::from_timestamp_millis(t.0)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartitionJson {
    partition_id: String,
    begin_sequence_number: u64,
    last_enqueued_sequence_number: Option<u64>,
    last_enqueued_offset: Option<String>,
    last_enqueued_time_utc: Option<String>,
    is_empty: bool,
}

impl PartitionJson {
    /// With the partition id as the endpoint numbers it.
    fn local(p: PartitionInfo, slot: EndpointSlot) -> Self {
        PartitionJson {
            partition_id: (p.partition - slot.base).to_string(),
            begin_sequence_number: p.begin_sequence_number,
            last_enqueued_sequence_number: p.last_enqueued_sequence_number,
            last_enqueued_offset: p.last_enqueued_offset.map(|o| o.to_string()),
            last_enqueued_time_utc: p.last_enqueued_time.map(time_ms),
            is_empty: p.is_empty,
        }
    }
}

/// An event as the read API shows it (also the console's hub-wide stream).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EventJson {
    partition_id: String,
    sequence_number: u64,
    offset: String,
    enqueued_time_utc: String,
    system_properties: BTreeMap<String, String>,
    properties: BTreeMap<String, String>,
    /// The body, base64.
    body: String,
}

impl From<D2cEvent> for EventJson {
    fn from(e: D2cEvent) -> Self {
        let mut system: BTreeMap<String, String> = e.system_properties.into_iter().collect();
        system.insert("iothub-enqueuedtime".into(), time_ms(e.enqueued_time));
        EventJson {
            partition_id: e.partition.to_string(),
            sequence_number: e.sequence_number,
            offset: e.offset.to_string(),
            enqueued_time_utc: time_ms(e.enqueued_time),
            system_properties: system,
            properties: e.application_properties.into_iter().collect(),
            body: B64.encode(&e.body),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReadQuery {
    from: Option<String>,
    sequence_number: Option<u64>,
    offset: Option<String>,
    enqueued_time_utc: Option<String>,
    max: Option<usize>,
    timeout: Option<u64>,
}

impl ReadQuery {
    fn position(&self) -> Result<ReadPosition, ApiError> {
        let given = [
            self.from.is_some(),
            self.sequence_number.is_some(),
            self.offset.is_some(),
            self.enqueued_time_utc.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(ApiError::argument(
                "give only one of from, sequenceNumber, offset, enqueuedTimeUtc",
            ));
        }
        if let Some(s) = self.sequence_number {
            return Ok(ReadPosition::Sequence(s));
        }
        if let Some(o) = &self.offset {
            return o
                .parse()
                .map(ReadPosition::Offset)
                .map_err(|_| ApiError::argument(format!("offset {o:?} is not a number")));
        }
        if let Some(t) = &self.enqueued_time_utc {
            let dt = chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| ApiError::argument(format!("enqueuedTimeUtc {t:?}: {e}")))?;
            return Ok(ReadPosition::EnqueuedTime(UnixMillis(
                dt.timestamp_millis(),
            )));
        }
        match self.from.as_deref() {
            None | Some("start") => Ok(ReadPosition::Start),
            Some("end") => Ok(ReadPosition::End),
            Some(other) => Err(ApiError::argument(format!(
                "from must be start or end, not {other:?}"
            ))),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CheckpointJson {
    sequence_number: u64,
    offset: String,
    #[serde(default, skip_deserializing)]
    updated_time_utc: String,
}

fn require_service(p: &Principal) -> Result<(), ApiError> {
    Ok(p.require_hub(Permission::ServiceConnect)?)
}

/// For a ServiceConnect caller (checked first, so a stranger learns nothing of partitions),
/// the global partition of an endpoint's partition id.
fn service_partition(p: &Principal, slot: EndpointSlot, id: &PathId) -> Result<u16, ApiError> {
    require_service(p)?;
    partition_id(slot, id)
}

/// The global partition of an endpoint's partition id.
fn partition_id(slot: EndpointSlot, p: &PathId) -> Result<u16, ApiError> {
    p.0.parse::<u16>()
        .ok()
        .filter(|local| *local < slot.partitions)
        .map(|local| slot.base + local)
        .ok_or(ApiError::Events(D2cError::NoSuchPartition(u16::MAX)))
}

/// `/events/...` (the built-in endpoint) or `/endpoints/{name}/...` (a custom one).
fn endpoint(ctx: Context) -> impl Filter<Extract = (EndpointSlot,), Error = Rejection> + Clone {
    let builtin = {
        let ctx = ctx.clone();
        warp::path("events").and_then(move || {
            let store = ctx.store.clone();
            async move {
                store
                    .run(|s| {
                        Ok::<_, StorageError>(
                            s.endpoint_slot(ferrohub_engine::endpoints::BUILTIN_ENDPOINT),
                        )
                    })
                    .await
                    .map_err(|e| warp::reject::custom(ApiError::Storage(e)))?
                    .ok_or_else(warp::reject::not_found)
            }
        })
    };
    let custom = warp::path("endpoints")
        .and(warp::path::param::<PathId>())
        .and_then(move |name: PathId| {
            let store = ctx.store.clone();
            async move {
                let n = name.0.clone();
                store
                    .run(move |s| Ok::<_, StorageError>(s.endpoint_slot(&n)))
                    .await
                    .map_err(|e| warp::reject::custom(ApiError::Storage(e)))?
                    .ok_or_else(|| {
                        warp::reject::custom(ApiError::Events(D2cError::NoSuchEndpoint(name.0)))
                    })
            }
        });
    builtin.or(custom).unify()
}

/// The read API's route table: path (under an endpoint or not), method, inputs, handler.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let at_endpoint = || endpoint(ctx.clone());
    let group = || warp::path!("events" / "consumergroups" / PathId);
    let checkpoint = || warp::path!("consumergroups" / PathId / "partitions" / PathId / "checkpoint");
    let messages = warp::path!("consumergroups" / PathId / "partitions" / PathId / "messages");
    one_of([
        at_endpoint().and(warp::path!("partitions")).and(warp::get()).and(caller()).then(list_partitions_handler).boxed(),
        at_endpoint().and(warp::path!("partitions" / PathId)).and(warp::get()).and(caller()).then(get_partition_handler).boxed(),
        warp::path!("events" / "consumergroups").and(warp::get()).and(caller()).then(list_groups_handler).boxed(),
        group().and(warp::put()).and(caller()).then(create_group_handler).boxed(),
        group().and(warp::delete()).and(caller()).then(delete_group_handler).boxed(),
        at_endpoint().and(messages).and(warp::get()).and(warp::query()).and(caller()).then(read_handler).boxed(),
        at_endpoint().and(checkpoint()).and(warp::get()).and(caller()).then(get_checkpoint_handler).boxed(),
        at_endpoint().and(checkpoint()).and(warp::put()).and(caller()).and(json_body()).then(put_checkpoint_handler).boxed(),
    ])
}

async fn list_partitions_handler(slot: EndpointSlot, ctx: Context, p: Principal) -> Handled {
    require_service(&p)?;
    let infos = ctx
        .store
        .run(move |s| {
            (slot.base..slot.base + slot.partitions)
                .map(|i| s.partition_info(i))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
    Ok(json(
        &infos
            .into_iter()
            .map(|i| PartitionJson::local(i, slot))
            .collect::<Vec<_>>(),
    ))
}

async fn get_partition_handler(
    slot: EndpointSlot,
    id: PathId,
    ctx: Context,
    p: Principal,
) -> Handled {
    let pid = service_partition(&p, slot, &id)?;
    let info = ctx.store.run(move |s| s.partition_info(pid)).await?;
    Ok(json(&PartitionJson::local(info, slot)))
}

async fn list_groups_handler(ctx: Context, p: Principal) -> Handled {
    require_service(&p)?;
    Ok(json(&ctx.store.run(|s| s.list_consumer_groups()).await?))
}

async fn create_group_handler(g: PathId, ctx: Context, p: Principal) -> Handled {
    require_service(&p)?;
    let call = crate::hub::calls::CreateConsumerGroup {
        name: g.0.clone(),
        now: ctx.clock.now(),
    };
    ctx.write(call).await?;
    Ok(json_with_status(
        &serde_json::json!({ "name": g.0 }),
        StatusCode::CREATED,
    ))
}

async fn delete_group_handler(g: PathId, ctx: Context, p: Principal) -> Handled {
    require_service(&p)?;
    ctx.write(crate::hub::calls::DeleteConsumerGroup { name: g.0 })
        .await?;
    Ok(no_content())
}

async fn get_checkpoint_handler(
    slot: EndpointSlot,
    g: PathId,
    id: PathId,
    ctx: Context,
    p: Principal,
) -> Handled {
    let pid = service_partition(&p, slot, &id)?;
    match ctx.store.run(move |s| s.get_checkpoint(&g.0, pid)).await? {
        Some(c) => Ok(json(&CheckpointJson {
            sequence_number: c.sequence_number,
            offset: c.offset.to_string(),
            updated_time_utc: format_time(Some(c.updated)),
        })),
        None => Err(ApiError::NotFound("no checkpoint stored".into())),
    }
}

async fn put_checkpoint_handler(
    slot: EndpointSlot,
    g: PathId,
    id: PathId,
    ctx: Context,
    p: Principal,
    body: CheckpointJson,
) -> Handled {
    let pid = service_partition(&p, slot, &id)?;
    let offset = body
        .offset
        .parse()
        .map_err(|_| ApiError::argument("offset must be a number"))?;
    let cp = Checkpoint {
        sequence_number: body.sequence_number,
        offset,
        updated: ctx.clock.now(),
    };
    let call = crate::hub::calls::SetCheckpoint {
        group: g.0,
        partition: pid,
        checkpoint: cp,
    };
    ctx.write(call).await?;
    Ok(no_content())
}

fn read_body(slot: EndpointSlot, pid: u16, events: Vec<D2cEvent>) -> serde_json::Value {
    let next = events.last().map(|e| e.sequence_number + 1);
    let local = (pid - slot.base).to_string();
    let events: Vec<EventJson> = events
        .into_iter()
        .map(|e| EventJson {
            partition_id: local.clone(),
            ..EventJson::from(e)
        })
        .collect();
    serde_json::json!({
        "partitionId": local,
        "events": events,
        "nextSequenceNumber": next,
    })
}

/// A batch read; with `timeout` (seconds) it waits for events when there are none yet.
async fn read_handler(
    slot: EndpointSlot,
    group: PathId,
    id: PathId,
    q: ReadQuery,
    ctx: Context,
    p: Principal,
) -> Handled {
    let pid = service_partition(&p, slot, &id)?;
    let max = q.max.unwrap_or(100).clamp(1, MAX_BATCH);
    let wait = Duration::from_secs(q.timeout.unwrap_or(0)).min(MAX_WAIT);
    let g = group.0.clone();
    ctx.store
        .run(move |s| s.get_checkpoint(&g, pid).map(drop))
        .await?;
    let mut position = q.position()?;
    if position == ReadPosition::End {
        position =
            ReadPosition::Sequence(ctx.store.run(move |s| s.next_sequence_number(pid)).await?);
    }
    let mut watch = ctx
        .d2c
        .subscribe(pid)
        .ok_or(ApiError::Events(D2cError::NoSuchPartition(pid)))?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let events = ctx
            .store
            .run(move |s| s.read_events(pid, position, max))
            .await?;
        let done = !events.is_empty() || tokio::time::Instant::now() >= deadline;
        if done {
            return Ok(json(&read_body(slot, pid, events)));
        }
        // Wake on the next durable append to this partition, or give up at the deadline.
        // A closed channel (the node is stopping) ends the wait: read once more, answer.
        if let Ok(Err(_)) = tokio::time::timeout_at(deadline, watch.changed()).await {
            let events = ctx
                .store
                .run(move |s| s.read_events(pid, position, max))
                .await?;
            return Ok(json(&read_body(slot, pid, events)));
        }
    }
}
