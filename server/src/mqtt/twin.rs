//! Twin operations over MQTT (TWN-4, MQT-10, `compat` §A7): GET and reported PATCH requests
//! answered on `$iothub/twin/res/{status}/?$rid={rid}[&$version={v}]`, and the desired-patch
//! notification topic. Responses go to the requesting session whether or not it subscribed to
//! `$iothub/twin/res/#` (the SDK's first GET may come before its subscription).
//!
//! A request over its throttle is answered 429 (the daily quota used up, 403) and changes
//! nothing.
//!
//! A request's answer is produced by a future queued behind the connection's earlier work, so
//! answers keep the order of requests. A failure is an error status to the device, never a
//! closed connection.

use ferrohub_engine::TwinError;
use mqtt::packet::{PubackPacket, PublishPacket, QoSWithPacketIdentifier, VariablePacket};
use mqtt::TopicName;
use serde_json::{Map, Value};

use super::topics::Identity;
use crate::hub::throttle::Operation;
use crate::hub::HubContext;

/// Packets to send, in order, once a queued piece of work completes.
pub type Packets = Vec<VariablePacket>;

fn publish(topic: String, body: Vec<u8>) -> Option<VariablePacket> {
    let topic = TopicName::new(topic).ok()?;
    Some(PublishPacket::new(topic, QoSWithPacketIdentifier::Level0, body).into())
}

/// `$iothub/twin/res/{status}/?$rid={rid}[&$version={v}]`, the `/` before `?` kept.
pub fn response_topic(status: u16, rid: &str, version: Option<u64>) -> String {
    let rid = percent_encoding::utf8_percent_encode(rid, percent_encoding::NON_ALPHANUMERIC);
    match version {
        Some(v) => format!("$iothub/twin/res/{status}/?$rid={rid}&$version={v}"),
        None => format!("$iothub/twin/res/{status}/?$rid={rid}"),
    }
}

/// The desired-patch notification: topic and body (the change as sent, with `$version`).
pub fn desired_notification(version: u64, body: Vec<u8>) -> Option<VariablePacket> {
    publish(
        format!("$iothub/twin/PATCH/properties/desired/?$version={version}"),
        body,
    )
}

/// A section's members with `$version`, as the device SDK expects them (no `$metadata`).
fn section(body: &Map<String, Value>, version: u64) -> Value {
    let mut out = body.clone();
    out.insert("$version".into(), Value::from(version));
    Value::Object(out)
}

/// The REST status of the same failure (`crate::error_codes`), so both protocols agree.
fn status_of(e: &TwinError) -> u16 {
    crate::error_codes::twin(e).0.as_u16()
}

fn answer(pkid: Option<u16>, topic: String, body: Vec<u8>) -> Packets {
    let mut out: Packets = pkid
        .map(|id| PubackPacket::new(id).into())
        .into_iter()
        .collect();
    out.extend(publish(topic, body));
    out
}

/// Admits a twin operation under its throttle (429 on excess) and the daily quota (403 when
/// used up), or the answer refusing it.
async fn refusal(
    ctx: &HubContext,
    op: Operation,
    bytes: usize,
    rid: &str,
    pkid: Option<u16>,
) -> Option<Packets> {
    let (status, body) = ctx
        .throttles
        .refuse_twin_operation(op, bytes, ctx.clock.now())
        .await?;
    Some(answer(
        pkid,
        response_topic(status, rid, None),
        body.to_string().into_bytes(),
    ))
}

/// `$iothub/twin/GET/?$rid=`: `{"desired": {...}, "reported": {...}}` with status 200.
pub async fn get(ctx: HubContext, who: Identity, rid: String, pkid: Option<u16>) -> Packets {
    if let Some(refused) = refusal(&ctx, Operation::TwinRead, 0, &rid, pkid).await {
        return refused;
    }
    let result = ctx
        .store
        .run(move |s| s.get_twin(&who.device_id, who.module_id.as_deref()))
        .await;
    match result {
        Ok(t) => {
            let body = serde_json::json!({
                "desired": section(&t.record.desired.body, t.record.desired.version),
                "reported": section(&t.record.reported.body, t.record.reported.version),
            });
            answer(
                pkid,
                response_topic(200, &rid, None),
                body.to_string().into_bytes(),
            )
        }
        Err(e) => answer(
            pkid,
            response_topic(status_of(&e), &rid, None),
            e.to_string().into_bytes(),
        ),
    }
}

/// `$iothub/twin/PATCH/properties/reported/?$rid=`: 204 with the new reported `$version`, or
/// 400 for a body that is not a JSON object or breaks a limit (nothing stored).
pub async fn patch_reported(
    ctx: HubContext,
    who: Identity,
    rid: String,
    payload: Vec<u8>,
    pkid: Option<u16>,
) -> Packets {
    if let Some(refused) = refusal(&ctx, Operation::TwinUpdate, payload.len(), &rid, pkid).await {
        return refused;
    }
    let patch = match serde_json::from_slice::<Value>(&payload) {
        Ok(Value::Object(m)) => m,
        _ => {
            return answer(
                pkid,
                response_topic(400, &rid, None),
                b"the reported patch must be a JSON object".to_vec(),
            )
        }
    };
    let now = ctx.clock.now();
    // Checked, applied and queued on the blocking pool; the answer waits for the sync without
    // holding a thread or the device's lock, so the device's next patch can share that sync.
    let call = crate::hub::calls::PatchReported::by(&who, patch, now);
    let result = ctx.write(call).await;
    match result {
        Ok(version) => answer(pkid, response_topic(204, &rid, Some(version)), Vec::new()),
        Err(e) => answer(
            pkid,
            response_topic(status_of(&e), &rid, None),
            e.to_string().into_bytes(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_keep_the_slash_and_encode_the_rid() {
        assert_eq!(
            response_topic(200, "abc", None),
            "$iothub/twin/res/200/?$rid=abc"
        );
        assert_eq!(
            response_topic(204, "a/b", Some(7)),
            "$iothub/twin/res/204/?$rid=a%2Fb&$version=7"
        );
    }
}
