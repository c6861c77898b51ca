//! A full commit queue suspends only the writing connection: the runtime keeps answering
//! everyone else, and the writer's messages are acknowledged, in order, once writes resume.

use std::time::Duration;

use ferrohub_engine::StoreConfig;
use ferrohub_server::config::Config;
use ferrohub_tests::inproc::InProcHub;
use mqtt::packet::*;
use warp::http::StatusCode;

// One runtime worker: a worker parked in a blocking call would stall every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_full_commit_queue_stalls_the_writer_not_the_runtime() {
    let engine = StoreConfig {
        commit_queue_depth: 4,
        ..StoreConfig::default()
    };
    let hub = InProcHub::start_with(Config::default(), engine).await;
    let writer_key = hub.create_device("writer").await;
    let other_key = hub.create_device("other").await;
    let mut writer = hub.connect("writer", &writer_key, 0).await;
    let mut other = hub.connect("other", &other_key, 0).await;

    let hold = hub.ctx.store.hold_commits();
    const SENT: u16 = 40;
    for pkid in 1..=SENT {
        writer.publish_telemetry("writer", pkid, b"{}").await;
    }
    // The writer's messages wait for the disk; nothing is acknowledged yet.
    assert!(
        writer
            .recv_within(Duration::from_millis(300))
            .await
            .is_none(),
        "no PUBACK while writes are held"
    );
    // Everyone else is still served.
    other.send(PingreqPacket::new()).await;
    assert!(
        matches!(
            other.recv_within(Duration::from_secs(5)).await,
            Some(VariablePacket::PingrespPacket(_))
        ),
        "another connection's PINGREQ is answered during the stall"
    );
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(5),
        hub.rest("GET", "/devices/other?api-version=2021-04-12", None),
    )
    .await
    .expect("a REST GET is answered during the stall");
    assert_eq!(status, StatusCode::OK, "{body}");

    drop(hold);
    for pkid in 1..=SENT {
        match writer.recv_within(Duration::from_secs(10)).await {
            Some(VariablePacket::PubackPacket(ack)) => assert_eq!(ack.packet_identifier(), pkid),
            other => panic!("expected PUBACK {pkid}, got {other:?}"),
        }
    }
}
