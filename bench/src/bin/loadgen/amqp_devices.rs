//! Telemetry from simulated devices over AMQP (`--transport amqp`), as the device SDKs send
//! it: a CBS put-token of the device's own SAS token, a sender link to
//! `/devices/{id}/messages/events`, and up to `--inflight` transfers outstanding; latency is
//! from the send to the hub's `accepted` (given only once the message is durable).

use std::sync::Arc;
use std::time::Instant;

use fe2o3_amqp::link::Sender;
use fe2o3_amqp::types::messaging::{Message, Outcome};
use ferrohub_bench::amqp::ServiceConnection;
use ferrohub_server::auth::sas;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::{Args, DeviceResult};

pub async fn run_device(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    id: String,
    key: String,
    connect_gate: Arc<Semaphore>,
    start: Arc<tokio::sync::Barrier>,
) -> DeviceResult {
    let mut result = DeviceResult {
        connect_us: None,
        latencies_us: Vec::with_capacity(args.messages_per_device),
        error: None,
    };
    let expiry = chrono::Utc::now().timestamp() as u64 + 3600;
    let token =
        sas::sign(&format!("{}/devices/{id}", args.host), &key, expiry, None).unwrap_or_default();
    let permit = connect_gate.acquire().await;
    let t0 = Instant::now();
    let opened = async {
        let mut conn =
            ServiceConnection::open(&tls, &args.host, args.amqp_port, &id, token).await?;
        let link = Sender::attach(
            &mut conn.session,
            format!("{id}-events"),
            format!("/devices/{id}/messages/events"),
        )
        .await?;
        anyhow::Ok((conn, link))
    }
    .await;
    drop(permit);
    let (conn, mut link) = match opened {
        Ok(o) => o,
        Err(e) => {
            result.error = Some(format!("{id}: connect: {e:#}"));
            start.wait().await;
            return result;
        }
    };
    result.connect_us = Some(t0.elapsed().as_micros() as u64);
    start.wait().await;
    let payload = vec![b'x'; args.payload_bytes];
    let mut outstanding = FuturesUnordered::new();
    let mut sent = 0;
    while result.latencies_us.len() < args.messages_per_device {
        while sent < args.messages_per_device && outstanding.len() < args.inflight {
            let message = Message::builder().data(payload.clone()).build();
            match link.send_batchable(message).await {
                Ok(delivery) => {
                    let at = Instant::now();
                    outstanding.push(async move { (at, delivery.await) });
                    sent += 1;
                }
                Err(e) => {
                    result.error = Some(format!("{id}: send: {e}"));
                    return result;
                }
            }
        }
        match outstanding.next().await {
            Some((at, Ok(Outcome::Accepted(_)))) => {
                result.latencies_us.push(at.elapsed().as_micros() as u64)
            }
            Some((_, other)) => {
                result.error = Some(format!("{id}: outcome {other:?}"));
                return result;
            }
            None => break,
        }
    }
    let _ = link.close().await;
    conn.close().await;
    result
}
