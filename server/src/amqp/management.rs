//! The `$management` node as Event Hubs serves it to its clients (`get_eventhub_properties`,
//! `get_partition_properties`, and the partition list every consumer starts with).
//!
//! A request is a message with application properties `operation` = `READ`, `type` =
//! `com.microsoft:eventhub` or `com.microsoft:partition`, `name` (the entity), `partition`
//! (for the second), and `security_token` (a SAS token; without one, the connection's CBS
//! claim must allow ServiceConnect). The reply (see `replies`) carries a map body:
//! - eventhub: `name`, `type`, `created_at` (timestamp), `partition_count` (int),
//!   `partition_ids` (array of strings);
//! - partition: `name`, `type`, `partition`, `begin_sequence_number`,
//!   `last_enqueued_sequence_number` (longs, -1 before the first event),
//!   `last_enqueued_offset` (string, "-1" before the first event), `last_enqueued_time_utc`
//!   (timestamp, the epoch before the first event), `is_partition_empty` (bool).

use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::messaging::{Body, Message};
use fe2o3_amqp::types::primitives::{Array, OrderedMap, SimpleValue, Timestamp, Value};
use ferrohub_engine::d2c::PartitionInfo;

use super::claims::Claims;
use super::entity::{entity, Entity, EntityError};
use super::replies::{application_property, correlation_of, reply, Replies};
use crate::auth::Permission;
use crate::hub::{AuthFailure, HubContext};

const EVENTHUB_TYPE: &str = "com.microsoft:eventhub";
const PARTITION_TYPE: &str = "com.microsoft:partition";

/// A refused request: status code and description.
type Refusal = (i32, String);

/// Serves the client's sender link to `$management` until it closes.
pub async fn serve_requests(mut link: Receiver, replies: Replies, ctx: HubContext, claims: Claims) {
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "$management request link ended");
                break;
            }
        };
        let request = delivery.message();
        let answer = match authorise(request, &ctx, &claims).await {
            Ok(()) => read(request, &ctx).await,
            Err(refusal) => Err(refusal),
        };
        let correlation_id = correlation_of(request);
        if link.accept(&delivery).await.is_err() {
            break;
        }
        let message = match answer {
            Ok(body) => reply(correlation_id, 200, "OK", body),
            Err((status, description)) => {
                tracing::debug!(status, %description, "$management request refused");
                let mut refused = reply(correlation_id, status, &description, Value::Null);
                // pyamqp's management link reads the description under this name.
                if let Some(application) = refused.application_properties.as_mut() {
                    application.0.insert(
                        "statusDescription".to_string(),
                        SimpleValue::String(description),
                    );
                }
                refused
            }
        };
        replies.send(message).await;
    }
    let _ = link.close().await;
}

/// The request's own token if it has one, else the connection's claim.
async fn authorise(
    request: &Message<Body<Value>>,
    ctx: &HubContext,
    claims: &Claims,
) -> Result<(), Refusal> {
    let Some(token) = application_property(request, "security_token") else {
        return claims
            .check(Permission::ServiceConnect, ctx.auth.now_secs())
            .map_err(|reason| (401, reason));
    };
    match ctx.auth.service_claim(token).await {
        Ok(claim) => claim
            .principal
            .require_hub(Permission::ServiceConnect)
            .map_err(|e| (401, e.to_string())),
        Err(AuthFailure::Refused(reason)) => Err((401, reason.to_string())),
        Err(AuthFailure::Unavailable(e)) => Err((500, e.to_string())),
    }
}

fn refusal(e: EntityError) -> Refusal {
    match e {
        EntityError::Storage(s) => (500, s.to_string()),
        other => (404, other.to_string()),
    }
}

async fn read(request: &Message<Body<Value>>, ctx: &HubContext) -> Result<Value, Refusal> {
    match application_property(request, "operation") {
        Some("READ") => {}
        other => {
            return Err((
                400,
                format!("operation {other:?} is not supported; $management answers READ"),
            ))
        }
    }
    let name = application_property(request, "name").ok_or_else(|| {
        (
            400,
            "the request names no entity (application property name)".into(),
        )
    })?;
    let found = entity(ctx, name).await.map_err(refusal)?;
    match application_property(request, "type") {
        Some(EVENTHUB_TYPE) => Ok(eventhub_properties(&found)),
        Some(PARTITION_TYPE) => {
            let id = application_property(request, "partition").ok_or_else(|| {
                (
                    400,
                    "the request names no partition (application property partition)".into(),
                )
            })?;
            let partition = found.partition(id).map_err(refusal)?;
            let info = ctx
                .store
                .run(move |s| s.partition_info(partition))
                .await
                .map_err(|e| refusal(e.into()))?;
            Ok(partition_properties(&found, id, &info))
        }
        other => Err((
            400,
            format!("type {other:?} is not supported; use {EVENTHUB_TYPE} or {PARTITION_TYPE}"),
        )),
    }
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    let map: OrderedMap<Value, Value> = entries
        .into_iter()
        .map(|(k, v)| (Value::String(k.to_string()), v))
        .collect();
    Value::Map(map)
}

fn eventhub_properties(e: &Entity) -> Value {
    let ids = e.partition_ids().into_iter().map(Value::String).collect();
    map(vec![
        ("name", Value::String(e.name.clone())),
        ("type", Value::String(EVENTHUB_TYPE.into())),
        (
            "created_at",
            Value::Timestamp(Timestamp::from_milliseconds(e.created.0)),
        ),
        ("partition_count", Value::Int(i32::from(e.slot.partitions))),
        ("partition_ids", Value::Array(Array(ids))),
    ])
}

fn partition_properties(e: &Entity, id: &str, info: &PartitionInfo) -> Value {
    let last_sequence = info.last_enqueued_sequence_number.map_or(-1, |s| s as i64);
    let last_offset = info
        .last_enqueued_offset
        .map_or_else(|| "-1".to_string(), |o| o.to_string());
    let last_time = info.last_enqueued_time.map_or(0, |t| t.0);
    map(vec![
        ("name", Value::String(e.name.clone())),
        ("type", Value::String(PARTITION_TYPE.into())),
        ("partition", Value::String(id.to_string())),
        (
            "begin_sequence_number",
            Value::Long(info.begin_sequence_number as i64),
        ),
        ("last_enqueued_sequence_number", Value::Long(last_sequence)),
        ("last_enqueued_offset", Value::String(last_offset)),
        (
            "last_enqueued_time_utc",
            Value::Timestamp(Timestamp::from_milliseconds(last_time)),
        ),
        ("is_partition_empty", Value::Bool(info.is_empty)),
    ])
}
