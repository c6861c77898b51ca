//! `GET /console/api/stream`: the built-in endpoint's events from every partition in one long
//! poll, for the console's hub-wide live view (what `az iot hub monitor-events` shows: device
//! messages, and the hub's events that routes send to `events`). A browser keeps at most six
//! connections to the hub, so one poll for all partitions instead of one per partition.
//!
//! # Invariants
//! - A cursor is the next sequence number of each built-in partition, in partition order
//!   (`"12,0,7,3"`). An answer's cursor moves past every event it holds and every event the
//!   device filter left out, so polling with it neither repeats nor misses an event (only what
//!   retention deleted in between is gone).
//! - Without a cursor the answer holds no event and its cursor is every partition's end: a
//!   view starts with what arrives next.
//! - A request waits at most [`MAX_WAIT`] for an append to any partition; the events of one
//!   answer come in enqueued-time order.
//! - ServiceConnect, as the read API.

use std::time::Duration;

use ferrohub_engine::d2c::{D2cError, D2cEvent, ReadPosition};
use futures::future::select_all;
use serde::Deserialize;
use serde_json::json;

use crate::auth::{Permission, Principal};
use crate::rest::error::ApiError;
use crate::rest::events::EventJson;
use crate::rest::reply::{json as json_reply, Handled};
use crate::rest::Context;

/// The longest one request waits for events.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Events read per partition per pass.
const PER_PARTITION: usize = 100;
/// The system property that names the sending device.
const DEVICE_ID: &str = "iothub-connection-device-id";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamQuery {
    cursor: Option<String>,
    /// Only this device's events.
    device_id: Option<String>,
    /// Seconds to wait when nothing is there yet (0: answer at once).
    timeout: Option<u64>,
}

pub async fn stream_handler(q: StreamQuery, ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::ServiceConnect)?;
    let count = ctx
        .store
        .run(|s| Ok::<_, ApiError>(s.partition_count()))
        .await?;
    let Some(text) = q.cursor else {
        let ends = ctx
            .store
            .run(move |s| {
                (0..count)
                    .map(|p| s.next_sequence_number(p))
                    .collect::<Result<Vec<u64>, D2cError>>()
            })
            .await?;
        return Ok(json_reply(&json!({"events": [], "cursor": encode(&ends)})));
    };
    let mut cursor = parse(&text, count)?;
    let wait = Duration::from_secs(q.timeout.unwrap_or(0)).min(MAX_WAIT);
    // Subscribed before the first read: an append after it wakes the wait.
    let mut watches: Vec<_> = (0..count).filter_map(|p| ctx.d2c.subscribe(p)).collect();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let (events, next) = read_all(&ctx, cursor, q.device_id.clone()).await?;
        cursor = next;
        if !events.is_empty() || tokio::time::Instant::now() >= deadline || watches.is_empty() {
            return Ok(answer(events, &cursor));
        }
        let any = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        match tokio::time::timeout_at(deadline, any).await {
            // The node is stopping: answer with what there is.
            Ok((Err(_), _, _)) => return Ok(answer(Vec::new(), &cursor)),
            Ok((Ok(()), _, _)) | Err(_) => {}
        }
    }
}

/// Every partition read once from its cursor: the events kept and the cursor past all read.
async fn read_all(
    ctx: &Context,
    cursor: Vec<u64>,
    device_id: Option<String>,
) -> Result<(Vec<D2cEvent>, Vec<u64>), ApiError> {
    ctx.store
        .run(move |s| {
            let mut next = cursor;
            let mut kept = Vec::new();
            for (partition, position) in next.iter_mut().enumerate() {
                let read = s.read_events(
                    partition as u16,
                    ReadPosition::Sequence(*position),
                    PER_PARTITION,
                )?;
                if let Some(last) = read.last() {
                    *position = last.sequence_number + 1;
                }
                kept.extend(read.into_iter().filter(|e| {
                    device_id.as_deref().is_none_or(|wanted| {
                        e.system_properties
                            .iter()
                            .any(|(k, v)| k == DEVICE_ID && v == wanted)
                    })
                }));
            }
            kept.sort_by_key(|e| (e.enqueued_time, e.partition, e.sequence_number));
            Ok::<_, D2cError>((kept, next))
        })
        .await
        .map_err(ApiError::from)
}

fn answer(events: Vec<D2cEvent>, cursor: &[u64]) -> warp::reply::Response {
    let events: Vec<EventJson> = events.into_iter().map(EventJson::from).collect();
    json_reply(&json!({"events": events, "cursor": encode(cursor)}))
}

fn encode(cursor: &[u64]) -> String {
    cursor
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse(text: &str, count: u16) -> Result<Vec<u64>, ApiError> {
    let cursor: Vec<u64> = text
        .split(',')
        .map(|n| n.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| ApiError::format("cursor: comma-separated sequence numbers"))?;
    if cursor.len() != usize::from(count) {
        return Err(ApiError::argument(format!(
            "cursor: {} sequence numbers for {count} partitions",
            cursor.len()
        )));
    }
    Ok(cursor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_a_wrong_one_is_refused() {
        assert_eq!(
            parse(&encode(&[12, 0, 7, 3]), 4).expect("parses"),
            vec![12, 0, 7, 3]
        );
        assert!(parse("1,2,3", 4).is_err());
        assert!(parse("1,x,3,4", 4).is_err());
        assert!(parse("", 1).is_err());
    }
}
