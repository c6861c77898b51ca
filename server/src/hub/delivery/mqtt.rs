//! An MQTT broker target: each event is published with QoS 1 over MQTT 5 to the endpoint's
//! topic (the device's id in it) and counts as delivered once the broker acknowledged it
//! (PUBACK with a success code, "no matching subscribers" included: the broker took it).
//!
//! What subscribers get (docs/routing.md, "NATS and MQTT endpoints"): the body as stored,
//! the message's content type as MQTT 5's content type, and the event's properties as user
//! properties ([`super::headers`]; one longer than MQTT's 65,535 bytes is left out).
//!
//! # Invariants
//! - Each partition has its own connection (client id `ferrohub-{endpoint}-{partition}`) and
//!   one publish in flight, so order per device is the partition's order.
//! - A connection that failed, timed out or sat idle longer than the keep-alive is dropped and
//!   made anew on the next publish, with a clean session: nothing of a dead connection is
//!   resent behind the caller's back (the caller's retry is the only resend).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrohub_engine::d2c::D2cEvent;
use ferrohub_engine::delivery::{BrokerTarget, DEVICE_ID_PLACEHOLDER};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use rumqttc::v5::mqttbytes::v5::{PubAckReason, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop, Incoming, MqttOptions};
use tokio::sync::Mutex;

use super::headers;

/// Escaped in the device id put into a topic: what would split or widen a level, and `$`
/// (a topic that begins with it is the broker's own).
const NOT_IN_A_LEVEL: &AsciiSet = &CONTROLS.add(b'/').add(b'+').add(b'#').add(b'%').add(b'$');
/// MQTT strings carry a 16-bit length: a longer user property would corrupt the packet.
const MAX_PROPERTY: usize = u16::MAX as usize;
const KEEP_ALIVE: Duration = Duration::from_secs(60);
/// A connection idle this long is made anew rather than found closed by the next publish.
const IDLE_LIMIT: Duration = Duration::from_secs(30);

/// One partition's publisher to an MQTT target.
pub struct MqttSender {
    options: MqttOptions,
    topic: String,
    endpoint: String,
    timeout: Duration,
    connection: Mutex<Option<Connection>>,
}

struct Connection {
    client: AsyncClient,
    events: EventLoop,
    last_used: Instant,
}

impl MqttSender {
    /// # Errors
    /// The URL or the TLS settings do not load.
    pub fn new(
        endpoint: &str,
        partition: u16,
        target: &BrokerTarget,
    ) -> Result<MqttSender, String> {
        let url = url::Url::parse(&target.url).map_err(|e| format!("url: {e}"))?;
        let tls = url.scheme() == "mqtts";
        let host = url.host_str().ok_or("url: no host")?.to_string();
        let port = url.port().unwrap_or(if tls { 8883 } else { 1883 });
        let mut options = MqttOptions::new(format!("ferrohub-{endpoint}-{partition}"), host, port);
        options.set_keep_alive(KEEP_ALIVE);
        options.set_clean_start(true);
        options.set_connection_timeout(target.timeout_ms.div_ceil(1000));
        if let Some(user) = &target.username {
            options.set_credentials(user.clone(), target.password.clone().unwrap_or_default());
        }
        if tls {
            let config = super::client_tls::client_config(target.ca_certificate.as_deref())?;
            options.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(Arc::new(config)),
            ));
        }
        Ok(MqttSender {
            options,
            topic: target.topic.clone(),
            endpoint: endpoint.to_string(),
            timeout: Duration::from_millis(target.timeout_ms),
            connection: Mutex::new(None),
        })
    }

    /// Publishes one event; `Ok` once the broker acknowledged it.
    ///
    /// # Errors
    /// What went wrong, for the endpoint's health and the log.
    pub async fn post(&self, event: &D2cEvent) -> Result<(), String> {
        let mut slot = self.connection.lock().await;
        if slot
            .as_ref()
            .is_some_and(|c| c.last_used.elapsed() > IDLE_LIMIT)
        {
            *slot = None;
        }
        let connection = slot.get_or_insert_with(|| {
            let (client, events) = AsyncClient::new(self.options.clone(), 4);
            Connection {
                client,
                events,
                last_used: Instant::now(),
            }
        });
        let outcome = tokio::time::timeout(
            self.timeout,
            publish(connection, &self.topic, &self.endpoint, event),
        )
        .await
        .unwrap_or_else(|_| Err("no acknowledgement within the timeout".into()));
        match outcome {
            Ok(()) => {
                connection.last_used = Instant::now();
                Ok(())
            }
            Err(e) => {
                *slot = None;
                Err(e)
            }
        }
    }
}

/// Publishes `event` on `connection` and drives it until the broker's PUBACK.
async fn publish(
    connection: &mut Connection,
    template: &str,
    endpoint: &str,
    event: &D2cEvent,
) -> Result<(), String> {
    let event_headers = headers::of(endpoint, event);
    let properties = PublishProperties {
        // A property too long for MQTT is left out rather than the message refused.
        content_type: Some(event_headers.content_type).filter(|c| c.len() <= MAX_PROPERTY),
        user_properties: event_headers
            .pairs
            .into_iter()
            .filter(|(n, v)| n.len() <= MAX_PROPERTY && v.len() <= MAX_PROPERTY)
            .collect(),
        ..PublishProperties::default()
    };
    connection
        .client
        .publish_with_properties(
            topic(template, event),
            QoS::AtLeastOnce,
            false,
            event.body.clone(),
            properties,
        )
        .await
        .map_err(|e| format!("publish: {e}"))?;
    loop {
        match connection.events.poll().await {
            Ok(Event::Incoming(Incoming::PubAck(ack))) => {
                return match ack.reason {
                    PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
                    refused => Err(format!("the broker refused the message: {refused:?}")),
                };
            }
            Ok(_) => {}
            Err(e) => return Err(format!("connection: {e}")),
        }
    }
}

/// The topic of `event`: the template with the device's id, escaped to one level.
fn topic(template: &str, event: &D2cEvent) -> String {
    let id = utf8_percent_encode(headers::device_id(event), NOT_IN_A_LEVEL).to_string();
    template.replace(DEVICE_ID_PLACEHOLDER, &id)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_device_id_stays_one_level() {
        let event = ferrohub_engine::d2c::D2cEvent {
            partition: 0,
            sequence_number: 0,
            offset: 0,
            enqueued_time: ferrohub_engine::model::UnixMillis(0),
            system_properties: vec![("iothub-connection-device-id".into(), "$a+b#c%d.e".into())],
            application_properties: vec![],
            body: vec![],
        };
        assert_eq!(
            super::topic("hub/{deviceId}/t", &event),
            "hub/%24a%2Bb%23c%25d.e/t"
        );
    }
}
