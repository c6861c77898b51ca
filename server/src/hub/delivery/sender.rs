//! What a partition's task hands its events to: one of the target kinds, each with the same
//! promise (`Ok` only once the target accepted the event).

use std::sync::Arc;

use ferrohub_engine::d2c::D2cEvent;
use ferrohub_engine::delivery::DeliveryTarget;
use ferrohub_engine::endpoints::Endpoint;

use super::mqtt::MqttSender;
use super::nats::NatsSender;
use super::webhook::WebhookSender;

/// A partition's way to its endpoint's target.
pub enum Sender {
    /// Shared by the endpoint's partitions (one pool of HTTP connections).
    Webhook(Arc<WebhookSender>),
    /// Shared likewise (one NATS connection multiplexes the publishes).
    Nats(Arc<NatsSender>),
    /// A connection of its own per partition (one publish in flight on it).
    Mqtt(MqttSender),
}

impl Sender {
    /// Offers one event; `Ok` once the target accepted it.
    ///
    /// # Errors
    /// What went wrong, for the endpoint's health and the log.
    pub async fn post(&self, event: &D2cEvent) -> Result<(), String> {
        match self {
            Sender::Webhook(s) => s.post(event).await,
            Sender::Nats(s) => s.post(event).await,
            Sender::Mqtt(s) => s.post(event).await,
        }
    }
}

/// One sender per partition of `endpoint`, in partition order; `None` without a target.
///
/// # Errors
/// The target cannot be used (a key, CA or URL that does not load).
pub async fn for_partitions(endpoint: &Endpoint) -> Result<Vec<(u16, Sender)>, String> {
    let partitions = endpoint.slot.base..endpoint.slot.base + endpoint.slot.partitions;
    let Some(target) = &endpoint.delivery else {
        return Ok(Vec::new());
    };
    Ok(match target {
        DeliveryTarget::Webhook(w) => {
            let shared = Arc::new(WebhookSender::new(&endpoint.name, w)?);
            partitions
                .map(|p| (p, Sender::Webhook(Arc::clone(&shared))))
                .collect()
        }
        DeliveryTarget::Nats(b) => {
            let shared = Arc::new(NatsSender::new(&endpoint.name, b).await?);
            partitions
                .map(|p| (p, Sender::Nats(Arc::clone(&shared))))
                .collect()
        }
        DeliveryTarget::Mqtt(b) => partitions
            .map(|p| MqttSender::new(&endpoint.name, p, b).map(|s| (p, Sender::Mqtt(s))))
            .collect::<Result<_, _>>()?,
    })
}

/// Checks what the engine's validation cannot: that a CA certificate, if any, parses.
///
/// # Errors
/// Why it does not, after the target's kind (`webhook.caCertificate: ...`).
pub fn check(target: &DeliveryTarget) -> Result<(), String> {
    let outcome = match target {
        DeliveryTarget::Webhook(w) => super::webhook::check(w),
        DeliveryTarget::Nats(b) | DeliveryTarget::Mqtt(b) => match &b.ca_certificate {
            Some(pem) => super::client_tls::ca_certificates(pem).map(drop),
            None => Ok(()),
        },
    };
    outcome.map_err(|e| format!("{}.{e}", target.kind()))
}
