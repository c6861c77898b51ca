//! Timing rules of the MQTT endpoint, C2D locks and direct methods, on tokio's paused clock:
//! time moves only when every task waits, so each deadline is checked to the millisecond
//! without sleeping.

use std::time::Duration;

use ferrohub_server::config::Config;
use ferrohub_tests::inproc::InProcHub;
use mqtt::packet::*;
use serde_json::json;
use tokio::time::Instant;
use warp::http::StatusCode;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn a_silent_client_is_dropped_at_one_and_a_half_keep_alives() {
    let hub = InProcHub::start().await;
    let key = hub.create_device("d1").await;
    let mut c = hub.connect("d1", &key, 2).await;
    let start = Instant::now();
    assert!(
        c.recv().await.is_none(),
        "the hub closes a silent connection"
    );
    let waited = start.elapsed();
    assert!(
        waited >= ms(3000) && waited < ms(3050),
        "closed after {waited:?}, not 1.5 x 2 s"
    );

    // Traffic just inside the limit keeps it open, again and again.
    let mut c = hub.connect("d1", &key, 2).await;
    for _ in 0..4 {
        tokio::time::sleep(ms(2900)).await;
        c.send(PingreqPacket::new()).await;
        assert!(matches!(
            c.recv_within(ms(100)).await,
            Some(VariablePacket::PingrespPacket(_))
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn an_unacknowledged_c2d_message_is_redelivered_when_its_lock_expires() {
    let mut config = Config::default();
    config.c2d.lock_timeout = Duration::from_secs(10);
    let hub = InProcHub::start_with(config, Default::default()).await;
    let key = hub.create_device("d1").await;
    let mut c = hub.connect("d1", &key, 0).await;
    c.subscribe("devices/d1/messages/devicebound/#", 1).await;
    let (status, _) = hub
        .rest(
            "POST",
            "/devices/d1/messages/deviceBound?api-version=2021-04-12",
            Some(json!({ "n": 1 })),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let Some(VariablePacket::PublishPacket(first)) = c.recv_within(ms(100)).await else {
        panic!("the message is delivered");
    };
    let locked_at = Instant::now();
    // Not acknowledged: nothing comes until the lock has expired...
    assert!(c.recv_within(ms(9_900)).await.is_none());
    // ...and then the same message comes again.
    let Some(VariablePacket::PublishPacket(again)) = c.recv_within(ms(1_000)).await else {
        panic!("the message is redelivered after its lock expired");
    };
    let waited = locked_at.elapsed();
    assert!(waited >= ms(10_000) && waited < ms(10_200), "{waited:?}");
    assert_eq!(again.payload(), first.payload());
    let QoSWithPacketIdentifier::Level1(pkid) = again.qos() else {
        panic!("C2D is QoS 1");
    };
    c.send(PubackPacket::new(pkid)).await;
    // Completed: the queue is empty once the completion is durable.
    let mut depth = None;
    for _ in 0..50 {
        let (_, device) = hub
            .rest("GET", "/devices/d1?api-version=2021-04-12", None)
            .await;
        depth = device["cloudToDeviceMessageCount"].as_u64();
        if depth == Some(0) {
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert_eq!(depth, Some(0));
}

#[tokio::test(start_paused = true)]
async fn a_silent_device_gets_504101_at_the_response_timeout() {
    let hub = InProcHub::start().await;
    let key = hub.create_device("d1").await;
    let mut c = hub.connect("d1", &key, 0).await;
    c.subscribe("$iothub/methods/POST/#", 1).await;
    let start = Instant::now();
    let call = hub.rest(
        "POST",
        "/twins/d1/methods?api-version=2021-04-12",
        Some(json!({ "methodName": "reboot", "payload": {}, "responseTimeoutInSeconds": 5 })),
    );
    let device = async {
        match c.recv_within(ms(1000)).await {
            Some(VariablePacket::PublishPacket(p)) => p.topic_name().to_string(),
            other => panic!("expected the method request, got {other:?}"),
        }
    };
    let ((status, body), topic) = tokio::join!(call, device);
    let waited = start.elapsed();
    assert!(topic.starts_with("$iothub/methods/POST/reboot/"), "{topic}");
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(body["errorCode"], 504101);
    assert!(waited >= ms(5000) && waited < ms(5100), "{waited:?}");
}
