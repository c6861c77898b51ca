//! AMQP device links in process, through `fe2o3-amqp`'s client (AMQ-5, AMQ-6, AMQ-8): a
//! device's CBS token authorises its own links and no other device's, telemetry is accepted
//! only once stored and keeps its properties, one connection may carry several identities (as
//! IoT Edge multiplexes), an expired token is refused, and a receiver on
//! `messages/events/$management` is redirected to the built-in endpoint. The Node device SDK
//! drives the same code over TLS in `tests/python/test_amqp_device.py`.

use std::time::Duration;

use fe2o3_amqp::link::{Receiver, Sender};
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition, LinkError};
use fe2o3_amqp::types::messaging::{ApplicationProperties, Body, Message, Outcome, Properties};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Session};
use ferrohub_tests::inproc::InProcHub;

/// Opens a connection with no SASL layer (as the Node device SDK does) and puts `token` on
/// `$cbs`; the status code of the answer.
async fn open_with_token(
    hub: &InProcHub,
    token: &str,
) -> (
    fe2o3_amqp::connection::ConnectionHandle<()>,
    SessionHandle<()>,
    i32,
) {
    let (connection, session, mut cbs) = open(hub).await;
    let status = cbs.put_token("localhost%2Fdevices%2Fd1", token).await;
    (connection, session, status)
}

/// A connection with no SASL layer, a session, and its `$cbs` link pair.
async fn open(
    hub: &InProcHub,
) -> (
    fe2o3_amqp::connection::ConnectionHandle<()>,
    SessionHandle<()>,
    Cbs,
) {
    let mut connection = Connection::builder()
        .container_id("device")
        .hostname("localhost")
        .open_with_stream(hub.amqp_stream())
        .await
        .expect("open");
    let mut session = Session::begin(&mut connection).await.expect("begin");
    let tx = Sender::attach(&mut session, "cbs-tx", "$cbs")
        .await
        .unwrap();
    let rx = Receiver::attach(&mut session, "cbs-rx", "$cbs")
        .await
        .unwrap();
    (connection, session, Cbs { tx, rx, next_id: 1 })
}

struct Cbs {
    tx: Sender,
    rx: Receiver,
    next_id: u64,
}

impl Cbs {
    /// Puts a SAS token for `audience` (URL-encoded, as the SDKs send it); the status code.
    async fn put_token(&mut self, audience: &str, token: &str) -> i32 {
        let request = Message::builder()
            .properties(Properties::builder().message_id(self.next_id).build())
            .application_properties(
                ApplicationProperties::builder()
                    .insert("operation", "put-token")
                    .insert("type", "servicebus.windows.net:sastoken")
                    .insert("name", audience)
                    .build(),
            )
            .value(token.to_string())
            .build();
        self.next_id += 1;
        self.tx.send(request).await.expect("put-token");
        let reply = self.rx.recv::<Body<Value>>().await.expect("answer");
        self.rx.accept(&reply).await.unwrap();
        match reply
            .message()
            .application_properties
            .as_ref()
            .and_then(|p| p.0.get("status-code"))
        {
            Some(SimpleValue::Int(s)) => *s,
            other => panic!("status-code {other:?}"),
        }
    }
}

/// The first event of each partition of the built-in endpoint, by the device that sent it.
async fn stored_events(hub: &InProcHub) -> Vec<serde_json::Value> {
    let mut all = Vec::new();
    for p in 0..4 {
        let (_, body) = hub
            .rest(
                "GET",
                &format!("/events/consumergroups/$Default/partitions/{p}/messages?from=start"),
                None,
            )
            .await;
        all.extend(body["events"].as_array().cloned().unwrap_or_default());
    }
    all
}

fn device_token(hub: &InProcHub, device_id: &str, key: &str, expiry: u64) -> String {
    let _ = hub;
    ferrohub_server::auth::sas::sign(&format!("localhost/devices/{device_id}"), key, expiry, None)
        .expect("token")
}

async fn detach_condition(link: &mut Sender) -> Option<ErrorCondition> {
    match tokio::time::timeout(Duration::from_secs(10), link.on_detach()).await {
        Ok(fe2o3_amqp::link::DetachError::RemoteDetachedWithError(e))
        | Ok(fe2o3_amqp::link::DetachError::RemoteClosedWithError(e)) => Some(e.condition),
        Ok(other) => panic!("detached without an error: {other:?}"),
        Err(_) => None,
    }
}

#[tokio::test]
async fn a_device_token_opens_its_own_telemetry_link_and_events_keep_their_properties() {
    let hub = InProcHub::start().await;
    let key = hub.create_device("d1").await;
    hub.create_device("d2").await;
    let token = device_token(&hub, "d1", &key, hub.ctx.clock.now_secs() + 3600);
    let (_connection, mut session, status) = open_with_token(&hub, &token).await;
    assert_eq!(status, 200);

    let mut events = Sender::attach(&mut session, "d2c", "/devices/d1/messages/events")
        .await
        .expect("attach telemetry");
    let message = Message::builder()
        .properties(
            Properties::builder()
                .message_id(String::from("m-1"))
                .correlation_id(String::from("c-1"))
                .content_type("application/json")
                .build(),
        )
        .application_properties(
            ApplicationProperties::builder()
                .insert("alpha", "5")
                .build(),
        )
        .data(br#"{"t":21.5}"#.to_vec())
        .build();
    let outcome = events.send(message).await.expect("sent");
    assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");

    // Accepted means stored: the event is readable at once, with its properties.
    let mut found = None;
    for p in 0..4 {
        let (_, body) = hub
            .rest(
                "GET",
                &format!("/events/consumergroups/$Default/partitions/{p}/messages?from=start"),
                None,
            )
            .await;
        if let Some(e) = body["events"].as_array().and_then(|e| e.first()) {
            found = Some(e.clone());
        }
    }
    let event = found.expect("the accepted event is stored");
    let system = &event["systemProperties"];
    assert_eq!(system["message-id"], "m-1");
    assert_eq!(system["correlation-id"], "c-1");
    assert_eq!(system["content-type"], "application/json");
    assert_eq!(system["iothub-connection-device-id"], "d1");
    assert_eq!(event["properties"]["alpha"], "5");

    // The same connection may not open another device's links.
    let mut other = Sender::attach(&mut session, "d2c-other", "/devices/d2/messages/events")
        .await
        .expect("attach answered");
    assert_eq!(
        detach_condition(&mut other).await,
        Some(AmqpError::UnauthorizedAccess.into())
    );
    let (_, d1) = hub
        .rest("GET", "/devices/d1?api-version=2021-04-12", None)
        .await;
    assert_eq!(d1["connectionState"], "Connected");
}

#[tokio::test]
async fn an_expired_or_foreign_token_opens_nothing() {
    let hub = InProcHub::start().await;
    let key = hub.create_device("d1").await;
    let other_key = hub.create_device("d2").await;
    // d2's key signing a token for d1: CBS refuses it, and no link of d1 opens.
    let forged = device_token(&hub, "d1", &other_key, hub.ctx.clock.now_secs() + 3600);
    let (_c, mut session, status) = open_with_token(&hub, &forged).await;
    assert_eq!(status, 401);
    let mut events = Sender::attach(&mut session, "d2c", "/devices/d1/messages/events")
        .await
        .expect("attach answered");
    assert_eq!(
        detach_condition(&mut events).await,
        Some(AmqpError::UnauthorizedAccess.into())
    );
    let expired = device_token(&hub, "d1", &key, hub.ctx.clock.now_secs() - 10);
    let (_c, _session, status) = open_with_token(&hub, &expired).await;
    assert_eq!(status, 401);
    let (_, d1) = hub
        .rest("GET", "/devices/d1?api-version=2021-04-12", None)
        .await;
    assert_eq!(d1["connectionState"], "Disconnected");
}

#[tokio::test]
async fn a_messages_events_receiver_is_redirected_to_the_built_in_endpoint() {
    let hub = InProcHub::start().await;
    let token = hub.policy_token("service", hub.ctx.clock.now_secs() + 3600);
    let mut connection = Connection::builder()
        .container_id("monitor")
        .hostname("localhost")
        .sasl_profile(SaslProfile::Plain {
            username: format!("service@sas.root.{}", hub.ctx.settings.hub_name),
            password: token,
        })
        .open_with_stream(hub.amqp_stream())
        .await
        .expect("open");
    let mut session = Session::begin(&mut connection).await.expect("begin");
    let mut receiver = Receiver::attach(
        &mut session,
        "monitor",
        "amqps://localhost/messages/events/$management",
    )
    .await
    .expect("attach answered");
    let received = tokio::time::timeout(Duration::from_secs(10), receiver.recv::<Body<Value>>())
        .await
        .expect("redirected in time");
    use fe2o3_amqp::link::{LinkStateError, RecvError};
    let error = match received {
        Err(RecvError::LinkStateError(
            LinkStateError::RemoteDetachedWithError(e) | LinkStateError::RemoteClosedWithError(e),
        )) => e,
        other => panic!("not a detach with an error: {other:?}"),
    };
    assert_eq!(error.condition, LinkError::Redirect.into());
    let info = error.info.expect("redirect info");
    let get = |k: &str| {
        info.get(&fe2o3_amqp::types::primitives::Symbol::from(k))
            .cloned()
    };
    assert_eq!(get("hostname"), Some(Value::String("localhost".into())));
    assert_eq!(get("port"), Some(Value::Int(5671)));
    assert_eq!(
        get("address"),
        Some(Value::String(format!(
            "amqps://localhost:5671/{}/$management",
            hub.ctx.settings.hub_name
        )))
    );
}

/// IoT Edge's shape: one connection carries several identities, each with its own CBS token,
/// and each link is checked against the identity its address names.
#[tokio::test]
async fn one_connection_carries_several_identities_each_on_its_own_links() {
    let hub = InProcHub::start().await;
    let keys = [
        hub.create_device("edge1").await,
        hub.create_device("leaf1").await,
    ];
    hub.create_device("stranger").await;
    let expiry = hub.ctx.clock.now_secs() + 3600;
    let (_connection, mut session, mut cbs) = open(&hub).await;
    for (id, key) in ["edge1", "leaf1"].iter().zip(&keys) {
        let token = device_token(&hub, id, key, expiry);
        let audience = format!("localhost%2Fdevices%2F{id}");
        assert_eq!(cbs.put_token(&audience, &token).await, 200, "{id}");
    }
    for id in ["edge1", "leaf1"] {
        let mut link = Sender::attach(
            &mut session,
            format!("d2c-{id}"),
            format!("/devices/{id}/messages/events"),
        )
        .await
        .expect("attach telemetry");
        let message = Message::builder()
            .properties(
                Properties::builder()
                    .message_id(format!("from-{id}"))
                    .build(),
            )
            .data(id.as_bytes().to_vec())
            .build();
        let outcome = link.send(message).await.expect("sent");
        assert!(matches!(outcome, Outcome::Accepted(_)), "{id}: {outcome:?}");
    }
    // A third identity with no token on this connection opens nothing.
    let mut stranger = Sender::attach(
        &mut session,
        "d2c-stranger",
        "/devices/stranger/messages/events",
    )
    .await
    .expect("attach answered");
    assert_eq!(
        detach_condition(&mut stranger).await,
        Some(AmqpError::UnauthorizedAccess.into())
    );
    let events = stored_events(&hub).await;
    for id in ["edge1", "leaf1"] {
        let event = events
            .iter()
            .find(|e| e["systemProperties"]["message-id"] == format!("from-{id}"))
            .unwrap_or_else(|| panic!("{id}'s event is stored"));
        assert_eq!(event["systemProperties"]["iothub-connection-device-id"], id);
    }
    assert!(events
        .iter()
        .all(|e| e["systemProperties"]["iothub-connection-device-id"] != "stranger"));
    for id in ["edge1", "leaf1"] {
        let (_, device) = hub
            .rest(
                "GET",
                &format!("/devices/{id}?api-version=2021-04-12"),
                None,
            )
            .await;
        assert_eq!(device["connectionState"], "Connected", "{id}");
    }
}
