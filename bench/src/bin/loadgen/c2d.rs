//! The C2D scenario: every device subscribes and PUBACKs (which completes its message) while
//! `--callers` back-end senders send `devices × messages-per-device` messages, either over
//! keep-alive HTTPS (`POST /devices/{id}/messages/deviceBound`, one connection per sender) or
//! over AMQP as the service SDKs do (CBS put-token, sender links to `/messages/devicebound`,
//! `--links` per connection). Each sender has one message in flight; a full queue is retried
//! after 5 ms. The latency is from the send to the device's receipt.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrohub_bench::amqp::{self, SendOutcome};
use ferrohub_bench::http::HttpsConnection;
use ferrohub_bench::stats;

use super::responders::{spawn_responders, Answer};
use super::{Args, C2dSender};

/// The sends every sender draws from, and what they share.
struct Work {
    next: AtomicUsize,
    total: usize,
    devices: Vec<String>,
    /// The clock the bodies carry: a body is its send time in µs since `origin`.
    origin: Instant,
    /// Sends answered "queue full" and retried.
    refused: AtomicUsize,
    /// The owner's SAS token.
    token: String,
}

impl Work {
    /// The next send's index and device, or `None` once all are taken.
    fn take(&self) -> Option<(usize, &str)> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.total).then(|| (i, self.devices[i % self.devices.len()].as_str()))
    }

    fn body(&self) -> Vec<u8> {
        (self.origin.elapsed().as_micros() as u64)
            .to_string()
            .into_bytes()
    }
}

type SenderTask = tokio::task::JoinHandle<Result<(), String>>;

/// Runs the C2D scenario and prints its report.
pub async fn run_c2d(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    ids: Vec<String>,
    key: String,
    owner_token: String,
) -> anyhow::Result<()> {
    let total = ids.len() * args.messages_per_device;
    let origin = Instant::now();
    let received = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(total)));
    let all_received = Arc::new(tokio::sync::Notify::new());
    let stop = Arc::new(tokio::sync::Notify::new());
    let answer: Answer = {
        let (received, latencies, all_received) = (
            Arc::clone(&received),
            Arc::clone(&latencies),
            Arc::clone(&all_received),
        );
        Arc::new(move |p| {
            // The body is the send time in microseconds since `origin`.
            if let Some(sent) = std::str::from_utf8(p.payload())
                .ok()
                .and_then(|b| b.parse::<u64>().ok())
            {
                let now = origin.elapsed().as_micros() as u64;
                latencies.lock().push(now.saturating_sub(sent));
            }
            if received.fetch_add(1, Ordering::Relaxed) + 1 == total {
                all_received.notify_one();
            }
            match p.qos() {
                mqtt::packet::QoSWithPacketIdentifier::Level1(id) => {
                    Some(mqtt::packet::PubackPacket::new(id).into())
                }
                _ => None,
            }
        })
    };
    let (responders, ready) = spawn_responders(
        &args,
        &tls,
        &ids,
        &key,
        &stop,
        |id| format!("devices/{id}/messages/devicebound/#"),
        answer,
    );
    let wait_ready = Instant::now();
    while ready.load(Ordering::Relaxed) < ids.len() {
        anyhow::ensure!(
            wait_ready.elapsed() < Duration::from_secs(args.time_limit),
            "only {} of {} devices subscribed",
            ready.load(Ordering::Relaxed),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let work = Arc::new(Work {
        next: AtomicUsize::new(0),
        total,
        devices: ids,
        origin,
        refused: AtomicUsize::new(0),
        token: owner_token,
    });
    let start = Instant::now();
    let senders: Vec<SenderTask> = match args.c2d_sender {
        C2dSender::Https => (0..args.callers.max(1))
            .map(|_| {
                tokio::spawn(https_sender(
                    Arc::clone(&args),
                    tls.clone(),
                    Arc::clone(&work),
                ))
            })
            .collect(),
        C2dSender::Amqp => amqp_senders(&args, &tls, &work).await?,
    };
    let sent = futures::future::join_all(senders).await;
    let mut errors: Vec<String> = sent
        .into_iter()
        .filter_map(|r| match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(e) => Some(e.to_string()),
        })
        .collect();
    if received.load(Ordering::Relaxed) < total
        && tokio::time::timeout(
            Duration::from_secs(args.time_limit),
            all_received.notified(),
        )
        .await
        .is_err()
    {
        errors.push(format!(
            "only {} of {total} messages received",
            received.load(Ordering::Relaxed)
        ));
    }
    let duration = start.elapsed();
    stop.notify_waiters();
    for r in responders {
        r.abort();
    }
    let latencies = std::mem::take(&mut *latencies.lock());
    let report = serde_json::json!({
        "target": "ferrohub", "scenario": "c2d", "devices": work.devices.len(), "callers": args.callers,
        "sender": args.c2d_sender, "links_per_connection": args.links,
        "messages": total, "received": received.load(Ordering::Relaxed),
        "queue_full_retries": work.refused.load(Ordering::Relaxed),
        "errors": errors.len(), "first_error": errors.first(),
        "duration_s": duration.as_secs_f64(),
        "throughput_msgs_per_s": received.load(Ordering::Relaxed) as f64 / duration.as_secs_f64(),
        "send_to_receipt_latency": stats::percentiles(latencies),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
/// One HTTPS sender: its own keep-alive connection, one POST at a time.
async fn https_sender(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    work: Arc<Work>,
) -> Result<(), String> {
    let mut http = HttpsConnection::connect(&tls, &args.host, args.https_port)
        .await
        .map_err(|e| e.to_string())?;
    while let Some((_, device)) = work.take() {
        let path = format!("/devices/{device}/messages/deviceBound?api-version=2021-04-12");
        loop {
            let (status, _) = http
                .request("POST", &path, &work.token, &work.body())
                .await
                .map_err(|e| e.to_string())?;
            match status {
                204 => break,
                // Queue full: the device is behind; try again shortly.
                403 => {
                    work.refused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => return Err(format!("send answered {other}")),
            }
        }
    }
    Ok(())
}

/// Opens `ceil(callers / links)` AMQP connections and starts one sender task per link,
/// `callers` in all. A connection stays open until its last link's task ends.
async fn amqp_senders(
    args: &Arc<Args>,
    tls: &tokio_rustls::TlsConnector,
    work: &Arc<Work>,
) -> anyhow::Result<Vec<SenderTask>> {
    let (callers, per_connection) = (args.callers.max(1), args.links.max(1));
    let mut tasks = Vec::with_capacity(callers);
    for (c, first) in (0..callers).step_by(per_connection).enumerate() {
        let mut service = amqp::ServiceConnection::open(
            tls,
            &args.host,
            args.amqp_port,
            &format!("loadgen-{c}"),
            work.token.clone(),
        )
        .await?;
        let mut links = Vec::new();
        for l in first..(first + per_connection).min(callers) {
            let link = service.c2d_sender(format!("c2d-{l}")).await?;
            links.push(tokio::spawn(amqp_sender(link, Arc::clone(work))));
        }
        // The connection's own task waits for its links, then closes it.
        tasks.push(tokio::spawn(async move {
            let mut result = Ok(());
            for link in links {
                let outcome = link.await.map_err(|e| e.to_string()).and_then(|r| r);
                result = result.and(outcome);
            }
            service.close().await;
            result
        }));
    }
    Ok(tasks)
}

/// One AMQP sender link: one message at a time, each waiting for its disposition.
async fn amqp_sender(mut link: fe2o3_amqp::Sender, work: Arc<Work>) -> Result<(), String> {
    while let Some((i, device)) = work.take() {
        loop {
            match amqp::send_c2d(&mut link, device, format!("m-{i}"), work.body())
                .await
                .map_err(|e| format!("{e:#}"))?
            {
                SendOutcome::Accepted => break,
                SendOutcome::QueueFull => {
                    work.refused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                SendOutcome::Refused(why) => return Err(format!("send {why}")),
            }
        }
    }
    let _ = link.close().await;
    Ok(())
}
