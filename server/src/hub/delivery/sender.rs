//! What a partition's task hands its events to: one of the target kinds, each with the same
//! promise (`Ok` only once the target accepted the event).

use std::sync::Arc;

use ferrohub_engine::d2c::D2cEvent;
use ferrohub_engine::delivery::{BrokerTarget, DeliveryTarget, StorageTarget};
use ferrohub_engine::endpoints::Endpoint;

use super::mqtt::MqttSender;
use super::nats::NatsSender;
use super::storage_writer::StorageWriter;
use super::webhook::WebhookSender;

/// A partition's way to its endpoint's target: how its task hands the events over.
pub enum Sender {
    /// One event at a time ([`super::worker`]'s loop).
    Each(EventSender),
    /// Written in batches to a storage container ([`super::storage`]'s loop).
    Batched(Arc<StorageWriter>),
}

/// The targets that take events one by one.
pub enum EventSender {
    /// Shared by the endpoint's partitions (one pool of HTTP connections).
    Webhook(Arc<WebhookSender>),
    /// Shared likewise (one NATS connection multiplexes the publishes).
    Nats(Arc<NatsSender>),
    /// A connection of its own per partition (one publish in flight on it).
    Mqtt(MqttSender),
}

impl EventSender {
    /// Offers one event; `Ok` once the target accepted it.
    ///
    /// # Errors
    /// What went wrong, for the endpoint's health and the log.
    pub async fn post(&self, event: &D2cEvent) -> Result<(), String> {
        match self {
            EventSender::Webhook(s) => s.post(event).await,
            EventSender::Nats(s) => s.post(event).await,
            EventSender::Mqtt(s) => s.post(event).await,
        }
    }
}

/// One sender per partition of `endpoint`, in partition order; `None` without a target.
///
/// # Errors
/// The target cannot be used (a key, CA or URL that does not load).
pub async fn for_partitions(
    endpoint: &Endpoint,
    hub_name: &str,
) -> Result<Vec<(u16, Sender)>, String> {
    let partitions = endpoint.slot.base..endpoint.slot.base + endpoint.slot.partitions;
    let Some(target) = &endpoint.delivery else {
        return Ok(Vec::new());
    };
    Ok(match target {
        DeliveryTarget::Webhook(w) => {
            let shared = Arc::new(WebhookSender::new(&endpoint.name, w)?);
            partitions
                .map(|p| (p, Sender::Each(EventSender::Webhook(Arc::clone(&shared)))))
                .collect()
        }
        DeliveryTarget::Nats(b) => {
            let shared = Arc::new(NatsSender::new(&endpoint.name, b)?);
            partitions
                .map(|p| (p, Sender::Each(EventSender::Nats(Arc::clone(&shared)))))
                .collect()
        }
        DeliveryTarget::Mqtt(b) => partitions
            .map(|p| {
                MqttSender::new(&endpoint.name, p, b)
                    .map(|s| (p, Sender::Each(EventSender::Mqtt(s))))
            })
            .collect::<Result<_, _>>()?,
        DeliveryTarget::Storage(t) => partitions
            .map(|p| {
                StorageWriter::new(t, hub_name, p - endpoint.slot.base)
                    .map(|w| (p, Sender::Batched(Arc::new(w))))
            })
            .collect::<Result<_, _>>()?,
    })
}

/// Checks what the engine's validation cannot: that the URL parses with a host and a port
/// that can be, that the TLS settings load (a CA certificate that parses, roots to trust),
/// and that the storage connection string makes a client.
///
/// # Errors
/// Why not, after the target's kind (`webhook.caCertificate: ...`).
pub fn check(target: &DeliveryTarget) -> Result<(), String> {
    let outcome = match target {
        DeliveryTarget::Webhook(w) => super::webhook::check(w),
        DeliveryTarget::Nats(b) => check_broker(b, "tls"),
        DeliveryTarget::Mqtt(b) => check_broker(b, "mqtts"),
        DeliveryTarget::Storage(t) => check_storage(t),
    };
    outcome.map_err(|e| format!("{}.{e}", target.kind()))
}

/// A broker's URL and TLS settings; `tls_scheme` is the scheme that means TLS.
fn check_broker(b: &BrokerTarget, tls_scheme: &str) -> Result<(), String> {
    let url = url::Url::parse(&b.url).map_err(|e| format!("url: {e}"))?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("url: no host".into());
    }
    let tls = url.scheme() == tls_scheme;
    if b.ca_certificate.is_some() && !tls && tls_scheme == "mqtts" {
        return Err("caCertificate: only with an mqtts:// URL".into());
    }
    if tls || b.ca_certificate.is_some() {
        super::client_tls::client_config(b.ca_certificate.as_deref())?;
    }
    Ok(())
}

/// A storage target's connection string makes a client, and its file name format makes blob
/// names the container takes (no empty, `.` or `..` segment).
fn check_storage(t: &StorageTarget) -> Result<(), String> {
    crate::blob::StorageAccount::from_connection_string(&t.connection_string, &t.container_name)
        .map_err(|e| format!("connectionString: {e}"))?;
    let sample = ferrohub_engine::d2c::D2cEvent {
        partition: 0,
        sequence_number: 1,
        offset: 0,
        enqueued_time: ferrohub_engine::model::UnixMillis(0),
        system_properties: Vec::new(),
        application_properties: Vec::new(),
        body: Vec::new(),
    };
    let name = super::archive::blob_name(&t.file_name_format, "hub", 0, &sample, true);
    let segments_ok = !name.starts_with('/')
        && name
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if !segments_ok || object_store::path::Path::parse(&name).is_err() {
        return Err(format!(
            "fileNameFormat: makes blob names like {name:?}, which a container does not take (an empty, '.' or '..' segment, or a character a blob name cannot hold)"
        ));
    }
    Ok(())
}
