//! Event Hubs receiver links (AMQ-4): a client's receiver on
//! `{entity}/ConsumerGroups/{group}/Partitions/{p}` gets the partition's events from the
//! position its selector filter names, in sequence order, then each new event as it becomes
//! durable.
//!
//! # Invariants
//! - Deliveries are sent settled (Event Hubs has no per-event acknowledgement: readers keep
//!   their own position) and only against the credit the client grants, so prefetch is the
//!   client's link credit and the hub holds at most one read batch per link.
//! - Events go out in sequence order without gaps: each read starts right after the last
//!   event sent.
//! - A link is served only while the connection's claim allows ServiceConnect and while its
//!   reader holds the partition (`hub::partition_readers`): a reader with a higher or equal
//!   owner level detaches it with `amqp:link:stolen`.

use fe2o3_amqp::link::Sender;
use fe2o3_amqp::types::definitions::{AmqpError, Error, ErrorCondition, LinkError};
use fe2o3_amqp::types::messaging::FilterSet;
use fe2o3_amqp::types::performatives::Attach;
use fe2o3_amqp::types::primitives::{Symbol, Value};
use ferrohub_engine::d2c::ReadPosition;

use super::address::PartitionAddress;
use super::claims::Claims;
use super::entity::{consumer_group, entity, EntityError};
use super::errors;
use super::event_message::event_message;
use super::selector;
use crate::auth::Permission;
use crate::hub::partition_readers::ReaderRefusal;
use crate::hub::HubContext;

/// Events read from the engine at a time for one link.
const READ_BATCH: usize = 256;
/// The link property carrying a receiver's owner level.
const EPOCH: &str = "com.microsoft:epoch";

/// What a receiver's attach asks for, taken from the attach before it is answered.
#[derive(Debug)]
pub struct PartitionRequest {
    pub address: PartitionAddress,
    filter: Option<FilterSet>,
    owner_level: Option<i64>,
}

impl PartitionRequest {
    pub fn of(address: PartitionAddress, attach: &Attach) -> PartitionRequest {
        let filter = attach.source.as_ref().and_then(|s| s.filter.clone());
        let owner_level = attach
            .properties
            .as_ref()
            .and_then(|p| p.get(&Symbol::from(EPOCH)))
            .and_then(|v| match v {
                Value::Long(l) => Some(*l),
                Value::Int(i) => Some(i64::from(*i)),
                Value::Uint(u) => Some(i64::from(*u)),
                Value::Ulong(u) => i64::try_from(*u).ok(),
                _ => None,
            });
        PartitionRequest {
            address,
            filter,
            owner_level,
        }
    }

    fn shown(&self) -> String {
        let a = &self.address;
        format!(
            "{}/ConsumerGroups/{}/Partitions/{}",
            a.entity, a.group, a.partition
        )
    }
}

fn plain_error(condition: impl Into<ErrorCondition>, description: String) -> Error {
    Error::new(condition, description, None)
}

fn entity_error(e: EntityError) -> Error {
    match e {
        EntityError::Storage(s) => errors::internal(&s.to_string()),
        other => plain_error(AmqpError::NotFound, other.to_string()),
    }
}

fn refusal_error(r: ReaderRefusal) -> Error {
    match r {
        ReaderRefusal::Stolen(m) => plain_error(LinkError::Stolen, m),
        limit @ ReaderRefusal::TooManyReaders { .. } => {
            plain_error(AmqpError::ResourceLimitExceeded, limit.to_string())
        }
    }
}

/// Serves one receiver link until the client detaches it, its claim lapses, another reader
/// takes the partition, or the node stops.
pub async fn serve(mut link: Sender, request: PartitionRequest, ctx: HubContext, claims: Claims) {
    if let Err(e) = serve_link(&mut link, &request, &ctx, &claims).await {
        tracing::debug!(link = %request.shown(), error = ?e, "Event Hubs receiver detached");
        let _ = link.close_with_error(e).await;
    } else {
        let _ = link.close().await;
    }
}

/// Returns `Ok` when the client went away, `Err` with the error to detach with otherwise.
async fn serve_link(
    link: &mut Sender,
    request: &PartitionRequest,
    ctx: &HubContext,
    claims: &Claims,
) -> Result<(), Error> {
    let authorised = || {
        claims
            .check(Permission::ServiceConnect, ctx.auth.now_secs())
            .map_err(|reason| errors::unauthorized(&reason))
    };
    authorised()?;
    let found = entity(ctx, &request.address.entity)
        .await
        .map_err(entity_error)?;
    let group = consumer_group(ctx, &found, &request.address.group)
        .await
        .map_err(entity_error)?;
    let partition = found
        .partition(&request.address.partition)
        .map_err(entity_error)?;
    let mut position = selector::start_position(request.filter.as_ref())
        .map_err(|m| plain_error(AmqpError::InvalidField, m))?;
    let mut lease = ctx
        .admit_reader(partition, &group, request.owner_level, &request.shown())
        .await
        .map_err(refusal_error)?;
    let mut appended = ctx
        .d2c
        .subscribe(partition)
        .ok_or_else(|| errors::internal("the partition has no notifier"))?;
    if position == ReadPosition::End {
        position = ReadPosition::Sequence(
            ctx.store
                .run(move |s| s.next_sequence_number(partition))
                .await
                .map_err(|e| errors::internal(&e.to_string()))?,
        );
    }
    if let ReadPosition::Sequence(next) = position {
        lease.sent_up_to(next);
    }
    tracing::debug!(link = %request.shown(), ?position, owner_level = ?request.owner_level, "Event Hubs receiver attached");
    loop {
        authorised()?;
        // Seen before reading, so an append after the read wakes the wait below.
        appended.borrow_and_update();
        let from = position;
        let events = ctx
            .store
            .run(move |s| s.read_events(partition, from, READ_BATCH))
            .await
            .map_err(|e| errors::internal(&e.to_string()))?;
        let Some(last) = events.last() else {
            tokio::select! {
                changed = appended.changed() => if changed.is_err() {
                    // The node is stopping.
                    return Ok(());
                },
                lost = lease.lost() => return Err(refusal_error(lost)),
                _ = link.on_detach() => return Ok(()),
            }
            continue;
        };
        position = ReadPosition::Sequence(last.sequence_number + 1);
        for event in &events {
            // Waits for credit: the client's prefetch bounds what is in flight. Batchable, so
            // the transfer carries all its fields and goes out as written (`full_fields`);
            // settled, so there is no outcome to wait for.
            tokio::select! {
                sent = link.send_batchable(event_message(event)) => if let Err(e) = sent {
                    tracing::debug!(error = %e, "Event Hubs receiver link ended");
                    return Ok(());
                },
                lost = lease.lost() => return Err(refusal_error(lost)),
            }
            lease.sent_up_to(event.sequence_number + 1);
        }
    }
}
