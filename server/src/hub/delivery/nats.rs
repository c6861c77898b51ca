//! A NATS JetStream target: each event is published to the endpoint's subject (the device's
//! id in it) and counts as delivered once a stream stored it (JetStream's publish
//! acknowledgement).
//!
//! What the stream gets (docs/routing.md, "NATS and MQTT endpoints"): the body as stored, the
//! event's properties as NATS headers ([`super::headers`]) with `Content-Type`, and
//! `Nats-Msg-Id` made of the endpoint, partition, sequence number and enqueued time, so a
//! repeated delivery inside the stream's duplicate window is stored once.
//!
//! # Invariants
//! - A subject no stream captures is a failure ("no responders"), retried and dead-lettered
//!   like any other: the hub never counts as delivered what no stream stored.
//! - One client serves every partition of the endpoint. It is made at the first publish
//!   (a server that cannot be reached is a failed publish, retried); once connected it
//!   reconnects by itself a few times ([`RECONNECTS`]), then gives up and is made anew by the
//!   next publish. A client never outlives its sender by more than those attempts, so a target
//!   replaced or removed leaves nothing connecting in the background.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use ferrohub_engine::d2c::D2cEvent;
use ferrohub_engine::delivery::{BrokerTarget, DEVICE_ID_PLACEHOLDER};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use tokio::sync::Mutex;

use super::headers;

/// Escaped in the device id put into a subject: what would split, widen or break a token,
/// and `$` (subjects that begin with it are the server's own API).
const NOT_IN_A_TOKEN: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'.')
    .add(b'*')
    .add(b'>')
    .add(b'%')
    .add(b'$');

/// How often a connected client tries to reconnect before it gives up.
const RECONNECTS: usize = 5;

/// The publisher of one NATS target.
pub struct NatsSender {
    options: BrokerTarget,
    connected: Mutex<Option<Arc<jetstream::Context>>>,
    subject: String,
    endpoint: String,
}

impl NatsSender {
    /// # Errors
    /// The target's TLS settings do not load.
    pub fn new(endpoint: &str, target: &BrokerTarget) -> Result<NatsSender, String> {
        if target.url.starts_with("tls://") || target.ca_certificate.is_some() {
            super::client_tls::client_config(target.ca_certificate.as_deref())?;
        }
        Ok(NatsSender {
            options: target.clone(),
            connected: Mutex::new(None),
            subject: target.topic.clone(),
            endpoint: endpoint.to_string(),
        })
    }

    /// The connected client, made when there is none (or the last one gave up).
    async fn jetstream(&self) -> Result<Arc<jetstream::Context>, String> {
        let mut slot = self.connected.lock().await;
        if let Some(js) = slot.as_ref() {
            return Ok(Arc::clone(js));
        }
        let target = &self.options;
        let timeout = Duration::from_millis(target.timeout_ms);
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("ferrohub endpoint {}", self.endpoint))
            .max_reconnects(RECONNECTS)
            .connection_timeout(timeout)
            .request_timeout(Some(timeout));
        options = match (&target.username, &target.password) {
            (Some(user), password) => {
                options.user_and_password(user.clone(), password.clone().unwrap_or_default())
            }
            (None, Some(token)) => options.token(token.clone()),
            (None, None) => options,
        };
        if target.url.starts_with("tls://") || target.ca_certificate.is_some() {
            let tls = super::client_tls::client_config(target.ca_certificate.as_deref())?;
            options = options.require_tls(true).tls_client_config(tls);
        }
        let client = tokio::time::timeout(timeout, options.connect(target.url.as_str()))
            .await
            .map_err(|_| "cannot connect within the timeout".to_string())?
            .map_err(|e| format!("cannot connect: {e}"))?;
        let mut js = jetstream::new(client);
        js.set_timeout(timeout);
        let js = Arc::new(js);
        *slot = Some(Arc::clone(&js));
        Ok(js)
    }

    /// Forgets a client that is not connected, after a failed publish: the next publish makes
    /// a new one (the old one's few reconnects run out on their own).
    async fn forget_if_disconnected(&self, failed: &Arc<jetstream::Context>) {
        if failed.client().connection_state() == async_nats::connection::State::Connected {
            return;
        }
        let mut slot = self.connected.lock().await;
        if slot.as_ref().is_some_and(|js| Arc::ptr_eq(js, failed)) {
            *slot = None;
        }
    }

    /// Publishes one event; `Ok` once a stream stored it.
    ///
    /// # Errors
    /// What went wrong, for the endpoint's health and the log.
    pub async fn post(&self, event: &D2cEvent) -> Result<(), String> {
        let event_headers = headers::of(&self.endpoint, event);
        let mut nats_headers = async_nats::HeaderMap::new();
        nats_headers.insert("Content-Type", event_headers.content_type.as_str());
        nats_headers.insert(
            "Nats-Msg-Id",
            format!(
                "{}/{}/{}/{}",
                self.endpoint, event.partition, event.sequence_number, event.enqueued_time.0
            ),
        );
        for (name, value) in event_headers.pairs {
            nats_headers.insert(name, value);
        }
        let jetstream = self.jetstream().await?;
        let outcome = async {
            let ack = jetstream
                .publish_with_headers(
                    subject(&self.subject, event),
                    nats_headers,
                    event.body.clone().into(),
                )
                .await
                .map_err(|e| format!("publish: {e}"))?;
            ack.await
                .map(drop)
                .map_err(|e| format!("no stream stored it: {e}"))
        }
        .await;
        if outcome.is_err() {
            self.forget_if_disconnected(&jetstream).await;
        }
        outcome
    }
}

/// The subject of `event`: the template with the device's id, escaped to one token.
fn subject(template: &str, event: &D2cEvent) -> String {
    let id = utf8_percent_encode(headers::device_id(event), NOT_IN_A_TOKEN).to_string();
    template.replace(DEVICE_ID_PLACEHOLDER, &id)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_device_id_stays_one_token() {
        let event = ferrohub_engine::d2c::D2cEvent {
            partition: 0,
            sequence_number: 0,
            offset: 0,
            enqueued_time: ferrohub_engine::model::UnixMillis(0),
            system_properties: vec![("iothub-connection-device-id".into(), "$a.b*c>d%e f".into())],
            application_properties: vec![],
            body: vec![],
        };
        assert_eq!(
            super::subject("hub.{deviceId}.t", &event),
            "hub.%24a%2Eb%2Ac%3Ed%25e%20f.t"
        );
    }
}
