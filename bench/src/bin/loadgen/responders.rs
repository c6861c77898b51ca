//! Simulated devices that stay subscribed and answer what the hub pushes (direct method
//! requests, C2D messages): the device side of the back-end scenarios.

use std::sync::Arc;

use ferrohub_server::auth::sas;
use futures::{SinkExt, StreamExt};
use mqtt::packet::VariablePacket;
use tokio::sync::Semaphore;

use super::{dialer_of, mqtt_port, Args};
use ferrohub_bench::client;

/// What a responder sends back for a PUBLISH the hub pushed, if anything.
pub type Answer = Arc<dyn Fn(&mqtt::packet::PublishPacket) -> Option<VariablePacket> + Send + Sync>;

/// A device that subscribes to `filter` and answers every PUBLISH it gets with what `answer`
/// returns, until `stop`. Counts itself in `ready` once its SUBACK arrived.
#[allow(clippy::too_many_arguments)]
async fn run_responder(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    id: String,
    key: String,
    gate: Arc<Semaphore>,
    stop: Arc<tokio::sync::Notify>,
    filter: String,
    ready: Arc<std::sync::atomic::AtomicUsize>,
    answer: Answer,
) -> Result<(), String> {
    let expiry = chrono::Utc::now().timestamp() as u64 + 3600;
    let user = Some(format!("{}/{id}/?api-version=2021-04-12", args.host));
    let pass = sas::sign(&format!("{}/devices/{id}", args.host), &key, expiry, None);
    let permit = gate.acquire().await;
    let mut conn = client::connect(
        &dialer_of(&args, &tls)?,
        &args.host,
        mqtt_port(&args),
        &id,
        user,
        pass,
        60,
    )
    .await
    .map_err(|e| format!("{id}: {e:#}"))?;
    drop(permit);
    let sub = mqtt::packet::SubscribePacket::new(
        1,
        vec![(
            mqtt::TopicFilter::new(filter).map_err(|e| format!("{e:?}"))?,
            mqtt::QualityOfService::Level1,
        )],
    );
    conn.send(sub).await.map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            _ = stop.notified() => return Ok(()),
            packet = conn.next() => match packet {
                Some(Ok(VariablePacket::SubackPacket(_))) => {
                    ready.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Some(Ok(VariablePacket::PublishPacket(p))) => {
                    if let Some(reply) = answer(&p) {
                        conn.send(reply).await.map_err(|e| e.to_string())?;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("{id}: {e}")),
                None => return Err(format!("{id}: closed")),
            }
        }
    }
}

/// Starts one responder per device; returns their handles and the SUBACK counter.
#[allow(clippy::type_complexity)]
pub fn spawn_responders(
    args: &Arc<Args>,
    tls: &tokio_rustls::TlsConnector,
    ids: &[String],
    key: &str,
    stop: &Arc<tokio::sync::Notify>,
    filter: impl Fn(&str) -> String,
    answer: Answer,
) -> (
    Vec<tokio::task::JoinHandle<Result<(), String>>>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let gate = Arc::new(Semaphore::new(args.connect_concurrency.max(1)));
    let ready = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles = ids
        .iter()
        .map(|id| {
            tokio::spawn(run_responder(
                Arc::clone(args),
                tls.clone(),
                id.clone(),
                key.to_string(),
                Arc::clone(&gate),
                Arc::clone(stop),
                filter(id),
                Arc::clone(&ready),
                Arc::clone(&answer),
            ))
        })
        .collect();
    (handles, ready)
}
