//! MQT-6 and D2C-1 together: a device that keeps many QoS 1 messages in flight gets every PUBACK,
//! in order, and its events are stored in exactly the order it sent them, although the hub
//! acknowledges each only after its (group-committed) durable append.

use std::collections::VecDeque;

use base64::Engine as _;
use ferrohub_bench::http::HttpsConnection;
use ferrohub_bench::{client, registry};
use ferrohub_tests::TestHub;
use futures::{SinkExt, StreamExt};
use mqtt::packet::VariablePacket;

const KEY: &str = "cGlwZWxpbmluZy10ZXN0LWRldmljZS1rZXktMzItYnl0ZXM=";
const MESSAGES: u16 = 2000;
const WINDOW: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_publishes_keep_their_order() -> anyhow::Result<()> {
    let hub = TestHub::start();
    let tls = client::tls_connector(&hub.ca())?;
    registry::register(
        &tls,
        "localhost",
        hub.https_port,
        &hub.token("iothubowner"),
        &["pipe".to_string()],
        KEY,
    )
    .await?;
    let password = ferrohub_server::auth::sas::sign(
        "localhost/devices/pipe",
        KEY,
        chrono::Utc::now().timestamp() as u64 + 3600,
        None,
    );
    let mut conn = client::connect(
        &tls.clone().into(),
        "localhost",
        hub.mqtt_port,
        "pipe",
        Some("localhost/pipe/?api-version=2021-04-12".into()),
        password,
        60,
    )
    .await?;

    let mut outstanding: VecDeque<u16> = VecDeque::new();
    let mut next = 1u16;
    let mut acked = 0u16;
    while acked < MESSAGES {
        while next <= MESSAGES && outstanding.len() < WINDOW {
            conn.feed(client::publish(
                "devices/pipe/messages/events/",
                Some(next),
                next.to_string().into_bytes(),
            )?)
            .await?;
            outstanding.push_back(next);
            next += 1;
        }
        SinkExt::<mqtt::packet::PublishPacket>::flush(&mut conn).await?;
        match conn.next().await {
            Some(Ok(VariablePacket::PubackPacket(ack))) => {
                assert_eq!(
                    Some(ack.packet_identifier()),
                    outstanding.pop_front(),
                    "PUBACKs come in publish order"
                );
                acked += 1;
            }
            other => anyhow::bail!("expected PUBACK, got {other:?}"),
        }
    }

    let token = hub.token("iothubowner");
    let mut http = HttpsConnection::connect(&tls, "localhost", hub.https_port).await?;
    let (status, body) = http
        .request(
            "GET",
            "/events/partitions?api-version=2021-04-12",
            &token,
            b"",
        )
        .await?;
    assert_eq!(status, 200);
    let partitions: serde_json::Value = serde_json::from_slice(&body)?;
    let mut bodies = Vec::new();
    for p in partitions.as_array().expect("array") {
        let pid = p["partitionId"].as_str().expect("id");
        let mut seq = 0u64;
        loop {
            let path = format!("/events/consumergroups/$Default/partitions/{pid}/messages?sequenceNumber={seq}&max=1000");
            let (status, body) = http.request("GET", &path, &token, b"").await?;
            assert_eq!(status, 200);
            let batch: serde_json::Value = serde_json::from_slice(&body)?;
            let events = batch["events"].as_array().expect("events");
            if events.is_empty() {
                break;
            }
            for e in events {
                assert_eq!(e["sequenceNumber"].as_u64(), Some(seq), "no gaps");
                seq += 1;
                let raw = base64::engine::general_purpose::STANDARD
                    .decode(e["body"].as_str().expect("body"))?;
                bodies.push(String::from_utf8(raw)?.parse::<u16>()?);
            }
        }
    }
    let expected: Vec<u16> = (1..=MESSAGES).collect();
    assert_eq!(bodies, expected, "stored in the order sent");
    Ok(())
}
