//! The AMQP service endpoint in process, through `fe2o3-amqp`'s client (AMQ-1, AMQ-2): CBS
//! put-token answers, what a claim allows and until when, refusals of unknown nodes and
//! malformed input, and C2D sends accepted only once stored. The official SDKs drive the same
//! code over TLS in `tests/python/test_sdk_amqp.py`.

use std::time::Duration;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::{Receiver, Sender};
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition};
use fe2o3_amqp::types::messaging::{ApplicationProperties, Body, Message, Outcome, Properties};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use fe2o3_amqp::{Connection, Session};
use ferrohub_engine::c2d::Settle;
use ferrohub_tests::inproc::InProcHub;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Client {
    connection: ConnectionHandle<()>,
    session: SessionHandle<()>,
    cbs_tx: Sender,
    cbs_rx: Receiver,
    next_id: u64,
}

impl Client {
    async fn open(hub: &InProcHub, sasl: SaslProfile) -> Client {
        Self::open_with(hub, Some(sasl)).await
    }

    /// `None`: no SASL layer at all (the plain AMQP header, as the Node SDK opens).
    async fn open_with(hub: &InProcHub, sasl: Option<SaslProfile>) -> Client {
        let builder = Connection::builder()
            .container_id("test-client")
            .hostname("localhost");
        let opened = match sasl {
            Some(sasl) => {
                builder
                    .sasl_profile(sasl)
                    .open_with_stream(hub.amqp_stream())
                    .await
            }
            None => builder.open_with_stream(hub.amqp_stream()).await,
        };
        let mut connection = opened.expect("open");
        let mut session = Session::begin(&mut connection).await.expect("begin");
        let cbs_tx = Sender::attach(&mut session, "$cbs-sender", "$cbs")
            .await
            .expect("cbs sender");
        let cbs_rx = Receiver::attach(&mut session, "$cbs-receiver", "$cbs")
            .await
            .expect("cbs receiver");
        Client {
            connection,
            session,
            cbs_tx,
            cbs_rx,
            next_id: 0,
        }
    }

    /// Puts a token on `$cbs`; the status code and description of the answer.
    async fn put_token(&mut self, token: &str) -> (i32, String) {
        self.next_id += 1;
        let request = Message::builder()
            .properties(Properties::builder().message_id(self.next_id).build())
            .application_properties(
                ApplicationProperties::builder()
                    .insert("operation", "put-token")
                    .insert("type", "servicebus.windows.net:sastoken")
                    .insert("name", "https://localhost")
                    .build(),
            )
            .value(token.to_string())
            .build();
        let outcome = self.cbs_tx.send(request).await.expect("put-token sent");
        assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
        let reply = self
            .cbs_rx
            .recv::<Body<Value>>()
            .await
            .expect("put-token answer");
        self.cbs_rx.accept(&reply).await.expect("settle answer");
        let message = reply.message();
        let correlation = message
            .properties
            .as_ref()
            .and_then(|p| p.correlation_id.clone());
        assert_eq!(correlation, Some(self.next_id.into()));
        let props = &message
            .application_properties
            .as_ref()
            .expect("properties")
            .0;
        let status = match props.get("status-code") {
            Some(SimpleValue::Int(s)) => *s,
            other => panic!("status-code must be an AMQP int, got {other:?}"),
        };
        let description = match props.get("status-description") {
            Some(SimpleValue::String(s)) => s.clone(),
            other => panic!("status-description must be a string, got {other:?}"),
        };
        (status, description)
    }

    async fn devicebound(&mut self) -> Sender {
        Sender::attach(
            &mut self.session,
            "c2d-sender",
            "amqps://localhost/messages/devicebound",
        )
        .await
        .expect("attach devicebound")
    }
}

fn c2d(device_id: &str, body: &str) -> Message<fe2o3_amqp::types::messaging::Data> {
    Message::builder()
        .properties(
            Properties::builder()
                .to(format!("/devices/{device_id}/messages/devicebound"))
                .message_id(format!("m-{body}"))
                .build(),
        )
        .data(body.as_bytes().to_vec())
        .build()
}

fn condition_of(outcome: &Outcome) -> Option<ErrorCondition> {
    match outcome {
        Outcome::Rejected(r) => r.error.as_ref().map(|e| e.condition.clone()),
        _ => None,
    }
}

async fn queue_depth(hub: &InProcHub, device_id: &str) -> u64 {
    let (_, body) = hub
        .rest(
            "GET",
            &format!("/devices/{device_id}?api-version=2021-04-12"),
            None,
        )
        .await;
    body["cloudToDeviceMessageCount"].as_u64().expect("count")
}

/// The link's detach error, once the hub detaches it.
async fn detach_condition(link: &mut Sender) -> Option<ErrorCondition> {
    match tokio::time::timeout(Duration::from_secs(5), link.on_detach()).await {
        Ok(fe2o3_amqp::link::DetachError::RemoteDetachedWithError(e)) => Some(e.condition),
        Ok(fe2o3_amqp::link::DetachError::RemoteClosedWithError(e)) => Some(e.condition),
        Ok(other) => panic!("detached without an error: {other:?}"),
        Err(_) => None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_put_token_authorises_sends_that_are_stored_before_accepted() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let mut client = Client::open(&hub, SaslProfile::Anonymous).await;
    let token = hub.policy_token("service", hub.ctx.clock.now_secs() + 3600);
    assert_eq!(client.put_token(&token).await, (200, "OK".to_string()));
    let mut link = client.devicebound().await;
    let outcome = link.send(c2d("d1", "one")).await.expect("sent");
    assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
    // Accepted means stored: the queue holds it already.
    assert_eq!(queue_depth(&hub, "d1").await, 1);

    let refused = link.send(c2d("nobody", "two")).await.expect("sent");
    assert_eq!(condition_of(&refused), Some(AmqpError::NotFound.into()));
    let mut no_to = c2d("d1", "three");
    no_to.properties.as_mut().unwrap().to = None;
    let refused = link.send(no_to).await.expect("sent");
    assert_eq!(condition_of(&refused), Some(AmqpError::InvalidField.into()));
    assert_eq!(queue_depth(&hub, "d1").await, 1);
    // The link goes on after refusals.
    let outcome = link.send(c2d("d1", "four")).await.expect("sent");
    assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
    assert_eq!(queue_depth(&hub, "d1").await, 2);
    let _ = link.close().await;
    let _ = client.session.end().await;
    let _ = client.connection.close().await;
}

#[tokio::test(start_paused = true)]
async fn bad_tokens_get_401_and_no_link_without_a_valid_claim() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let mut client = Client::open(&hub, SaslProfile::Anonymous).await;
    let now = hub.ctx.clock.now_secs();

    let expired = hub.policy_token("service", now - 10);
    let (status, description) = client.put_token(&expired).await;
    assert_eq!(status, 401, "{description}");
    assert!(description.contains("expired"), "{description}");

    let wrong_key = ferrohub_server::auth::sas::sign(
        "localhost",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        now + 3600,
        Some("service"),
    )
    .unwrap();
    assert_eq!(client.put_token(&wrong_key).await.0, 401);
    assert_eq!(client.put_token("not a token").await.0, 401);

    // No claim yet: the C2D link is detached as unauthorised.
    let mut link = client.devicebound().await;
    assert_eq!(
        detach_condition(&mut link).await,
        Some(AmqpError::UnauthorizedAccess.into())
    );

    // A valid token of a policy without ServiceConnect: accepted on $cbs, refused on the link.
    let read_only = hub.policy_token("registryRead", now + 3600);
    assert_eq!(client.put_token(&read_only).await.0, 200);
    let mut link = client.devicebound().await;
    assert_eq!(
        detach_condition(&mut link).await,
        Some(AmqpError::UnauthorizedAccess.into())
    );
    assert_eq!(queue_depth(&hub, "d1").await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_claim_ends_when_its_token_expires_and_a_renewal_extends_it() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let mut client = Client::open(&hub, SaslProfile::Anonymous).await;
    let now = hub.ctx.clock.now_secs();
    assert_eq!(
        client
            .put_token(&hub.policy_token("service", now + 60))
            .await
            .0,
        200
    );
    let mut link = client.devicebound().await;
    assert!(matches!(
        link.send(c2d("d1", "a")).await.expect("sent"),
        Outcome::Accepted(_)
    ));
    // Renewed on the same $cbs link before it expires: sends go on past the first expiry.
    tokio::time::sleep(Duration::from_secs(50)).await;
    let renewed_until = hub.ctx.clock.now_secs() + 60;
    assert_eq!(
        client
            .put_token(&hub.policy_token("service", renewed_until))
            .await
            .0,
        200
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(matches!(
        link.send(c2d("d1", "b")).await.expect("sent"),
        Outcome::Accepted(_)
    ));
    // Past the renewed expiry: refused and detached.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let outcome = link.send(c2d("d1", "c")).await;
    if let Ok(outcome) = outcome {
        assert_eq!(
            condition_of(&outcome),
            Some(AmqpError::UnauthorizedAccess.into())
        );
    }
    assert_eq!(
        detach_condition(&mut link).await,
        Some(AmqpError::UnauthorizedAccess.into())
    );
    assert_eq!(queue_depth(&hub, "d1").await, 2);
}

#[tokio::test(start_paused = true)]
async fn sasl_plain_with_a_policy_token_or_key_and_refusals() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let now = hub.ctx.clock.now_secs();
    let plain = |username: &str, password: String| SaslProfile::Plain {
        username: username.to_string(),
        password,
    };
    // A policy token as the password: authorised from the start, no put-token.
    let mut client = Client::open(
        &hub,
        plain(
            "service@sas.root.ferrohub",
            hub.policy_token("service", now + 3600),
        ),
    )
    .await;
    let mut link = client.devicebound().await;
    assert!(matches!(
        link.send(c2d("d1", "plain")).await.expect("sent"),
        Outcome::Accepted(_)
    ));
    // The policy's key as the password.
    let key = hub
        .ctx
        .settings
        .policy("service")
        .unwrap()
        .primary_key
        .clone();
    let mut client = Client::open(&hub, plain("service@sas.root.ferrohub", key)).await;
    let mut link = client.devicebound().await;
    assert!(matches!(
        link.send(c2d("d1", "key")).await.expect("sent"),
        Outcome::Accepted(_)
    ));
    // Wrong credentials end SASL with a refusal.
    let refused = Connection::builder()
        .container_id("wrong")
        .hostname("localhost")
        .sasl_profile(plain("service@sas.root.ferrohub", "bm90IGEga2V5".into()))
        .open_with_stream(hub.amqp_stream())
        .await;
    assert!(refused.is_err(), "wrong PLAIN credentials were accepted");
    assert_eq!(queue_depth(&hub, "d1").await, 2);
}

#[tokio::test(start_paused = true)]
async fn unknown_nodes_and_garbage_are_refused_and_others_still_served() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let mut client = Client::open(&hub, SaslProfile::Anonymous).await;
    let token = hub.policy_token("service", hub.ctx.clock.now_secs() + 3600);
    assert_eq!(client.put_token(&token).await.0, 200);
    let mut nowhere = Sender::attach(&mut client.session, "nowhere", "/messages/nowhere")
        .await
        .expect("attach");
    assert_eq!(
        detach_condition(&mut nowhere).await,
        Some(AmqpError::NotFound.into())
    );

    // Garbage instead of a protocol header: the hub answers with the header it speaks and
    // closes the stream.
    let mut raw = hub.amqp_stream();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let answer = tokio::time::timeout(Duration::from_secs(1), async {
        let mut all = Vec::new();
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return all,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the hub kept a garbage stream open");
    assert_eq!(answer, b"AMQP\x03\x01\x00\x00");

    // A valid header, then a frame of nonsense where the open should be.
    let mut raw = hub.amqp_stream();
    raw.write_all(b"AMQP\x00\x01\x00\x00").await.unwrap();
    raw.write_all(&[0, 0, 0, 12, 2, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef])
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(60), async {
        let mut all = Vec::new();
        loop {
            match raw.read(&mut buf).await {
                Ok(0) | Err(_) => return all,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the hub kept a malformed connection open");
    // Its header and open, then a close performative (descriptor 0x18) ends the connection.
    assert!(answer.starts_with(b"AMQP\x00\x01\x00\x00"), "{answer:?}");
    assert!(
        answer.windows(2).any(|w| w == [0x53, 0x18]),
        "no close: {answer:?}"
    );

    // The first connection is still served.
    let mut link = client.devicebound().await;
    assert!(matches!(
        link.send(c2d("d1", "still")).await.expect("sent"),
        Outcome::Accepted(_)
    ));
    assert_eq!(queue_depth(&hub, "d1").await, 1);
}

/// Sends one C2D message asking for full feedback, and has the device settle it with `how`.
async fn settled_c2d(hub: &InProcHub, client: &mut Client, device_id: &str, id: &str, how: Settle) {
    let mut link = client.devicebound().await;
    let mut message = c2d(device_id, id);
    message.application_properties = Some(
        ApplicationProperties::builder()
            .insert("iothub-ack", "full")
            .build(),
    );
    assert!(matches!(
        link.send(message).await.expect("sent"),
        Outcome::Accepted(_)
    ));
    let _ = link.close().await;
    let settings = hub.ctx.c2d.settings;
    let (now, device) = (hub.ctx.clock.now(), device_id.to_string());
    let token = hub
        .ctx
        .store
        .run(move |s| s.receive_c2d(&device, 1, now, &settings))
        .await
        .expect("receive")[0]
        .lock_token
        .clone();
    let device = device_id.to_string();
    hub.ctx
        .store
        .run(move |s| s.settle_c2d(&device, &token, how, now, &settings))
        .await
        .expect("settle");
}

/// The next feedback delivery within `wait`, with its records as JSON.
async fn next_feedback(
    link: &mut Receiver,
    wait: Duration,
) -> Option<(
    fe2o3_amqp::link::delivery::Delivery<Body<Value>>,
    serde_json::Value,
)> {
    let delivery = tokio::time::timeout(wait, link.recv::<Body<Value>>())
        .await
        .ok()?
        .expect("feedback delivery");
    let message = delivery.message();
    let content_type = message
        .properties
        .as_ref()
        .and_then(|p| p.content_type.clone());
    assert_eq!(
        content_type.map(|s| s.0),
        Some("application/vnd.microsoft.iothub.feedback.json".to_string())
    );
    let body = match &message.body {
        Body::Data(sections) => sections
            .iter()
            .flat_map(|d| d.0.iter().copied())
            .collect::<Vec<u8>>(),
        other => panic!("feedback body is not data: {other:?}"),
    };
    let records = serde_json::from_slice(&body).expect("records are JSON");
    Some((delivery, records))
}

#[tokio::test(start_paused = true)]
async fn feedback_is_delivered_and_settled_by_the_clients_outcome() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let mut client = Client::open(&hub, SaslProfile::Anonymous).await;
    let token = hub.policy_token("service", hub.ctx.clock.now_secs() + 3600);
    assert_eq!(client.put_token(&token).await.0, 200);
    settled_c2d(&hub, &mut client, "d1", "done", Settle::Complete).await;

    let mut feedback = Receiver::attach(
        &mut client.session,
        "feedback",
        "/messages/serviceBound/feedback",
    )
    .await
    .expect("attach feedback");
    let (first, records) = next_feedback(&mut feedback, Duration::from_secs(10))
        .await
        .expect("feedback for the completed message");
    assert_eq!(records[0]["OriginalMessageId"], "m-done");
    assert_eq!(records[0]["StatusCode"], 0);
    assert_eq!(records[0]["Description"], "Success");
    assert_eq!(records[0]["DeviceId"], "d1");
    // Released: abandoned, so it comes back.
    feedback.release(&first).await.expect("release");
    let (again, records) = next_feedback(&mut feedback, Duration::from_secs(10))
        .await
        .expect("the released feedback again");
    assert_eq!(records[0]["OriginalMessageId"], "m-done");
    feedback.accept(&again).await.expect("accept");
    assert!(
        next_feedback(&mut feedback, Duration::from_secs(5))
            .await
            .is_none(),
        "accepted feedback was delivered again"
    );

    // A rejected device message: its feedback, rejected in turn, is dead and never returns.
    settled_c2d(&hub, &mut client, "d1", "refused", Settle::Reject).await;
    let (rejected, records) = next_feedback(&mut feedback, Duration::from_secs(10))
        .await
        .expect("feedback for the rejected message");
    assert_eq!(records[0]["OriginalMessageId"], "m-refused");
    assert_eq!(records[0]["Description"], "Message rejected");
    feedback.reject(&rejected, None).await.expect("reject");
    assert!(next_feedback(&mut feedback, Duration::from_secs(5))
        .await
        .is_none());
}

#[tokio::test(start_paused = true)]
async fn feedback_unsettled_when_the_connection_drops_comes_back() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let token = hub.policy_token("service", hub.ctx.clock.now_secs() + 3600);
    let mut client = Client::open(&hub, SaslProfile::Anonymous).await;
    assert_eq!(client.put_token(&token).await.0, 200);
    settled_c2d(&hub, &mut client, "d1", "dropped", Settle::Complete).await;
    let mut feedback =
        Receiver::attach(&mut client.session, "fb", "/messages/serviceBound/feedback")
            .await
            .expect("attach");
    let (_unsettled, _) = next_feedback(&mut feedback, Duration::from_secs(10))
        .await
        .expect("feedback");
    drop(feedback);
    drop(client);

    let mut other = Client::open(&hub, SaslProfile::Anonymous).await;
    assert_eq!(other.put_token(&token).await.0, 200);
    let mut feedback =
        Receiver::attach(&mut other.session, "fb2", "/messages/serviceBound/feedback")
            .await
            .expect("attach");
    let (back, records) = next_feedback(&mut feedback, Duration::from_secs(10))
        .await
        .expect("the unsettled feedback, back without waiting for its lock to expire");
    assert_eq!(records[0]["OriginalMessageId"], "m-dropped");
    feedback.accept(&back).await.expect("accept");
}

#[tokio::test(start_paused = true)]
async fn a_client_without_sasl_authorises_through_cbs() {
    let hub = InProcHub::start().await;
    hub.create_device("d1").await;
    let mut client = Client::open_with(&hub, None).await;
    let mut refused = client.devicebound().await;
    assert_eq!(
        detach_condition(&mut refused).await,
        Some(AmqpError::UnauthorizedAccess.into())
    );
    let token = hub.policy_token("service", hub.ctx.clock.now_secs() + 3600);
    assert_eq!(client.put_token(&token).await.0, 200);
    let mut link = client.devicebound().await;
    assert!(matches!(
        link.send(c2d("d1", "plain")).await.expect("sent"),
        Outcome::Accepted(_)
    ));
}
