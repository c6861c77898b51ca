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
//! - One client serves every partition of the endpoint; it reconnects by itself, so a broker
//!   that is down is only a failed publish, never a task that ends.

use std::time::Duration;

use async_nats::jetstream;
use ferrohub_engine::d2c::D2cEvent;
use ferrohub_engine::delivery::{BrokerTarget, DEVICE_ID_PLACEHOLDER};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use super::headers;

/// Escaped in the device id put into a subject: what would split, widen or break a token.
const NOT_IN_A_TOKEN: &AsciiSet = &CONTROLS.add(b' ').add(b'.').add(b'*').add(b'>').add(b'%');

/// The publisher of one NATS target.
pub struct NatsSender {
    jetstream: jetstream::Context,
    subject: String,
    endpoint: String,
}

impl NatsSender {
    /// Starts the client; it connects (and reconnects) in the background.
    ///
    /// # Errors
    /// The target's TLS settings do not load, or the URL is refused.
    pub async fn new(endpoint: &str, target: &BrokerTarget) -> Result<NatsSender, String> {
        let timeout = Duration::from_millis(target.timeout_ms);
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("ferrohub endpoint {endpoint}"))
            .retry_on_initial_connect()
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
        let client = options
            .connect(target.url.as_str())
            .await
            .map_err(|e| format!("NATS {}: {e}", target.url))?;
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(timeout);
        Ok(NatsSender {
            jetstream,
            subject: target.topic.clone(),
            endpoint: endpoint.to_string(),
        })
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
        let ack = self
            .jetstream
            .publish_with_headers(
                subject(&self.subject, event),
                nats_headers,
                event.body.clone().into(),
            )
            .await
            .map_err(|e| format!("publish: {e}"))?;
        ack.await.map_err(|e| format!("no stream stored it: {e}"))?;
        Ok(())
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
            system_properties: vec![("iothub-connection-device-id".into(), "a.b*c>d%e f".into())],
            application_properties: vec![],
            body: vec![],
        };
        assert_eq!(
            super::subject("hub.{deviceId}.t", &event),
            "hub.a%2Eb%2Ac%3Ed%25e%20f.t"
        );
    }
}
