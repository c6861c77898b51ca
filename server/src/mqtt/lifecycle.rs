//! What an MQTT connection records when it ends without a DISCONNECT: its Will (MQT-8), sent
//! as telemetry. Connection states are [`crate::hub::connection_state`]'s.

use crate::hub::HubContext;
use crate::telemetry::{self, DeviceMessage};

use super::authenticate::Authenticated;
use super::property_bag;
use super::topics::{self, Inbound};

/// Sends the Will as telemetry with `iothub-MessageType=Will` (MQT-8).
pub(super) async fn publish_will(
    ctx: &HubContext,
    auth: &Authenticated,
    topic: &str,
    payload: Vec<u8>,
    retain: bool,
) {
    let Ok(Inbound::Telemetry { bag }) = topics::parse_publish(topic, &auth.who) else {
        tracing::debug!(
            topic,
            "will topic is not a telemetry topic of this identity; dropped"
        );
        return;
    };
    let Ok(properties) = property_bag::parse(bag) else {
        return;
    };
    let mut msg = DeviceMessage {
        properties,
        body: payload,
    };
    telemetry::add_application_property(&mut msg, "iothub-MessageType", "Will");
    if retain {
        mark_retained(&mut msg);
    }
    match telemetry::to_event(&auth.record, auth.method, msg) {
        Ok(event) => {
            let lane = ctx.telemetry_lane();
            let appended = ctx
                .append_telemetry(&lane, vec![event], auth.who.module_id.clone())
                .await;
            if let Err(e) = appended.await {
                tracing::error!(error = %e, "cannot store the will message");
            }
        }
        Err(e) => tracing::debug!(error = %e, "will message refused"),
    }
}

/// MQT-7: RETAIN is not kept; the message carries it as application properties.
pub(super) fn mark_retained(msg: &mut DeviceMessage) {
    telemetry::add_application_property(msg, "x-opt-retain", "true");
    telemetry::add_application_property(msg, "mqtt-retain", "true");
}
